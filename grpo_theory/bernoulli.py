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
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import sympy as sp

from .advantages import ESTIMATORS, compute_advantages

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


def to_exact(x: Any, *, name: str = "value") -> sp.Expr:
    """Convert ``x`` to an exact sympy number: ints and Fractions exactly, floats by their repr.

    ``0.1`` becomes ``1/10`` (the decimal the user typed), not the binary double.

    >>> to_exact(0.1)
    1/10
    """
    if isinstance(x, sp.Basic):
        return x
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a number, got bool")
    if isinstance(x, int | np.integer):
        return sp.Integer(int(x))
    if isinstance(x, Fraction):
        return sp.Rational(x.numerator, x.denominator)
    if isinstance(x, float | np.floating):
        if not math.isfinite(float(x)):
            raise ValueError(f"{name} must be finite, got {x}")
        return sp.Rational(repr(float(x)))
    raise TypeError(f"{name} must be a number or sympy expression, got {type(x)!r}")


def _is_exact_p(p: Any) -> bool:
    return isinstance(p, sp.Basic | Fraction)


def _check_R(R: Any, minimum: int = 1) -> int:
    if isinstance(R, bool) or not isinstance(R, int | np.integer):
        raise TypeError(f"R must be an int, got {type(R)!r}")
    if R < minimum:
        raise ValueError(f"R must be >= {minimum}, got R={R}")
    return int(R)


def _check_p(p: Any) -> Any:
    """Return ``p`` as sympy (exact input) or float; raise if a number outside [0, 1]."""
    if _is_exact_p(p):
        q = to_exact(p, name="p")
        if q.is_number and not (0 <= q <= 1):
            raise ValueError(f"p must be in [0, 1], got {p}")
        return q
    q = float(p)
    if not math.isfinite(q) or not 0.0 <= q <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return q


