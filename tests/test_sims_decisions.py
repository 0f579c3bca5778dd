"""The Monte Carlo decision rule of :mod:`sims` (k = 4 throughout, as everywhere): exact standard
errors, the exact count rule for rare classes of groups, and planted errors that must still fail.

The rare case is the one that made ``grpo-audit sims moments`` (full size, seed 0) exit 1:
``grpo_passk`` at R = 16 in the moments bandit (J = 0.652) has a nonzero advantage only in groups
with exactly one success, probability 1.38e-6 per group: 0.28 expected in 200 000 groups.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import binom

from sims import checks
from sims._stats import FiniteLaw
from sims.experiments import _bandit
from sims.results import RARE_COUNT, RareCount, law_check, make_check, rare_count_pvalues

K = 4.0  # the stated threshold (sims.results.DEFAULT_K)
ALPHA = math.erfc(K / math.sqrt(2))  # the level of |z| <= 4 for a normal estimate


class _Planted:
    """A world whose sampler is replaced (a planted error or a forced rare outcome), everything
    else (J, the exact values) the original world's."""

    def __init__(self, world: Any, sample: Any) -> None:
        self._world, self._sample = world, sample

    def __getattr__(self, name: str) -> Any:
        return getattr(self._world, name)

    def sample(self, n: int, R: int, rng: np.random.Generator) -> Any:
        return self._sample(n, R, rng)


def _with_one_success_groups(world: Any, how_many: int) -> _Planted:
    """The world's own sampler, with the first ``how_many`` groups replaced by groups with exactly
    one success (arms drawn by the world, the success on arm-consistent rollout 0)."""

    def sample(n: int, R: int, rng: np.random.Generator) -> Any:
        arms, rewards = world.sample(n, R, rng)
        rewards = rewards.copy()
        rewards[:how_many] = 0.0
        rewards[:how_many, 0] = 1.0
        return arms, rewards

    return _Planted(world, sample)


def _by_name(res: list[Any], prefix: str) -> Any:
    (hit,) = [r for r in res if r.name.startswith(prefix)]
    return hit


# --- the rule itself ---------------------------------------------------------------------------
def test_rare_count_pvalues_equal_the_binomial_and_the_brute_force_convolution() -> None:
    for obs, n, q in [(0, 200_000, 1.38e-6), (1, 200_000, 1.38e-6), (7, 1000, 0.01)]:
        lo, hi = rare_count_pvalues(obs, [(n, q)])
        assert lo == pytest.approx(binom.cdf(obs, n, q), rel=1e-12)
        assert hi == pytest.approx(binom.sf(obs - 1, n, q), rel=1e-9, abs=1e-15)
    trials = [(3, 0.2), (5, 0.5), (1, 0.9)]
    pmf = np.array([1.0])
    for n, q in trials:
        pmf = np.convolve(pmf, binom.pmf(np.arange(n + 1), n, q))
    for obs in range(10):
        lo, hi = rare_count_pvalues(obs, trials)
        assert lo == pytest.approx(pmf[: obs + 1].sum(), rel=1e-12)
        assert hi == pytest.approx(pmf[obs:].sum(), rel=1e-9, abs=1e-15)


def test_rare_rule_accepts_three_groups_that_the_normal_rule_calls_a_5_sigma_failure() -> None:
    n, q, y = 200_000, 1.38e-6, 1.0
    law = FiniteLaw.of([0.0, y], [1 - q, q])
    three = np.zeros(n)
    three[:3] = y  # P(N >= 3) = 0.0029 when 0.28 are expected: no evidence of an error
    chk = law_check("rare", three, law=law, exact=q * y)
    assert chk.z == pytest.approx((3 - n * q) / math.sqrt(n * q * (1 - q)), rel=1e-6)
    assert abs(chk.z) > 4  # what |z| <= 4 would have said, even with the exact SE
    assert chk.passed and chk.details["rule"].startswith("exact count")
    assert chk.details["rare_expected"] == pytest.approx(n * q)
    none = law_check("rare", np.zeros(n), law=law, exact=q * y)
    assert none.passed and math.isfinite(none.z)  # never z = -inf from a zero sample SE
    many = np.zeros(n)
    many[:6] = y  # 6 groups where 0.28 are expected: P = 2e-8
    assert not law_check("rare", many, law=law, exact=q * y).passed


def test_normal_rule_uses_the_exact_se_and_fails_a_sampler_six_se_off() -> None:
    law = FiniteLaw.of([0.0, 1.0], [0.7, 0.3])
    n = 10_000
    se = law.sd / math.sqrt(n)
    rng = np.random.default_rng(0)
    x = (rng.random(n) < 0.3).astype(float)
    ok = law_check("p", x, law=law, exact=0.3)
    assert ok.passed and ok.se == pytest.approx(se) and ok.details["rule"].startswith("normal")
    shifted = (np.random.default_rng(1).random(n) < 0.3 + 6 * se).astype(float)  # 6 SE off
    bad = law_check("p", shifted, law=law, exact=0.3)
    assert not bad.passed and bad.z > 4


