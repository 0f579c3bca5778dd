"""The result object every check in :mod:`sims` returns, and the one decision rule.

A check compares a Monte Carlo ``estimate`` with an ``exact`` value that this package computed
itself (closed form, enumeration or dynamic programming). The verdict is computed, never typed,
with ``k`` fixed and stated (default 4):

* **normal rule**: ``z = (estimate - exact) / se`` and ``passed = |z| <= k``, where ``se`` is the
  exact standard error (from the exact law of the per-group statistic, or its exact second
  moment) wherever the package can compute it, and the sample SE only where it cannot
  (continuous rewards, the multi-turn gradient; ``details["se_from"]`` says which);
* **rare-event rule**: when the estimate is driven by a class of groups whose expected number in
  the sample, ``lambda``, is below :data:`RARE_COUNT` (e.g. the groups with a nonzero advantage
  under ``grpo_passk`` at ``R = 16``, ``J = 0.652``: exactly one success, probability 1.38e-6,
  ``lambda = 0.28`` in 200 000 groups), the normal approximation fails (three such groups are a
  5.2-sigma event for it even with the exact SE, yet happen in 0.3 % of runs; a sample without
  any had sample SE 0 and ``z = -inf``). Such a check passes iff the observed count ``N`` of that
  class is inside the two-sided
  exact acceptance region of its law (a Binomial, or a sum of independent Binomials):
  ``P(N' <= N) > alpha / 2`` and ``P(N' >= N) > alpha / 2`` with ``alpha = 2 Phi(-k)``, the
  level of ``|z| <= k`` for a normal estimate (6.3e-5 at ``k = 4``);
* **deterministic**: ``se == 0`` for an identity that holds in every sampled group (or a point-mass
  law): ``|estimate - exact| <= atol`` (recorded in ``details``); an SE below
  ``1e-12 * max(1, |exact|)`` is float rounding of constant samples and is treated as 0. A zero
  *sample* SE of a statistical check is not a yardstick: it is an error, never ``z = inf``.

With ``law_mean`` (the mean of the exact law the SE comes from) the check also requires
``law_mean == exact`` to ``1e-9`` (relative): two exact computations that must agree. The paper's
own formula, when it makes a claim about the same quantity, is carried separately as
``paper_value`` so that a wrong formula shows up as ``exact != paper_value`` while the Monte
Carlo agrees with ``exact``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from grpo_io import to_jsonable

from ._stats import Z_THRESHOLD, FiniteLaw

__all__ = [
    "CheckResult", "make_check", "law_check", "DEFAULT_K", "RARE_COUNT", "RareCount",
    "rare_count_pvalues", "results_table", "md_escape",
]

#: Default ``k`` of :func:`make_check`: the one threshold :data:`sims._stats.Z_THRESHOLD`.
DEFAULT_K = Z_THRESHOLD

#: Below this expected count of a rare class of groups the exact count rule decides (a Poisson
#: count with mean 100 fails ``|z| <= 4`` falsely at 1.1x the normal rate; at mean 30, 2.7x;
#: at mean 5, 11x; at mean 0.28, 45x: 3 groups, 0.3 % of runs).
RARE_COUNT = 100.0


@dataclass(frozen=True)
class RareCount:
    """The observed number of groups in a class and the exact law of that number.

    Attributes:
        observed: groups of the class in the sample.
        trials: ``((n_1, q_1), ...)``: the count is a sum of independent Binomial(n_i, q_i)
            (one pair for one world; one per prompt or per step otherwise).
        what: the class, e.g. ``"groups with a nonzero advantage"``.
    """

    observed: int
    trials: tuple[tuple[int, float], ...]
    what: str

    @property
    def expected(self) -> float:
        """``sum_i n_i q_i``."""
        return float(sum(n * q for n, q in self.trials))


def rare_count_pvalues(observed: int, trials: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(P(N <= observed), P(N >= observed))`` for ``N = sum_i Binomial(n_i, q_i)``, exactly.

    The pmf of ``N`` on ``0..observed`` is the convolution of the Binomial pmfs truncated there
    (exact for those counts: a term beyond ``observed`` never lands below it); the upper tail is
    ``1 - P(N <= observed - 1)``, accurate to ~1e-15 absolute (the decision compares it with
    ``alpha / 2 >= 1e-10``). Beyond 10 000 the upper tail is Chernoff's bound
    ``exp(-lambda) (e lambda / m)^m`` (an upper bound: the decision stays sound).

    >>> lo, hi = rare_count_pvalues(0, [(200_000, 8.6e-8)])  # lambda = 0.0172
    >>> round(lo, 4), hi
    (0.9829, 1.0)
    >>> [round(p, 4) for p in rare_count_pvalues(1, [(200_000, 8.6e-8)])]
    [0.9999, 0.0171]
    """
    import numpy as np
    from scipy.stats import binom

    m = int(observed)
    if m < 0:
        raise ValueError(f"observed must be >= 0, got {observed}")
    lam = float(sum(n * q for n, q in trials))
    if m > 10_000:
        if m <= lam:
            raise ValueError(f"observed={m} > 10000 is not a rare count (expected {lam:g})")
        log_hi = -lam + m * (1.0 + math.log(lam / m)) if lam > 0 else -math.inf
        return 1.0, math.exp(log_hi)
    pmf = np.zeros(m + 1)
    pmf[0] = 1.0
    for n, q in trials:
        b = binom.pmf(np.arange(min(int(n), m) + 1), int(n), float(q))
        pmf = np.convolve(pmf, b)[: m + 1]
    below = min(1.0, float(pmf.sum()))  # P(N <= m)
    return below, min(1.0, max(0.0, 1.0 - below + float(pmf[m])))


