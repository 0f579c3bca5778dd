"""grpo_audit.render: the core's bound tables as Markdown, CSV and LaTeX (exact strings)."""

from __future__ import annotations

import numpy as np
import pytest

import grpo_theory as gt
from grpo_audit.render import (
    bound_table_csv,
    bound_table_latex,
    bound_table_markdown,
    render_bound_table,
)
from grpo_theory.tables import bound_table


def test_bound_table_renderings_flag_each_vacuous_cell() -> None:
    t = bound_table("hoeffding", R_values=[2, 4, 8, 16], eps_values=[0.3, 0.2, 0.1])
    n_vacuous = int((t.values >= 1).sum())
    # 2 exp(-2 R eps^2) >= 1  <=>  R eps^2 <= ln(2)/2 = 0.3466: R=2 (all 3), R=4 (eps .2, .1),
    # R=8 (eps .2, .1), R=16 (eps .1)
    assert n_vacuous == 8
    assert bound_table_markdown(t).count("(vacuous)") == n_vacuous
    csv_lines = bound_table_csv(t).strip().splitlines()
    assert csv_lines[0] == "R,eps,value,vacuous" and len(csv_lines) == 13
    tex = bound_table_latex(t)
    assert "\\begin{tabular}" in tex and tex.count("\\dagger") == n_vacuous + 1


def test_bound_table_markdown_tiny_case_hand_checked() -> None:
    # 2 exp(-2 * 16 * 0.09) = 2 exp(-2.88) = 0.112269...
    t = bound_table("hoeffding", R_values=[16], eps_values=[0.3])
    assert t.values[0, 0] == pytest.approx(2 * np.exp(-2.88), rel=1e-14)
    lines = bound_table_markdown(t).splitlines()
    assert lines[-1] == "| 16 | 0.112 |"
    assert bound_table_csv(t).splitlines()[1] == "16,0.3,0.11226952566826745,0"


def test_render_bound_table_rejects_unknown_format() -> None:
    t = bound_table("hoeffding", R_values=[2], eps_values=[0.3])
    with pytest.raises(ValueError, match="format must be one of"):
        render_bound_table(t, "html")


# --- exact probabilities are never vacuous -------------------------------------------------------
def test_exact_probability_tables_are_never_marked_vacuous_in_csv_or_latex():
    from grpo_audit.render import bound_table_csv, bound_table_latex

    # R=2, eps=0.2: the exact sup tail is 1 (= 1, a probability, not a vacuous bound).
    t = gt.bound_table("exact-baseline-tail", R_values=[2], eps_values=[0.2])
    assert float(t.values[0, 0]) == 1.0
    assert bound_table_csv(t).splitlines()[1].split(",")[3] == "0"
    assert "dagger" not in bound_table_latex(t)
    h = gt.bound_table("hoeffding", R_values=[2], eps_values=[0.2])  # 2 exp(-0.16) = 1.70 >= 1
    assert bound_table_csv(h).splitlines()[1].split(",")[3] == "1"
    assert "vacuous" in bound_table_latex(h)
