"""Claims of "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr. GRPO; Liu et al.
2025, arXiv 2503.20783, v1 numbering), checked in toy worlds with exact ground truth.

Statements from the digest ``../shared/papers/dr-grpo-2503.20783.md`` (D1-D16; a digest reports
what the paper says, not that it is right). One module per paper section; ids carry the prefix
``drgrpo_``; ``grpo-audit audit --paper dr-grpo --out DIR`` writes the report. The worlds are
:mod:`sims.length_worlds` (a softmax over whole responses; a token MDP whose stop probability
depends on an earlier answer token) and :mod:`sims.question_mix`; the mathematics is
:mod:`grpo_theory.length_bias`, :mod:`grpo_theory.question_weights` and
:mod:`grpo_theory.surrogate` on top of the estimator registry and the loss aggregations. Shared
worlds and helpers: :mod:`.worlds` (a support module: it registers no claim). Each claim's check
is a public ``*_outcome(ctx, **inputs)`` function of its section module, so that
``tests/test_paper_dr_grpo.py`` can plant errors in its inputs.
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="dr-grpo",
    arxiv="2503.20783",
    title="Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO)",
    scope="v1",
    claim_prefix="drgrpo_",
    provenance="the statements are those of the digest `shared/papers/dr-grpo-2503.20783.md` "
    "(v1 read in full; v2 not read), each claim is our paraphrase, and the paper's printed "
    "numbers are taken from `paper_values/dr_grpo.py` and labelled as the paper's.",
    sections=(
        "s1_s2_headline",
        "s3_objective",
        "s3_1_biases",
        "s3_2_dr_grpo",
        "s3_4_llama",
        "appA_policy_gradient",
        "appD_response_length",
        "cross_paper",
    ),
    support_modules=("worlds",),
)
