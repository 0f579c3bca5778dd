"""Claims of "GRPO, Dr. GRPO, and DAPO Are Three Operations on One Number: The
Group-Standard-Deviation Identity" (Bay and Yearick, arXiv 2607.00152), checked exactly.

Statements from the digest ``../shared/papers/grpo-std-identity-2607.00152.md`` (D1-D20, read from
the authors' LaTeX at its latest commit). The paper uses the population std (divisor G); TRL,
verl and OpenRLHF divide by G - 1 (``grpo_theory.conventions``), so the statements whose numbers
depend on it are registered a second time as practised, with the suffix ``_bessel``. Ids carry
the prefix ``stdid_``; ``grpo-audit audit --paper grpo-std-identity --out DIR``. The paper's
printed formulas are transcribed once in :mod:`.formulas` (a support module); our side is the
estimator registry (``grpo_theory.compute_advantages``) on enumerated groups and
``grpo_theory.question_weights`` (for the scalar prompt, ``E[g] = p (1 - p) c(p)``). The
authors publish check scripts; ``authors_checks`` re-derives what the digest says they check
and reports whether our exact computation agrees. Each claim's check is a public
``*_outcome(ctx, **inputs)`` function (``tests/test_paper_std_identity.py`` plants errors).
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="grpo-std-identity",
    arxiv="2607.00152",
    title="GRPO, Dr. GRPO, and DAPO Are Three Operations on One Number: The Group-Standard-"
    "Deviation Identity",
    claim_prefix="stdid_",
    provenance="the statements are those of the digest `shared/papers/grpo-std-identity-"
    "2607.00152.md` (the authors' LaTeX and generated tables at their latest commit; the arXiv "
    "page not reached), each claim is our paraphrase, the printed formulas are transcribed "
    "once in `paper_checks/claims/group_std_identity/formulas.py` and the printed numbers (and "
    "those of the authors' checks) are taken from `paper_values/group_std_identity.py` and "
    "labelled as the paper's.",
    sections=("s2_setup", "s3_identity", "s4_group_size", "s5_silent_groups",
              "s6_difficulty_weight", "s7_s8_data", "s10_scope", "authors_checks"),
    support_modules=("formulas",),
)