def test_exact_value_off_the_law_mean_fails_and_a_sample_off_the_support_fails() -> None:
    law = FiniteLaw.of([0.0, 1.0], [0.7, 0.3])
    x = np.r_[np.ones(300), np.zeros(700)]
    bad = law_check("p", x, law=law, exact=0.3 + 1e-6)  # within any SE, but not the law's mean
    assert not bad.passed and bad.details["law_matches_exact"] is False
    off = law_check("p", np.r_[x[:-1], 0.5], law=law, exact=0.3)
    assert not off.passed and off.details["samples_off_support"] == 1


def test_a_zero_sample_se_is_an_error_not_an_infinite_z() -> None:
    with pytest.raises(ValueError, match="no yardstick"):
        make_check("s", estimate=0.0, exact=1e-6, se=0.0, n=100, se_from="sample")
    rare = RareCount(0, ((100, 0.001),), "groups")
    ok = make_check("s", estimate=0.0, exact=1e-6, se=1e-6, n=100, rare=rare)
    assert ok.passed and 100 * 0.001 < RARE_COUNT


# --- the grpo_passk case at full size, and planted errors there ---------------------------------
@pytest.fixture(scope="module")
def bandit() -> Any:
    return _bandit()


def test_grpo_passk_r16_theorem41_passes_with_none_or_one_signal_group(bandit: Any) -> None:
    assert bandit.J() == pytest.approx(0.652, abs=5e-4)
    for world in (bandit, _with_one_success_groups(bandit, 1)):
        res = checks.check_theorem41(world, "grpo_passk", R=16, n_groups=200_000,
                                     rng=np.random.default_rng(0))
        assert all(r.passed for r in res), [(r.name, r.z, r.details) for r in res if not r.passed]
        for name in ("thm4.1(i)", "thm4.1(ii)", "thm4.1(iv)"):
            r = _by_name(res, name)
            assert r.details["rule"].startswith("exact count") and math.isfinite(r.z)
            assert r.details["rare_expected"] == pytest.approx(0.276, rel=0.01)


def test_grpo_passk_r16_planted_errors_fail(bandit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a) too many signal groups for the exact law: 8 where 0.28 are expected
    res = checks.check_theorem41(_with_one_success_groups(bandit, 8), "grpo_passk", R=16,
                                 n_groups=200_000, rng=np.random.default_rng(0))
    for name in ("thm4.1(i)", "thm4.1(ii)", "thm4.1(iv)"):
        r = _by_name(res, name)
        assert not r.passed and r.details["rare_p_high"] < ALPHA / 2
    # (b) a biased sampler: rewards drawn at p = 0.5 while the exact values use J = 0.652
    def half(n: int, R: int, rng: np.random.Generator) -> Any:
        return np.zeros((n, R), dtype=np.int64), (rng.random((n, R)) < 0.5).astype(float)

    res = checks.check_theorem41(_Planted(bandit, half), "grpo_passk", R=16, n_groups=200_000,
                                 rng=np.random.default_rng(0))
    assert not _by_name(res, "thm4.1(ii)").passed
    # (c) a wrong exact value: the variance 10 % off (far inside the rare case's noise)
    from sims import exact

    true = exact.bernoulli_advantage_moments

    def wrong(*a: Any, **kw: Any) -> dict[str, float]:
        return {**true(*a, **kw), "var": 1.1 * true(*a, **kw)["var"]}

    monkeypatch.setattr(checks, "bernoulli_advantage_moments", wrong)
    res = checks.check_theorem41(bandit, "grpo_passk", R=16, n_groups=200_000,
                                 rng=np.random.default_rng(0))
    r = _by_name(res, "thm4.1(ii)")
    assert not r.passed and r.details["law_matches_exact"] is False


def test_grpo_passk_r16_unbiasedness_rare_rule_and_planted_error(bandit: Any) -> None:
    res = checks.check_unbiasedness(_with_one_success_groups(bandit, 1), "grpo_passk", R=16,
                                    n_groups=100_000, rng=np.random.default_rng(0))
    assert res and all(r.passed for r in res), [r.name for r in res if not r.passed]
    assert not any("cosine" in r.name for r in res)  # no measurable direction: not checked
    ratio = _by_name(res, "E[g_hat] ratio")
    assert ratio.details["rule"].startswith("exact count") and ratio.details["rare_observed"] == 1
    res = checks.check_unbiasedness(_with_one_success_groups(bandit, 6), "grpo_passk", R=16,
                                    n_groups=100_000, rng=np.random.default_rng(0))
    assert not _by_name(res, "E[g_hat] ratio").passed


def test_normal_regime_planted_biased_sampler_fails_theorem41(bandit: Any) -> None:
    """grpo at R = 4 (no rare class): a sampler 0.05 off in p moves Var(A_i) by ~8 exact SEs."""
    from sims.bandit import SoftmaxBandit

    good = checks.check_theorem41(bandit, "grpo", R=4, n_groups=20_000,
                                  rng=np.random.default_rng(1))
    assert all(r.passed for r in good)
    assert _by_name(good, "thm4.1(ii)").details["rule"].startswith("normal")
    shifted = SoftmaxBandit(bandit.logits, np.clip(bandit.arm_means + 0.05, 0, 1))
    res = checks.check_theorem41(_Planted(bandit, shifted.sample), "grpo", R=4, n_groups=20_000,
                                 rng=np.random.default_rng(1))
    r = _by_name(res, "thm4.1(ii)")
    assert not r.passed and abs(r.z) > 4 and r.details["law_matches_exact"] is True
