"""Monte Carlo checks of the seed paper's claims against exact values, as :class:`CheckResult`s.

Every check samples groups in a world of :mod:`sims`, computes advantages with
:func:`grpo_theory.compute_advantages`, and compares the sample estimate with the exact value from
:mod:`sims.exact` / the world's DP, with ``|z| <= k`` (``k = 4`` by default). The paper's
formula for the same quantity is carried as ``paper_value``; bounds (Chebyshev, Hoeffding)
are recorded in ``details`` with ``bound_holds`` computed against the exact tail.

Checks:

* :func:`check_theorem41`: Thm 4.1 (i) zero-sum, (ii) ``Var(A_i)``, (iii) ``Cov(A_i, A_j)``,
  (iv) tails ``P(|A_i| > eps)`` with Chebyshev (Eq. 20); App. A.2 baseline error with Hoeffding.
* :func:`check_unbiasedness`: ``E[g_hat]`` vs ``grad J`` (ratio and cosine, Eq. 15/19) and
  ``E[A_i | outcome_i]`` vs the true advantage (Eq. 13).
* :func:`check_unbiasedness_batch`: the same over a batch of prompts of different difficulty.
* :func:`check_multiturn`, :func:`check_multiturn_modes`, :func:`multiturn_bias_table`
  (defined in :mod:`sims.multiturn_checks`, re-exported here): ``E[A_GRPO(h) | prefix]`` vs
  exact and vs Eq. 26-27, and whether the per-stage bias biases ``E[g_hat]``.
* :func:`check_spectra_limit`: spectral metrics of ``diag(A) Psi`` under the limit Grams.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_theory import binom_pmf, compute_advantages, estimator_spec, spectral_metrics
from grpo_theory.bounds import (
    advantage_tail_event,
    baseline_tail_counts,
    chebyshev_bound,
    exact_baseline_tail_bernoulli,
    hoeffding_bound,
)
from grpo_theory.limits import check_R_limit

from ._stats import FiniteLaw, group_count_law
from ._stats import adv as _adv
from ._stats import jackknife_cosine as _jackknife_cosine
from ._stats import mean_se as _mean_se
from ._stats import var_cov_stats as _var_cov_stats
from .exact import (
    bernoulli_advantage_moments,
    bernoulli_tail,
    cond_advantage_given_reward,
    estimator_options,
    expected_gradient_bernoulli,
    expected_gradient_linear,
    linear_coefficients,
    outcome_advantage_se,
    projection_moments,
)
from .multiturn_checks import (
    check_multiturn,
    check_multiturn_modes,
    multiturn_bias_table,
    multiturn_mode_coefficients,
)
from .results import DEFAULT_K, RARE_COUNT, CheckResult, RareCount, law_check, make_check

__all__ = [
    "check_theorem41",
    "check_tails",
    "check_unbiasedness",
    "check_unbiasedness_batch",
    "check_multiturn",
    "multiturn_bias_table",
    "multiturn_mode_coefficients",
    "check_multiturn_modes",
    "spectra_summary",
    "check_spectra_limit",
    "SPECTRA_R_MAX",
]

def _is_linear(estimator: str) -> bool:
    """True when the registry declares ``estimator`` linear in the rewards."""
    return estimator_spec(estimator).is_linear


def sampled_baseline_tail_event(rewards: np.ndarray, *, eps: float, p: float) -> np.ndarray:
    """``[n]`` bool: ``|v_hat_R - p| > eps`` for each sampled binary group, decided exactly by
    :func:`grpo_theory.bounds.baseline_tail_counts` (the cut points of the exact tail's event)."""
    R = rewards.shape[1]
    counts = np.rint(rewards.sum(axis=1)).astype(np.int64)
    a, b = baseline_tail_counts(R=R, eps=eps, p=p)
    return (counts <= a) | (counts >= b)


def sampled_advantage_tail_event(
    rewards: np.ndarray, *, eps: float, estimator: str, opts: dict[str, Any] | None = None
) -> np.ndarray:
    """``[n, R]`` bool: ``|A_i| > eps`` for each rollout of each sampled binary group, decided
    exactly by :func:`grpo_theory.bounds.advantage_tail_event` (the event of the exact tail
    :func:`sims.exact.bernoulli_tail`), indexed by (own reward, successes among the others).

    Args:
        rewards: ``[n, R]`` binary rewards (0/1).
        eps: threshold, ``>= 0`` (read as its decimal repr, as in the exact tail).
        estimator: registry name with an exact form.
        opts: estimator options (default: the registered ``check_options``).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [n, R], got shape {rewards.shape}")
    if not np.all((rewards == 0.0) | (rewards == 1.0)):
        raise ValueError("rewards must be binary (0/1) for the exact advantage-tail event")
    R = rewards.shape[1]
    mask = advantage_tail_event(
        R=R, eps=eps, estimator=estimator, estimator_options=estimator_options(estimator, opts)
    )
    own = rewards.astype(np.int64)
    others = own.sum(axis=1, keepdims=True) - own
    return mask[own, others]


#: A float ``|A| - eps`` within this of 0 is a tie the float comparison cannot be trusted on.
_TIE_TOL = 1e-9


# --- Theorem 4.1 -------------------------------------------------------------------------------
def check_theorem41(
    world: Any,
    estimator: str,
    *,
    R: int,
    n_groups: int,
    rng: np.random.Generator,
    eps_values: tuple[float, ...] = (0.3,),
    k: float = DEFAULT_K,
    opts: dict[str, Any] | None = None,
) -> list[CheckResult]:
    """Thm 4.1 (i)-(iv) for one estimator in a bandit (or any world with ``sample``/``J``).

    Exact values: enumeration over (own reward, successes among others) for binary rewards
    (:func:`sims.exact.bernoulli_advantage_moments`, any estimator); for continuous rewards only
    linear estimators have exact moments here (``A_1 = a r_1 + b sum_{j!=1} r_j + c``:
    ``Var = sigma^2 (a^2 + (R-1) b^2)``, ``Cov = sigma^2 (2ab + (R-2) b^2)``), and other estimators
    are skipped (no exact value, no verdict).

    Decision (binary rewards): each group's statistic (``sum_i A_i``; ``(1/R) sum_i (A_i - m)^2``
    and ``sum_{i != j} (A_i - m)(A_j - m) / (R (R-1))`` with the exact mean ``m = E[A_i]``, whose
    expectations are ``Var`` and ``Cov``; the tail fractions) is a function of the success count
    ``k ~ Binomial(R, J)``, so its exact law is known: :func:`sims.results.law_check` (exact SE,
    the exact count rule when the statistic is constant but for rare groups, the law's mean
    equal to the exact value). Continuous rewards: the sample SE (``se_from="sample"``).

    Paper values (Thm 4.1 as stated for GRPO, applied to this estimator): ``E sum A = 0``,
    ``Var = (R-1)/R sigma_r^2``, ``Cov = -sigma_r^2/R``.

    Returns:
        list of :class:`CheckResult`.
    """
    binary = getattr(world, "reward", "bernoulli") == "bernoulli"
    p = world.J()
    sigma2 = world.reward_variance()
    tag = f"{estimator} R={R} J={p:.3g}" + ("" if binary else f" ({world.reward})")
    if binary:
        ex = bernoulli_advantage_moments(estimator, R=R, p=p, opts=opts)
    elif _is_linear(estimator):
        a, b, c = linear_coefficients(estimator, R=R, opts=opts)
        ex = {
            "mean_sum": R * (p * (a + (R - 1) * b) + c),
            "var": sigma2 * (a**2 + (R - 1) * b**2),
            "cov": sigma2 * (2 * a * b + (R - 2) * b**2),
        }
    else:
        return []
    _, rewards = world.sample(n_groups, R, rng)
    A = _adv(estimator, rewards, opts)
    if binary:
        out = _theorem41_binary(estimator, A, rewards, R=R, p=p, ex=ex, tag=tag, k=k, opts=opts)
        return out + _tail_checks(estimator, A, rewards, R=R, p=p, eps_values=eps_values, k=k,
                                  opts=opts)
    sums = A.sum(1)
    m, se = _mean_se(sums)
    out = [make_check(f"thm4.1(i) E[sum_i A_i] {tag}", estimate=m, exact=ex["mean_sum"], se=se,
                      n=n_groups, k=k, paper_value=0.0, se_from="sample",
                      atol=1e-9 * max(1.0, abs(ex["mean_sum"])))]
    vs, cs = _var_cov_stats(A)
    for label, stat, key, paper in (("thm4.1(ii) Var(A_i)", vs, "var", (R - 1) / R * sigma2),
                                    ("thm4.1(iii) Cov(A_i,A_j)", cs, "cov", -sigma2 / R)):
        m, se = _mean_se(stat)
        out.append(make_check(f"{label} {tag}", estimate=m, exact=ex[key], se=se, n=n_groups,
                              k=k, paper_value=paper, se_from="sample",
                              details={"sigma2": sigma2}))
    return out


def _moment_statistics(A: np.ndarray, mean: float) -> dict[str, np.ndarray]:
    """Per-group statistics of Thm 4.1 (i)-(iii) for advantages ``A [n, R]`` and the exact mean
    ``E[A_i]``: ``sum_i A_i``, and the unbiased ``Var``/``Cov`` statistics."""
    R = A.shape[1]
    c = A - mean
    s1, s2 = c.sum(1), (c**2).sum(1)
    return {"sum": A.sum(1), "var": s2 / R, "cov": (s1**2 - s2) / (R * (R - 1))}


def _theorem41_binary(
    estimator: str, A: np.ndarray, rewards: np.ndarray, *, R: int, p: float,
    ex: dict[str, float], tag: str, k: float, opts: dict[str, Any] | None,
) -> list[CheckResult]:
    """Thm 4.1 (i)-(iii) with binary rewards, each decided on its statistic's exact law."""
    n = A.shape[0]
    sigma2 = p * (1 - p)
    sums = A.sum(1)
    if ex["max_abs_sum"] <= 1e-12:
        # an identity in every group: compare the largest sampled |sum| with the exact 0
        out = [make_check(f"thm4.1(i) max|sum_i A_i| {tag}", estimate=float(np.abs(sums).max()),
                          exact=ex["max_abs_sum"], se=0.0, n=n, k=k, paper_value=0.0, atol=1e-9,
                          se_from="deterministic")]
    else:
        law = group_count_law(estimator, R=R, p=p, opts=opts,
                              statistic=lambda a, r: a.sum(1))
        out = [law_check(f"thm4.1(i) E[sum_i A_i] {tag}", sums, law=law, exact=ex["mean_sum"],
                         k=k, paper_value=0.0, atol=1e-9 * max(1.0, abs(ex["mean_sum"])),
                         details={"sampled_max_abs_sum": float(np.abs(sums).max()),
                                  "exact_max_abs_sum": ex.get("max_abs_sum")})]
    stats = _moment_statistics(A, ex["mean"])
    for label, key, paper in (("thm4.1(ii) Var(A_i)", "var", (R - 1) / R * sigma2),
                              ("thm4.1(iii) Cov(A_i,A_j)", "cov", -sigma2 / R)):
        law = group_count_law(
            estimator, R=R, p=p, opts=opts,
            statistic=lambda a, r, key=key: _moment_statistics(a, ex["mean"])[key])
        out.append(law_check(f"{label} {tag}", stats[key], law=law, exact=ex[key], k=k,
                             paper_value=paper, details={"sigma2": sigma2}))
    return out


