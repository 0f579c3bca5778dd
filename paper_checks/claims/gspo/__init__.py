"""Claims of GSPO, "Group Sequence Policy Optimization" (Zheng et al. 2025, arXiv 2507.18071,
read as v2 from a transcription of the PDF), checked in toy worlds with exact ground truth.

Statements from the digest ``../shared/papers/gspo-2507.18071.md`` (D1-D17; D15 registered as
its empirical part and its mathematical part). One module per paper section; ids carry the
prefix ``gspo_``; ``grpo-audit audit --paper gspo --out DIR`` writes the report. The paper's
objectives and gradient formulas are transcribed once, as functions, in :mod:`.formulas` (a
support module), which also holds the worlds: a tabular token MDP with a sampled group of
responses of different lengths, differentiated by central finite differences. Token against
sequence ratios under per-token noise: :mod:`sims.sequence_ratio`. Each claim's check is a public
``*_outcome(ctx, **inputs)`` function (``tests/test_paper_gspo.py`` plants errors in them).
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="gspo",
    arxiv="2507.18071",
    title="Group Sequence Policy Optimization (GSPO)",
    scope="v2",
    claim_prefix="gspo_",
    provenance="the statements are those of the digest `shared/papers/gspo-2507.18071.md` (v2 "
    "read in full from a transcription; v1 not read), each claim is our paraphrase, the paper's "
    "objectives are transcribed once in `paper_checks/claims/gspo/formulas.py` and its printed "
    "numbers are taken from `paper_values/gspo.py` and labelled as the paper's.",
    sections=("s2_preliminaries", "s3_motivation", "s4_1_sequence_ratio", "s4_2_gradients",
              "s4_3_gspo_token", "s5_experiments"),
    support_modules=("formulas",),
)
