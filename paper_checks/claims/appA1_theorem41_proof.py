"""Appendix A.1, Proof of Theorem 4.1: the variance steps of Eqs. (24)-(25), checked with sympy.
"""

from __future__ import annotations

import sympy as sp

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "A.1 Proof of Theorem 4.1"


@claim(
    "a1_eq24_25_variance_steps", kind="derivation",
    location="App. A.1, Eqs. (24)-(25)",
    text="Var(A_i) = ((R-1)/R)^2 sigma^2 + (1/R^2) sum_{j != i} sigma^2 = (R-1)/R sigma^2, each "
    "step.",
    check="Sympy: each displayed equality simplified to zero, symbolic R and sigma^2 "
    "(the first step uses independence of the r_j).",
)
def _a1(ctx: CheckContext) -> Outcome:
    R, s2 = sp.symbols("R sigma2", positive=True)
    steps = [
        ((R - 1) / R) ** 2 * s2 + (R - 1) * s2 / R**2,
        (R - 1) ** 2 / R**2 * s2 + (R - 1) / R**2 * s2,
        ((R - 1) ** 2 + (R - 1)) / R**2 * s2,
        (R - 1) * R / R**2 * s2,
        (R - 1) / R * s2,
    ]
    diffs = [sp.simplify(a - b) == 0 for a, b in zip(steps[:-1], steps[1:], strict=True)]
    ok = all(diffs)
    return Outcome(verdict_from(ok),
                   {"n_steps": len(diffs), "n_steps_simplify_to_zero": int(sum(diffs))},
                   correction=None if ok else "a step of Eq. 24-25 is wrong")
