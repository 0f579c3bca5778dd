"""Exact enumeration for Bernoulli(p) rewards: the law of ``A_1`` for any estimator.

With i.i.d. binary rewards ``r_i ~ Bernoulli(p)`` a group is summarised by its number of
successes ``k ~ Binomial(R, p)``: every estimator of :mod:`grpo_theory.advantages` gives a success
the value ``a_S(k)`` and a failure the value ``a_F(k)``. Conditioning on rollout 1's own reward,

    ``P(A_1 = a_S(j+1)) = p * Bin(j; R-1, p)``,   ``P(A_1 = a_F(j)) = (1-p) * Bin(j; R-1, p)``,

for ``j = 0..R-1`` (``j`` = successes among the other ``R-1`` rollouts). Moments follow by finite
sums; ``Cov(A_1, A_2)`` conditions on ``(r_1, r_2)`` and ``Bin(R-2, p)`` for the rest.

Exactness. The advantage values are built in sympy from ``k`` and ``R`` (rationals; grpo_std uses
``sympy.sqrt`` and stays exact), for every registered estimator that has an exact form
(:data:`EXACT_ESTIMATORS`). When ``p`` is a sympy number or symbol (or a
:class:`fractions.Fraction`) every probability and moment is an exact sympy expression; when ``p``
is a float the values stay exact (so comparisons such as ``|A| > eps`` are decided exactly) and
the probabilities are floats. Float options (``eps``, ``delta``, ``alpha``, ``baseline``) are read
as the decimal they print as (``0.1 -> 1/10``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ._validate import check_p, check_R, is_exact_number, to_exact
from .advantages import compute_advantages
from .limits import ARRAY_R_MAX, EXACT_P_R_MAX, EXACT_R_MAX, check_R_limit
from .registry import RegistryView, estimator_spec, validate_options

if TYPE_CHECKING:  # sympy is imported only inside the functions that do exact work
    import sympy as sp

__all__ = [
    "EXACT_ESTIMATORS",
    "to_exact",
    "binom_pmf",
    "group_outcomes",
    "advantage_values",
    "advantage_value_table",
    "advantage_distribution",
    "exact_advantage_moments",
]

Number = Any  # float | sympy.Expr

_TINY = np.finfo(np.float64).tiny * 2.0**53  # below this a float power has lost precision


def binom_pmf(k: Any, R: int, p: Any) -> np.ndarray:
    """Float Binomial pmf ``C(R, k) p^k (1-p)^(R-k)``, broadcasting ``k`` and ``p``.

    The one float binomial pmf of the project. Computed as the direct product
    ``C(R, k) * p**k * (1-p)**(R-k)`` (``0^0 = 1``; ``C(R, k)`` from :func:`math.comb`), and in
    log space (``gammaln``, ``log1p``) where a factor of that product leaves the normal float
    range (subnormal ``p`` such as ``2.2e-308``, ``R > 1000``): no overflow, no precision lost to
    subnormals (scipy's ``binom.pmf`` raises OverflowError there). ``k`` outside ``0..R`` gives 0.

    Args:
        k: success counts (array-like of integers; a non-integer is a ``ValueError``).
        R: number of trials, an int ``>= 0``.
        p: success probability(ies) in ``[0, 1]`` (NaN or outside: ``ValueError``).

    Returns:
        float64 array of the broadcast shape of ``k`` and ``p``.

    >>> binom_pmf(np.arange(3), 2, 0.5).tolist()
    [0.25, 0.5, 0.25]
    """
    R = check_R(R, minimum=0)
    try:
        k = np.asarray(k, dtype=np.float64)
        q = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"k and p must be real numbers or arrays, got k={k!r}, p={p!r}") from None
    if not np.all(np.isfinite(k)) or np.any(k != np.floor(k)):
        raise ValueError(f"k must hold integers (success counts), got {k.tolist()!r}")
    if not np.all((q >= 0) & (q <= 1)):  # NaN fails too
        raise ValueError(f"p must be in [0, 1], got {q.tolist()!r}")
    k, q = np.broadcast_arrays(k, q)
    inside = (k >= 0) & (k <= R)
    kk = np.where(inside, k, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        if R <= 1000:
            coef_table = np.array([float(math.comb(R, j)) for j in range(R + 1)])
            coef = coef_table[kk.astype(np.int64)]
            fp = np.power(q, kk)
            fq = np.power(1.0 - q, R - kk)
            out = coef * fp * fq
            risky = ((fp < _TINY) & (fp > 0)) | ((fq < _TINY) & (fq > 0))
        else:
            out = np.zeros(k.shape)
            risky = np.ones(k.shape, dtype=bool)
        if risky.any():
            from scipy.special import gammaln

            logc = gammaln(R + 1.0) - gammaln(kk + 1.0) - gammaln(R - kk + 1.0)
            lp = np.where(kk > 0, kk * np.log(np.where(q > 0, q, 1.0)), 0.0)
            lq = np.where(R - kk > 0, (R - kk) * np.log1p(-np.where(q < 1, q, 0.0)), 0.0)
            out = np.where(risky, np.exp(logc + lp + lq), out)
    out = np.where((q == 0) & (kk > 0), 0.0, out)
    out = np.where((q == 1) & (kk < R), 0.0, out)
    return np.where(inside, out, 0.0)


def group_outcomes(*, R: int, p: Any) -> tuple[np.ndarray, list[Any] | np.ndarray]:
    """Support and law of the success count ``k ~ Binomial(R, p)`` of one group.

    Args:
        R: group size, ``R >= 1``.
        p: success probability in ``[0, 1]``; a sympy number/symbol or Fraction gives exact pmf.

    Returns:
        ``(k, pmf)``: ``k = [0..R]`` (int array) and ``pmf[k] = C(R, k) p^k (1-p)^(R-k)``, a list
        of sympy expressions for exact ``p``, else a float64 array.

    >>> from fractions import Fraction
    >>> group_outcomes(R=2, p=Fraction(1, 3))[1]
    [4/9, 4/9, 1/9]
    """
    R = check_R(R)
    q = check_p(p)
    exact = is_exact_number(q)
    if exact:
        check_R_limit(R, limit=EXACT_P_R_MAX, name="EXACT_P_R_MAX", routine="group_outcomes "
                      "(the exact law of every exact-p moment, tail and mass)",
                      cost="the exact law of all R + 1 counts in rationals",
                      alternative="pass p as a float (floats to R = EXACT_R_MAX for the moments "
                      "and tails, any R for exact_baseline_tail_bernoulli), or use the closed "
                      "forms of grpo_theory.symbolic or the Hoeffding bound")
    else:
        check_R_limit(R, limit=ARRAY_R_MAX, name="ARRAY_R_MAX", routine="group_outcomes",
                      cost="the law of all R + 1 counts", alternative="for the counts you need "
                      "use binom_pmf(k, R, p) (its cost grows with len(k), not with R)")
    k = np.arange(R + 1)
    if exact:
        return k, _exact_pmf(R, q)
    return k, binom_pmf(k, R, q)


def _exact_pmf(R: int, q: Any) -> list[Any]:
    """``[C(R, j) q^j (1-q)^(R-j)]`` in sympy; a rational ``q = a/b`` in integer arithmetic,
    ``C(R, j) a^j (b-a)^(R-j) / b^R`` (about 30x faster than sympy powers at R = 500)."""
    import sympy as sp

    if not q.is_Rational:  # irrational or symbolic p
        return [sp.binomial(R, j) * q**j * (1 - q) ** (R - j) for j in range(R + 1)]
    a, b = int(q.p), int(q.q)
    c, den = b - a, b**R
    pa, pc = [1], [1]
    for _ in range(R):
        pa.append(pa[-1] * a)
        pc.append(pc[-1] * c)
    return [sp.Rational(math.comb(R, j) * pa[j] * pc[R - j], den) for j in range(R + 1)]


EXACT_ESTIMATORS = RegistryView("exact")
"""Read-only live view ``name -> exact form`` of the registered estimators that declare one."""


def freeze_options(opts: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Estimator options as a hashable cache key (sorted; floats as exact numbers)."""
    out = []
    for key, v in sorted(opts.items()):
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float):
            v = to_exact(v, name=key)
        try:
            hash(v)
        except TypeError:
            raise TypeError(
                f"option {key} must be a scalar (a number, or a string for named choices) in the "
                f"exact forms, got {type(v).__name__} {v!r}"
            ) from None
        out.append((key, v))
    return tuple(out)


