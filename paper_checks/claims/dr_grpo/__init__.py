"""Claims of "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr. GRPO; Liu et al.
2025, arXiv 2503.20783, v1 numbering), checked in toy worlds with exact ground truth.

Statements from the digest ``../shared/papers/dr-grpo-2503.20783.md`` (D1-D16; a digest reports
what the paper says, not that it is right). One module per paper section; ids carry the prefix
``drgrpo_``; ``grpo-audit audit --paper dr-grpo --out DIR`` writes the report. The worlds are
:mod:`sims.length_worlds` (a softmax over whole responses; a token MDP whose stop probability
depends on an earlier answer token) and :mod:`sims.question_mix`; the mathematics is
:mod:`grpo_theory.length_bias`, :mod:`grpo_theory.question_weights` and
:mod:`grpo_theory.surrogate` on top of the estimator registry and the loss aggregations.
"""

PAPER_KEY = "dr-grpo"