def _tail_checks(
    estimator: str,
    A: np.ndarray,
    rewards: np.ndarray,
    *,
    R: int,
    p: float,
    eps_values: tuple[float, ...],
    k: float,
    opts: dict[str, Any] | None,
    baseline: bool = True,
) -> list[CheckResult]:
    """Tail checks for binary rewards: each sampled rollout is classified by the exact event
    (:func:`sampled_advantage_tail_event`), so estimate and exact value estimate the same event
    at ties too. The float advantages ``A`` are compared with that event off the ties
    (``details["float_event_mismatch_off_ties"]``, 0 when the float estimator agrees;
    ``details["n_ties"]``: sampled rollouts with ``||A| - eps| <= 1e-9``). An estimator without
    an exact form gets no advantage-tail row (no exact value, no verdict). Each group's tail
    fraction (and the baseline event) is a function of its success count: decided on its exact
    law (:func:`sims.results.law_check`)."""
    sigma2 = p * (1 - p)
    has_exact = estimator_spec(estimator).has_exact
    out = []
    for eps in eps_values:
        if has_exact:
            exact = bernoulli_tail(estimator, R=R, p=p, eps=eps, opts=opts)
            hit = sampled_advantage_tail_event(rewards, eps=eps, estimator=estimator, opts=opts)
            gap = np.abs(A) - eps
            ties = np.abs(gap) <= _TIE_TOL
            mismatch = int(np.count_nonzero(((gap > 0) != hit) & ~ties))
            cheb = float(chebyshev_bound(R=R, eps=eps, sigma2=sigma2))
            law = group_count_law(
                estimator, R=R, p=p, opts=opts, statistic=lambda a, r, eps=eps:
                sampled_advantage_tail_event(r, eps=eps, estimator=estimator, opts=opts).mean(1))
            out.append(
                law_check(
                    f"thm4.1(iv) P(|A_i|>{eps:g}) {estimator} R={R} p={p:.3g}",
                    hit.mean(1),
                    law=law,
                    exact=exact,
                    k=k,
                    details={
                        "chebyshev_bound": cheb,
                        "bound_holds": bool(exact <= cheb + 1e-12),
                        "bound_vacuous": bool(cheb >= 1.0),
                        "eps": eps,
                        "n_ties": int(np.count_nonzero(ties)),
                        "float_event_mismatch_off_ties": mismatch,
                    },
                )
            )
        if baseline:
            ex_b = exact_baseline_tail_bernoulli(R=R, eps=eps, p=p)
            hb = float(hoeffding_bound(R=R, eps=eps))
            law = group_count_law(
                estimator, R=R, p=p, opts=opts, statistic=lambda a, r, eps=eps:
                sampled_baseline_tail_event(r, eps=eps, p=p).astype(float))
            out.append(
                law_check(
                    f"appA.2 P(|v_hat-v|>{eps:g}) R={R} p={p:.3g}",
                    sampled_baseline_tail_event(rewards, eps=eps, p=p).astype(float),
                    law=law,
                    exact=ex_b,
                    k=k,
                    details={
                        "hoeffding_bound": hb,
                        "bound_holds": bool(ex_b <= hb + 1e-12),
                        "bound_vacuous": bool(hb >= 1.0),
                        "eps": eps,
                    },
                )
            )
    return out


