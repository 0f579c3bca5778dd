"""Bound/tail tables: rows ``R``, columns ``eps``, one probability (or bound) per cell.

Cells ``>= 1`` are flagged *vacuous* (a probability bound that says nothing). This module computes
the numbers (:class:`BoundTable` is data); rendering as Markdown, CSV and LaTeX lives above the
core, in :mod:`grpo_audit.render`. Kinds (:data:`TABLE_KINDS`):

* ``hoeffding``: ``2 exp(-2 R eps^2 / width^2)`` (Appendix A.2); option ``width``.
* ``chebyshev``: ``(R-1) sigma2 / (R eps^2)`` (Thm 4.1(iv), Eq. 20); ``sigma2`` or ``p``.
* ``bernstein``: ``2 exp(-R eps^2 / (2 sigma2 + 2 width eps / 3))``; ``sigma2`` or ``p``,
  ``width``.
* ``exact-baseline-tail``: ``P(|v_hat_R - p| > eps)``, or its sup over ``p`` when ``p`` is omitted.
* ``exact-advantage-tail``: ``P(|A_1| > eps)`` for Bernoulli(p) rewards; ``p``, ``estimator`` and
  its options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ._validate import check_R
from .bounds import (
    bernstein_bound,
    chebyshev_bound,
    exact_advantage_tail_bernoulli,
    exact_baseline_tail_bernoulli,
    hoeffding_bound,
    sup_baseline_tail_bernoulli,
)

__all__ = ["TABLE_KINDS", "BoundTable", "bound_table"]

TABLE_KINDS: dict[str, str] = {
    "hoeffding": "Hoeffding bound 2 exp(-2 R eps^2 / width^2) on P(|v_hat_R - v| > eps) (App. A.2)",
    "chebyshev": "Chebyshev bound (R-1) sigma2 / (R eps^2) on P(|A_i| > eps) (Thm 4.1(iv))",
    "bernstein": "Bernstein bound 2 exp(-R eps^2 / (2 sigma2 + 2 width eps / 3)) "
    "on P(|v_hat_R - v| > eps)",
    "exact-baseline-tail": "exact P(|v_hat_R - p| > eps) for Bernoulli(p) rewards "
    "(sup over p if p omitted)",
    "exact-advantage-tail": "exact P(|A_1| > eps) for Bernoulli(p) rewards and a chosen estimator",
}


@dataclass(frozen=True)
class BoundTable:
    """One table: ``values[i, j]`` is the cell for ``R_values[i]`` and ``eps_values[j]``.

    Attributes:
        kind: the table kind (a key of :data:`TABLE_KINDS`).
        title: one-line description, with the parameters.
        event: column header stem, e.g. ``"P(|v_hat_R - v| > eps)"``.
        R_values: row labels.
        eps_values: column labels.
        values: ``[len(R_values), len(eps_values)]`` float array.
        params: the parameters that produced the table.
        extra: optional per-cell arrays (e.g. ``argmax_p`` of the sup table).
        digits: default significant digits when rendering (used by :mod:`grpo_audit.render`).
        is_bound: True for upper bounds (a cell >= 1 is *vacuous*), False for exact
            probabilities (a cell = 1 is an event that is certain, flagged ``(= 1)``).
    """

    kind: str
    title: str
    event: str
    R_values: tuple[int, ...]
    eps_values: tuple[float, ...]
    values: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    digits: int = 3
    is_bound: bool = True

    @property
    def vacuous(self) -> np.ndarray:
        """Bool mask of cells ``>= 1`` (a bound that says nothing)."""
        return self.values >= 1.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "kind": self.kind,
            "title": self.title,
            "event": self.event,
            "R_values": list(self.R_values),
            "eps_values": list(self.eps_values),
            "values": self.values.tolist(),
            "vacuous": self.vacuous.tolist(),
            "params": {
                k: (v if isinstance(v, int | float | str | type(None)) else str(v))
                for k, v in self.params.items()
            },
            "extra": {k: v.tolist() for k, v in self.extra.items()},
        }


def _sigma2(sigma2: float | None, p: float | None, kind: str) -> tuple[float, str]:
    if (sigma2 is None) == (p is None):
        raise ValueError(f"{kind} needs exactly one of sigma2 or p (sigma2 = p (1 - p))")
    if p is not None:
        if not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p}")
        return p * (1 - p), f"p={p:g}, sigma2=p(1-p)={p * (1 - p):g}"
    assert sigma2 is not None
    return float(sigma2), f"sigma2={sigma2:g}"


class _Cells(NamedTuple):
    """The computed part of a :class:`BoundTable`."""

    values: np.ndarray
    title: str
    event: str
    params: dict[str, Any]
    extra: dict[str, np.ndarray]


def _check_grid(R_values: Sequence[int], eps_values: Sequence[float]
                ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The rows (group sizes, integers in ``[1, 2^53]``) and columns (``eps > 0``), checked."""
    Rs = tuple(check_R(r) for r in R_values)  # 2.5 is an error, never the row R = 2
    big = [r for r in Rs if r > 2**53]
    if big:
        raise ValueError(
            f"R values must be <= 2^53 (tables are computed in float64), got one of "
            f"{len(str(big[0]))} digits"
        )
    es = tuple(float(e) for e in eps_values)
    if not Rs or not es:
        raise ValueError("R_values and eps_values must be non-empty")
    if any(r < 1 for r in Rs):
        raise ValueError(f"every R must be >= 1, got {Rs}")
    if any(not e > 0 for e in es):
        raise ValueError(f"every eps must be > 0, got {es}")
    return Rs, es


