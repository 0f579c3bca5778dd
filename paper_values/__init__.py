"""The PAPER'S printed values, typed in once, here only (arXiv 2606.29238).

Nothing in this module is a result of ours: these are the numbers and labels as the paper prints
them, so that the checks can compare the recomputed values with them. Every check that uses a
paper value takes it from here, and imports it from here (``from paper_values import
PAPER_TABLE1``: one import path). Another audited paper's printed values go beside these, in
``paper_values/<paper_package>.py`` (the paper's identity, its arXiv id and title, is its
registration in ``paper_checks/claims/``).

Why a package of its own, at the bottom of the stack: both ``paper_checks`` (the audit) and
``real_model`` (``grpo-audit compare`` draws Table 1 beside the real model) need the printed
Table 1, and ``real_model`` may not import ``paper_checks`` (above it); ``grpo_theory`` is the
mathematics and ``grpo_io`` is IO, so neither is the place for a paper's printed numbers. This
package is data only: it imports nothing.
"""

from __future__ import annotations

__all__ = [
    "PAPER_A2_EPS",
    "PAPER_A2_R",
    "PAPER_A2_TABLE",
    "PAPER_TABLE1",
    "PAPER_TABLE1_EFF_RANK_TEXT",
    "PAPER_LABELLED_STATEMENTS",
    "PAPER_CROSS_REFERENCES",
]

#: Appendix A.2, "Interpretation by group size": columns are P(|v_hat_R - v| > eps).
PAPER_A2_R: tuple[int, ...] = (2, 4, 8, 16)
PAPER_A2_EPS: tuple[float, ...] = (0.3, 0.2, 0.1)

#: (R, eps) -> (printed bound value, printed "(vacuous)" label). PAPER'S VALUES, not results.
PAPER_A2_TABLE: dict[tuple[int, float], tuple[float, bool]] = {
    (2, 0.3): (1.34, True),
    (2, 0.2): (1.70, True),
    (2, 0.1): (1.92, True),
    (4, 0.3): (0.93, True),
    (4, 0.2): (1.44, True),
    (4, 0.1): (1.85, True),
    (8, 0.3): (0.44, False),
    (8, 0.2): (1.05, True),
    (8, 0.1): (1.71, True),
    (16, 0.3): (0.10, False),
    (16, 0.2): (0.55, False),
    (16, 0.1): (1.47, True),
}

#: Table 1 (Nemotron-4B, GSM8K): R -> printed (max rank, eff. rank, top-1 fraction range).
#: The paper prints the effective rank as "~2" (:data:`PAPER_TABLE1_EFF_RANK_TEXT`).
#: PAPER'S VALUES, not results.
PAPER_TABLE1: dict[int, dict[str, float | tuple[float, float]]] = {
    2: {"max_rank": 1, "eff_rank": 2.0, "top1": (0.6, 0.7)},
    4: {"max_rank": 3, "eff_rank": 2.0, "top1": (0.7, 0.8)},
    8: {"max_rank": 7, "eff_rank": 2.0, "top1": (0.5, 0.6)},
}
#: How Table 1 prints every effective rank.
PAPER_TABLE1_EFF_RANK_TEXT = "~2"

#: The labelled statements that the paper actually states (theorems, corollaries, remarks,
#: definitions), as printed in its body.
PAPER_LABELLED_STATEMENTS: tuple[str, ...] = (
    "Definition 2.1",
    "Theorem 3.1",
    "Remark 3.2",
    "Theorem 4.1",
    "Corollary 4.2",
)

#: Cross-references as printed: (where, the text of the reference, the label it names or None
#: where the paper prints an unresolved "??").
PAPER_CROSS_REFERENCES: tuple[tuple[str, str, str | None], ...] = (
    ("Sec. 8, Future directions (3)", "would validate Theorem 4.2", "Theorem 4.2"),
    ("App. A.2, heading", "Proof of ?? (Baseline Concentration)", None),
    ("App. A.2, last paragraph", "So ?? directly bounds the advantage estimation error", None),
    ("App. A.1, heading", "Proof of Theorem 4.1 (Full Details)", "Theorem 4.1"),
    ("Sec. 8, Connection to memorization", "uniform credit assignment (Theorem 3.1)",
     "Theorem 3.1"),
)