@dataclass(frozen=True)
class CheckResult:
    """One estimate-versus-exact comparison.

    Attributes:
        name: what is checked, e.g. ``"thm4.1(ii) Var(A_i) grpo R=4 p=0.3"``.
        estimate: Monte Carlo estimate.
        exact: the exact value computed by this package.
        se: standard error of ``estimate`` (0 for a deterministic check).
        n: number of independent samples (groups) behind ``estimate``.
        z: ``(estimate - exact) / se`` (0 when both differences and se are 0; inf when se = 0
            and they differ).
        k: the threshold: ``passed = |z| <= k``.
        passed: the computed verdict.
        paper_value: what the paper's formula gives for the same quantity, or None if the paper
            makes no claim about it.
        details: anything else (parameters, ``paper_matches_exact``, tolerances).
    """

    name: str
    estimate: float
    exact: float
    se: float
    n: int
    z: float
    k: float
    passed: bool
    paper_value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats as :data:`grpo_io.NONFINITE_POLICY` says)."""
        return to_jsonable(asdict(self))


def make_check(
    name: str,
    *,
    estimate: float,
    exact: float,
    se: float,
    n: int,
    k: float = DEFAULT_K,
    paper_value: float | None = None,
    atol: float = 1e-9,
    paper_rtol: float = 1e-9,
    details: dict[str, Any] | None = None,
    se_from: str = "exact",
    rare: RareCount | None = None,
    law_mean: float | None = None,
) -> CheckResult:
    """Build a :class:`CheckResult`, computing ``z`` and the verdict (module docstring).

    Args:
        name: label of the check.
        estimate: Monte Carlo estimate.
        exact: exact value (must be finite).
        se: standard error, ``>= 0`` (0: a deterministic check).
        n: sample size.
        k: pass threshold on ``|z|`` (default 4); the rare-event rule uses the same level.
        paper_value: the paper's formula for the same quantity, or None.
        atol: tolerance of a deterministic check (``se == 0``).
        paper_rtol: relative tolerance for ``details["paper_matches_exact"]``.
        details: extra JSON-able information.
        se_from: where ``se`` comes from: ``"exact"`` (the exact law or exact moments),
            ``"sample"`` (the sample SE: a zero value is then an error, not a yardstick) or
            ``"jackknife"``; recorded in ``details["se_from"]``.
        rare: the class of groups that drives the estimate and its exact count law; when its
            expected count is below :data:`RARE_COUNT` the exact count rule decides.
        law_mean: mean of the exact law behind ``se``; must equal ``exact`` (``1e-9`` relative).

    Returns:
        The frozen :class:`CheckResult`.

    Raises:
        ValueError: non-finite ``exact``/``estimate``, negative ``se``, or a zero sample SE.

    >>> make_check("x", estimate=1.02, exact=1.0, se=0.01, n=100).passed
    True
    """
    estimate, exact, se = float(estimate), float(exact), float(se)
    _require_yardstick(name, estimate=estimate, exact=exact, se=se, n=n, atol=atol,
                       se_from=se_from)
    d = dict(details or {})
    d["se_from"] = se_from
    if 0 < se <= 1e-12 * max(1.0, abs(exact), abs(estimate)):
        # the samples are constant up to float rounding: judge as a deterministic check
        d["se_rounding_only"] = se
        se = 0.0
    z, passed = _normal_or_deterministic(estimate - exact, se=se, k=k, atol=atol, details=d)
    if rare is not None and se > 0 and rare.expected < RARE_COUNT:
        passed = _rare_count_verdict(rare, k=k, details=d)
    if law_mean is not None:
        passed = _law_mean_agrees(law_mean, exact=exact, atol=atol, details=d) and passed
    if paper_value is not None:
        paper_value = float(paper_value)
        d["paper_matches_exact"] = bool(
            abs(paper_value - exact) <= paper_rtol * max(1.0, abs(exact))
        )
    return CheckResult(
        name=name,
        estimate=estimate,
        exact=exact,
        se=se,
        n=int(n),
        z=float(z),
        k=float(k),
        passed=bool(passed),
        paper_value=paper_value,
        details=d,
    )


def _require_yardstick(
    name: str, *, estimate: float, exact: float, se: float, n: int, atol: float, se_from: str
) -> None:
    """ValueError for a non-finite estimate or exact value, a negative or non-finite SE, or a
    zero sample/jackknife SE with a visible difference (no yardstick to judge it by)."""
    if not (math.isfinite(estimate) and math.isfinite(exact)):
        raise ValueError(f"check {name!r}: estimate={estimate} and exact={exact} must be finite")
    if not math.isfinite(se) or se < 0:
        raise ValueError(f"check {name!r}: se must be finite and >= 0, got {se}")
    if se_from in ("sample", "jackknife") and se == 0 and n > 1 and abs(estimate - exact) > atol:
        raise ValueError(
            f"check {name!r}: the {se_from} SE is 0 (every sampled value equal) while the "
            f"estimate {estimate!r} differs from the exact {exact!r} by more than atol={atol!r}: "
            "no yardstick; this check "
            "needs an exact standard error or a rare-event rule"
        )


def _normal_or_deterministic(
    diff: float, *, se: float, k: float, atol: float, details: dict[str, Any]
) -> tuple[float, bool]:
    """``(z, passed)``: ``z = diff / se``, ``|z| <= k`` when ``se > 0``; else the deterministic
    rule ``|diff| <= atol`` (``z`` 0 or signed infinity). Records the rule in ``details``."""
    if se > 0:
        details["rule"] = f"normal: |z| <= {k:g}"
        return diff / se, abs(diff / se) <= k
    details["atol"] = atol
    details["rule"] = "deterministic: |estimate - exact| <= atol"
    z = 0.0 if abs(diff) <= atol else math.copysign(math.inf, diff)
    return z, abs(diff) <= atol


def _rare_count_verdict(rare: RareCount, *, k: float, details: dict[str, Any]) -> bool:
    """The exact count rule: ``P(N <= obs) > alpha/2`` and ``P(N >= obs) > alpha/2`` with
    ``alpha = 2 Phi(-k)``, the level of ``|z| <= k``. Records the rule and both tails."""
    alpha = math.erfc(k / math.sqrt(2.0))  # 2 Phi(-k): the level of |z| <= k
    lo, hi = rare_count_pvalues(rare.observed, rare.trials)
    details.update({
        "rule": f"exact count of {rare.what}: P(N <= obs), P(N >= obs) > alpha/2, "
                f"alpha = 2 Phi(-{k:g}) = {alpha:.3g}",
        "rare_observed": rare.observed,
        "rare_expected": rare.expected,
        "rare_p_low": lo,
        "rare_p_high": hi,
    })
    return min(lo, hi) > alpha / 2


def _law_mean_agrees(law_mean: float, *, exact: float, atol: float,
                     details: dict[str, Any]) -> bool:
    """``|law_mean - exact| <= 1e-9 max(1, |exact|) + atol``: two exact computations agree."""
    agree = abs(float(law_mean) - exact) <= 1e-9 * max(1.0, abs(exact)) + atol
    details["law_mean"] = float(law_mean)
    details["law_matches_exact"] = bool(agree)
    return bool(agree)


def law_check(
    name: str,
    samples: Any,
    *,
    law: FiniteLaw,
    exact: float,
    k: float = DEFAULT_K,
    paper_value: float | None = None,
    atol: float = 1e-9,
    details: dict[str, Any] | None = None,
) -> CheckResult:
    """The Monte Carlo mean of a per-group statistic with a known finite law, against ``exact``.

    ``estimate = mean(samples)``; ``se = sd(law) / sqrt(n)`` (the exact SE); the rare class is
    the groups off the law's most likely value (count law Binomial(n, P(X != mode))), so a
    statistic that is constant but for rare groups is decided by the exact count rule; the law's
    mean must equal ``exact`` (two exact computations); and every sample must lie in the law's
    support (else the sampled groups do not follow it: an estimator that is not exchangeable,
    or a wrong world). ``details`` records the sample SE beside the exact one.

    >>> law = FiniteLaw.of([0.0, 1.0], [0.75, 0.25])
    >>> law_check("x", [0.0, 1.0, 0.0, 0.0] * 50, law=law, exact=0.25).passed
    True
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    n = x.size
    if n == 0:
        raise ValueError(f"check {name!r}: no samples")
    off_support = law.count_off_support(x)
    d = {**(details or {}), "sample_se": float(x.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
         "law_support_size": int(law.values.size), "samples_off_support": off_support}
    chk = make_check(
        name, estimate=float(x.mean()), exact=exact, se=law.sd / np.sqrt(n), n=n, k=k,
        paper_value=paper_value, atol=atol, details=d, se_from="exact law",
        rare=RareCount(law.count_off_mode(x), ((n, law.off_mode),),
                       "groups off the most likely value"),
        law_mean=law.mean,
    )
    return replace(chk, passed=chk.passed and off_support == 0)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.5g}"


def md_escape(text: str) -> str:
    """Escape ``|`` so a string can sit inside a Markdown table cell."""
    return text.replace("|", "\\|")


def results_table(results: list[CheckResult]) -> str:
    """Markdown table: check, estimate, exact, SE, z, verdict (k), paper value, paper = exact?"""
    lines = [
        "| check | estimate | exact | SE | n | z | verdict | paper | paper = exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = f"{'pass' if r.passed else 'FAIL'} (k={r.k:g})"
        pm = r.details.get("paper_matches_exact")
        pm_s = "-" if pm is None else ("yes" if pm else "NO")
        lines.append(
            f"| {md_escape(r.name)} | {_fmt(r.estimate)} | {_fmt(r.exact)} | {_fmt(r.se)} | "
            f"{r.n} | {_fmt(r.z)} | {verdict} | {_fmt(r.paper_value)} | {pm_s} |"
        )
    return "\n".join(lines)
