"""Cross-references: every reference the paper prints resolves to a labelled statement it states.

The labels and references as printed come from :mod:`paper_values`.
"""

from __future__ import annotations

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from
from paper_values import PAPER_CROSS_REFERENCES, PAPER_LABELLED_STATEMENTS

SECTION = "Cross-references"


@claim(
    "cross_references_resolve", kind="reference",
    location="Sec. 8 (\"Theorem 4.2\"); App. A.2 (\"Proof of ??\", \"So ??\")",
    text="The paper's cross-references point to statements it contains.",
    check="Each printed reference is looked up among the labelled statements the paper states.",
)
def _xref(ctx: CheckContext) -> Outcome:
    broken = [(w, t) for w, t, lab in PAPER_CROSS_REFERENCES
              if lab is None or lab not in PAPER_LABELLED_STATEMENTS]
    ev = {"n_references": len(PAPER_CROSS_REFERENCES), "n_unresolved": len(broken)}
    return Outcome(
        verdict_from(not broken),
        ev,
        short="'Theorem 4.2' does not exist; App. A.2 proves an unstated statement ('??')"
        if broken else None,
        correction=("unresolved: " + "; ".join(f"{w}: '{t}'" for w, t in broken)
                    + ". 'Theorem 4.2' does not exist (Corollary 4.2 is meant, and it is about "
                    "gradient size, not rank); App. A.2 proves a baseline-concentration statement "
                    "that is never stated in the body") if broken else None,
    )
