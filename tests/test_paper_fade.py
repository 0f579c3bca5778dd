"""sims.fade_dynamics: tiny hand-checked cases, exact identities and one seeded statistical check
(|estimate - exact| <= 4 SE)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sims._stats import Z_THRESHOLD as K_SE  # the one k of the statistical tier
from sims.bandit import SoftmaxBandit
from sims.fade_dynamics import (
    FadeWorld,
    entropy,
    kish_ess,
    mean_field_trajectory,
    one_step_exact,
    power_alpha_prompt_mass,
    stochastic_bandit_runs,
)
from sims.token_mdp import TokenMDP


def _bandit() -> SoftmaxBandit:
    return SoftmaxBandit(np.array([0.5, 0.0, -0.5]), np.array([0.8, 0.4, 0.1]))


def test_entropy_hand_checked():
    assert entropy(np.ones(4) / 4) == pytest.approx(math.log(4))
    assert entropy(np.array([1.0, 0.0])) == 0.0


def test_kish_ess_hand_checked_and_rejects_bad_weights():
    assert kish_ess(np.ones(3)) == pytest.approx(3.0)
    assert kish_ess(np.array([1.0, 0.0])) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="all weights are zero"):
        kish_ess(np.zeros(2))
    with pytest.raises(ValueError, match=">= 0"):
        kish_ess(np.array([1.0, -1.0]))


def test_power_alpha_prompt_mass_hand_checked():
    # R = 2, p = 1/2, alpha = 1: k = 1 with probability 1/2 and mass 2 * 1 * 1 / 2 = 1
    assert power_alpha_prompt_mass(np.array(0.5), R=2, alpha=1.0) == pytest.approx(0.5)
    # alpha = 2 multiplies the k = 1 mass by (1 - 1/2)
    assert power_alpha_prompt_mass(np.array(0.5), R=2, alpha=2.0) == pytest.approx(0.25)


def test_power_alpha_prompt_mass_matches_grpo_theory_mass():
    from grpo_theory.mass import expected_mass_bernoulli

    ps = np.linspace(0.05, 0.95, 7)
    for a in (1.0, 2.5):
        ms, mf = expected_mass_bernoulli("power_alpha", R=6, p=ps, alpha=a)
        np.testing.assert_allclose(power_alpha_prompt_mass(ps, R=6, alpha=a), ms + mf,
                                   atol=1e-13)


@pytest.mark.parametrize("world", ["bandit", "token_mdp"])
def test_one_step_mean_field_uses_the_exact_expected_gradient(world):
    """E[g_hat] over the enumerated groups equals sims.exact's (the mean-field step) and gives
    E[g] = c grad J with GRPO's c = (R-1)/R."""
    w = _bandit() if world == "bandit" else TokenMDP.random(
        np.random.default_rng(1), vocab=2, length=2, success_fraction=0.5, binary_rewards=True)
    o = one_step_exact(FadeWorld(w), "grpo", R=3, lr=0.5)
    assert o["scale"] == pytest.approx(2 / 3, abs=1e-12)
    assert o["m_S"] == pytest.approx(o["m_F"], abs=1e-12)  # zero-sum


def test_asym_grpo_masses_follow_delta():
    o = one_step_exact(FadeWorld(_bandit()), "asym_grpo", R=4, lr=0.1, opts={"delta": 0.5})
    assert o["m_F"] == pytest.approx(o["m_S"] / 0.5, rel=1e-12)


def test_mean_field_path_is_the_same_for_every_delta():
    """E[g] = c(J) grad J: AsymGRPO(delta) follows GRPO's path (entropy at equal J agrees up to
    the step discretisation, here < 1e-3)."""
    fw = FadeWorld(_bandit())
    curves = []
    for d in (0.5, 2.0):
        c = one_step_exact(fw, "asym_grpo", R=4, lr=1.0, opts={"delta": d})["scale"]
        tr = mean_field_trajectory(fw, "asym_grpo", R=4, lr=0.2 / c, steps=40, opts={"delta": d})
        curves.append(tr)
    j = 0.5 * (curves[0]["J"][0] + min(c["J"][-1] for c in curves))
    h = [np.interp(j, c["J"], c["H"]) for c in curves]
    assert abs(h[0] - h[1]) < 1e-3


def test_stochastic_runs_match_the_exact_one_step_expectation():
    """Seeded: mean J after one sampled step vs the exact E[J(theta')], k = 4 SE."""
    b = _bandit()
    st = stochastic_bandit_runs(b, "grpo", R=4, lr=1.0, steps=1, n_runs=20_000,
                                rng=np.random.default_rng(5))
    exact = one_step_exact(FadeWorld(b), "grpo", R=4, lr=1.0)
    est = st["J"][1].mean() - st["J"][0][0]
    se = st["J"][1].std(ddof=1) / math.sqrt(st["J"].shape[1])
    assert abs(est - exact["dJ"]) <= K_SE * se


def test_fade_dynamics_rejects_bad_arguments():
    fw = FadeWorld(_bandit())
    with pytest.raises(ValueError, match="R >= 2"):
        one_step_exact(fw, "grpo", R=1, lr=1.0)
    with pytest.raises(ValueError, match="steps >= 1"):
        mean_field_trajectory(fw, "grpo", R=4, lr=1.0, steps=0)
    with pytest.raises(ValueError, match="n_runs >= 1"):
        stochastic_bandit_runs(_bandit(), "grpo", R=4, lr=1.0, steps=1, n_runs=0,
                               rng=np.random.default_rng(0))
