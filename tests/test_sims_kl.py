"""sims.kl_dynamics and sims.sequence_ratio: the KL worlds against sims' own worlds, finite
differences, where the expected flows end, the sampled dynamics exact against seeded Monte Carlo
and the sequence-ratio laws against Monte Carlo (|estimate - exact| <= 4 SE)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from sims._stats import Z_THRESHOLD as K_SE
from sims.bandit import SoftmaxBandit
from sims.kl_dynamics import (
    KLOption,
    KLWorld,
    expected_flow,
    finite_difference_targets,
    gibbs_tilt,
    monte_carlo_gradient,
    option_gradient,
    sampled_kl_exact,
    sampled_kl_monte_carlo,
)
from sims.sequence_ratio import (
    NoiseModel,
    clip_probability,
    clipped_weight_moments,
    log_ratio_laws,
    sample_log_ratios,
)
from sims.token_mdp import TokenMDP


def _mdp_world(seed: int = 0) -> KLWorld:
    rng = np.random.default_rng(seed)
    m = TokenMDP.random(rng, vocab=2, length=3, logit_scale=0.8)
    return KLWorld.from_token_mdp(m, 0.8 * rng.standard_normal(m.logits.shape))


def _bandit_world() -> KLWorld:
    return KLWorld.from_bandit(SoftmaxBandit(np.array([0.6, 0.0, -0.4]),
                                             np.array([0.8, 0.4, 0.1])), np.array([0.0, 0.3, 0.2]))


def test_kl_world_enumeration_equals_the_token_mdps():
    rng = np.random.default_rng(1)
    m = TokenMDP.random(rng, vocab=2, length=3)
    w = KLWorld.from_token_mdp(m, m.logits)
    np.testing.assert_allclose(w.probs, m.seq_probs(), atol=1e-15)
    np.testing.assert_allclose(w.scores.sum(1), m.psi(), atol=1e-15)
    np.testing.assert_allclose(w.grad_J(), m.grad_J(), atol=1e-15)
    assert w.kl_values() == (0.0, 0.0)


def test_bandit_world_is_one_token():
    b = SoftmaxBandit(np.array([0.2, -0.1]), np.array([0.3, 0.6]))
    w = KLWorld.from_bandit(b, np.zeros(2))
    np.testing.assert_allclose(w.probs, b.probs)
    np.testing.assert_allclose(w.scores[:, 0, :], b.scores())


def test_world_rejects_mismatched_shapes():
    w = _mdp_world()
    with pytest.raises(ValueError, match="ref_logits"):
        replace(w, ref_logits=np.zeros((2, 2)))


def test_finite_differences_agree_with_every_exact_target():
    w = _mdp_world(2)
    fd = finite_difference_targets(w)
    for name, t in w.targets().items():
        np.testing.assert_allclose(fd[name], t, atol=1e-8, err_msg=name)


def test_monte_carlo_gradient_within_4_se_on_and_off_policy():
    w = _mdp_world(3)
    old = w.logits + 0.3 * np.random.default_rng(9).standard_normal(w.logits.shape)
    for opt in (KLOption("k3", "loss"), KLOption("k1", "reward_to_go", importance="token")):
        for o in (None, old):
            mean, se = monte_carlo_gradient(w, opt, n=20_000, rng=np.random.default_rng(7),
                                            old_logits=o)
            exact = option_gradient(w, opt, old_logits=o)
            ok = se > 0
            z = np.abs(mean - exact)[ok] / se[ok]
            assert z.max() <= K_SE, (opt.name, z.max())  # every coordinate, k = 4
            assert np.all(mean[~ok] == exact[~ok])


def test_the_correct_flow_ends_at_the_gibbs_tilt_and_k3_loss_does_not():
    b = _bandit_world()
    tilt = gibbs_tilt(b, 0.2)
    good = expected_flow(b, KLOption("k1", "reward"), beta=0.2, lr=5.0, steps=150)
    bad = expected_flow(b, KLOption("k3", "loss"), beta=0.2, lr=5.0, steps=150)
    assert np.abs(good["probs"] - tilt).max() < 1e-4
    assert np.abs(bad["probs"] - tilt).max() > 1e-2


def test_sampled_dynamics_exact_against_monte_carlo():
    b = _bandit_world()
    w = replace(b, logits=b.ref_logits.copy(), _cache={})
    opt = KLOption("k1", "loss")
    ex = sampled_kl_exact(w, opt, beta=0.5, lr=1.0, batch=2, steps=2)
    runs = 400
    mc = sampled_kl_monte_carlo(w, opt, beta=0.5, lr=1.0, batch=2, steps=2, runs=runs,
                                rng=np.random.default_rng(11))
    se = ex["reverse_kl_sd"] / math.sqrt(runs)
    assert abs(mc["reverse_kl"][-1] - ex["reverse_kl"]) <= K_SE * se
    # k2 and k3 as losses do not move the policy from the reference (their coefficients are 0)
    assert sampled_kl_exact(w, KLOption("k2", "loss"), beta=0.5, lr=1.0, batch=1,
                            steps=1)["reverse_kl"] == pytest.approx(
        sampled_kl_exact(w, None, beta=0.5, lr=1.0, batch=1, steps=1)["reverse_kl"])


def test_sampled_dynamics_refuse_too_many_branches():
    with pytest.raises(ValueError, match="too many"):
        sampled_kl_exact(_mdp_world(), None, beta=1.0, lr=1.0, batch=4, steps=3)


# --- sequence ratios ------------------------------------------------------------------------------
def test_log_ratio_laws_hand_checked():
    laws = log_ratio_laws(NoiseModel(0.1, 0.01, 100))
    assert laws["token"] == (0.01, 0.1)
    assert laws["sequence_normalised"] == pytest.approx((0.01, 0.01))
    assert laws["sequence"] == pytest.approx((1.0, 1.0))
    with pytest.raises(ValueError, match="length"):
        NoiseModel(0.1, 0.0, 0)


def test_clip_probability_and_partial_moments_against_monte_carlo():
    rng = np.random.default_rng(12)
    m = NoiseModel(0.2, -0.02, 5)
    n = 200_000
    x = sample_log_ratios(m, n=n, rng=rng)
    w = np.exp(x["token"][:, 0])
    p = clip_probability(-0.02, 0.2, eps_low=0.2, eps_high=0.27)
    est = float(np.mean((w < 0.8) | (w > 1.27)))
    assert abs(est - p) <= K_SE * math.sqrt(p * (1 - p) / n)
    mom = clipped_weight_moments(-0.02, 0.2, eps=0.2, sign=1)
    y = w * (w <= 1.2)
    assert abs(y.mean() - mom["clipped_mean"]) <= K_SE * math.sqrt(mom["clipped_var"] / n)
    s = x["sequence_normalised"]
    assert abs(s.var() - 0.2**2 / 5) <= K_SE * (0.2**2 / 5) * math.sqrt(2 / n)