def _closed_form_cells(kind: str, Rs: tuple[int, ...], es: tuple[float, ...], *,
                       sigma2: float | None, p: float | None, width: float) -> _Cells:
    """Hoeffding, Chebyshev (Thm 4.1 (iv)) or Bernstein on the grid."""
    Rg = np.array(Rs, dtype=float)[:, None]
    Eg = np.array(es, dtype=float)[None, :]
    if kind == "hoeffding":
        vals = np.asarray(hoeffding_bound(R=Rg, eps=Eg, width=width))
        title = (
            f"Hoeffding bound on P(|v_hat_R - v| > eps), rewards in an interval of width {width:g}"
        )
        return _Cells(vals, title, "P(|v_hat_R - v| > eps)", {"width": width}, {})
    s2, desc = _sigma2(sigma2, p, kind)
    if kind == "chebyshev":
        vals = np.asarray(chebyshev_bound(R=Rg, eps=Eg, sigma2=s2))
        title = f"Chebyshev bound (Thm 4.1(iv)) on P(|A_i| > eps), {desc}"
        return _Cells(vals, title, "P(|A_i| > eps)", {"sigma2": s2, "p": p}, {})
    vals = np.asarray(bernstein_bound(R=Rg, eps=Eg, sigma2=s2, width=width))
    title = f"Bernstein bound on P(|v_hat_R - v| > eps), {desc}, width {width:g}"
    return _Cells(vals, title, "P(|v_hat_R - v| > eps)",
                  {"sigma2": s2, "p": p, "width": width}, {})


def _exact_baseline_cells(Rs: tuple[int, ...], es: tuple[float, ...], *, p: float | None
                          ) -> _Cells:
    """Exact Bernoulli tails of the baseline: at ``p``, or the sup over ``p`` (``p=None``)."""
    vals = np.zeros((len(Rs), len(es)))
    extra: dict[str, np.ndarray] = {}
    if p is None:
        arg = np.zeros_like(vals)
        for i, R in enumerate(Rs):
            for j, e in enumerate(es):
                vals[i, j], arg[i, j] = sup_baseline_tail_bernoulli(R=R, eps=e)
        extra["argmax_p"] = arg
        title = "Exact sup over p of P(|v_hat_R - p| > eps), Bernoulli(p) rewards"
    else:
        for i, R in enumerate(Rs):
            for j, e in enumerate(es):
                vals[i, j] = exact_baseline_tail_bernoulli(R=R, eps=e, p=p)
        title = f"Exact P(|v_hat_R - p| > eps), Bernoulli(p={p:g}) rewards"
    return _Cells(vals, title, "P(|v_hat_R - v| > eps)", {"p": p}, extra)


