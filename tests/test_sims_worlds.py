"""Exact tests of the sims worlds: DP vs brute-force enumeration, finite differences, invariants."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_theory import compute_advantages
from grpo_theory.multiturn import multiturn_advantages
from sims._stats import Z_THRESHOLD
from sims.bandit import SoftmaxBandit
from sims.multiturn import MultiTurnMDP
from sims.token_mdp import TokenMDP

K_SE = Z_THRESHOLD  # statistical tests: |estimate - exact| <= K_SE SE
SEEDS = st.integers(0, 2**31 - 1)


def _fd_grad(J, theta: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros(theta.size)
    for i in range(theta.size):
        t = theta.ravel().copy()
        t[i] += h
        a = J(t.reshape(theta.shape))
        t[i] -= 2 * h
        b = J(t.reshape(theta.shape))
        g[i] = (a - b) / (2 * h)
    return g


# --- bandit -------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(SEEDS, st.integers(2, 6))
def test_bandit_policy_sums_to_one_and_advantages_average_to_zero(seed: int, K: int) -> None:
    rng = np.random.default_rng(seed)
    b = SoftmaxBandit(3 * rng.standard_normal(K), rng.random(K))
    assert b.probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert b.probs @ b.advantage() == pytest.approx(0.0, abs=1e-12)
    assert b.grad_J().sum() == pytest.approx(0.0, abs=1e-12)  # softmax: logits shift-invariant
    assert b.probs @ b.scores() == pytest.approx(np.zeros(K), abs=1e-12)  # E[psi] = 0


def test_bandit_grad_J_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    b = SoftmaxBandit(rng.standard_normal(5), rng.random(5))
    fd = _fd_grad(lambda t: SoftmaxBandit(t, b.arm_means).J(), b.logits)
    np.testing.assert_allclose(b.grad_J(), fd, atol=1e-8)


def test_bandit_sampled_arm_frequencies_match_policy_within_4se() -> None:
    b = SoftmaxBandit(np.array([0.0, 1.0, -1.0, 0.5]), np.array([0.1, 0.4, 0.6, 0.9]))
    arms, rewards = b.sample(50_000, 4, np.random.default_rng(1))
    n = arms.size
    freq = np.bincount(arms.ravel(), minlength=4) / n
    se = np.sqrt(b.probs * (1 - b.probs) / n)
    assert np.all(np.abs(freq - b.probs) <= K_SE * se)
    se_r = np.sqrt(b.reward_variance() / n)
    assert abs(rewards.mean() - b.J()) <= K_SE * se_r


@pytest.mark.parametrize("reward", ["beta", "gaussian"])
def test_bandit_continuous_reward_mean_and_variance_within_4se(reward: str) -> None:
    b = SoftmaxBandit(np.array([0.3, -0.2, 0.0]), np.array([0.2, 0.5, 0.8]), reward=reward)
    _, r = b.sample(40_000, 4, np.random.default_rng(2))
    x = r[:, 0]
    assert abs(x.mean() - b.J()) <= K_SE * x.std() / np.sqrt(x.size)
    c2 = (x - b.J()) ** 2
    assert abs(c2.mean() - b.reward_variance()) <= K_SE * c2.std() / np.sqrt(x.size)


def test_bandit_fast_path_has_the_same_law() -> None:
    b = SoftmaxBandit(np.array([0.0, 1.0, -1.0]), np.array([0.2, 0.5, 0.9]))
    arms, rew = b.sample_bernoulli_fast(40_000, 8, np.random.default_rng(3))
    n = arms.size
    assert abs(rew.mean() - b.J()) <= K_SE * np.sqrt(b.reward_variance() / n)
    freq = np.bincount(arms.ravel(), minlength=3) / n
    assert np.all(np.abs(freq - b.probs) <= K_SE * np.sqrt(b.probs * (1 - b.probs) / n))


def test_bandit_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="arm_means"):
        SoftmaxBandit(np.zeros(3), np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        SoftmaxBandit(np.zeros(2), np.array([0.1, 1.2]))
    with pytest.raises(ValueError, match="finite"):
        SoftmaxBandit(np.array([0.0, np.nan]), np.array([0.1, 0.2]))


# --- token MDP ----------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(SEEDS, st.integers(2, 4), st.integers(1, 4), st.booleans())
def test_token_mdp_dp_values_match_enumeration(seed: int, V: int, T: int, binary: bool) -> None:
    m = TokenMDP.random(
        np.random.default_rng(seed), vocab=V, length=T, binary_rewards=binary, logit_scale=2.0
    )
    v, q = m.values()
    v_e, q_e = m.values_enumeration()
    np.testing.assert_allclose(v, v_e, atol=1e-12)
    np.testing.assert_allclose(q, q_e, atol=1e-12)
    assert m.seq_probs().sum() == pytest.approx(1.0, abs=1e-12)
    assert v[0] == pytest.approx(m.J(), abs=1e-12)
    # sum_a pi(a|s) A(s, a) = 0 in every state
    np.testing.assert_allclose((m.policy * m.advantages()).sum(1), 0.0, atol=1e-12)
    # E[psi] = 0 (score identity, Eq. 6)
    np.testing.assert_allclose(m.seq_probs() @ m.psi(), 0.0, atol=1e-12)


def test_token_mdp_grad_J_matches_finite_differences() -> None:
    m = TokenMDP.random(np.random.default_rng(4), vocab=3, length=3, binary_rewards=False)
    fd = _fd_grad(lambda t: m.with_logits(t).J(), m.logits)
    np.testing.assert_allclose(m.grad_J(), fd, atol=1e-8)


def test_token_mdp_grad_J_equals_policy_gradient_theorem_with_advantages() -> None:
    """Eq. 10: grad J = E[sum_t A(s_t, a_t) grad log pi(a_t|s_t)], by enumeration."""
    m = TokenMDP.random(np.random.default_rng(5), vocab=3, length=3, binary_rewards=False)
    adv = m.advantages()
    pol = m.policy
    P = m.seq_probs()
    g = np.zeros((m.n_states, m.vocab))
    for t in range(m.length):
        s, a = m.state_index[:, t], m.sequences[:, t]
        blk = -pol[s]
        blk[np.arange(s.size), a] += 1.0
        np.add.at(g, s, (P * adv[s, a])[:, None] * blk)
    np.testing.assert_allclose(g.ravel(), m.grad_J(), atol=1e-12)


def test_token_mdp_sampled_sequences_match_exact_probabilities_within_4se() -> None:
    m = TokenMDP.random(np.random.default_rng(6), vocab=2, length=3)
    idx, rew = m.sample(30_000, 4, np.random.default_rng(7))
    n = idx.size
    P = m.seq_probs()
    freq = np.bincount(idx.ravel(), minlength=P.size) / n
    assert np.all(np.abs(freq - P) <= K_SE * np.sqrt(P * (1 - P) / n) + 1e-12)


# --- multi-turn MDP -----------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(SEEDS, st.integers(3, 4), st.integers(1, 3), st.integers(2, 3))
def test_multiturn_dp_matches_bruteforce_enumeration(seed: int, H: int, S: int, A: int) -> None:
    m = MultiTurnMDP.random(np.random.default_rng(seed), H=H, S=S, A=A, logit_scale=1.5)
    v, q = m.values()
    v_e, q_e, reach = m.values_enumeration()
    assert m.trajectories["prob"].sum() == pytest.approx(1.0, abs=1e-12)
    ok = reach > 0
    np.testing.assert_allclose(v[:-1][ok], v_e[ok], atol=1e-12)
    np.testing.assert_allclose(q[ok], q_e[ok], atol=1e-12)
    np.testing.assert_allclose((m.policy * m.advantages()).sum(-1), 0.0, atol=1e-12)
    # law of the total reward count: recursion vs enumeration
    tr = m.trajectories
    cnt = np.bincount(tr["rewards"].sum(1).astype(int), weights=tr["prob"], minlength=H + 1)
    np.testing.assert_allclose(m.total_count_pmf(), cnt, atol=1e-12)


def test_multiturn_grad_J_matches_finite_differences_and_advantage_form() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(8))
    fd = _fd_grad(lambda t: dataclasses.replace(m, logits=t).J(), m.logits)
    np.testing.assert_allclose(m.grad_J(), fd, atol=1e-8)
    np.testing.assert_allclose(m.expected_gradient_true_advantage(), m.grad_J(), atol=1e-12)


def test_multiturn_sampled_returns_match_dp_within_4se() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(9))
    rng = np.random.default_rng(10)
    tot = m.sample(20_000, 2, rng)["stage_rewards"].sum(-1).ravel()
    assert abs(tot.mean() - m.J()) <= K_SE * tot.std() / np.sqrt(tot.size)
    _, q = m.values()
    fut = m.sample_continuation(1, 2, 1, 40_000, rng)
    assert abs(fut.mean() - q[1, 2, 1]) <= K_SE * fut.std() / np.sqrt(fut.size)


@pytest.mark.parametrize("estimator", ["grpo", "grpo_std", "rloo"])
def test_multiturn_conditional_advantage_matches_pairwise_bruteforce(estimator: str) -> None:
    """R = 2: enumerate every PAIR of trajectories and condition on rollout 1's prefix."""
    m = MultiTurnMDP.random(np.random.default_rng(11), H=3, S=2, A=2)
    tr = m.trajectories
    tot = tr["rewards"].sum(1)
    N = tot.size
    rows = np.stack([np.repeat(tot, N), np.tile(tot, N)], axis=1)
    A1 = np.asarray(compute_advantages(estimator, rows))[:, 0].reshape(N, N)
    pA = A1 @ tr["prob"]  # E over rollout 2, for every trajectory of rollout 1
    for pr in m.prefix_table():
        h = pr["h"]
        sel = (
            (tr["states"][:, h] == pr["s"])
            & (tr["actions"][:, h] == pr["a"])
            & (tr["rewards"][:, :h].sum(1) == pr["past_count"])
        )
        brute = (tr["prob"][sel] @ pA[sel]) / tr["prob"][sel].sum()
        exact = m.conditional_advantage(
            estimator, R=2, h=h, s=pr["s"], a=pr["a"], past_count=pr["past_count"]
        )
        assert exact == pytest.approx(brute, abs=1e-12)


