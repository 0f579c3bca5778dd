"""The result object every check in :mod:`sims` returns.

A check compares a Monte Carlo ``estimate`` with an ``exact`` value that this package computed
itself (closed form, enumeration or dynamic programming). The verdict is computed, never typed:
``z = (estimate - exact) / se`` and ``passed = |z| <= k`` with ``k`` stated (default 4). A
deterministic check (``se == 0``, e.g. an identity that holds in every sampled group) passes when
``|estimate - exact| <= atol`` (``atol`` recorded in ``details``); an SE below
``1e-12 * max(1, |exact|)`` is float rounding of constant samples and is treated as 0. The
paper's own formula, when it makes a claim about the same quantity, is carried separately as
``paper_value`` so that a wrong formula shows up as ``exact != paper_value`` while the Monte
Carlo agrees with ``exact``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_io import to_jsonable

from ._stats import Z_THRESHOLD

__all__ = ["CheckResult", "make_check", "DEFAULT_K", "results_table", "md_escape"]

#: Default ``k`` of :func:`make_check`: the one threshold :data:`sims._stats.Z_THRESHOLD`.
DEFAULT_K = Z_THRESHOLD


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
) -> CheckResult:
    """Build a :class:`CheckResult`, computing ``z`` and the verdict.

    Args:
        name: label of the check.
        estimate: Monte Carlo estimate.
        exact: exact value (must be finite).
        se: standard error, ``>= 0``.
        n: sample size.
        k: pass threshold on ``|z|`` (default 4).
        paper_value: the paper's formula for the same quantity, or None.
        atol: tolerance of a deterministic check (``se == 0``).
        paper_rtol: relative tolerance for ``details["paper_matches_exact"]``.
        details: extra JSON-able information.

    Returns:
        The frozen :class:`CheckResult`.

    Raises:
        ValueError: non-finite ``exact``/``estimate`` or negative ``se``.

    >>> make_check("x", estimate=1.02, exact=1.0, se=0.01, n=100).passed
    True
    """
    estimate, exact, se = float(estimate), float(exact), float(se)
    if not (math.isfinite(estimate) and math.isfinite(exact)):
        raise ValueError(f"check {name!r}: estimate={estimate} and exact={exact} must be finite")
    if not math.isfinite(se) or se < 0:
        raise ValueError(f"check {name!r}: se must be finite and >= 0, got {se}")
    diff = estimate - exact
    d = dict(details or {})
    if 0 < se <= 1e-12 * max(1.0, abs(exact), abs(estimate)):
        # the samples are constant up to float rounding: judge as a deterministic check
        d["se_rounding_only"] = se
        se = 0.0
    if se > 0:
        z = diff / se
        passed = abs(z) <= k
    else:
        z = 0.0 if abs(diff) <= atol else math.copysign(math.inf, diff)
        passed = abs(diff) <= atol
        d["atol"] = atol
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
