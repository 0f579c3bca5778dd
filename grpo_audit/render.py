"""Rendering of the core's tables (:class:`grpo_theory.tables.BoundTable`): Markdown, CSV, LaTeX.

The core computes the numbers; this module only formats them. Cells ``>= 1`` of a bound table are
flagged ``(vacuous)`` (a bound that says nothing); in an exact-probability table a cell ``= 1`` is
an event that is certain, flagged ``(= 1)``.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from grpo_theory.tables import BoundTable

__all__ = ["bound_table_markdown", "bound_table_csv", "bound_table_latex", "render_bound_table"]

FORMATS = ("md", "csv", "latex")


def _fmt_eps(e: float) -> str:
    return f"{e:g}"


def _cell(t: BoundTable, i: int, j: int, digits: int, flag: str) -> str:
    v = float(t.values[i, j])
    s = f"{v:#.{digits}g}" if v != 0 else "0"
    if "argmax_p" in t.extra:
        s += f" (p*={float(t.extra['argmax_p'][i, j]):.3g})"
    return s + (f" {flag}" if v >= 1.0 else "")


def _header(t: BoundTable) -> list[str]:
    return ["R"] + [t.event.replace("eps", _fmt_eps(e)) for e in t.eps_values]


def bound_table_markdown(t: BoundTable, *, digits: int | None = None) -> str:
    """GitHub Markdown table with a title line; vacuous cells get ``(vacuous)``.

    >>> from grpo_theory.tables import bound_table
    >>> t = bound_table("hoeffding", R_values=[2], eps_values=[0.3])
    >>> print(bound_table_markdown(t), end="")
    **Hoeffding bound on P(|v_hat_R - v| > eps), rewards in an interval of width 1**
    <BLANKLINE>
    | R | P(\\|v_hat_R - v\\| > 0.3) |
    |---:|---:|
    | 2 | 1.40 (vacuous) |
    """
    d = t.digits if digits is None else digits
    head = [h.replace("|", "\\|") for h in _header(t)]  # a bare | splits a cell
    lines = [f"**{t.title}**", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join(["---:"] * len(head)) + "|")
    for i, R in enumerate(t.R_values):
        flag = "(vacuous)" if t.is_bound else "(= 1)"
        cells = [_cell(t, i, j, d, flag) for j in range(len(t.eps_values))]
        lines.append("| " + " | ".join([str(R)] + cells) + " |")
    return "\n".join(lines) + "\n"


def bound_table_csv(t: BoundTable) -> str:
    """CSV with columns ``R, eps, value, vacuous`` (one row per cell, full precision)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = ["R", "eps", "value", "vacuous"] + sorted(t.extra)
    w.writerow(cols)
    for i, R in enumerate(t.R_values):
        for j, e in enumerate(t.eps_values):
            v = float(t.values[i, j])
            row = [R, repr(float(e)), repr(v), int(t.is_bound and v >= 1.0)]
            row += [repr(float(t.extra[k][i, j])) for k in sorted(t.extra)]
            w.writerow(row)
    return buf.getvalue()


def bound_table_latex(t: BoundTable, *, digits: int | None = None) -> str:
    """A ``tabular`` (booktabs); vacuous cells are set in grey with a dagger."""
    d = t.digits if digits is None else digits
    head = ["$R$"] + [
        "$"
        + t.event.replace("eps", _fmt_eps(e))
        .replace("|", "\\lvert ", 1)
        .replace("|", "\\rvert", 1)
        .replace("v_hat_R", "\\hat v_R")
        + "$"
        for e in t.eps_values
    ]
    lines = [
        f"% {t.title}",
        "\\begin{tabular}{r" + "r" * len(t.eps_values) + "}",
        "\\toprule",
        " & ".join(head) + " \\\\",
        "\\midrule",
    ]
    for i, R in enumerate(t.R_values):
        cells = []
        for j in range(len(t.eps_values)):
            c = _cell(t, i, j, d, "").strip()
            vacuous = t.is_bound and t.values[i, j] >= 1
            cells.append(f"\\textcolor{{gray}}{{{c}$^\\dagger$}}" if vacuous else c)
        lines.append(" & ".join([str(R)] + cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    if t.is_bound:
        lines.append("% $^\\dagger$ vacuous (>= 1)")
    return "\n".join(lines) + "\n"


def render_bound_table(t: BoundTable, fmt: str, *, digits: int | None = None) -> str:
    """``fmt`` in ``{"md", "csv", "latex"}``."""
    if fmt == "md":
        return bound_table_markdown(t, digits=digits)
    if fmt == "csv":
        return bound_table_csv(t)
    if fmt == "latex":
        return bound_table_latex(t, digits=digits)
    raise ValueError(f"format must be one of 'md', 'csv', 'latex', got {fmt!r}")
