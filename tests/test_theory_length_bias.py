"""grpo_theory.length_bias, question_weights and surrogate: hand-checked cases, exact identities,
equivalence with an independent enumeration, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_theory import AGGREGATION_MODES, compute_advantages
from grpo_theory.bernoulli import exact_advantage_moments
from grpo_theory.length_bias import (
    brute_force_aggregated_gradient,
    conditional_weighted_advantage,
    expected_aggregated_gradient,
    mean_length_given_reward,
    others_reward_length_law,
    own_advantage_table,
    reward_length_law,
    rollout_weight,
)
from grpo_theory.question_weights import (
    conditional_advantages,
    group_mean_factor,
    population_std_question_weight,
    question_weight,
)
from grpo_theory.surrogate import clipped_surrogate


def _world(seed: int, n: int = 4, d: int = 3):
    rng = np.random.default_rng(seed)
    p = rng.random(n) + 0.1
    p /= p.sum()
    mu = rng.random(n)
    L = rng.integers(1, 6, n)
    psi = rng.standard_normal((n, d))
    return p, mu, L, psi


# --- length_bias ---------------------------------------------------------------------------------
def test_others_law_sums_to_one_with_binomial_successes_and_additive_lengths():
    p, mu, L, _ = _world(0)
    cell = reward_length_law(p, mu, L)
    P = others_reward_length_law(cell, 3)
    assert P.sum() == pytest.approx(1.0, abs=1e-14)
    J = float(p @ mu)
    k = np.arange(4)
    np.testing.assert_allclose(P.sum(1), [math.comb(3, i) * J**i * (1 - J) ** (3 - i) for i in k],
                               atol=1e-14)
    S = np.arange(P.shape[1])
    assert P.sum(0) @ S == pytest.approx(3 * float(p @ L), abs=1e-12)
    assert others_reward_length_law(cell, 0).tolist() == [[1.0]]


def test_rollout_weight_hand_checked():
    assert rollout_weight(4, 12, G=2, mode="sequence_mean") == pytest.approx(1 / 8)
    assert rollout_weight(4, 12, G=2, mode="token_mean") == pytest.approx(1 / 16)
    assert rollout_weight(4, 12, G=2, mode="dr_grpo", max_tokens=16) == pytest.approx(1 / 32)
    assert rollout_weight(4, 12, G=2, mode="sequence_sum") == pytest.approx(1 / 2)
    assert rollout_weight(4, 12, G=3, mode="token_mean") == pytest.approx(1 / 16)  # 12 = 6 + 6


def test_own_advantage_table_uses_the_registered_estimator():
    A = own_advantage_table("grpo_std", G=3, ddof=1, eps=0.0)
    row = np.asarray(compute_advantages("grpo_std", [[1.0, 1.0, 0.0]], ddof=1, eps=0.0))[0]
    assert A[1, 1] == pytest.approx(row[0]) and A[0, 2] == pytest.approx(
        np.asarray(compute_advantages("grpo_std", [[0.0, 1.0, 1.0]], ddof=1, eps=0.0))[0, 0])
    assert A[0, 0] == 0.0 and A[1, 2] == 0.0  # constant groups


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("estimator,opts", [("grpo", {}), ("grpo_std", {"ddof": 1, "eps": 1e-8}),
                                            ("rloo", {})])
def test_expected_gradient_equals_enumeration_of_every_joint_group(mode, estimator, opts):
    for seed in (1, 2):
        p, mu, L, psi = _world(seed)
        for G in (2, 3):
            kw = dict(probs=p, means=mu, lengths=L, psi=psi, G=G, mode=mode,
                      max_tokens=int(L.max()) + 1 if mode == "dr_grpo" else None,
                      estimator_options=opts)
            np.testing.assert_allclose(expected_aggregated_gradient(estimator, **kw),
                                       brute_force_aggregated_gradient(estimator, **kw),
                                       atol=1e-14)


def test_sequence_mean_is_the_group_estimator_with_psi_over_length():
    """E[g] of the per-response mean = sims.exact's E[(1/G) sum_i A_i psi_i / L_i]."""
    from sims.exact import expected_gradient_bernoulli

    p, mu, L, psi = _world(3)
    g = expected_aggregated_gradient("grpo_std", probs=p, means=mu, lengths=L, psi=psi, G=5,
                                     mode="sequence_mean", estimator_options={"ddof": 1})
    ref = expected_gradient_bernoulli("grpo_std", probs=p, means=mu, psi=psi / L[:, None], R=5,
                                      opts={"ddof": 1})
    np.testing.assert_allclose(g, ref, atol=1e-14)