@lru_cache(maxsize=512)
def _table_cached(
    estimator: str, R: int, frozen: tuple[tuple[str, Any], ...]
) -> tuple[tuple[sp.Expr | None, ...], tuple[sp.Expr | None, ...]]:
    import sympy as sp

    fn = estimator_spec(estimator).exact

    succ: list[sp.Expr | None] = []
    fail: list[sp.Expr | None] = []
    for k in range(R + 1):
        s, f = fn(R, k, **dict(frozen))
        succ.append(sp.sympify(s) if k >= 1 else None)
        fail.append(sp.sympify(f) if k <= R - 1 else None)
    return tuple(succ), tuple(fail)


def advantage_value_table(
    estimator: str, *, R: int, **opts: Any
) -> tuple[list[sp.Expr | None], list[sp.Expr | None]]:
    """Exact ``a_S(k)`` and ``a_F(k)`` for ``k = 0..R`` (``None`` where no such rollout exists).

    ``a_S(0)`` (no success in the group) and ``a_F(R)`` are ``None``.

    Args:
        estimator: registry name in :data:`EXACT_ESTIMATORS`.
        R: group size.
        **opts: the estimator's options (as for :func:`grpo_theory.compute_advantages`).

    Returns:
        ``(succ, fail)``: two lists of length ``R + 1`` of sympy numbers.
    """
    spec = estimator_spec(estimator)
    if spec.exact is None:
        raise ValueError(
            f"estimator {estimator!r} has no exact form; use advantage_values(..., exact=False)"
        )
    validate_options(estimator, opts)
    R = check_R(R)
    if R > EXACT_R_MAX:
        raise ValueError(
            f"R={R} exceeds EXACT_R_MAX={EXACT_R_MAX}, the largest group whose 2(R+1) exact "
            "advantage values are enumerated (a few seconds at the limit). For larger R use the "
            "closed forms (Theorem 4.1 for grpo: Var(A_i) = (R-1) p(1-p)/R, "
            "Cov(A_i, A_j) = -p(1-p)/R; grpo_theory.symbolic.linear_estimator_moments for any "
            "R and linear estimator), the Hoeffding/Bernstein bounds, or a Monte Carlo estimate "
            "(grpo-audit sims)"
        )
    if R < spec.min_group_size:
        raise ValueError(f"{estimator} needs R >= {spec.min_group_size}, got R={R}")
    s, f = _table_cached(estimator, R, freeze_options(opts))
    return list(s), list(f)


