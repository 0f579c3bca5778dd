"""Claims of arXiv 2503.06639 v4 (Mroueh, "Reinforcement Learning with Verifiable Rewards:
GRPO's Effective Loss, Dynamics, and Success Amplification"), one module per paper section.

Run with ``grpo-audit audit --paper grpo-effective-loss --out DIR``; ids carry the prefix
``effloss_``. The paper's printed numbers are in ``paper_values/effective_loss.py``, its printed
formulas (transcribed as functions, so that a planted error in them flips a verdict) in
:mod:`.printed_formulas`, and grids, worlds and the cached fixed-point scans shared by several
sections in :mod:`.worlds_and_scans` (the two support modules: they register no claim). Digest
of the statements: ``../shared/papers/grpo-effective-loss-2503.06639.md``.
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="grpo-effective-loss",
    arxiv="2503.06639v4",
    title="Mroueh: Reinforcement Learning with Verifiable Rewards: GRPO's Effective Loss, "
    "Dynamics, and Success Amplification",
    claim_prefix="effloss_",
    provenance="each claim is our paraphrase of the v4 text (theorem, section and equation "
    "numbers of the v4 PDF); the paper's printed numbers enter the checks from "
    "`paper_values/effective_loss.py` and its printed formulas from "
    "`paper_checks/claims/effective_loss/printed_formulas.py` (the one place each is typed in), "
    "so that a planted error in them flips the verdict.",
    sections=(
        "s2_contrastive_loss",
        "s3_dynamics",
        "s3_1_amplification",
        "s4_mirror",
        "s5_mean_only",
        "appA_experiments",
        "appB_algorithm",
        "appC_stability",
        "appD_general",
        "appE_two_kl",
        "appF_parametric",
    ),
    support_modules=("printed_formulas", "worlds_and_scans"),
)