def test_constant_normaliser_gives_group_mean_factor_times_grad_j():
    p, mu, L, psi = _world(4)
    psi = psi - p @ psi  # a score has mean 0 under the policy
    gJ = (p * mu) @ psi
    for G in (2, 4, 7):
        g = expected_aggregated_gradient("dr_grpo", probs=p, means=mu, lengths=L, psi=psi, G=G,
                                         mode="dr_grpo", max_tokens=10)
        np.testing.assert_allclose(g, (G - 1) / (G * 10) * gJ, atol=1e-14)


def test_conditional_weighted_advantage_hand_checked():
    T = conditional_weighted_advantage("grpo", probs=[0.5, 0.5], means=[1.0, 0.0], lengths=[1, 3],
                                       G=2, mode="sequence_mean")
    # G = 2: the other rollout fails w.p. 1/2, and then A(success) = 1/2, A(failure) = 0
    assert T[:, 0].tolist() == [0.0, 0.0]  # no response has length 0
    assert T[1, 1] == pytest.approx(0.5 * 0.5 / (2 * 1))
    assert T[0, 3] == pytest.approx(0.5 * -0.5 / (2 * 3))
    assert T[1, 2] == pytest.approx(0.5 * 0.5 / (2 * 2))  # what a length-2 response would get


def test_mean_length_given_reward_hand_checked():
    assert mean_length_given_reward([0.5, 0.5], [1.0, 0.0], [1, 3], reward=1) == 1.0
    assert mean_length_given_reward([0.5, 0.5], [0.5, 0.5], [1, 3], reward=0) == 2.0


def test_length_bias_rejects_bad_input():
    ok = dict(probs=[0.5, 0.5], means=[1.0, 0.0], lengths=[1, 3], psi=np.eye(2), G=2)
    with pytest.raises(ValueError, match="distribution"):
        expected_aggregated_gradient("grpo", **{**ok, "probs": [0.5, 0.6]}, mode="token_mean")
    with pytest.raises(ValueError, match="integers >= 1"):
        expected_aggregated_gradient("grpo", **{**ok, "lengths": [0, 3]}, mode="token_mean")
    with pytest.raises(ValueError, match="success probabilities"):
        expected_aggregated_gradient("grpo", **{**ok, "means": [1.5, 0.0]}, mode="token_mean")
    with pytest.raises(ValueError, match="max_tokens >= the longest"):
        expected_aggregated_gradient("grpo", **ok, mode="dr_grpo", max_tokens=2)
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        expected_aggregated_gradient("grpo", **ok, mode="per_token")
    with pytest.raises(ValueError, match="psi must be shaped"):
        expected_aggregated_gradient("grpo", **{**ok, "psi": np.eye(3)}, mode="token_mean")
    with pytest.raises(ValueError, match="couples the groups"):
        own_advantage_table("gpg", G=4)
    with pytest.raises(ValueError, match="no option"):
        own_advantage_table("grpo", G=4, ddof=1)
    with pytest.raises(ValueError, match="BRUTE_FORCE_MAX_GROUPS"):
        brute_force_aggregated_gradient("grpo", **{**ok, "G": 30}, mode="token_mean")
    with pytest.raises(ValueError, match="no outcome has reward 1"):
        mean_length_given_reward([1.0], [0.0], [2], reward=1)


# --- question_weights ----------------------------------------------------------------------------
def test_mean_centred_weight_is_the_group_mean_factor_for_every_p():
    ps = np.linspace(0, 1, 11)
    for G in (2, 5, 9):
        np.testing.assert_allclose(question_weight("grpo", G=G, p=ps), (G - 1) / G, atol=1e-14)
        assert group_mean_factor(G) == pytest.approx((G - 1) / G, abs=0)