def binom_pmf(k: Any, R: int, p: Any) -> np.ndarray:
    """Float ``C(R, k) p^k (1-p)^(R-k)``, broadcasting ``k`` and ``p``; log-space, no overflow.

    (scipy's ``binom.pmf`` raises OverflowError for subnormal ``p`` such as ``2.2e-308``.)

    >>> binom_pmf(np.arange(3), 2, 0.5).tolist()
    [0.25, 0.5, 0.25]
    """
    from scipy.special import gammaln

    k = np.asarray(k, dtype=np.float64)
    q = np.asarray(p, dtype=np.float64)
    k, q = np.broadcast_arrays(k, q)
    inside = (k >= 0) & (k <= R)
    logc = gammaln(R + 1.0) - gammaln(np.where(inside, k, 0) + 1.0)
    logc -= gammaln(R - np.where(inside, k, 0) + 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.where(k > 0, k * np.log(np.where(q > 0, q, 1.0)), 0.0)
        lq = np.where(R - k > 0, (R - k) * np.log1p(-np.where(q < 1, q, 0.0)), 0.0)
        out = np.exp(logc + lp + lq)
    out = np.where((q == 0) & (k > 0), 0.0, out)
    out = np.where((q == 1) & (k < R), 0.0, out)
    return np.where(inside, out, 0.0)


def group_outcomes(*, R: int, p: Any) -> tuple[np.ndarray, list[Any] | np.ndarray]:
    """Support and law of the success count ``k ~ Binomial(R, p)`` of one group.

    Args:
        R: group size, ``R >= 1``.
        p: success probability in ``[0, 1]``; a sympy number/symbol or Fraction gives exact pmf.

    Returns:
        ``(k, pmf)``: ``k = [0..R]`` (int array) and ``pmf[k] = C(R, k) p^k (1-p)^(R-k)``, a list
        of sympy expressions for exact ``p``, else a float64 array.

    >>> group_outcomes(R=2, p=sp.Rational(1, 3))[1]
    [4/9, 4/9, 1/9]
    """
    R = _check_R(R)
    q = _check_p(p)
    k = np.arange(R + 1)
    if isinstance(q, sp.Basic):
        pmf = [sp.binomial(R, j) * q**j * (1 - q) ** (R - j) for j in range(R + 1)]
        return k, pmf
    return k, binom_pmf(k, R, q)


# --- exact advantage values per estimator -------------------------------------------------------
def _exact_centred(R: int, k: int) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    m = sp.Rational(k, R)
    return m, 1 - m, -m


def _ex_grpo(R: int, k: int, **opts: Any) -> tuple[sp.Expr, sp.Expr]:
    _no_opts("grpo", opts)
    _, cs, cf = _exact_centred(R, k)
    return cs, cf


def _ex_dr_grpo(R: int, k: int, **opts: Any) -> tuple[sp.Expr, sp.Expr]:
    _no_opts("dr_grpo", opts)
    return _ex_grpo(R, k)


def _ex_rloo(R: int, k: int, **opts: Any) -> tuple[sp.Expr, sp.Expr]:
    _no_opts("rloo", opts)
    _, cs, cf = _exact_centred(R, k)
    f = sp.Rational(R, R - 1)
    return f * cs, f * cf


def _ex_reinforce(R: int, k: int, *, baseline: Any = 0.0) -> tuple[sp.Expr, sp.Expr]:
    b = to_exact(baseline, name="baseline")
    return 1 - b, -b


def _ex_grpo_std(
    R: int,
    k: int,
    *,
    ddof: int = 1,
    eps: Any = 0.0,
    std_scope: str = "group",
    on_zero_std: str = "zero",
) -> tuple[sp.Expr, sp.Expr]:
    if std_scope != "group":
        raise ValueError(
            "std_scope='batch' depends on the other groups of the batch; exact enumeration of one "
            "group supports std_scope='group' only"
        )
    if ddof < 0 or R < max(2, ddof + 1):
        raise ValueError(
            f"grpo_std needs ddof >= 0 and R >= max(2, ddof+1), got R={R}, ddof={ddof}"
        )
    e = to_exact(eps, name="eps")
    if e < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if on_zero_std not in ("zero", "raise"):
        raise ValueError(f"on_zero_std must be 'zero' or 'raise', got {on_zero_std!r}")
    _, cs, cf = _exact_centred(R, k)
    if k in (0, R):
        if on_zero_std == "raise" and e == 0:
            raise ValueError(
                f"grpo_std: the group with k={k} of R={R} successes has zero variance and eps=0: "
                "0/0. Use on_zero_std='zero' (advantage 0) or eps>0."
            )
        return sp.Integer(0), sp.Integer(0)
    std = sp.sqrt(sp.Rational(k * (R - k), R) / (R - ddof))
    return cs / (std + e), cf / (std + e)


def _ex_asym(R: int, k: int, *, delta: Any = 1.0) -> tuple[sp.Expr, sp.Expr]:
    d = to_exact(delta, name="delta")
    if not d > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    _, cs, cf = _exact_centred(R, k)
    return cs, (cf if cf >= 0 else cf / d)


def _power_factor(R: int, k: int, alpha: Any) -> sp.Expr:
    a = to_exact(alpha, name="alpha")
    base = 1 - sp.Rational(k, R)
    return sp.Integer(0) if base == 0 else base ** (a - 1)


def _ex_power(R: int, k: int, *, alpha: Any = 1.0) -> tuple[sp.Expr, sp.Expr]:
    _, cs, cf = _exact_centred(R, k)
    f = _power_factor(R, k, alpha)
    return f * cs, f * cf


def _ex_fade(R: int, k: int, *, alpha: Any = 1.0, delta: Any = 1.0) -> tuple[sp.Expr, sp.Expr]:
    d = to_exact(delta, name="delta")
    if not d > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    s, f = _ex_power(R, k, alpha=alpha)
    return s, (f if f >= 0 else f / d)


def _no_opts(name: str, opts: dict[str, Any]) -> None:
    if opts:
        raise TypeError(f"{name} takes no options, got {sorted(opts)}")


EXACT_ESTIMATORS: dict[str, Callable[..., tuple[sp.Expr, sp.Expr]]] = {
    "grpo": _ex_grpo,
    "dr_grpo": _ex_dr_grpo,
    "rloo": _ex_rloo,
    "reinforce": _ex_reinforce,
    "grpo_std": _ex_grpo_std,
    "asym_grpo": _ex_asym,
    "power_alpha": _ex_power,
    "fade": _ex_fade,
}
"""Estimators with an exact (sympy) form of ``(a_S(k), a_F(k))``: every registered one."""


def _freeze(opts: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = []
    for key, v in sorted(opts.items()):
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float):
            v = to_exact(v, name=key)
        out.append((key, v))
    return tuple(out)


@lru_cache(maxsize=512)
def _table_cached(
    estimator: str, R: int, frozen: tuple[tuple[str, Any], ...]
) -> tuple[tuple[sp.Expr | None, ...], tuple[sp.Expr | None, ...]]:
    fn = EXACT_ESTIMATORS[estimator]
    succ: list[sp.Expr | None] = []
    fail: list[sp.Expr | None] = []
    for k in range(R + 1):
        s, f = fn(R, k, **dict(frozen))
        succ.append(sp.sympify(s) if k >= 1 else None)
        fail.append(sp.sympify(f) if k <= R - 1 else None)
    return tuple(succ), tuple(fail)


def _min_R(estimator: str, opts: dict[str, Any]) -> int:
    if estimator == "reinforce":
        return 1
    if estimator == "grpo_std":
        return max(2, int(opts.get("ddof", 1)) + 1)
    return 2


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
    if estimator not in ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}"
        )
    if estimator not in EXACT_ESTIMATORS:
        raise ValueError(
            f"estimator {estimator!r} has no exact form; use advantage_values(..., exact=False)"
        )
    R = _check_R(R)
    if R < _min_R(estimator, opts):
        raise ValueError(f"{estimator} needs R >= {_min_R(estimator, opts)}, got R={R}")
    s, f = _table_cached(estimator, R, _freeze(opts))
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
    R = _check_R(R)
    if not 0 <= k <= R:
        raise ValueError(f"need 0 <= k <= R, got k={k}, R={R}")
    if exact:
        s, f = advantage_value_table(estimator, R=R, **opts)
        return s[k], f[k]
    row = np.array([[1.0] * k + [0.0] * (R - k)])
    a = np.asarray(compute_advantages(estimator, row, **opts))[0]
    return (float(a[0]) if k >= 1 else None), (float(a[-1]) if k <= R - 1 else None)


