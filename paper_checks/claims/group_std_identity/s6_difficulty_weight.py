"""Sec. 6 of arXiv 2607.00152: the difficulty weight w(p) = 1/sqrt(p(1-p)) (D16), set against
the finite-G question weight of the Dr. GRPO audit (grpo_theory.question_weights)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import formulas as F

SECTION = "6. What the division optimises: the difficulty weight"


def difficulty_weight_outcome(ctx: CheckContext, *, G_values: tuple[int, ...] = (2, 3, 8, 256)
                              ) -> Outcome:
    """sympy d/dp 2 arcsin sqrt(p); the printed values; GRPO's finite-G question weight (std,
    population) against w(p), and the mean-only one against 1."""
    import sympy as sp

    from grpo_theory.question_weights import question_weight
    from paper_values.group_std_identity import DIFFICULTY_WEIGHT as W

    p = sp.symbols("p", positive=True)
    deriv_ok = sp.simplify(sp.diff(2 * sp.asin(sp.sqrt(p)), p) - 1 / sp.sqrt(p * (1 - p))) == 0
    ev: dict[str, Any] = {"derivative_matches": bool(deriv_ok)}
    for q, printed in W.items():
        ev[f"w_at_{q:g}"] = float(F.weight_printed(q))
        ev[f"printed_w_at_{q:g}"] = printed
    ev["w_0.05_over_w_0.5"] = ev["w_at_0.05"] / ev["w_at_0.5"]
    grid = np.array([0.05, 0.2, 0.5])
    spread = {}
    for G in G_values:
        c = np.asarray(question_weight("grpo_std", G=G, p=grid, ddof=0, eps=0.0))
        ratio = c / F.weight_printed(grid)
        ev[f"G{G}_std_question_weight_over_w"] = ratio.tolist()
        spread[G] = float(np.ptp(c) / c.max())
        ev[f"G{G}_std_question_weight_relative_spread_over_p"] = spread[G]
        ev[f"G{G}_mean_only_question_weight"] = float(question_weight("grpo", G=G, p=0.3))
    values_ok = (math.isclose(ev["w_at_0.5"], W[0.5]) and abs(ev["w_at_0.05"] - W[0.05]) < 0.05
                 and ev["w_0.05_over_w_0.5"] > 2)
    big = ev[f"G{G_values[-1]}_std_question_weight_over_w"]
    limit_ok = max(abs(r - 1) for r in big) < 0.02
    ok = bool(deriv_ok) and values_ok and limit_ok
    flat = [G for G in G_values if spread[G] < 1e-9]
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=("w(p) is the large-G limit of the std division's per-question weight: at "
                    f"G = {G_values[-1]} the exact weight is "
                    f"{min(big):.3f}-{max(big):.3f} times w(p) on p in {{0.05, 0.2, 0.5}}, "
                    "at G = 8 "
                    f"{min(ev['G8_std_question_weight_over_w']):.3f}-"
                    f"{max(ev['G8_std_question_weight_over_w']):.3f}, and at G = {flat} it is flat "
                    "in p (no difficulty weighting); the mean-only (Dr. GRPO) weight is "
                    "(G-1)/G, constant in p" if flat else
                    "w(p) is the large-G limit of the std division's per-question weight"),
        correction=None if ok else "the weight or its printed values differ: " + str(ev),
        short=(f"w(p) only as G -> infinity; flat in p at G = {flat}" if ok
               else "weight differs"))


@claim(
    "stdid_d16_difficulty_weight",
    location="Sec. 6, Eq. (11), Fig. 8; Sec. 1 contribution 4",
    text="w(p) = d/dp [2 arcsin sqrt(p)] = 1/sqrt(p(1-p)), 'the same 1/sigma that appears in "
    "the advantage'; smallest at p = 1/2 (w = 2), about 4.6 at p = 0.05 or 0.95, more than twice "
    "the coin-flip weight; Dr. GRPO corresponds to w = 1; w is the question-level difficulty "
    "bias of Dr. GRPO (Liu et al. 2025).",
    check="sympy derivative; the printed values (paper_values.group_std_identity); the finite-G "
    "question weight E[A | r = 1] - E[A | r = 0] of the registry's population-std GRPO "
    "(grpo_theory.question_weights, the Dr. GRPO audit's) against w(p) at G = 2, 3, 8, 256, "
    "and the mean-only one.",
    kind="derivation",
)
def _d16(ctx: CheckContext) -> Outcome:
    return difficulty_weight_outcome(ctx)
