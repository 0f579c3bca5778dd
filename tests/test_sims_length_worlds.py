"""sims.length_worlds, sims.question_mix, sims.length_dynamics: hand-checked cases, exact
identities (scores, finite differences), and seeded statistical checks (|est - exact| <= 4 SE)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sims._stats import Z_THRESHOLD as K_SE
from sims.length_dynamics import (
    LOSSES,
    LossSpec,
    expected_update,
    flow,
    length_summary,
    sampled_gradients,
    true_gradient,
)
from sims.length_worlds import AnswerLengthMDP, ResponseBandit
from sims.question_mix import QuestionMix


def _mdp(shared: bool = False, seed: int = 0) -> AnswerLengthMDP:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((1 if shared else 3, 4)) - 0.5
    return AnswerLengthMDP(rng.standard_normal(3), z, np.array([1.0, 0.0, 0.5]),
                           shared_stop=shared)


def _fd(world, h: float = 1e-6) -> np.ndarray:
    th = world.theta
    return np.array([(world.with_theta(th + h * e).J() - world.with_theta(th - h * e).J()) / (2 * h)
                     for e in np.eye(th.size)])


def test_answer_mdp_hand_checked_lengths_and_probabilities():
    # stop logits +-50: answer 0 always stops at once (L = 2), answer 1 never (L = N + 2 = 5)
    m = AnswerLengthMDP(np.zeros(2), np.array([[50.0] * 3, [-50.0] * 3]), np.array([1.0, 0.0]))
    np.testing.assert_allclose(m.mean_length_given_answer(), [2.0, 5.0], atol=1e-12)
    assert m.max_length == 5 and m.lengths.tolist() == [2, 3, 4, 5, 2, 3, 4, 5]
    s = length_summary(m)
    assert s["mean_length_correct"] == pytest.approx(2.0) and s["J"] == pytest.approx(0.5)


@pytest.mark.parametrize("shared", [False, True])
def test_answer_mdp_exact_quantities(shared):
    m = _mdp(shared)
    p, mu, psi = m.outcome_model()
    assert p.sum() == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(psi, m.token_structure[0].sum(1), atol=1e-14)
    np.testing.assert_allclose(p @ psi, 0.0, atol=1e-14)  # a score has mean 0
    np.testing.assert_allclose(m.grad_J(), _fd(m), atol=1e-8)
    tok, mask = m.token_probs()
    np.testing.assert_allclose(np.prod(np.where(mask == 1, tok, 1.0), axis=1), p, atol=1e-14)
    np.testing.assert_array_equal(mask.sum(1), m.lengths)
    assert m.with_theta(m.theta).theta.tolist() == m.theta.tolist()
    np.testing.assert_allclose(m.grad_J()[m.K:], 0.0, atol=1e-15)  # J ignores the stop logits
    v = m.state_values()
    assert v[0] == pytest.approx(m.J()) and v.shape == (m.n_states,)


def test_response_bandit_exact_quantities_and_validation():
    b = ResponseBandit(np.array([0.2, -0.1, 0.4]), np.array([1, 5, 3]), np.array([1.0, 0.0, 0.3]))
    np.testing.assert_allclose(b.grad_J(), _fd(b), atol=1e-9)
    assert b.max_length == 5
    with pytest.raises(ValueError, match="integers >= 1"):
        ResponseBandit(np.zeros(2), np.array([0, 2]), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="answer_logits and answer_means"):
        AnswerLengthMDP(np.zeros(1), np.zeros((1, 2)), np.zeros(1))
    with pytest.raises(ValueError, match=r"stop_logits must be \[1, N\]"):
        AnswerLengthMDP(np.zeros(2), np.zeros((2, 2)), np.zeros(2), shared_stop=True)
    with pytest.raises(ValueError, match="theta must be shaped"):
        _mdp().with_theta(np.zeros(3))


def test_sampling_follows_the_exact_response_law():
    """Seeded: the sampled mean length is within 4 SE of the exact E[L]."""
    m = _mdp()
    idx, rew = m.sample(5000, 4, np.random.default_rng(7))
    L = m.lengths[idx].ravel().astype(float)
    exact = float(m.probs() @ m.lengths)
    assert abs(L.mean() - exact) <= K_SE * L.std(ddof=1) / math.sqrt(L.size)
    r = rew.ravel()
    assert abs(r.mean() - m.J()) <= K_SE * r.std(ddof=1) / math.sqrt(r.size)


def _mix() -> QuestionMix:
    return QuestionMix((_mdp(seed=1), _mdp(seed=2)), np.array([0.3, 0.7]))


def test_question_mix_exact_quantities_and_blocks():
    q = _mix()
    np.testing.assert_allclose(q.grad_J(), _fd(q), atol=1e-8)
    p, mu, psi = q.outcome_model()
    assert p.sum() == pytest.approx(1.0) and psi.shape == (len(q.lengths), q.theta.size)
    assert (p * mu).sum() == pytest.approx(q.J())
    g = expected_update(q, "grpo", G=4)
    d0 = q.worlds[0].theta.size
    np.testing.assert_allclose(g[:d0], 0.3 * expected_update(q.worlds[0], "grpo", G=4),
                               atol=1e-15)
    with pytest.raises(ValueError, match="distribution"):
        QuestionMix((_mdp(),), np.array([0.5]))


@pytest.mark.parametrize("loss", ["dr_grpo", "dr_grpo_sum"])
def test_constant_normaliser_update_is_group_mean_factor_times_grad_j(loss):
    for w in (_mdp(), _mix()):
        const = w.max_length if LOSSES[loss].mode == "dr_grpo" else 1
        np.testing.assert_allclose(expected_update(w, loss, G=5),
                                   (4 / 5) / const * true_gradient(w), atol=1e-14)


@pytest.mark.parametrize("loss", ["grpo", "mean_token_mean"])
def test_sampled_groups_average_to_the_exact_update(loss):
    """Seeded statistical tier (k = 4): the projection of the mean sampled g on the exact E[g]."""
    w = _mix()
    ex = expected_update(w, loss, G=4)
    u = ex / np.linalg.norm(ex)
    x = sampled_gradients(w, loss, G=4, n_groups=6000, rng=np.random.default_rng(11)) @ u
    assert abs(x.mean() - ex @ u) <= K_SE * x.std(ddof=1) / math.sqrt(x.size)


def test_flow_lengthens_incorrect_responses_under_grpo_only():
    m = _mdp()
    g = flow(m, "grpo", G=4, lr=2.0, steps=20)
    d = flow(m, "dr_grpo", G=4, lr=2.0, steps=20)
    per = [m.with_theta(t).mean_length_given_answer() for t in g["theta"][[0, -1]]]
    assert per[1][1] > per[0][1] and per[1][0] < per[0][0]  # wrong answer longer, correct shorter
    per_d = [m.with_theta(t).mean_length_given_answer() for t in d["theta"][[0, -1]]]
    np.testing.assert_allclose(per_d[0], per_d[1], atol=1e-12)
    assert g["J"].shape == (21,) and g["theta"].shape == (21, m.theta.size)


def test_length_dynamics_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown loss"):
        expected_update(_mdp(), "ppo", G=4)
    with pytest.raises(ValueError, match="steps must be"):
        flow(_mdp(), "grpo", G=4, lr=1.0, steps=0)
    with pytest.raises(ValueError, match="lr must be > 0"):
        flow(_mdp(), None, G=4, lr=-1.0, steps=1)
    spec = LossSpec("grpo_std", "token_mean", {"ddof": 1})
    assert spec.max_tokens(_mdp()) is None and dict(spec.options) == {"ddof": 1}