def _law_terms(estimator: str, R: int, p: Any, opts: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``[(value, probability)]`` of ``A_1`` (unmerged), one term per (own reward, k)."""
    q = _check_p(p)
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

    >>> advantage_distribution("grpo", R=2, p=sp.Rational(1, 2))
    [(-1/2, 1/4), (0, 1/2), (1/2, 1/4)]
    """
    merged: dict[sp.Expr, Any] = {}
    for v, pr in _law_terms(estimator, _check_R(R), p, opts):
        merged[v] = merged.get(v, 0) + pr
    items = sorted(merged.items(), key=lambda t: float(t[0]))
    if _is_exact_p(p):
        return [(v, sp.expand(pr)) for v, pr in items]
    return [(v, float(pr)) for v, pr in items]


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

    >>> m = exact_advantage_moments("grpo", R=4, p=sp.Rational(1, 2))
    >>> (m["mean"], m["var"], m["cov"], m["cond_mean_success"])
    (0, 3/16, -1/16, 3/8)
    """
    R = _check_R(R)
    q = _check_p(p)
    s, f = advantage_value_table(estimator, R=R, **opts)
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
    if isinstance(q, sp.Basic):
        return {key: (None if v is None else sp.simplify(v)) for key, v in out.items()}
    return {key: (None if v is None else float(v)) for key, v in out.items()}