def _exact_advantage_cells(Rs: tuple[int, ...], es: tuple[float, ...], *, p: float | None,
                           estimator: str, options: dict[str, Any]) -> _Cells:
    """Exact Bernoulli tails ``P(|A_1| > eps)`` of ``estimator`` with ``options``."""
    if p is None:
        raise ValueError("exact-advantage-tail needs p")
    vals = np.zeros((len(Rs), len(es)))
    for i, R in enumerate(Rs):
        for j, e in enumerate(es):
            vals[i, j] = exact_advantage_tail_bernoulli(
                R=R, eps=e, p=p, estimator=estimator, estimator_options=options
            )
    o = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    est = f"{estimator} ({o})" if o else estimator
    title = f"Exact P(|A_1| > eps), estimator {est}, Bernoulli(p={p:g})"
    return _Cells(vals, title, "P(|A_1| > eps)", {"p": p, "estimator": estimator, **options}, {})


def bound_table(
    kind: str,
    *,
    R_values: Sequence[int],
    eps_values: Sequence[float],
    digits: int = 3,
    sigma2: float | None = None,
    p: float | None = None,
    width: float = 1.0,
    estimator: str = "grpo",
    estimator_options: dict[str, Any] | None = None,
) -> BoundTable:
    """Build a table of ``kind`` over ``R_values`` x ``eps_values``.

    Args:
        kind: one of :data:`TABLE_KINDS`.
        R_values: group sizes (rows), each ``>= 1``.
        eps_values: thresholds (columns), each ``> 0``.
        digits: significant digits when rendering (default 3).
        sigma2: reward variance (chebyshev, bernstein); or give ``p``.
        p: Bernoulli success probability (chebyshev, bernstein: ``sigma2 = p(1-p)``;
            exact tails). ``exact-baseline-tail`` without ``p`` tabulates the sup over ``p``.
        width: reward range / deviation bound (hoeffding, bernstein); default 1.
        estimator: estimator of ``exact-advantage-tail`` (default ``"grpo"``).
        estimator_options: its options, e.g. ``{"ddof": 1, "eps": 1e-4}`` for grpo_std.

    Returns:
        :class:`BoundTable`.

    >>> t = bound_table("hoeffding", R_values=[2, 16], eps_values=[0.3])
    >>> t.vacuous.ravel().tolist()
    [True, False]
    """
    if kind not in TABLE_KINDS:
        raise ValueError(f"unknown table kind {kind!r}; choose one of {sorted(TABLE_KINDS)}")
    Rs, es = _check_grid(R_values, eps_values)
    if kind in ("hoeffding", "chebyshev", "bernstein"):
        cells = _closed_form_cells(kind, Rs, es, sigma2=sigma2, p=p, width=width)
    elif kind == "exact-baseline-tail":
        cells = _exact_baseline_cells(Rs, es, p=p)
    else:
        cells = _exact_advantage_cells(Rs, es, p=p, estimator=estimator,
                                       options=dict(estimator_options or {}))
    vals, title, event, params, extra = cells
    return BoundTable(
        kind=kind,
        title=title,
        event=event,
        R_values=Rs,
        eps_values=es,
        values=np.asarray(vals, dtype=float).reshape(len(Rs), len(es)),
        params=params,
        extra=extra,
        digits=digits,
        is_bound=kind in ("hoeffding", "chebyshev", "bernstein"),
    )