def test_multiturn_expected_gradient_matches_pairwise_bruteforce() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(12), H=3, S=2, A=2)
    tr = m.trajectories
    tot = tr["rewards"].sum(1)
    N = tot.size
    psi = m.psi(tr["states"], tr["actions"])
    rows = np.stack([np.repeat(tot, N), np.tile(tot, N)], axis=1)
    A = np.asarray(compute_advantages("grpo_std", rows)).reshape(N, N, 2)
    w = tr["prob"][:, None] * tr["prob"][None, :]
    # g_hat = (A_1 psi_1 + A_2 psi_2) / 2 over all pairs
    g = np.einsum("ij,ij,id->d", w, A[..., 0], psi) + np.einsum("ij,ij,jd->d", w, A[..., 1], psi)
    np.testing.assert_allclose(m.expected_gradient("grpo_std", R=2), g / 2, atol=1e-12)


def test_multiturn_eq22_advantages_equal_grpo_theory_multiturn() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(13))
    sr = m.sample(50, 4, np.random.default_rng(14))["stage_rewards"]
    ref = multiturn_advantages(sr, mode="total_minus_group_mean")
    ours = np.asarray(compute_advantages("grpo", sr.sum(-1)))
    np.testing.assert_allclose(ref, np.repeat(ours[..., None], sr.shape[-1], axis=-1), atol=1e-12)
    ref_loo = multiturn_advantages(sr, mode="total_minus_group_mean", baseline="leave_one_out")
    ours_loo = np.asarray(compute_advantages("rloo", sr.sum(-1)))
    np.testing.assert_allclose(ref_loo[..., 0], ours_loo, atol=1e-12)