def check_tails(
    *,
    estimator: str,
    R: int,
    p: float,
    eps_values: tuple[float, ...],
    n_groups: int,
    rng: np.random.Generator,
    k: float = DEFAULT_K,
    opts: dict[str, Any] | None = None,
) -> list[CheckResult]:
    """Sampled vs exact ``P(|A_i| > eps)`` and ``P(|v_hat - v| > eps)`` for Bernoulli(p) rewards,
    with the Chebyshev (Eq. 20) and Hoeffding (App. A.2) bounds in ``details``."""
    rewards = (rng.random((n_groups, R)) < p).astype(np.float64)
    A = _adv(estimator, rewards, opts)
    return _tail_checks(estimator, A, rewards, R=R, p=p, eps_values=eps_values, k=k, opts=opts)


# --- unbiasedness ------------------------------------------------------------------------------
def _signal_count(
    estimator: str, A: np.ndarray, *, R: int, p: float, opts: dict[str, Any] | None
) -> tuple[int, float]:
    """Sampled groups with a nonzero advantage row (``A [..., R]``) and the exact probability of
    one, ``sum_k Bin(k; R, p) [the advantages of k successes are not all 0]``: the groups that
    carry any gradient. A group without signal contributes exactly 0 to ``g_hat``."""
    law = group_count_law(estimator, R=R, p=p, opts=opts,
                          statistic=lambda a, r: np.any(a != 0, axis=1).astype(float))
    observed = int(np.count_nonzero(np.any(A.reshape(-1, R) != 0, axis=1)))
    return observed, law.mean


