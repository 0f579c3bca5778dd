"""Concentration bounds and exact tails for the group baseline and the advantages.

Classical bounds (vectorised over ``R`` and ``eps`` by NumPy broadcasting; values are *not*
clipped at 1, so a vacuous bound shows as a number ``>= 1``):

* Chebyshev, Theorem 4.1(iv) / Eq. (20) of arXiv 2606.29238, for the GRPO advantage:
  ``P(|A_i| > eps) <= Var(A_i) / eps^2 = (R-1) sigma2 / (R eps^2)``.
* Hoeffding, Appendix A.2, for the baseline ``v_hat_R`` (mean of R i.i.d. rewards in an interval
  of length ``width``): ``P(|v_hat_R - v| > eps) <= 2 exp(-2 R eps^2 / width^2)``.
* Bernstein, same event, rewards with variance ``sigma2`` and ``|r - v| <= width``:
  ``P(|v_hat_R - v| > eps) <= 2 exp(-R eps^2 / (2 sigma2 + 2 width eps / 3))``.

Exact tails for Bernoulli(p) rewards (strict ``>`` everywhere, as in the paper; the event
``|.| > eps`` is decided in exact rational arithmetic, floats read as their decimal repr):

* ``P(|v_hat_R - p| > eps) = sum_{k : |k/R - p| > eps} Bin(k; R, p)``: the project's ONE
  implementation (:func:`exact_baseline_tail_bernoulli`; the event itself, per ``k``, is
  :func:`baseline_tail_event`, which Monte Carlo estimates use too). Convention: strict ``>``
  decided exactly. ``p`` and ``eps`` are read as exact rationals: ints, Fractions and sympy
  rationals as they are, floats as the decimal they print as (``repr``: ``0.1 -> 1/10``,
  ``0.4 -> 2/5``). So at a breakpoint typed as decimals (``R = 2, eps = 0.4, p = 0.1``:
  ``|1/2 - 1/10| = 2/5``) the count ``k = 1`` is excluded and the tail is ``p^2 = 0.01``;
  a float computed as ``0.5 - 0.4 = 0.09999999999999998`` is not that breakpoint, and there
  ``k = 1`` counts (``1 - (1-p)^2 ~ 0.19``). At a breakpoint the tail equals the one-sided limit
  from the side where the count is excluded;
* its supremum over ``p in [0, 1]``: piecewise polynomial in ``p``; on each piece (between the
  breakpoints ``k/R +- eps``) it is ``F(a) + 1 - F(b - 1)`` for fixed integers ``a < b``
  (``F`` the Binomial(R, p) cdf), whose derivative
  ``R [C(R-1, b-1) p^(b-1) (1-p)^(R-b) - C(R-1, a) p^a (1-p)^(R-1-a)]`` has the single root
  ``p* = t / (1 + t)``, ``t = (C(R-1, a) / C(R-1, b-1))^(1/(b-1-a))``. Each piece is maximised
  in closed form (endpoints and ``p*``): no grid;
* ``P(|A_1| > eps)`` for any estimator with an exact form, by the enumeration of
  :mod:`grpo_theory.bernoulli`: the ONE implementation (:func:`exact_advantage_tail_bernoulli`;
  the event itself, per (own reward, successes among the others), is
  :func:`advantage_tail_event`, which Monte Carlo estimates use too).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from ._validate import (
    check_p,
    check_R,
    is_exact_number,
    to_fraction,
)
from .bernoulli import advantage_value_table, binom_pmf, freeze_options, group_outcomes
from .limits import ARRAY_R_MAX, EXACT_P_R_MAX, SUP_R_MAX, check_R_limit

__all__ = [
    "chebyshev_bound",
    "hoeffding_bound",
    "bernstein_bound",
    "baseline_tail_counts",
    "baseline_tail_event",
    "exact_baseline_tail_bernoulli",
    "sup_baseline_tail_bernoulli",
    "advantage_tail_event",
    "exact_advantage_tail_bernoulli",
]


def _arr(x: Any, name: str, *, positive: bool = False, integer: bool = False) -> np.ndarray:
    if isinstance(x, str | bytes):
        raise TypeError(f"{name} must be a number or array of numbers, got {x!r}")
    try:
        a = np.asarray(x, dtype=np.float64)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float (> 1.8e308)") from None
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number or array of numbers, got {x!r}") from None
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {x}")
    if positive and np.any(a <= 0):
        raise ValueError(f"{name} must be > 0, got {x}")
    if integer and np.any(a != np.round(a)):
        raise ValueError(f"{name} must be integer, got {x}")
    return a


def _out(v: np.ndarray) -> float | np.ndarray:
    return float(v) if v.ndim == 0 else v


def chebyshev_bound(*, R: Any, eps: Any, sigma2: Any) -> float | np.ndarray:
    """Chebyshev bound of Theorem 4.1(iv), Eq. (20): ``(R - 1) sigma2 / (R eps^2)``.

    Bounds ``P(|A_i| > eps)`` for mean-centred GRPO advantages with i.i.d. rewards of variance
    ``sigma2`` (it uses ``Var(A_i) = (R-1) sigma2 / R``).

    Args:
        R: group size(s), ``>= 1``; broadcasts with ``eps`` and ``sigma2``.
        eps: threshold(s), ``> 0``.
        sigma2: reward variance(s), ``>= 0``.

    Returns:
        float or array (broadcast shape); not clipped at 1; a bound beyond the float range is
        ``inf`` (vacuous), and ``0`` when ``R = 1`` or ``sigma2 = 0``.

    >>> chebyshev_bound(R=4, eps=0.5, sigma2=0.25)
    0.75
    """
    r = _arr(R, "R", positive=True, integer=True)
    e = _arr(eps, "eps", positive=True)
    s = _arr(sigma2, "sigma2")
    if np.any(s < 0):
        raise ValueError(f"sigma2 must be >= 0, got {sigma2}")
    # beyond the float range: inf (vacuous); the 0 * inf of R = 1 is masked by the where
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        v = np.where((r - 1) * s == 0, 0.0, ((r - 1) / r) * (s / e) / e)
    return _out(v)


def hoeffding_bound(*, R: Any, eps: Any, width: float = 1.0) -> float | np.ndarray:
    """Hoeffding bound of Appendix A.2: ``2 exp(-2 R eps^2 / width^2)``.

    Bounds ``P(|v_hat_R - v| > eps)`` for the mean of ``R`` i.i.d. rewards in an interval of
    length ``width`` (default 1: rewards in ``[0, 1]``).

    Args:
        R: group size(s), ``>= 1``.
        eps: threshold(s), ``> 0``.
        width: ``b - a`` of the reward range, ``> 0``.

    Returns:
        float or array; not clipped at 1.

    >>> round(hoeffding_bound(R=16, eps=0.3), 4)
    0.1123
    """
    r = _arr(R, "R", positive=True, integer=True)
    e = _arr(eps, "eps", positive=True)
    w = _arr(width, "width", positive=True)
    with np.errstate(over="ignore", under="ignore"):  # exp(-inf) = 0, exactly the limit
        return _out(2.0 * np.exp(-2.0 * r * (e / w) ** 2))


def bernstein_bound(*, R: Any, eps: Any, sigma2: Any, width: float = 1.0) -> float | np.ndarray:
    """Bernstein bound: ``2 exp(-R eps^2 / (2 sigma2 + 2 width eps / 3))``.

    Bounds ``P(|v_hat_R - v| > eps)`` for ``R`` i.i.d. rewards with variance ``sigma2`` and
    ``|r - v| <= width`` a.s. (rewards in ``[0, 1]``: ``width = 1`` is always valid). Sharper
    than Hoeffding when ``sigma2`` is small (easy or hard prompts).

    Args:
        R: group size(s).
        eps: threshold(s), ``> 0``.
        sigma2: reward variance(s), ``>= 0``.
        width: bound on ``|r - v|``, ``> 0``.

    Returns:
        float or array; not clipped at 1.
    """
    r = _arr(R, "R", positive=True, integer=True)
    e = _arr(eps, "eps", positive=True)
    s = _arr(sigma2, "sigma2")
    w = _arr(width, "width", positive=True)
    if np.any(s < 0):
        raise ValueError(f"sigma2 must be >= 0, got {sigma2}")
    # r eps^2 / (2 sigma2 + 2 width eps / 3) written as r eps / (2 sigma2 / eps + 2 width / 3):
    # no eps^2 to overflow or underflow; an exponent beyond the float range gives exp(-inf) = 0
    with np.errstate(over="ignore", under="ignore"):
        return _out(2.0 * np.exp(-r * (e / (2.0 * s / e + 2.0 * w / 3.0))))


def _check_eps(eps: Any) -> Any:
    """``eps >= 0`` as an exact number: a Fraction (sympy only for non-rational sympy input)."""
    try:
        e: Any = to_fraction(eps, name="eps")
    except TypeError:
        if not is_exact_number(eps):
            raise
        from ._validate import to_exact

        e = to_exact(eps, name="eps")
    if e < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return e


# A float |k/R - p| - eps farther than this from 0 has the sign of the exact difference (float
# rounding of these O(1) numbers is ~1e-16); closer ones are decided in exact arithmetic.
_FLOAT_MARGIN = 1e-9


def baseline_tail_counts(*, R: int, eps: Any, p: Any) -> tuple[int, int]:
    """The event ``|k/R - p| > eps`` (strict) as two cut points, decided exactly, in ``O(1)``.

    ``|k/R - p| > eps`` iff ``k < R (p - eps)`` or ``k > R (p + eps)``, i.e. ``k <= a`` or
    ``k >= b`` with ``a = ceil(R (p - eps)) - 1`` and ``b = floor(R (p + eps)) + 1``, computed in
    exact rationals (``p`` and ``eps`` read as in the module docstring: floats as their decimal
    repr; irrational sympy numbers through sympy's exact ``ceiling``/``floor``). ``a = -1``: no
    low count is in the event; ``b = R + 1``: no high count is.

    Args:
        R: group size, ``>= 1`` (any size: nothing of size R is built).
        eps: threshold, ``>= 0``.
        p: success probability in ``[0, 1]`` (number; not a symbol).

    Returns:
        ``(a, b)`` with ``-1 <= a < b <= R + 1``.

    >>> baseline_tail_counts(R=2, eps=0.4, p=0.1)  # |1/2 - 1/10| = 2/5 is not > 2/5
    (-1, 2)
    >>> baseline_tail_counts(R=10**9, eps=0.1, p=0.5)
    (399999999, 600000001)
    """
    R = check_R(R)
    e = _check_eps(eps)
    q = check_p(p)
    try:
        qf, ef = to_fraction(q, name="p"), to_fraction(e, name="eps")
        a, b = math.ceil(R * (qf - ef)) - 1, math.floor(R * (qf + ef)) + 1
    except TypeError:  # irrational sympy p or eps
        import sympy as sp

        qs, es = sp.sympify(q), sp.sympify(e)
        if not (qs.is_number and es.is_number):
            raise TypeError(f"p and eps must be numbers, got p={p!r}, eps={eps!r}") from None
        a, b = int(sp.ceiling(R * (qs - es))) - 1, int(sp.floor(R * (qs + es))) + 1
    return max(a, -1), min(b, R + 1)


def baseline_tail_event(*, R: int, eps: Any, p: Any) -> np.ndarray:
    """The counts in the event ``|k/R - p| > eps`` (strict), decided exactly: bool ``[R + 1]``.

    ``mask[k] = k <= a or k >= b`` with the exact cut points of :func:`baseline_tail_counts`
    (``p`` and ``eps`` read as exact rationals, floats as their decimal repr; see the module
    docstring). ``R`` is capped at :data:`~grpo_theory.limits.ARRAY_R_MAX` (the mask has ``R + 1``
    entries); :func:`baseline_tail_counts` describes the same event for any ``R``.

    Args:
        R: group size, ``>= 1``.
        eps: threshold, ``>= 0``.
        p: success probability in ``[0, 1]`` (number; not a symbol).

    Returns:
        ``mask`` with ``mask[k]`` True iff ``|k/R - p| > eps``.

    >>> baseline_tail_event(R=2, eps=0.4, p=0.1).tolist()  # |1/2 - 1/10| = 2/5 is not > 2/5
    [False, False, True]
    """
    R = check_R(R)
    check_R_limit(R, limit=ARRAY_R_MAX, name="ARRAY_R_MAX", routine="baseline_tail_event",
                  cost="a mask of R + 1 counts",
                  alternative="baseline_tail_counts gives the same event as two cut points "
                  "(k <= a or k >= b) for any R")
    a, b = baseline_tail_counts(R=R, eps=eps, p=p)
    k = np.arange(R + 1)
    return (k <= a) | (k >= b)


def exact_baseline_tail_bernoulli(*, R: int, eps: Any, p: Any) -> Any:
    """Exact ``P(|v_hat_R - p| > eps)``, ``v_hat_R = k / R``, ``k ~ Binomial(R, p)`` (App. A.2).

    ``= P(k <= a) + P(k >= b)`` with the exact cut points ``(a, b)`` of
    :func:`baseline_tail_counts` (strict ``>``; floats read as their decimal repr). A float ``p``
    is answered for any ``R`` in ``O(1)``: ``bdtr(a, R, p) + bdtrc(b - 1, R, p)`` (regularised
    incomplete beta functions, relative accuracy ~1e-15; a tail below the float range reads 0).
    An exact ``p`` (sympy/Fraction) sums the exact Binomial law, ``R <= EXACT_P_R_MAX``.

    Args:
        R: group size, ``>= 1``.
        eps: threshold, ``>= 0`` (floats read as their decimal: ``0.3 -> 3/10``).
        p: success probability; exact (sympy/Fraction) gives an exact result, float a float.

    Returns:
        The probability (sympy number for exact ``p``, else float).

    >>> from fractions import Fraction
    >>> exact_baseline_tail_bernoulli(R=2, eps=0.3, p=Fraction(1, 2))
    1/2
    >>> round(exact_baseline_tail_bernoulli(R=2, eps=0.4, p=0.1), 15)  # only k = 2: 0.1^2
    0.01
    """
    R = check_R(R)
    a, b = baseline_tail_counts(R=R, eps=eps, p=p)
    q = check_p(p)
    if is_exact_number(q):
        import sympy as sp

        check_R_limit(R, limit=EXACT_P_R_MAX, name="EXACT_P_R_MAX",
                      routine="exact_baseline_tail_bernoulli", cost="an exact sum of R + 1 "
                      "rational terms", alternative="pass p as a float (O(1) for any R, "
                      "regularised incomplete beta), or use hoeffding_bound")
        _, pmf = group_outcomes(R=R, p=q)
        hit = [*range(a + 1), *range(b, R + 1)]
        return sp.simplify(sum((pmf[k] for k in hit), sp.Integer(0)))
    from scipy.special import bdtr, bdtrc

    left = float(bdtr(a, R, q)) if a >= 0 else 0.0
    right = float(bdtrc(b - 1, R, q)) if b <= R else 0.0  # P(k > b - 1); b >= 1 as p + eps >= 0
    return min(1.0, left + right)


def _piece_value(a: int, b: int, R: int, p: Fraction | float) -> float:
    """``P(k <= a) + P(k >= b)`` for ``k ~ Bin(R, p)`` (summed pmf terms, no ``1 - cdf``).

    Exact in rationals (then correctly rounded) for a rational ``p`` (the breakpoints); float
    pmf terms for a float ``p`` (the stationary point, irrational in general).
    """
    ks = [k for k in range(R + 1) if k <= a or k >= b]
    if isinstance(p, Fraction):
        return float(min(Fraction(1), sum(
            (math.comb(R, k) * p**k * (1 - p) ** (R - k) for k in ks), Fraction(0))))
    pmf = binom_pmf(np.arange(R + 1), R, p)
    return float(min(1.0, pmf[: max(a + 1, 0)].sum() + pmf[max(b, 0) :].sum()))


# Up to this R the pieces are evaluated in exact rationals at the breakpoints; above it every
# candidate is evaluated at once in float64 (regularised incomplete beta), O(R) memory and time.
_SUP_EXACT_R = 64


def _sup_tail_vectorised(R: int, e: Fraction) -> tuple[float, float]:
    """The piecewise maximisation of :func:`sup_baseline_tail_bernoulli`, vectorised.

    Breakpoints ``k/R +- eps`` are integers over the common denominator ``D = R * den(eps)``, so
    the pieces and their strict-event counts ``(a, b)`` are found in exact integer arithmetic;
    the stationary point uses log binomials (``gammaln``: no overflow for any R) and each
    candidate's tail ``P(k <= a) + P(k >= b)`` is ``bdtr(a) + bdtrc(b - 1)`` in float64. Tails
    below the float range read as 0.
    """
    from scipy.special import bdtr, bdtrc, expit, gammaln

    en, ed = e.numerator, e.denominator
    D = R * ed
    if 4 * D + 4 * R * en >= 2**62:  # pragma: no cover - needs a pathological eps denominator
        raise ValueError(f"eps={e} has too large a denominator for R={R}")
    k = np.arange(R + 1, dtype=np.int64)
    cand = np.concatenate([k * ed - en * R, k * ed + en * R, np.array([0, D], dtype=np.int64)])
    grid = np.unique(cand[(cand >= 0) & (cand <= D)])
    lo, hi = grid[:-1], grid[1:]
    M = lo + hi  # the midpoint is M / (2 D); R * mid = M / (2 ed)
    a = -((-(M - 2 * R * en)) // (2 * ed)) - 1  # ceil(R (mid - eps)) - 1
    b = (M + 2 * R * en) // (2 * ed) + 1  # floor(R (mid + eps)) + 1
    a = np.minimum(a, R)
    b = np.maximum(b, 0)
    full = a >= b - 1
    if full.any():  # every count is in the event on this piece: the tail is 1
        i = int(np.flatnonzero(full)[0])
        return 1.0, float(M[i] / (2 * D))
    plo, phi = lo / D, hi / D
    inner = (a >= 0) & (b <= R)
    ai, bi = np.where(inner, a, 0), np.where(inner, b, 1)
    n = R - 1

    def logc(j: np.ndarray) -> np.ndarray:
        return gammaln(n + 1.0) - gammaln(j + 1.0) - gammaln(n - j + 1.0)

    d = np.maximum(bi - 1 - ai, 1)
    ps = expit((logc(ai) - logc(bi - 1)) / d)  # t / (1 + t), t = (C(n,a)/C(n,b-1))^(1/d)
    ok = inner & (bi - 1 - ai > 0) & (plo < ps) & (ps < phi)
    P = np.concatenate([plo, phi, ps[ok]])
    A = np.concatenate([a, a, a[ok]])
    B = np.concatenate([b, b, b[ok]])
    with np.errstate(all="ignore"):
        left = np.where(A >= 0, bdtr(np.maximum(A, 0), R, P), 0.0)
        right = np.where(B <= R, bdtrc(np.maximum(B - 1, 0), R, P), 0.0)
        right = np.where(B <= 0, 1.0, right)
    val = np.minimum(1.0, left + right)
    best = float(val.max())
    tied = np.flatnonzero(val >= best / (1 + 1e-14))  # the first maximum, as the exact path
    j = int(tied[np.argmin(P[tied])])
    return best, float(P[j])


def sup_baseline_tail_bernoulli(*, R: int, eps: Any) -> tuple[float, float]:
    """``sup_{p in [0, 1]} P(|v_hat_R - p| > eps)`` for Bernoulli rewards, and where it is reached.

    Exact piecewise maximisation (see the module docstring): on each piece between consecutive
    breakpoints ``k/R +- eps`` the tail is ``P(k <= a) + P(k >= b)`` with ``a, b`` fixed; its
    maximum over the closed piece is at an endpoint or at the unique stationary point
    ``p* = t/(1+t)``, ``t = (C(R-1,a)/C(R-1,b-1))^(1/(b-1-a))``. Because the event is strict, at
    a breakpoint the tail equals the limit from one side only, so the supremum can be a limit
    ``p -> argmax`` rather than a value attained at ``argmax``.

    Args:
        R: group size, ``>= 1``.
        eps: threshold, ``>= 0``.

    Returns:
        ``(value, argmax_p)`` as floats.

    >>> v, p = sup_baseline_tail_bernoulli(R=2, eps=0.3)
    >>> round(v, 6), round(p, 6)
    (0.58, 0.3)
    """
    R = check_R(R)
    e = _check_eps(eps)
    if not isinstance(e, Fraction):
        raise TypeError(f"sup_baseline_tail_bernoulli needs a rational eps, got {eps!r}")
    if e >= 1:
        return 0.0, 0.0
    if R > SUP_R_MAX:
        raise ValueError(
            f"R={R} exceeds SUP_R_MAX={SUP_R_MAX} for sup_baseline_tail_bernoulli (about 4R "
            "pieces are maximised); for larger R the supremum is below Hoeffding's "
            f"2 exp(-2 R eps^2) = {2 * math.exp(-2 * R * float(e) ** 2):.3g}: use hoeffding_bound"
        )
    if R > _SUP_EXACT_R:
        return _sup_tail_vectorised(R, e)
    pts = {Fraction(0), Fraction(1)}
    for k in range(R + 1):
        for c in (Fraction(k, R) - e, Fraction(k, R) + e):
            if 0 < c < 1:
                pts.add(c)
    grid = sorted(pts)
    best, arg = -1.0, 0.0
    for lo, hi in zip(grid[:-1], grid[1:], strict=True):
        mid = (lo + hi) / 2
        # strict event at the midpoint: k/R < mid - eps  or  k/R > mid + eps
        a = math.ceil(R * (mid - e)) - 1  # largest k with k < R (mid - eps)
        b = math.floor(R * (mid + e)) + 1  # smallest k with k > R (mid + eps)
        a = min(a, R)
        b = max(b, 0)
        if a >= b - 1:  # every k is in the event
            val, where = 1.0, float(mid)
            if val > best:
                best, arg = val, where
            continue
        cands: list[Fraction | float] = [lo, hi]
        if a >= 0 and b <= R:
            d = b - 1 - a
            t = (math.comb(R - 1, a) / math.comb(R - 1, b - 1)) ** (1.0 / d)
            ps = t / (1.0 + t)
            if float(lo) < ps < float(hi):
                cands.append(ps)
        for c in cands:
            val = _piece_value(a, b, R, c)
            if best < 0 or val > best * (1 + 1e-14):  # relative: tails far below 1 count
                best, arg = val, float(c)
    return float(best), float(arg)


def advantage_tail_event(
    *,
    R: int,
    eps: Any,
    estimator: str = "grpo",
    estimator_options: dict[str, Any] | None = None,
    **opts: Any,
) -> np.ndarray:
    """The binary groups in the event ``|A_1| > eps`` (strict), decided exactly: bool ``[2, R]``.

    ``mask[r1, j]`` is True iff rollout 1, with own reward ``r1`` and ``j`` successes among the
    other ``R - 1`` rollouts, has ``|A_1| > eps``: ``|a_S(j + 1)| > eps`` for ``r1 = 1`` and
    ``|a_F(j)| > eps`` for ``r1 = 0``, with the exact values of
    :func:`grpo_theory.bernoulli.advantage_value_table` (seed paper Thm 4.1 (iv), Eq. 20: the
    event whose probability the Chebyshev bound controls). ``eps`` is read as an exact rational
    (floats as their decimal repr, see the module docstring), so ties are decided exactly. The
    one rule of the advantage-tail event: :func:`exact_advantage_tail_bernoulli` sums it against
    the Binomial law and Monte Carlo estimates index it by (own reward, successes among the
    others) of each sampled rollout. It does not depend on ``p``.

    Args:
        R: group size.
        eps: threshold, ``>= 0``.
        estimator: registry name of an estimator with an exact form (default ``"grpo"``).
        estimator_options: estimator options as a dict (grpo_std's own ``eps`` goes here).
        **opts: further estimator options (merged with ``estimator_options``).

    Returns:
        ``[2, R]`` bool array indexed ``[own reward, successes among the others]``.

    >>> from fractions import Fraction
    >>> advantage_tail_event(R=3, eps=Fraction(1, 3)).tolist()  # grpo: A_1 = r_1 - (r_1 + j)/3
    [[False, False, True], [True, False, False]]
    >>> advantage_tail_event(R=3, eps=1/3).tolist()  # 0.3333333333333333 < 1/3: ties counted
    [[False, True, True], [True, True, False]]
    """
    R = check_R(R)
    e = _check_eps(eps)
    merged = {**(estimator_options or {}), **opts}
    advantage_value_table(estimator, R=R, **merged)  # validates estimator, options and R
    return np.array(_tail_event_cached(estimator, R, freeze_options(merged), e), dtype=bool)


@lru_cache(maxsize=1024)
def _tail_event_cached(
    estimator: str, R: int, frozen: tuple[tuple[str, Any], ...], e: Any
) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """:func:`advantage_tail_event`'s comparisons (sympy, slow for irrational values), cached:
    the event does not depend on ``p``, so a scan over ``p`` decides it once."""
    s, f = advantage_value_table(estimator, R=R, **dict(frozen))
    return (tuple(bool(abs(f[j]) > e) for j in range(R)),
            tuple(bool(abs(s[j + 1]) > e) for j in range(R)))


def exact_advantage_tail_bernoulli(
    *,
    R: int,
    eps: Any,
    p: Any,
    estimator: str = "grpo",
    estimator_options: dict[str, Any] | None = None,
    **opts: Any,
) -> Any:
    """Exact ``P(|A_1| > eps)`` for i.i.d. Bernoulli(p) rewards and any registered estimator.

    ``= p sum_{j: |a_S(j+1)| > eps} Bin(j; R-1, p) + (1-p) sum_{j: |a_F(j)| > eps} Bin(j; R-1, p)``
    with the event decided exactly by :func:`advantage_tail_event` (the exact values ``a_S, a_F``
    of :func:`grpo_theory.bernoulli.advantage_value_table`; strict ``>``, floats read as their
    decimal repr).

    Args:
        R: group size.
        eps: threshold, ``>= 0``.
        p: success probability (exact sympy/Fraction or float).
        estimator: registry name (default ``"grpo"``).
        estimator_options: estimator options as a dict; needed for grpo_std's own ``eps``
            (which would clash with the threshold ``eps``): ``{"eps": 1e-4}``.
        **opts: further estimator options (merged with ``estimator_options``).

    Returns:
        The probability (exact for exact ``p``, else float).

    >>> from fractions import Fraction
    >>> exact_advantage_tail_bernoulli(R=4, eps=0.3, p=Fraction(1, 2))
    1/2
    >>> exact_advantage_tail_bernoulli(R=3, eps=Fraction(1, 3), p=0.5)  # only |A_1| = 2/3
    0.25
    """
    R = check_R(R)
    q = check_p(p)
    mask = advantage_tail_event(
        R=R, eps=eps, estimator=estimator, estimator_options=estimator_options, **opts
    )
    _, pmf = group_outcomes(R=R - 1, p=q) if R >= 2 else (None, [1])
    total: Any = 0
    for j in range(R):
        if mask[1, j]:
            total += q * pmf[j]
        if mask[0, j]:
            total += (1 - q) * pmf[j]
    if is_exact_number(p):
        import sympy as sp

        return sp.simplify(sp.sympify(total))
    return float(total)
