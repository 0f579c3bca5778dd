"""Claims of the seed paper, arXiv 2606.29238, one module per paper section; other papers below.

This package is the seed paper's claim package: its modules are the paper's sections in the
paper's order (:data:`PAPER` ``.sections``), and each declares its report heading once
(``SECTION = "..."``) above the claims it registers with :func:`paper_checks.registry.claim`.
A claim lives in the section its id names (``thm4_1_*`` in ``s4_theorem41``, ``a3_*`` and
``eq26``/``eq27`` in ``appA3_multiturn_bias``, ``abstract_*`` in ``abstract``).

Every other audited paper is a sub-package with the same shape (``fade/``: the FADE abstract).
How to add one: ``docs/adding_claims.md``. Importing this package registers
no claim: :func:`paper_checks.registry.load_claims` imports the section modules.
"""

from paper_checks.papers import Paper

PAPER = Paper(
    key="seed",
    arxiv="2606.29238",
    title="On the Policy Gradient Foundations of GRPO",
    claim_prefix="",
    provenance="the paper's printed numbers are taken from `paper_values/__init__.py` (the one "
    "place they are typed in) and labelled as the paper's.",
    report_tables="paper_checks.tables:seed_report_tables",
    real_checks="paper_checks.claims.s7_real_model",
    sections=(
        "abstract",
        "s2_policy_gradient",
        "s3_credit",
        "s4_theorem41",
        "s5_sparsity",
        "s6_multiturn",
        "s7_experiments",
        "s8_discussion",
        "s9_related_work",
        "appA1_theorem41_proof",
        "appA2_concentration",
        "appA3_multiturn_bias",
        "cross_references",
    ),
    support_modules=("s7_real_model",),
)