def advantage_values(
    estimator: str, *, R: int, k: int, exact: bool = True, **opts: Any
) -> tuple[Number | None, Number | None]:
    """Advantage of a success and of a failure in a group of ``R`` with ``k`` successes.

    Args:
        estimator: registry name (any registered estimator).
        R: group size.
        k: number of successes, ``0 <= k <= R``.
        exact: ``True`` (default) returns sympy numbers from the exact form; ``False`` evaluates the
            registered NumPy estimator on the reward row ``[1]*k + [0]*(R-k)`` (floats).
        **opts: the estimator's options.

    Returns:
        ``(a_S, a_F)``; ``a_S`` is ``None`` when ``k = 0`` and ``a_F`` is ``None`` when ``k = R``.

    >>> advantage_values("grpo", R=4, k=1)
    (3/4, -1/4)
    >>> advantage_values("grpo_std", R=4, k=2, ddof=0)
    (1, -1)
    """
    R = check_R(R)
    if not 0 <= k <= R:
        raise ValueError(f"need 0 <= k <= R, got k={k}, R={R}")
    if exact:
        s, f = advantage_value_table(estimator, R=R, **opts)
        return s[k], f[k]
    check_R_limit(R, limit=ARRAY_R_MAX, name="ARRAY_R_MAX", routine="advantage_values",
                  cost="a reward row of R floats",
                  alternative="the estimator's exact form, estimator_spec(estimator).exact(R, k, "
                  "**opts), gives (a_S(k), a_F(k)) for any R in O(1)")
    row = np.array([[1.0] * k + [0.0] * (R - k)])
    a = np.asarray(compute_advantages(estimator, row, **opts))[0]
    return (float(a[0]) if k >= 1 else None), (float(a[-1]) if k <= R - 1 else None)


