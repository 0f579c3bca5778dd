"""Aggregation weights (vs torch autograd of the framework losses), masses and multi-turn forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from framework_refs import reference_loss
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import grpo_theory as gt
from grpo_theory import (
    aggregation_weights,
    compute_advantages,
    effective_weights,
    gradient_mass,
    multiturn_advantages,
    past_rewards,
    reward_to_go,
)
from grpo_theory.conventions import TRL_LOSS_TYPES

# (our mode, framework, framework mode): TRL's loss types with PPO's clipped ratio from the one
# table (grpo_theory.conventions.TRL_LOSS_TYPES; the policy losses are checked against TRL's own
# code in tests/test_framework_checks_equivalence.py), verl's loss_agg_mode values here
LOSS_MAP = [
    *((lt.aggregation, "trl", name) for name, lt in TRL_LOSS_TYPES.items() if lt.aggregation),
    ("token_mean", "verl", "token-mean"),
    ("sequence_mean", "verl", "seq-mean-token-mean"),
    ("sequence_sum", "verl", "seq-mean-token-sum"),
    ("dr_grpo", "verl", "seq-mean-token-sum-norm"),
    ("token_sum", "verl", "token-sum"),
]


@pytest.mark.parametrize(("mode", "framework", "fmode"), LOSS_MAP)
def test_aggregation_weights_reproduce_framework_loss_gradient(
    mode: str, framework: str, fmode: str
) -> None:
    # Equivalence: grad of the framework's reduced loss of l_it = -A_i <theta, g_it> equals
    # -sum_i w_i A_i psi_i with psi_i = sum_t g_it (Eq. 18) and our weights w_i.
    rng = np.random.default_rng(1)
    P, R, T, d = 3, 4, 7, 5
    lengths = rng.integers(1, T + 1, size=(P, R))
    lengths[0, 0] = T
    mask = (np.arange(T)[None, None, :] < lengths[:, :, None]).astype(float)
    g = rng.standard_normal((P, R, T, d))
    A = np.asarray(
        compute_advantages(
            "grpo", rng.integers(0, 2, (P, R)).astype(float) + 0.1 * rng.random((P, R))
        )
    )
    theta = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    gt = torch.tensor(g.reshape(P * R, T, d))
    per_tok = -torch.tensor(A.reshape(-1, 1)) * (gt @ theta)
    loss = reference_loss(
        per_tok, torch.tensor(mask.reshape(P * R, T)), framework=framework, mode=fmode, max_tokens=T
    )
    loss.backward()
    psi = (g * mask[..., None]).sum(axis=2)  # [P, R, d]
    w = aggregation_weights(lengths, mode=mode, max_tokens=T if mode == "dr_grpo" else None)
    ours = -(w[..., None] * A[..., None] * psi).sum(axis=(0, 1))
    # verl's seq-mean-token-mean divides by (L_i + 1e-8): a relative difference <= 1e-8 / L_i
    rtol = 2e-8 if fmode == "seq-mean-token-mean" else 1e-10
    np.testing.assert_allclose(theta.grad.numpy(), ours, rtol=rtol, atol=1e-12)


def test_verl_seq_mean_token_sum_norm_is_dr_grpo_with_max_tokens_loss_scale_factor() -> None:
    # verl 0.9.1 agg_loss: sum / global_batch_size / loss_scale_factor = TRL's dr_grpo with
    # max_tokens = loss_scale_factor (no empty completions); not dr_grpo * P R (older verl).
    rng = np.random.default_rng(2)
    P, R, T = 2, 3, 6
    lengths = rng.integers(1, T + 1, size=(P, R))
    x = torch.tensor(rng.standard_normal((P * R, T)))
    mask = torch.tensor((np.arange(T)[None, :] < lengths.reshape(-1, 1)).astype(float))
    a = reference_loss(x, mask, framework="verl", mode="seq-mean-token-sum-norm", max_tokens=T)
    b = reference_loss(x, mask, framework="trl", mode="dr_grpo", max_tokens=T)
    assert float(a) == pytest.approx(float(b), rel=1e-12)


def test_aggregation_bad_input() -> None:
    with pytest.raises(ValueError, match="needs max_tokens"):
        aggregation_weights([[1, 2]], mode="dr_grpo")
    with pytest.raises(ValueError, match="smaller than the longest"):
        aggregation_weights([[1, 9]], mode="dr_grpo", max_tokens=4)
    with pytest.raises(ValueError, match="only used by mode='dr_grpo'"):
        aggregation_weights([[1, 2]], mode="token_mean", max_tokens=4)
    with pytest.raises(ValueError, match="non-negative integers"):
        aggregation_weights([[1.5, 2]], mode="token_mean")
    with pytest.raises(ValueError, match="no completion tokens"):
        aggregation_weights([[0, 0]], mode="token_mean")
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregation_weights([[1, 2]], mode="mean")
    with pytest.raises(ValueError, match="does not match"):
        effective_weights([[1.0, 2.0, 3.0]], [[1, 2]], mode="token_mean")
    assert aggregation_weights([[0, 2]], mode="sequence_mean").tolist() == [[0.0, 0.25]]


@pytest.mark.parametrize(
    ("bad", "err", "match"),
    [
        ([1, 2], ValueError, r"lengths must be 2-D \[num_prompts, group_size\], got shape \(2,\)"),
        ([[]], ValueError, r"lengths has an empty axis: shape \(1, 0\)"),
        ([[float("nan"), 2]], ValueError, r"lengths contains a non-finite value \(nan\)"),
        ([[1.5, 2]], ValueError, r"lengths must be non-negative integers \(completion token"),
        ([[-1, 2]], ValueError, r"lengths must be non-negative integers"),
        ([[1 + 1j, 2]], TypeError, "lengths must be real"),
        ([["a", "b"]], TypeError, "lengths must be numeric array-like"),
        ([[1, 2, 3]], ValueError,
         r"lengths shape \(1, 3\) does not match (rewards|advantages) shape \(1, 2\)"),
    ],
)
def test_one_lengths_validator_gives_the_same_error_everywhere(bad, err, match) -> None:
    from grpo_theory import whiten
    from grpo_theory._validate import check_lengths

    calls = [lambda: check_lengths(bad, shape=(1, 2)),
             lambda: compute_advantages("opo", [[1.0, 0.0]], lengths=bad),
             lambda: whiten([[1.0, 0.0]], lengths=bad)]
    if "does not match" not in match:  # aggregation has no rewards to match
        calls.append(lambda: aggregation_weights(bad, mode="token_mean"))
    msgs = set()
    for call in calls:
        with pytest.raises(err, match=match) as info:
            call()
        msgs.add(str(info.value).replace("advantages shape", "rewards shape"))
    assert len(msgs) == 1, msgs


def test_check_lengths_accepts_integer_tensors_and_returns_float64() -> None:
    from grpo_theory._validate import check_lengths

    out = check_lengths(torch.tensor([[0, 3]]), shape=(1, 2))
    assert out.dtype == np.float64 and out.tolist() == [[0.0, 3.0]]


# --- mass ----------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    st.tuples(st.integers(1, 4), st.integers(2, 8)).flatmap(
        lambda s: arrays(np.float64, s, elements=st.sampled_from([0.0, 1.0]))
    )
)
def test_gradient_mass_balance_rules(r: np.ndarray) -> None:
    for name in ("grpo", "rloo", "grpo_std"):
        ms, mf = gradient_mass(compute_advantages(name, r), r)
        np.testing.assert_allclose(ms, mf, atol=1e-12)
    ms, mf = gradient_mass(compute_advantages("asym_grpo", r, delta=0.25), r)
    np.testing.assert_allclose(mf, 4 * ms, rtol=1e-12, atol=1e-12)
    ms, mf = gradient_mass(compute_advantages("reinforce", r), r)
    assert np.all(mf == 0) and np.allclose(ms, r.sum(axis=1))


def test_gradient_mass_bad_input() -> None:
    with pytest.raises(ValueError, match="binary"):
        gradient_mass([[0.5, -0.5]], [[0.7, 0.2]])
    ms, mf = gradient_mass([[0.5, -0.5]], [[0.7, 0.2]], success_threshold=0.5)
    assert ms.tolist() == [0.5] and mf.tolist() == [0.5]
    with pytest.raises(ValueError, match="does not match"):
        gradient_mass([[0.5, -0.5, 0.0]], [[1.0, 0.0]])


# --- multi-turn --------------------------------------------------------------------------------
def stage_rewards() -> st.SearchStrategy[np.ndarray]:
    shapes = st.tuples(st.integers(1, 3), st.integers(2, 6), st.integers(1, 5))
    return shapes.flatmap(lambda s: arrays(np.float64, s, elements=st.integers(-3, 3).map(float)))


@settings(max_examples=40, deadline=None)
@given(stage_rewards())
def test_multiturn_identities(r: np.ndarray) -> None:
    g = r.sum(axis=2)
    eq22 = multiturn_advantages(r)
    # Eq. 22 is the same at every stage and equals single-turn GRPO on the total return
    np.testing.assert_allclose(
        eq22, np.repeat(np.asarray(compute_advantages("grpo", g))[..., None], r.shape[2], 2)
    )
    loo = multiturn_advantages(r, baseline="leave_one_out")
    np.testing.assert_allclose(loo[..., 0], np.asarray(compute_advantages("rloo", g)))
    rtg_g = multiturn_advantages(r, mode="reward_to_go_minus_group_mean")
    # Eq. 22 minus the reward-to-go form is exactly the past reward (Eq. 23's leakage term)
    np.testing.assert_allclose(eq22 - rtg_g, past_rewards(r), atol=1e-12)
    rtg_s = multiturn_advantages(r, mode="reward_to_go_minus_stage_mean")
    np.testing.assert_allclose(rtg_s.sum(axis=1), 0.0, atol=1e-9)  # zero-sum at every stage
    np.testing.assert_allclose(rtg_s[..., 0], eq22[..., 0], atol=1e-12)  # stage 1 coincide
    np.testing.assert_allclose(reward_to_go(r)[..., 0], g)
    t = multiturn_advantages(torch.tensor(r), mode="reward_to_go_minus_stage_mean")
    np.testing.assert_allclose(t.numpy(), rtg_s, atol=1e-12)


def test_multiturn_bad_input() -> None:
    with pytest.raises(ValueError, match="3-D"):
        multiturn_advantages(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="group_size >= 2"):
        multiturn_advantages(np.zeros((2, 1, 3)))
    with pytest.raises(ValueError, match="unknown multi-turn mode"):
        multiturn_advantages(np.zeros((1, 2, 3)), mode="gae")
    with pytest.raises(ValueError, match="non-finite"):
        multiturn_advantages(np.full((1, 2, 2), np.nan))


def test_plot_expected_mass_draws_on_given_axes() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sims.plots import plot_expected_mass

    fig, ax = plt.subplots()
    p, ms, mf = plot_expected_mass(ax, "asym_grpo", R=8, delta=0.5)
    assert len(ax.lines) == 2
    np.testing.assert_allclose(mf, 2 * ms, rtol=1e-12, atol=1e-15)
    plt.close(fig)


# --- tiny exact cases (rlax style): fixed input, hand-checked output ---------------------------
def test_gradient_mass_tiny_exact_case() -> None:
    from grpo_theory import gradient_mass

    # grpo on [1, 0, 0, 0]: A = [3/4, -1/4, -1/4, -1/4]: m_S = 3/4, m_F = 3 * 1/4 = 3/4;
    # asym delta = 1/2: A = [3/4, -1/2, -1/2, -1/2]: m_F = 3/2 = m_S / delta
    m_s, m_f = gradient_mass([[0.75, -0.25, -0.25, -0.25], [0.75, -0.5, -0.5, -0.5]],
                             [[1, 0, 0, 0], [1, 0, 0, 0]])
    assert m_s.tolist() == [0.75, 0.75] and m_f.tolist() == [0.75, 1.5]


def test_expected_mass_bernoulli_rloo_tiny_exact_case() -> None:
    import sympy as sp

    from grpo_theory import expected_mass_bernoulli

    # rloo, R = 2, p = 1/2: only k = 1 (prob 1/2) has both kinds: a_S(1) = 2 (1/2) = 1,
    # a_F(1) = 2 (-1/2) = -1; k = 0, 2 give 0. E m_S = 1/2 * 1 * 1, E m_F = 1/2 * 1 * 1.
    half = sp.Rational(1, 2)
    assert expected_mass_bernoulli("rloo", R=2, p=half) == (half, half)
    assert expected_mass_bernoulli("rloo", R=2, p=0.5) == (0.5, 0.5)


def test_aggregation_weights_and_effective_weights_tiny_exact_case() -> None:
    from grpo_theory import aggregation_weights, effective_weights

    # lengths [[1, 3]]: sequence_sum 1/(P R) = 1/2 each; token_mean 1/(1+3) = 1/4 each;
    # sequence_mean 1/(P R L_i) = [1/2, 1/6]; dr_grpo(max 4) 1/(1*2*4) = 1/8
    L = [[1, 3]]
    assert aggregation_weights(L, mode="sequence_sum").tolist() == [[0.5, 0.5]]
    assert aggregation_weights(L, mode="token_mean").tolist() == [[0.25, 0.25]]
    assert aggregation_weights(L, mode="dr_grpo", max_tokens=4).tolist() == [[0.125, 0.125]]
    # effective weights w_i A_i with A = [1/2, -1/2], token_mean: [1/8, -1/8]
    assert effective_weights([[0.5, -0.5]], L, mode="token_mean").tolist() == [[0.125, -0.125]]


def test_multiturn_past_rewards_and_reward_to_go_tiny_exact_case() -> None:
    from grpo_theory import past_rewards, reward_to_go

    # stage rewards [1, 0, 2]: past sums [0, 1, 1]; reward-to-go [3, 2, 2]
    assert past_rewards([[[1.0, 0.0, 2.0]]]).tolist() == [[[0.0, 1.0, 1.0]]]
    assert reward_to_go([[[1.0, 0.0, 2.0]]]).tolist() == [[[3.0, 2.0, 2.0]]]


# --- bad options and extreme rewards -------------------------------------------------------------
NAN = float("nan")


def test_aggregation_and_mass_options_must_be_finite() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        gt.aggregation_weights(np.array([[3, 4]]), mode="dr_grpo", max_tokens=NAN)
    with pytest.raises(ValueError, match="success_threshold"):
        gt.gradient_mass(np.array([[0.5, -0.5]]), np.array([[1.0, 0.0]]), success_threshold=NAN)


def test_multiturn_huge_rewards_scaled_or_refused() -> None:
    x = np.array([[[1.7e308], [1.7e308], [0.0]]])
    A = np.asarray(gt.multiturn_advantages(x))
    np.testing.assert_allclose(A, np.asarray(gt.multiturn_advantages(x / 1e300)) * 1e300)
    two = np.array([[[1.7e308, 1.7e308], [0.0, 0.0]]])  # a return of 3.4e308, advantages +-1.7e308
    A2 = np.asarray(gt.multiturn_advantages(two))
    np.testing.assert_allclose(A2, np.asarray(gt.multiturn_advantages(two / 1e300)) * 1e300)
    with pytest.raises(ValueError, match="overflow"):  # A_1 = 3.4e308 - 1.13e308: not a float
        gt.multiturn_advantages(np.array([[[1.7e308, 1.7e308], [0.0, 0.0], [0.0, 0.0]]]))
