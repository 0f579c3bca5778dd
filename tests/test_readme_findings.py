"""README.md's account of the audit holds to the audit's own output: every number of its findings
table is the claim's evidence rounded as printed, every claim there is refuted, and the counts
around the table (verdicts, App. A.2 cells, cross-references, "as practised" variants, the claims
per paper) are the registry's. So the README cannot drift from what ``grpo-audit audit``
computes.

The numbers are exact computations (enumeration, closed forms): the quick checks (seed 0, shared
with ``tests/test_paper_claims.py`` through the ``quick_claim`` fixture) give the full audit's
values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SNAPSHOT = ROOT / "tests" / "data" / "claims_snapshot.json"

#: claim id -> the evidence entries its README row prints, with the format it prints them in
FINDINGS: dict[str, list[tuple[str, str]]] = {
    "eq15_grpo_gradient_is_unbiased_reinforce": [
        ("scale_grpo_R2", ".4f"), ("scale_grpo_R8", ".4f"), ("scale_rloo_R8", ".4f")],
    "sec2_4_value_is_variance_minimising_baseline": [
        ("b_star", ".3f"), ("v", ".3f"), ("variance_ratio_v_over_b_star", ".2f")],
    "sec6_multiturn_gradient_bias": [("scale_grpo_R4", ".4f")],
    "sec7_max_rank_r_minus_1": [("min_rank_R8", "d"), ("max_rank_R8", "d")],
    "sec7_rank2_intrinsic_from_zero_sum": [
        ("isotropic_R2", ".2f"), ("isotropic_R4", ".2f"), ("isotropic_R8", ".2f"),
        ("isotropic_R16", ".2f")],
    "table1_internal_consistency": [
        ("R2_eff_rank_range_with_rank_R_lo", ".2f"), ("R2_eff_rank_range_with_rank_R_hi", ".2f")],
    "sec7_1_top1_is_variance_explained": [
        ("adversarial_top1", ".2f"), ("adversarial_centred_top1", ".2f")],
}


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def _findings_rows() -> dict[str, str]:
    """The findings table's rows, by the claim id in their last cell."""
    rows = {}
    for line in _section("What the audit found in the seed paper").splitlines():
        m = re.fullmatch(r"\|.*\| `([a-z0-9_]+)` \|", line.strip())
        if m:
            rows[m.group(1)] = line
    return rows


def test_every_row_of_the_findings_table_is_checked_here() -> None:
    assert set(_findings_rows()) == set(FINDINGS)


@pytest.mark.parametrize("claim_id", sorted(FINDINGS))
def test_findings_row_prints_the_claims_computed_numbers(claim_id: str, quick_claim) -> None:
    result = quick_claim(claim_id)
    assert result.verdict == "refuted", f"{claim_id} is {result.verdict}, the README says refuted"
    row = _findings_rows()[claim_id]
    for key, fmt in FINDINGS[claim_id]:
        printed = format(result.evidence[key], fmt)
        assert printed in row, f"{claim_id}: evidence {key} = {printed} is not in its README row"


def test_verdict_counts_are_those_of_the_snapshot_the_audit_is_held_to() -> None:
    # tests/test_claims_snapshot.py holds the computed verdicts to this snapshot
    seed = json.loads(SNAPSHOT.read_text(encoding="utf-8"))["seed"]
    counts = {v: sum(r["verdict"] == v for r in seed) for v in
              ("holds", "holds-with-conditions", "refuted", "inconclusive")}
    text = " ".join(_section("What the audit found in the seed paper").split())
    assert (f"Of its {len(seed)} checkable statements, {counts['holds']} hold, "
            f"{counts['holds-with-conditions']} hold only under conditions") in text
    assert f"{counts['refuted']} are refuted and {counts['inconclusive']} cannot be decided" in text


def test_appendix_a2_cells_cross_references_and_practised_variants_are_counted_right(
        quick_claim) -> None:
    from paper_checks.registry import REGISTRY, load_claims, ordered_ids

    load_claims()
    ids = ordered_ids("seed")
    cells = [quick_claim(c) for c in ids if c.startswith("a2_cell_")]
    off = [r for r in cells if r.verdict == "refuted"]
    diffs = [abs(r.evidence["difference_printed_minus_bound"]) for r in off]
    practised = [c for c in ids if "as practised" in REGISTRY[c].location]
    refuted_practised = [c for c in practised if quick_claim(c).verdict == "refuted"]
    xref = quick_claim("cross_references_resolve").evidence["n_unresolved"]
    text = " ".join(_section("What the audit found in the seed paper").split())
    assert (f"{len(off)} of the {len(cells)} printed cells of App. A.2's Hoeffding table "
            f"(off by {min(diffs):.3f} to {max(diffs):.3f})") in text
    assert f"{xref} unresolved cross-references" in text
    assert len(refuted_practised) == len(practised)
    assert f"and {len(practised)} statements under the variants practitioners run" in text


def test_papers_table_names_every_registered_paper_with_its_claim_count() -> None:
    from paper_checks.papers import papers
    from paper_checks.registry import load_claims, ordered_ids

    load_claims()
    table = _section("Audited papers")
    for key, paper in papers().items():
        row = next((line for line in table.splitlines() if line.startswith(f"| `{key}`")), None)
        assert row is not None, f"--paper {key} is not in README's table of audited papers"
        arxiv = re.sub(r"v[0-9]+$", "", paper.arxiv)  # "2503.06639v4": the README writes " v4"
        assert f"arXiv {arxiv}" in row and row.rstrip().endswith(f"| {len(ordered_ids(key))} |")