def test_std_normalised_weight_is_flat_for_g_2_and_3_and_u_shaped_from_4():
    ps = np.linspace(0.01, 0.5, 50)
    for G in (2, 3):
        assert np.ptp(question_weight("grpo_std", G=G, p=ps, ddof=1)) < 1e-12
    for G in (4, 8):
        c = question_weight("grpo_std", G=G, p=ps, ddof=1)
        assert np.all(np.diff(c) < 0)
        np.testing.assert_allclose(c, question_weight("grpo_std", G=G, p=1 - ps, ddof=1),
                                   atol=1e-12)
    # bounded at finite G: the limit p -> 0 is a_S(1) = (G-1)/sqrt(G) (ddof 1)
    assert question_weight("grpo_std", G=8, p=0.0, ddof=1) == pytest.approx(7 / math.sqrt(8))


def test_conditional_advantages_match_the_exact_moments():
    for est, opts in (("grpo_std", {"ddof": 1, "eps": 0.0}), ("rloo", {}), ("grpo", {})):
        for p in (0.13, 0.5):
            m = exact_advantage_moments(est, R=6, p=p, **opts)
            s, f = conditional_advantages(est, G=6, p=p, **opts)
            assert float(s) == pytest.approx(float(m["cond_mean_success"]), abs=1e-13)
            assert float(f) == pytest.approx(float(m["cond_mean_failure"]), abs=1e-13)
    assert question_weight("grpo", G=4, p=np.zeros((2, 3))).shape == (2, 3)


def test_population_weight_hand_checked_and_limits():
    assert float(population_std_question_weight(0.5, eps=0.5)) == pytest.approx(1.0)
    assert np.isinf(population_std_question_weight(0.0))
    big = question_weight("grpo_std", G=1000, p=0.3, ddof=0)
    assert float(big) == pytest.approx(float(population_std_question_weight(0.3)), rel=2e-3)


def test_question_weights_reject_bad_input():
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        question_weight("grpo", G=4, p=1.2)
    with pytest.raises(ValueError, match="R must be >= 2"):
        question_weight("grpo", G=1, p=0.5)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        population_std_question_weight(0.5, eps=-1.0)
    with pytest.raises(TypeError, match="R must be an integer"):
        group_mean_factor(2.5)


# --- surrogate ------------------------------------------------------------------------------------
def test_clipped_surrogate_hand_checked_both_signs():
    # A < 0: rho = 0.5 is clipped to 0.8 -> min(-0.5, -0.8) = -0.8; rho = 1.5 -> min(-1.5, -1.2)
    assert clipped_surrogate([[0.5, 1.5]], [-1.0], [[1, 1]], mode="token_sum") == pytest.approx(
        -0.8 - 1.5)
    # Dr. GRPO's constant: token sum / (G max_tokens)
    assert clipped_surrogate([[1.0, 1.0], [1.0, 1.0]], [1.0, -1.0], [[1, 1], [1, 0]],
                             mode="dr_grpo", max_tokens=4) == pytest.approx((2 - 1) / 8)
    # padding is ignored whatever its ratio
    assert clipped_surrogate([[1.0, 99.0]], [2.0], [[1, 0]], mode="sequence_mean") == 2.0


def test_clipped_surrogate_gradient_at_ratio_one_is_the_weighted_advantage():
    """d/dlog rho of the surrogate at rho = 1 is w_i A_i per token (the clip is inactive)."""
    A = np.array([0.7, -0.3, 1.1])
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], float)
    h = 1e-6
    base = np.ones((3, 3))
    for i in range(3):
        for t in range(int(mask[i].sum())):
            up, dn = base.copy(), base.copy()
            up[i, t] += h
            dn[i, t] -= h
            d = (clipped_surrogate(up, A, mask) - clipped_surrogate(dn, A, mask)) / (2 * h)
            assert d == pytest.approx(A[i] / (3 * mask[i].sum()), abs=1e-8)


def test_clipped_surrogate_rejects_bad_input():
    with pytest.raises(ValueError, match="mask must hold 0/1"):
        clipped_surrogate([[1.0]], [1.0], [[2]])
    with pytest.raises(ValueError, match="> 0 on the mask"):
        clipped_surrogate([[0.0]], [1.0], [[1]])
    with pytest.raises(ValueError, match="advantages must be finite"):
        clipped_surrogate([[1.0]], [1.0, 2.0], [[1]])
    with pytest.raises(ValueError, match="clip_eps must be < 1"):
        clipped_surrogate([[1.0]], [1.0], [[1]], clip_eps=1.0)
    with pytest.raises(ValueError, match="same shape|of one shape"):
        clipped_surrogate([[1.0, 1.0]], [1.0], [[1]])
