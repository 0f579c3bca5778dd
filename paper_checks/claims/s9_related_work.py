"""Section 9, Related work: RLOO's leave-one-out baseline removes GRPO's O(1/R) bias.

Token MDP of :mod:`sims.token_mdp`: exact ``E[g_hat]`` (:mod:`sims.exact`) against ``grad J`` by
finite differences.
"""

from __future__ import annotations

import numpy as np

from paper_checks.claim_support import ratio, token_mdp
from paper_checks.enumeration import (
    expected_gradient,
)
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "9. Related work"


TOL = 1e-6  # finite differences with h = 1e-6


@claim(
    "sec9_rloo_removes_o1r_bias", kind="derivation",
    location="Sec. 9 (Related work)",
    text="RLOO's leave-one-out baseline eliminates the O(1/R) bias (of the group-mean baseline).",
    check="Token MDP: exact E[g_RLOO] vs grad J and the GRPO bias |c - 1| times R, R in {2,4,8}.",
    variants=("rloo", "grpo"),
)
def _sec9(ctx: CheckContext) -> Outcome:
    m = token_mdp(ctx)
    w = m.outcome_world()
    fd = m.finite_difference_grad()
    ev: dict[str, float] = {}
    for R in (2, 4, 8):
        ev[f"rloo_max_abs_error_R{R}"] = float(np.max(np.abs(expected_gradient(w, "rloo", R=R)
                                                               - fd)))
        c = ratio(expected_gradient(w, "grpo", R=R), fd)[0]
        ev[f"grpo_bias_times_R_R{R}"] = (1 - c) * R
    ok = max(ev[f"rloo_max_abs_error_R{R}"] for R in (2, 4, 8)) < TOL
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "RLOO is biased")