def check_unbiasedness(
    world: Any,
    estimator: str,
    *,
    R: int,
    n_groups: int,
    rng: np.random.Generator,
    k: float = DEFAULT_K,
    opts: dict[str, Any] | None = None,
    n_outcomes: int = 4,
) -> list[CheckResult]:
    """``E[g_hat]`` vs ``grad J`` and ``E[A_i | outcome_i]`` vs the true advantage.

    ``g_hat = (1/R) sum_i A_i psi_i`` (Eq. 19). The exact ``E[g_hat]`` is enumerated
    (:func:`sims.exact.expected_gradient_bernoulli`; linear estimators also for continuous rewards).
    Reported: ``ratio = <E g_hat, grad J> / |grad J|^2`` (per-group projections) and
    ``cosine(E g_hat, grad J)`` (jackknife SE over 20 batches). Paper value 1 for the ratio and
    the cosine: Eqs. 6-7 state that a baseline adds no bias. ``E[A_i | o]`` is checked for the
    ``n_outcomes`` most probable outcomes (arms / sequences), paper value ``mu_o - J`` (Eq. 13).

    Decision (binary rewards): the SE of the ratio and of ``E[A_i | o]`` are exact
    (:func:`sims.exact.projection_moments`, :func:`sims.exact.outcome_advantage_se`); when the
    groups with a nonzero advantage (the only ones that carry gradient) are rare in the sample
    (expected count below :data:`sims.results.RARE_COUNT`, e.g. ``grpo_passk`` at large R) the
    exact count rule on them decides, and the cosine, which then has no measurable direction,
    is not checked. Continuous rewards: the sample SE.

    Args:
        world: a :class:`sims.bandit.SoftmaxBandit` or :class:`sims.token_mdp.TokenMDP`.
    """
    probs, means, psi = world.outcome_model()
    binary = getattr(world, "reward", "bernoulli") == "bernoulli"
    if binary:
        Eg = expected_gradient_bernoulli(
            estimator, probs=probs, means=means, psi=psi, R=R, opts=opts
        )
    elif _is_linear(estimator):
        Eg = expected_gradient_linear(estimator, probs=probs, means=means, psi=psi, R=R, opts=opts)
    else:
        return []
    idx, rewards = world.sample(n_groups, R, rng)
    sample = _UnbiasednessSample(
        estimator=estimator, probs=probs, means=means, psi=psi, grad_J=world.grad_J(),
        expected_gradient=Eg, idx=idx, A=_adv(estimator, rewards, opts), R=R, k=k, opts=opts,
        binary=binary,
        tag=f"{estimator} R={R} {type(world).__name__}" + ("" if binary else f" ({world.reward})"),
    )
    rare = sample.signal_count() if binary else None
    out = [sample.ratio_check(rare)]
    cosine = sample.cosine_check(rare)
    if cosine is not None:
        out.append(cosine)
    return out + sample.outcome_advantage_checks(rare, n_outcomes=n_outcomes)