def _law_terms(estimator: str, R: int, p: Any, opts: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``[(value, probability)]`` of ``A_1`` (unmerged), one term per (own reward, k)."""
    q = check_p(p)
    s, f = advantage_value_table(estimator, R=R, **opts)
    _, pmf = group_outcomes(R=R - 1, p=q) if R >= 2 else (None, [1])
    terms = []
    for j in range(R):
        terms.append((s[j + 1], q * pmf[j]))
        terms.append((f[j], (1 - q) * pmf[j]))
    return terms


def advantage_distribution(
    estimator: str, *, R: int, p: Any, **opts: Any
) -> list[tuple[sp.Expr, Any]]:
    """Exact law of one rollout's advantage ``A_1`` under i.i.d. Bernoulli(p) rewards.

    Args:
        estimator: registry name.
        R: group size.
        p: success probability (exact sympy/Fraction, or float).
        **opts: estimator options.

    Returns:
        ``[(value, probability)]`` sorted by value, equal values merged; values are exact sympy
        numbers, probabilities exact for exact ``p`` else floats. Probabilities sum to 1.

    >>> import sympy as sp
    >>> advantage_distribution("grpo", R=2, p=sp.Rational(1, 2))
    [(-1/2, 1/4), (0, 1/2), (1/2, 1/4)]
    """
    merged: dict[sp.Expr, Any] = {}
    for v, pr in _law_terms(estimator, check_R(R), p, opts):
        merged[v] = merged.get(v, 0) + pr
    items = sorted(merged.items(), key=lambda t: float(t[0]))
    if is_exact_number(p):
        import sympy as sp

        return [(v, sp.expand(pr)) for v, pr in items]
    return [(v, float(pr)) for v, pr in items]


def _as_floats(values: list[Any], estimator: str, opts: dict[str, Any]) -> np.ndarray:
    """Exact table values as float64 (``None`` -> 0: those terms have probability 0)."""
    try:
        return np.array([0.0 if v is None else float(v) for v in values], dtype=np.float64)
    except TypeError:
        symbolic = sorted(k for k, v in opts.items() if is_exact_number(v) and _has_symbols(v))
        raise ValueError(
            f"{estimator}: option(s) {symbolic or list(opts)} are symbolic, so the moments need an "
            "exact p (a sympy number or Fraction), not a float"
        ) from None


def _has_symbols(v: Any) -> bool:
    return bool(getattr(v, "free_symbols", None))


def _float_moments(
    estimator: str, R: int, q: float, s: list[Any], f: list[Any], opts: dict[str, Any]
) -> dict[str, Any]:
    """The float-``p`` branch of :func:`exact_advantage_moments`: the same sums over the exact
    values (converted to float64 once) with NumPy, ``O(R)`` (no sympy arithmetic per term)."""
    S, F = _as_floats(s, estimator, opts), _as_floats(f, estimator, opts)
    pmf1 = binom_pmf(np.arange(R), R - 1, q)
    cs = float(np.dot(S[1:], pmf1))
    cf = float(np.dot(F[:R], pmf1))
    m2 = float(np.dot(q * S[1:] ** 2 + (1 - q) * F[:R] ** 2, pmf1))
    mean = q * cs + (1 - q) * cf
    cov = None
    if R >= 2:
        pmf2 = binom_pmf(np.arange(R - 1), R - 2, q)
        e12 = float(
            np.dot(
                pmf2,
                q**2 * S[2:] ** 2
                + 2 * q * (1 - q) * S[1:R] * F[1:R]
                + (1 - q) ** 2 * F[: R - 1] ** 2,
            )
        )
        cov = e12 - mean**2
    return {
        "mean": mean,
        "var": m2 - mean**2,
        "cov": cov,
        "cond_mean_success": cs,
        "cond_mean_failure": cf,
    }


def exact_advantage_moments(estimator: str, *, R: int, p: Any, **opts: Any) -> dict[str, Any]:
    """Exact moments of the advantages under i.i.d. Bernoulli(p) rewards, by enumeration.

    ``mean = E[A_1]``, ``var = Var(A_1)``, ``cov = Cov(A_1, A_2)`` (needs ``R >= 2``),
    ``cond_mean_success = E[A_1 | r_1 = 1]``, ``cond_mean_failure = E[A_1 | r_1 = 0]`` (the other
    ``R - 1`` rewards still i.i.d. Bernoulli(p); defined for every ``p``).

    Args:
        estimator: registry name.
        R: group size.
        p: success probability: sympy (number or symbol) / Fraction for exact results, float else.
        **opts: estimator options.

    Returns:
        dict with keys ``mean``, ``var``, ``cov``, ``cond_mean_success``, ``cond_mean_failure``
        (sympy expressions for exact ``p``, else floats).

    >>> import sympy as sp
    >>> m = exact_advantage_moments("grpo", R=4, p=sp.Rational(1, 2))
    >>> (m["mean"], m["var"], m["cov"], m["cond_mean_success"])
    (0, 3/16, -1/16, 3/8)
    """
    R = check_R(R)
    q = check_p(p)
    s, f = advantage_value_table(estimator, R=R, **opts)
    if not is_exact_number(q):
        return _float_moments(estimator, R, q, s, f, opts)
    _, pmf1 = group_outcomes(R=R - 1, p=q) if R >= 2 else (None, [1])
    cs = sum(s[j + 1] * pmf1[j] for j in range(R))
    cf = sum(f[j] * pmf1[j] for j in range(R))
    m2 = sum((q * s[j + 1] ** 2 + (1 - q) * f[j] ** 2) * pmf1[j] for j in range(R))
    mean = q * cs + (1 - q) * cf
    var = m2 - mean**2
    if R >= 2:
        _, pmf2 = group_outcomes(R=R - 2, p=q) if R >= 3 else (None, [1])
        e12 = 0
        for j in range(R - 1):
            e12 += pmf2[j] * (
                q**2 * s[j + 2] ** 2
                + 2 * q * (1 - q) * s[j + 1] * f[j + 1]
                + (1 - q) ** 2 * f[j] ** 2
            )
        cov = e12 - mean**2
    else:
        cov = None
    out = {
        "mean": mean,
        "var": var,
        "cov": cov,
        "cond_mean_success": cs,
        "cond_mean_failure": cf,
    }
    if is_exact_number(q):
        import sympy as sp

        return {key: (None if v is None else sp.simplify(v)) for key, v in out.items()}
    return {key: (None if v is None else float(v)) for key, v in out.items()}
