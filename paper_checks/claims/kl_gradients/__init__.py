"""Claims of three papers on what gradient a sampled KL regulariser delivers, audited together
because they make overlapping statements: Tang and Munos, "On a few pitfalls in KL divergence
gradient estimation for RL" (arXiv 2506.09477, [TM]); Liu et al., "Rethinking KL Regularization
in RLHF" (arXiv 2510.01555, [LIU]); Shah et al., "A Comedy of Estimators" (arXiv 2512.21852,
[CE]).

Statements from the digest ``../shared/papers/kl-gradients.md`` (D1-D18). None of the three full
texts was read: the statements come from abstracts and secondary summaries, named in each claim's
location. A statement whose mathematics the digest states in full is checked as stated (exact
enumeration in a softmax bandit and a token MDP, finite differences, seeded Monte Carlo with
k = 4 standard errors); a statement whose deciding content the digest could not reach (a figure's
setting, one run's printed numbers, an attribution of low confidence) and every empirical one is
``inconclusive``, with our computation as evidence and what would decide it. One module per
paper; ids carry the prefix ``klgrad_``; ``grpo-audit audit --paper kl-gradients --out DIR``.
The mathematics is :mod:`grpo_theory.kl`; the worlds and dynamics :mod:`sims.kl_dynamics`;
shared worlds :mod:`.worlds`. Each claim's check is a public ``*_outcome(ctx, **inputs)``
function of its module (``tests/test_paper_kl_gradients.py`` plants errors in the inputs).
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="kl-gradients",
    arxiv="2506.09477, 2510.01555, 2512.21852",
    title="KL-estimator gradients: Tang & Munos; Liu et al.; Shah et al.",
    scope="abstracts and secondary summaries only",
    claim_prefix="klgrad_",
    provenance="the statements are those of the digest `shared/papers/kl-gradients.md`, which "
    "read none of the three full texts (abstracts and secondary summaries, named in each "
    "claim's location); each claim is our paraphrase, and the few printed numbers are taken "
    "from `paper_values/kl_gradients.py` and labelled as the papers'.",
    sections=("estimators", "tm_pitfalls", "liu_rethinking", "ce_comedy"),
    support_modules=("worlds",),
)