class _UnbiasednessSample:
    """One world's sampled groups and exact tables, for the checks of :func:`check_unbiasedness`.

    ``g[n] = (1/R) sum_i A_i psi_{o_i}`` per group (Eq. 19), ``[n_groups, d]``; ``grad_J`` and
    ``expected_gradient`` are ``[d]``; ``idx`` (outcome of each rollout) and ``A`` are ``[n, R]``.
    """

    def __init__(self, *, estimator: str, probs: np.ndarray, means: np.ndarray, psi: np.ndarray,
                 grad_J: np.ndarray, expected_gradient: np.ndarray, idx: np.ndarray,
                 A: np.ndarray, R: int, k: float, opts: dict[str, Any] | None, binary: bool,
                 tag: str) -> None:
        self.estimator, self.probs, self.means, self.psi = estimator, probs, means, psi
        self.gJ, self.Eg, self.idx, self.A = grad_J, expected_gradient, idx, A
        self.R, self.k, self.opts, self.binary, self.tag = R, k, opts, binary, tag
        self.n_groups = idx.shape[0]
        self.J = float(probs @ means)
        self.g = np.einsum("nr,nrd->nd", A, psi[idx]) / R
        self.nrm2 = float(grad_J @ grad_J)
        if self.nrm2 <= 0:
            raise ValueError("grad J is zero in this world: the ratio is undefined")

    def signal_count(self) -> RareCount:
        """The groups with a nonzero advantage and their exact Binomial count law."""
        observed, q = _signal_count(self.estimator, self.A, R=self.R, p=self.J, opts=self.opts)
        return RareCount(observed, ((self.n_groups, q),), "groups with a nonzero advantage")

    def ratio_check(self, rare: RareCount | None) -> CheckResult:
        """``<E g_hat, grad J> / |grad J|^2`` vs the exact value (paper: 1, Eqs. 6-7); exact SE
        from :func:`sims.exact.projection_moments` for binary rewards, the sample SE otherwise."""
        m, sample_se = _mean_se(self.g @ self.gJ / self.nrm2)
        exact_se: dict[str, Any] = {"se": sample_se, "se_from": "sample"}
        if self.binary:
            mean_x, second = projection_moments(
                self.estimator, probs=self.probs, means=self.means,
                x=self.psi @ self.gJ / self.nrm2, R=self.R, opts=self.opts)
            exact_se = {"se": float(np.sqrt(max(second - mean_x**2, 0.0) / self.n_groups)),
                        "se_from": "exact moments", "law_mean": mean_x}
        return make_check(
            f"E[g_hat] ratio {self.tag}",
            estimate=m,
            exact=float(self.Eg @ self.gJ / self.nrm2),
            n=self.n_groups,
            k=self.k,
            paper_value=1.0,
            rare=rare,
            details={"ci95": [m - 1.96 * exact_se["se"], m + 1.96 * exact_se["se"]],
                     "sample_se": sample_se},
            **exact_se,
        )

    def cosine_check(self, rare: RareCount | None) -> CheckResult | None:
        """``cosine(E g_hat, grad J)`` (jackknife SE over 20 batches; paper: 1), or None when no
        direction is measurable: a sample or jackknife replicate in which no group carried signal
        (e.g. ``grpo_passk`` at large R: only groups with exactly one success do), or such
        groups are rare (their expected count below ``RARE_COUNT``)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            cos, cse = _jackknife_cosine(self.g, self.gJ)
        exact_cos = float(self.Eg @ self.gJ / (np.linalg.norm(self.Eg) * np.sqrt(self.nrm2)))
        if not (np.isfinite(cos) and np.isfinite(cse)
                and (rare is None or rare.expected >= RARE_COUNT)):
            return None
        return make_check(
            f"E[g_hat] cosine {self.tag}",
            estimate=cos,
            exact=exact_cos,
            se=cse,
            n=self.n_groups,
            k=self.k,
            paper_value=1.0,
            se_from="jackknife",
            details={
                "se_method": "jackknife over 20 batches",
                "note": "cosine of a finite-sample mean is biased low",
            },
        )

    def exact_conditional_advantage(self) -> np.ndarray:
        """``E[A_i | o_i = o]`` per outcome, exactly: ``mu_o c_1 + (1 - mu_o) c_0`` for binary
        rewards; ``a mu_o + b (R - 1) J + c`` for an estimator linear in the rewards."""
        if self.binary:
            c0, c1 = cond_advantage_given_reward(self.estimator, R=self.R, p=self.J,
                                                 opts=self.opts)
            return self.means * c1 + (1 - self.means) * c0
        a, b, c = linear_coefficients(self.estimator, R=self.R, opts=self.opts)
        return a * self.means + b * (self.R - 1) * self.J + c

    def outcome_advantage_checks(self, rare: RareCount | None, *,
                                 n_outcomes: int) -> list[CheckResult]:
        """``E[A_i | o]`` (ratio estimate ``sum A 1[o] / sum 1[o]``) vs exact, for the
        ``n_outcomes`` most probable outcomes; paper value ``mu_o - J`` (Eq. 13)."""
        cond_exact = self.exact_conditional_advantage()
        out = []
        for o in np.argsort(-self.probs)[:n_outcomes]:
            hit = self.idx == o
            S = (hit * self.A).sum(1)
            N = hit.sum(1).astype(np.float64)
            if N.sum() < 2:
                continue
            est = S.sum() / N.sum()
            se_o = float(np.sqrt(np.var(S - est * N, ddof=1) / self.n_groups) / N.mean())
            se_kw: dict[str, Any] = {"se": se_o, "se_from": "sample"}
            if self.binary:
                se_kw = {"se_from": "exact moments", "se": outcome_advantage_se(
                    self.estimator, probs=self.probs, means=self.means, outcome=int(o),
                    theta=float(cond_exact[o]), R=self.R, n_groups=self.n_groups,
                    opts=self.opts)}
            true_advantage = float(self.means[o] - self.J)
            out.append(
                make_check(
                    f"E[A_i|o={int(o)}] {self.tag}",
                    estimate=est,
                    exact=float(cond_exact[o]),
                    n=int(N.sum()),
                    k=self.k,
                    paper_value=true_advantage,
                    rare=rare,
                    details={"pi_o": float(self.probs[o]), "true_advantage": true_advantage,
                             "sample_se": se_o},
                    **se_kw,
                )
            )
        return out


def check_unbiasedness_batch(
    worlds: list[Any],
    estimator: str,
    *,
    R: int,
    n_groups: int,
    rng: np.random.Generator,
    k: float = DEFAULT_K,
    opts: dict[str, Any] | None = None,
) -> list[CheckResult]:
    """``E[g_hat]`` vs ``grad J`` for a BATCH of prompts (binary rewards), each with its own
    parameters: ``J = (1/P) sum_p J_p`` and ``g_hat = (1/P) concat_p g_hat_p``.

    Per prompt, every reward-only estimator has ``E[g_hat_p] = (c_1(p) - c_0(p)) grad J_p`` with
    ``c_r = E[A_1 | r_1 = r]`` (since ``sum_o pi_o psi_o = 0``), so a single prompt can only be
    rescaled; over a batch the factors differ with the solve rate ``p``, which can turn the
    direction. Reported: ratio and cosine of the batch ``E[g_hat]`` with the batch ``grad J``.
    The estimator sees the ``[P, R]`` reward matrix (``std_scope="batch"`` is honoured).

    Decision: the ratio is ``sum_p X_p`` over independent prompts, ``X_p = <g_hat_p, grad J_p> /
    sum_q |grad J_q|^2``, so its exact variance is ``sum_p Var(X_p)``
    (:func:`sims.exact.projection_moments`); rare signal groups (summed over the prompts) are
    decided by the exact count rule, and then the cosine is not checked.
    """
    P = len(worlds)
    tables = [w.outcome_model() for w in worlds]
    gJs = [w.grad_J() for w in worlds]
    gJ = np.concatenate(gJs) / P
    Eg = (
        np.concatenate(
            [
                expected_gradient_bernoulli(estimator, probs=pr, means=mu, psi=ps, R=R, opts=opts)
                for pr, mu, ps in tables
            ]
        )
        / P
    )
    opts_ = estimator_options(estimator, opts)
    if opts_.get("std_scope") == "batch":
        raise ValueError(
            "batch-scoped std couples prompts: the per-prompt exact value does not apply"
        )
    A, g = _sample_batch_gradient(worlds, tables, estimator, R=R, n_groups=n_groups, rng=rng,
                                  opts=opts_)
    nrm2 = float(gJ @ gJ)
    tag = f"{estimator} R={R} batch of {P} prompts"
    m, sample_se = _mean_se(g @ gJ / nrm2)
    var, law_mean, rare = _batch_ratio_law(tables, gJs, A, estimator, R=R, opts=opts)
    out = [
        make_check(
            f"E[g_hat] ratio {tag}",
            estimate=m,
            exact=float(Eg @ gJ / nrm2),
            se=float(np.sqrt(var / n_groups)),
            se_from="exact moments",
            law_mean=law_mean,
            rare=rare,
            n=n_groups,
            k=k,
            paper_value=1.0,
            details={"sample_se": sample_se},
        ),
    ]
    cos, cse = _jackknife_cosine(g, gJ)
    if rare.expected >= RARE_COUNT:
        out.append(
            make_check(
                f"E[g_hat] cosine {tag}",
                estimate=cos,
                exact=float(Eg @ gJ / (np.linalg.norm(Eg) * np.sqrt(nrm2))),
                se=cse,
                se_from="jackknife",
                n=n_groups,
                k=k,
                paper_value=1.0,
                details={"se_method": "jackknife over 20 batches"},
            )
        )
    return out


def _sample_batch_gradient(
    worlds: list[Any], tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]], estimator: str,
    *, R: int, n_groups: int, rng: np.random.Generator, opts: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """``(A [n, P, R], g [n, sum_p d_p])``: the estimator sees the ``[P, R]`` rewards of each
    batch; ``g = (1/P) concat_p (1/R) sum_i A_{p,i} psi_{p,o_i}``."""
    P = len(worlds)
    samples = [w.sample(n_groups, R, rng) for w in worlds]
    rewards = np.stack([r for _, r in samples], axis=1)  # [n, P, R]
    A = np.asarray(compute_advantages(estimator, rewards.reshape(-1, R), **opts)).reshape(
        n_groups, P, R
    )
    g = (
        np.concatenate(
            [np.einsum("nr,nrd->nd", A[:, p], tables[p][2][samples[p][0]]) / R for p in range(P)],
            axis=1,
        )
        / P
    )
    return A, g


def _batch_ratio_law(
    tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]], gJs: list[np.ndarray],
    A: np.ndarray, estimator: str, *, R: int, opts: dict[str, Any] | None,
) -> tuple[float, float, RareCount]:
    """``(sum_p Var(X_p), sum_p E[X_p], signal-group count)`` of the batch ratio
    ``sum_p X_p``, ``X_p = <g_hat_p, grad J_p> / sum_q |grad J_q|^2``, over independent
    prompts (:func:`sims.exact.projection_moments`); the count of groups with a nonzero
    advantage is a sum of one Binomial per prompt."""
    n_groups = A.shape[0]
    D = float(sum(v @ v for v in gJs))
    var, law_mean, trials, observed = 0.0, 0.0, [], 0
    for p, (pr, mu, ps) in enumerate(tables):
        mp, m2 = projection_moments(estimator, probs=pr, means=mu, x=ps @ gJs[p] / D, R=R,
                                    opts=opts)
        var += max(m2 - mp**2, 0.0)
        law_mean += mp
        obs_p, q_p = _signal_count(estimator, A[:, p], R=R, p=float(pr @ mu), opts=opts)
        observed += obs_p
        trials.append((n_groups, q_p))
    return var, law_mean, RareCount(observed, tuple(trials), "groups with a nonzero advantage")


# --- spectra ------------------------------------------------------------------------------------
#: Largest R of :func:`check_spectra_limit`: its exact side computes ``R + 1`` spectra of
#: ``R x R`` Grams (0.1 s at 64 on one core, 8 s at 128).
SPECTRA_R_MAX = 64

_METRICS = ("rank", "effective_rank", "entropy_effective_rank", "top1_fraction")


def spectra_summary(metrics: list[Any]) -> dict[str, Any]:
    """Distribution summary (mean, SE, quantiles 5/25/50/75/95) of each metric over the
    non-degenerate groups, and the fraction of degenerate (all-zero-advantage) groups."""
    nd = [m for m in metrics if not m.degenerate]
    out: dict[str, Any] = {
        "n_groups": len(metrics),
        "frac_degenerate": 1.0 - len(nd) / max(1, len(metrics)),
    }
    for key in _METRICS:
        x = np.array([getattr(m, key) for m in nd], dtype=np.float64)
        if x.size == 0:
            out[key] = None
            continue
        out[key] = {
            "mean": float(x.mean()),
            "se": float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0,
            "quantiles": dict(
                zip(
                    ("q05", "q25", "q50", "q75", "q95"),
                    np.quantile(x, [0.05, 0.25, 0.5, 0.75, 0.95]).tolist(),
                    strict=True,
                )
            ),
        }
    return out


def check_spectra_limit(
    model: str,
    estimator: str,
    *,
    R: int,
    p: float,
    n_groups: int,
    rng: np.random.Generator,
    k: float = DEFAULT_K,
    opts: dict[str, Any] | None = None,
    **model_kw: Any,
) -> list[CheckResult]:
    """Mean effective rank and top-1 fraction of ``diag(A) Psi`` under the limit Gram of ``model``.

    Rewards are i.i.d. Bernoulli(p); with a limit Gram the metrics depend only on the number of
    successes ``k``, so a group's metric is ``f(k)`` and its exact distribution is known: ``k``
    is Binomial(R, p) conditioned on a non-degenerate group (nonzero advantage vector), with
    weights ``w_k``. The exact mean is ``mu = sum_k w_k f(k)`` and the SE of the mean of ``n``
    sampled groups is ``sqrt(sum_k w_k (f(k) - mu)^2 / n)``, from the exact variance: the sample
    standard deviation is the wrong yardstick here, because ``f`` is a step function with rare
    large values (``f(1) = f(R-1)``) and a sample short of them underestimates both the mean and
    its own spread (seed 0, isotropic, R=8: sample SE gave z = -4.6, the exact SE z = -3.7).
    ``details`` records the sample SE beside it. Decided by :func:`sims.results.law_check`
    (with its exact count rule when the metric is constant but for rare groups). No paper value:
    the paper's claim (effective rank ~2 for every R) is about a real model; the spectra
    experiment reports it.
    """
    from .psi_models import limit_gram

    if int(R) != R or R < 2:
        raise ValueError(f"group size R must be an integer >= 2, got {R}")
    check_R_limit(int(R), limit=SPECTRA_R_MAX, name="SPECTRA_R_MAX",
                  routine="check_spectra_limit", cost="R + 1 exact spectra of R x R Grams, "
                  "O(R^4)", alternative="the isotropic model has the closed form "
                  "isotropic_effective_rank_binary(R, k); otherwise sample the spectra "
                  "(sims.checks.spectra_summary)")
    opts_ = estimator_options(estimator, opts)
    ks = np.arange(R + 1)
    rows = (np.arange(R)[None, :] < ks[:, None]).astype(np.float64)
    A_k = np.asarray(compute_advantages(estimator, rows, **opts_))
    per_k = [spectral_metrics(limit_gram(model, rows[i], **model_kw), A_k[i]) for i in ks]
    w = binom_pmf(ks, R, p) * np.array([not m.degenerate for m in per_k])
    if w.sum() <= 0:
        return []
    w = w / w.sum()
    rewards = (rng.random((n_groups, R)) < p).astype(np.float64)
    A = np.asarray(compute_advantages(estimator, rewards, **opts_))
    mets = [
        spectral_metrics(limit_gram(model, rewards[i], **model_kw), A[i]) for i in range(n_groups)
    ]
    # the world's name carries its distinguishing parameter, as in the audit
    world = {
        "common": f"common (strength {model_kw.get('strength', 1.0):g})",
        "clustered": f"clustered (noise {model_kw.get('noise', 0.1):g})",
    }.get(model, model)
    out = []
    live = w > 0
    for key in ("effective_rank", "top1_fraction"):
        f_k = np.array([getattr(m, key) for m, ok in zip(per_k, live, strict=True) if ok])
        law = FiniteLaw.of(f_k, w[live])
        x = np.array([getattr(m, key) for m in mets if not m.degenerate])
        if x.size == 0:  # no non-degenerate group sampled: nothing to compare
            continue
        out.append(
            law_check(
                f"spectra {key} {world} {estimator} R={R} p={p:g} (d=inf)",
                x,
                law=law,
                exact=law.mean,
                k=k,
                details=dict(model_kw),
            )
        )
    return out
