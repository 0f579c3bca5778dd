"""Claims of FADE, arXiv 2607.01490 ("Don't Let Gains FADE: Breaking Down Policy Gradient Weights
in RL"): only its abstract is available, so the abstract is its one section.

Run with ``grpo-audit audit --paper fade --out DIR``; ids carry the prefix ``fade_``.
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="fade",
    arxiv="2607.01490",
    title="Don't Let Gains FADE: Breaking Down Policy Gradient Weights in RL",
    scope="abstract only",
    claim_prefix="fade_",
    provenance="only the abstract is available, so each claim is our paraphrase of it.",
    sections=("abstract",),
)
