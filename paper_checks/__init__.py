"""paper_checks: the proof audit of arXiv 2606.29238 (the seed paper) and of the other registered
papers, every checkable claim recomputed.

Each claim is registered (:mod:`paper_checks.registry`) with its location, our paraphrase, the
check, its kind (what the verdict is about: :data:`~paper_checks.registry.KINDS`) and a verdict
computed by it (``holds``, ``holds-with-conditions``, ``refuted``, ``inconclusive``), in the module
of its paper section (:mod:`paper_checks.claims`; one package per paper,
:mod:`paper_checks.papers`).
``grpo-audit audit --out DIR [--paper KEY] [--real FILE]`` writes ``REPORT.md`` (findings first:
:mod:`paper_checks.findings`, :mod:`paper_checks.report_md`), ``claims.json``, per-claim evidence
CSVs and figures (:mod:`paper_checks.report`); ``grpo-audit tables appendix-a2|table1`` prints the
regenerated tables.
"""

from __future__ import annotations

from typing import Any

_REGISTRY_NAMES = (
    "KINDS",
    "REGISTRY",
    "VERDICTS",
    "CheckContext",
    "Claim",
    "ClaimResult",
    "Outcome",
    "get_claim",
    "run_claim",
    "run_claims",
)

__all__ = [
    *_REGISTRY_NAMES,
    "all_claim_ids",
    "run_audit",
    "appendix_a2_table",
    "table1_toy",
    "effective_rank_range",
]


def all_claim_ids() -> list[str]:
    """Every registered claim id of every paper, in report order (paper by paper)."""
    from .papers import papers
    from .registry import ordered_ids

    return [cid for key in papers() for cid in ordered_ids(key)]


def __getattr__(name: str) -> Any:  # lazy: keep `import paper_checks` cheap (no numpy)
    if name in _REGISTRY_NAMES:
        from . import registry

        return getattr(registry, name)
    if name == "run_audit":
        from .report import run_audit

        return run_audit
    if name in ("appendix_a2_table", "table1_toy"):
        from . import tables

        return getattr(tables, name)
    if name == "effective_rank_range":
        from .spectra import effective_rank_range

        return effective_rank_range
    raise AttributeError(f"module 'paper_checks' has no attribute {name!r}")
