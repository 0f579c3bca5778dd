"""The paper's printed values: re-exported from the data package :mod:`paper_values` (one place).

``paper_values`` sits at the bottom of the stack so that ``real_model`` (``grpo-audit compare``)
can read the same Table 1 without importing the audit.
"""

from paper_values import (
    PAPER_A2_EPS,
    PAPER_A2_R,
    PAPER_A2_TABLE,
    PAPER_CROSS_REFERENCES,
    PAPER_ID,
    PAPER_LABELLED_STATEMENTS,
    PAPER_TABLE1,
    PAPER_TABLE1_EFF_RANK_TEXT,
)

__all__ = [
    "PAPER_ID",
    "PAPER_A2_EPS",
    "PAPER_A2_R",
    "PAPER_A2_TABLE",
    "PAPER_TABLE1",
    "PAPER_TABLE1_EFF_RANK_TEXT",
    "PAPER_LABELLED_STATEMENTS",
    "PAPER_CROSS_REFERENCES",
]
