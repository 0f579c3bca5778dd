"""grpo_theory.success_dynamics and grpo_theory.tilted_policies: hand-checked cases, exact
identities, hypothesis properties and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_theory import compute_advantages
from grpo_theory.success_dynamics import (
    fixed_points,
    logit,
    omega,
    omega_logit_derivative_bound,
    orbit_kinds,
    pos_trajectories,
    pos_trajectory,
    pos_update,
    pos_update_derivative,
    sigmoid,
    success_weights,
)
from grpo_theory.surrogate import ppo_clip_objective
from grpo_theory.tilted_policies import (
    conditional,
    expected_clipped_surrogate,
    geometric_mean,
    grpo_policy_iterates,
    grpo_policy_step,
    kl_divergence,
    regularised_objective,
    renyi_correction,
    renyi_divergence,
    sampled_group_update,
    tilt,
    total_variation,
)

S = np.array([True, False, False])


# --- hand-checked cases ------------------------------------------------------------------------
def test_success_weights_hand_checked():
    wp, wm = success_weights(0.2, eps=0.0)
    assert float(wp) == pytest.approx(2.0) and float(wm) == pytest.approx(0.5)  # sqrt(4), 1/2
    wp, wm = success_weights(0.2, eps=0.0, normalisation="mean_only")
    assert (float(wp), float(wm)) == pytest.approx((0.8, 0.2))
    assert float(omega(0.2, eps=0.0)) == pytest.approx(2.5)  # 1/sqrt(0.16)
    assert float(omega(0.0, eps=0.25)) == pytest.approx(2.0)


def test_pos_update_is_the_sigmoid_of_the_shifted_log_odds():
    # p_anchor = 1/2 (logit 0), Omega(1/2) = 2, beta = 2: sigmoid(1)
    assert float(pos_update(0.5, p_anchor=0.5, beta=2.0, eps=0.0)) == pytest.approx(
        1 / (1 + math.exp(-1)), abs=1e-15)
    assert float(pos_update(0.3, p_anchor=0.0, beta=1.0, eps=0.1)) == 0.0  # absorbing
    assert float(pos_update(0.3, p_anchor=1.0, beta=1.0, eps=0.1)) == 1.0


def test_logit_sigmoid_round_trip_and_extremes():
    p = np.array([1e-300, 0.2, 0.5, 1 - 1e-12])
    assert np.allclose(sigmoid(logit(p)), p, rtol=1e-12, atol=0)
    assert float(sigmoid(800.0)) == 1.0 and float(sigmoid(-800.0)) == 0.0


def test_derivative_matches_a_central_difference():
    p, d = 0.3, 1e-6
    fd = (pos_update(p + d, p_anchor=0.2, beta=0.7, eps=0.05)
          - pos_update(p - d, p_anchor=0.2, beta=0.7, eps=0.05)) / (2 * d)
    assert float(pos_update_derivative(p, p_ref=0.2, beta=0.7, eps=0.05)) == pytest.approx(
        float(fd), rel=1e-7)


def test_omega_slope_bound_hand_checked():
    # eps = 1e-4: 3^(-3/2) / 0.01 = 19.245
    assert omega_logit_derivative_bound(1e-4) == pytest.approx(3**-1.5 / 1e-2)
    assert omega_logit_derivative_bound(1.0) == pytest.approx(0.5 * 0.25 * 1.25**-1.5)


def test_trajectories_mean_only_mirror_is_arithmetic():
    L = pos_trajectories(0.25, beta=0.5, eps=0.0, n_steps=4, alpha=0.0,
                         normalisation="mean_only")[:, 0]
    assert np.allclose(L - L[0], 2.0 * np.arange(5))


def test_trajectory_scalar_wrapper_keeps_one_minus_p_near_one():
    t = pos_trajectory(0.001, beta=1.0, eps=1e-5, n_steps=2)  # L_2 ~ 309: 1 - p ~ 1e-134
    assert t.p[-1] == 1.0 and 0 < t.one_minus_p[-1] < 1e-100
    assert t.one_minus_p[-1] == pytest.approx(math.exp(-t.logit[-1]), rel=1e-12)


def test_fixed_points_hand_checked_mean_only_and_known_cases():
    fp = fixed_points(0.5, beta=0.5, eps=0.0, alpha=0.5, normalisation="mean_only")
    assert [f.logit for f in fp.points] == [pytest.approx(4.0)]  # L_ref + 1/(alpha beta)
    assert fp.points[0].multiplier == pytest.approx(0.5)  # 1 - alpha
    # p_ref = 0.001, beta = 5, eps = 1e-5: three fixed points, the inner one repelling (Fig. 5)
    fp = fixed_points(0.001, beta=5.0, eps=1e-5)
    assert fp.certified and len(fp.points) == 3
    assert fp.points[0].multiplier < -1 and not fp.points[0].attracting


def test_orbit_kinds_finds_the_two_cycle():
    kinds, last = orbit_kinds([0.001, 0.3], beta=[5.0, 5.0], eps=1e-5, n_steps=3000)
    assert kinds.tolist() == ["period 2", "fixed point"]
    assert abs(last[0, 0] - last[0, 1]) > 0.01


def test_tilt_hand_checked_and_gibbs_gap_identity():
    pi = tilt([0.5, 0.25, 0.25], S, a_plus=1.0, a_minus=1.0, beta=1.0)
    z = 0.5 * math.e + 0.5 / math.e
    assert pi.tolist() == pytest.approx([0.5 * math.e / z, 0.25 / math.e / z, 0.25 / math.e / z])
    rng = np.random.default_rng(0)
    anchor = rng.dirichlet(np.ones(3))
    star = tilt(anchor, S, a_plus=0.7, a_minus=1.3, beta=0.4)
    j = regularised_objective(star, S, a_plus=0.7, a_minus=1.3, beta=0.4, anchor=anchor)
    for q in rng.dirichlet(np.ones(3), size=5):
        jq = regularised_objective(q, S, a_plus=0.7, a_minus=1.3, beta=0.4, anchor=anchor)
        assert j - jq == pytest.approx(0.4 * kl_divergence(q, star), abs=1e-12)


def test_divergences_hand_checked():
    assert kl_divergence([0.5, 0.5], [0.5, 0.5]) == 0.0
    assert kl_divergence([0.5, 0.5], [1.0, 0.0]) == math.inf
    assert total_variation([1.0, 0.0], [0.25, 0.75]) == 0.75
    # D_1/2(p || q) = -2 log sum sqrt(p q)
    assert renyi_divergence([0.5, 0.5], [0.9, 0.1], alpha=0.5) == pytest.approx(
        -2 * math.log(math.sqrt(0.45) + math.sqrt(0.05)))
    assert conditional([0.2, 0.3, 0.5], S).tolist() == [1.0, 0.0, 0.0]


def test_geometric_mean_endpoints():
    a, b = np.array([0.2, 0.3, 0.5]), np.array([0.6, 0.4, 0.0])
    assert geometric_mean(a, b, alpha=1.0).tolist() == pytest.approx(a.tolist())
    assert geometric_mean(a, b, alpha=0.0).tolist() == pytest.approx(b.tolist())
    assert geometric_mean(a, b, alpha=0.5)[2] == 0.0


def test_renyi_correction_vanishes_along_the_iteration_from_pi_ref():
    pi_ref = np.array([0.1, 0.2, 0.3, 0.4])
    s = np.array([True, True, False, False])
    for pi in grpo_policy_iterates(pi_ref, s, beta=1.0, eps=1e-3, n_steps=10, alpha=0.5):
        assert abs(renyi_correction(pi_ref, pi, s, alpha=0.5)) < 1e-13
    assert abs(renyi_correction(pi_ref, np.array([0.3, 0.1, 0.1, 0.5]), s, alpha=0.5)) > 0.01


def test_policy_step_alpha_endpoints_are_reference_and_mirror():
    pi_ref = np.array([0.2, 0.3, 0.5])
    prev = np.array([0.5, 0.25, 0.25])
    ref = grpo_policy_step(prev, pi_ref, S, beta=1.0, eps=0.1, alpha=1.0)
    mir = grpo_policy_step(prev, pi_ref, S, beta=1.0, eps=0.1, alpha=0.0)
    wp, wm = (float(w) for w in success_weights(0.5, eps=0.1))
    assert ref.tolist() == pytest.approx(tilt(pi_ref, S, a_plus=wp, a_minus=wm, beta=1.0).tolist())
    assert mir.tolist() == pytest.approx(tilt(prev, S, a_plus=wp, a_minus=wm, beta=1.0).tolist())


def test_ppo_clip_hand_checked():
    assert ppo_clip_objective(2.0, 0.5, clip=0.2).tolist() == pytest.approx(0.6)
    assert ppo_clip_objective(0.5, -1.0, clip=0.2).tolist() == pytest.approx(-0.8)
    assert ppo_clip_objective(2.0, 0.5, clip=math.inf).tolist() == pytest.approx(1.0)
    assert expected_clipped_surrogate([0.5, 0.5], [0.5, 0.5], [1.0, -1.0], clip=0.2) == 0.0


def test_sampled_group_update_hand_checked():
    # G = 2 draws of output 0 (a success) with advantage 1: a_hat(0) = 2 * 1 / (2 * 0.5) = 2
    pi = sampled_group_update([2, 0, 0], [0.5, 0.25, 0.25], [0.5, 0.25, 0.25], S,
                              adv_success=1.0, adv_failure=-1.0, beta=1.0)
    z = 0.5 * math.e**2 + 0.5
    assert pi.tolist() == pytest.approx([0.5 * math.e**2 / z, 0.25 / z, 0.25 / z])


# --- the paper's advantage as a registry option -----------------------------------------------
def test_grpo_std_with_eps_under_the_root_is_eq4_at_p_hat():
    r = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    A = compute_advantages("grpo_std", r, ddof=0, eps=0.1, eps_mode="add_var")
    wp, wm = success_weights(0.25, eps=0.1)
    assert A[0].tolist() == pytest.approx([float(wp), -float(wm), -float(wm), -float(wm)])
    assert A[1].tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="eps_mode"):
        compute_advantages("grpo_std", r, eps_mode="under")


# --- properties --------------------------------------------------------------------------------
@settings(max_examples=30)
@given(st.floats(1e-3, 0.999), st.floats(0.05, 50.0), st.sampled_from([1e-5, 1e-2, 0.25]))
def test_every_fixed_point_exceeds_p_ref_and_is_a_root(p_ref, beta, eps):
    fp = fixed_points(p_ref, beta=beta, eps=eps, cells=256)
    assert fp.certified and fp.points
    for f in fp.points:
        assert f.p > p_ref
        lo, hi = f.bracket
        assert hi - lo <= 1e-12 * max(1.0, abs(lo))


@settings(max_examples=30)
@given(st.floats(1e-3, 0.999), st.floats(0.05, 20.0), st.floats(0.0, 1.0))
def test_mirror_iterates_increase(p_ref, beta, alpha):
    L = pos_trajectories(p_ref, beta=beta, eps=1e-3, n_steps=5, alpha=0.0)[:, 0]
    assert np.all(np.diff(L) > 0)
    L2 = pos_trajectories(p_ref, beta=beta, eps=1e-3, n_steps=5, alpha=alpha)[:, 0]
    assert L2[1] > L2[0]  # the first step always amplifies (Delta_R = 0 from pi_ref)


# --- errors ------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="0/0"):
        success_weights(0.0, eps=0.0)
    with pytest.raises(ValueError, match="beta must be"):
        pos_update(0.5, p_anchor=0.5, beta=0.0, eps=0.1)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        omega(1.5, eps=0.1)
    with pytest.raises(ValueError, match="normalisation"):
        omega(0.5, eps=0.1, normalisation="mean")
    with pytest.raises(ValueError, match="absorbing"):
        fixed_points(0.0, beta=1.0, eps=0.1)
    with pytest.raises(ValueError, match="n_steps"):
        pos_trajectory(0.5, beta=1.0, eps=0.1, n_steps=-1)
    with pytest.raises(ValueError, match="sum to 1"):
        tilt([0.5, 0.6], [1, 0], a_plus=1.0, a_minus=1.0, beta=1.0)
    with pytest.raises(ValueError, match="binary"):
        tilt([0.5, 0.5], [2, 0], a_plus=1.0, a_minus=1.0, beta=1.0)
    with pytest.raises(ValueError, match="alpha must be in"):
        renyi_divergence([0.5, 0.5], [0.5, 0.5], alpha=1.0)
    with pytest.raises(ValueError, match="probability 0"):
        conditional([1.0, 0.0, 0.0], ~S)