def test_multiturn_rejects_bad_transitions() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(0))
    bad = m.transitions.copy()
    bad[0, 0, 0] *= 2
    with pytest.raises(ValueError, match="probability distribution"):
        dataclasses.replace(m, transitions=bad)


def test_trajectory_enumeration_count() -> None:
    m = MultiTurnMDP.random(np.random.default_rng(0), H=3, S=3, A=2)
    H, S, A = m.shape
    expected = sum(1 for c in itertools.product(range(S), repeat=H) if c[0] == 0) * (2 * A) ** H
    assert m.trajectories["prob"].size == expected


@pytest.mark.parametrize(
    "mode",
    ["total_minus_group_mean", "reward_to_go_minus_stage_mean", "reward_to_go_minus_group_mean"],
)
def test_stagewise_expected_gradient_matches_pairwise_bruteforce(mode: str) -> None:
    from sims.checks import multiturn_mode_coefficients

    m = MultiTurnMDP.random(np.random.default_rng(15), H=3, S=2, A=2)
    H, S, A = m.shape
    tr = m.trajectories
    N = tr["prob"].size
    r = tr["rewards"]
    blocks = m.psi(tr["states"], tr["actions"]).reshape(N, H, S * A)
    pairs = np.stack([np.repeat(r, N, axis=0), np.tile(r, (N, 1))], axis=1)  # [N*N, 2, H]
    adv = np.asarray(multiturn_advantages(pairs, mode=mode)).reshape(N, N, 2, H)
    w = tr["prob"][:, None] * tr["prob"][None, :]
    g1 = np.einsum("ij,ijh,ihd->hd", w, adv[:, :, 0], blocks)
    g2 = np.einsum("ij,ijh,jhd->hd", w, adv[:, :, 1], blocks)
    brute = ((g1 + g2) / 2).reshape(-1)
    coef = multiturn_mode_coefficients(mode, R=2, H=H)
    np.testing.assert_allclose(m.expected_gradient_stagewise(coef), brute, atol=1e-12)
