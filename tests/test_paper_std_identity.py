"""The group-std identity audit (arXiv 2607.00152): one test per registered claim asserting its
computed verdict (recorded here from the computation; the ``_bessel`` claims are the statements
with the std divisor G - 1 the frameworks use), and planted errors in the checks' inputs (the
std divisor, the printed formulas and tables) that must flip the verdict."""

from __future__ import annotations

import pytest

from paper_checks.claims.group_std_identity import formulas as F
from paper_checks.claims.group_std_identity import (
    s2_setup,
    s3_identity,
    s4_group_size,
    s6_difficulty_weight,
    s7_s8_data,
)
from paper_checks.registry import KINDS, REGISTRY, CheckContext, ordered_ids
from paper_values.group_std_identity import BIG_MATH

CTX = CheckContext(seed=0, quick=True)

#: claim id -> the verdict its quick check computes (seed 0)
EXPECTED_STD_IDENTITY = {
    "stdid_d1_binary_std": "holds",
    "stdid_d2_score_identity_baseline": "holds",
    "stdid_d3_prop1_rescaled_rloo": "holds",
    "stdid_d4_theorem1_identity": "holds",
    "stdid_d4_theorem1_identity_bessel": "refuted",
    "stdid_d5_independent_of_baseline": "holds-with-conditions",
    "stdid_d6_scalar_form": "holds",
    "stdid_d7_std_is_update_size": "refuted",
    "stdid_d8_table1_three_operations": "holds",
    "stdid_d9_prop2_expected_gradient": "holds",
    "stdid_d10_corollary1_attenuation": "holds",
    "stdid_d10_corollary1_attenuation_bessel": "refuted",
    "stdid_d11_large_group_limits": "holds",
    "stdid_d12_fidelity_range": "holds",
    "stdid_d13_group_size_law": "refuted",
    "stdid_d14_table2_group_sizes": "holds",
    "stdid_d14_table2_group_sizes_bessel": "refuted",
    "stdid_d14_sec4_text_numbers": "holds",
    "stdid_d15_silent_rate_dapo": "holds",
    "stdid_d17_dapo_all_correct_fit": "inconclusive",
    "stdid_d16_difficulty_weight": "holds-with-conditions",
    "stdid_d18_big_math_numbers": "inconclusive",
    "stdid_d19_controlled_run": "inconclusive",
    "stdid_d20_scope_clip_kl": "holds-with-conditions",
    "stdid_authors_closed_forms_and_scalar_identity": "holds",
    "stdid_authors_exact_expectation_checks": "holds",
    "stdid_authors_monte_carlo_checks": "holds-with-conditions",
    "stdid_authors_group_size_example": "refuted",
}
#: quick checks of ~0.3 s of CPU or more: their per-claim tests are in the slow tier
SLOW = {"stdid_d10_corollary1_attenuation", "stdid_d10_corollary1_attenuation_bessel",
        "stdid_d12_fidelity_range",
        "stdid_d14_table2_group_sizes", "stdid_d14_table2_group_sizes_bessel"}


def test_expected_table_covers_every_registered_claim_in_report_order():
    assert list(EXPECTED_STD_IDENTITY) == ordered_ids("grpo-std-identity")


@pytest.mark.parametrize("claim_id", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW
                                      else c for c in EXPECTED_STD_IDENTITY])
def test_claim(claim_id: str, audit_record, quick_claim) -> None:
    r = quick_claim(claim_id)
    audit_record(r.paper, claim_id, r.verdict)
    assert REGISTRY[claim_id].kind in KINDS
    assert r.evidence and "computation_failed" not in r.evidence, r.evidence
    assert r.verdict == EXPECTED_STD_IDENTITY[claim_id], (r.verdict, r.evidence)
    if r.verdict != "holds":
        assert r.summary and "\n" not in r.summary
    if r.verdict == "refuted":
        assert r.correction and r.short
        pytest.xfail(f"REFUTED {claim_id} ({r.location}): {r.correction}")


def test_every_std_dependent_statement_is_also_registered_as_practised():
    """The std divisor the frameworks use (G - 1) is registered beside the paper's (G)."""
    for base in ("stdid_d4_theorem1_identity", "stdid_d10_corollary1_attenuation",
                 "stdid_d14_table2_group_sizes"):
        assert REGISTRY[base + "_bessel"].kind == "as-practised"


#: claim id -> (the planted error, the check called with it, the verdict it implies)
PLANTED = {
    "stdid_d1_binary_std": (
        "the Bessel std (ddof 1)", lambda: s2_setup.binary_std_outcome(CTX, ddof=1), "refuted"),
    "stdid_d3_prop1_rescaled_rloo": (
        "the constant G/(G-1)", lambda: s2_setup.rloo_outcome(CTX, factor=lambda G: G / (G - 1)),
        "refuted"),
    "stdid_d9_prop2_expected_gradient": (
        "Eq. (6) scaled by 1.01", lambda: s3_identity.prop2_outcome(
            CTX, printed=lambda G, p: 1.01 * F.expected_update_printed(G, p)), "refuted"),
    "stdid_d4_theorem1_identity_bessel": (
        "the population std in place of the frameworks' Bessel one",
        lambda: s3_identity.identity_outcome(CTX, ddof=0), "holds"),
    "stdid_d16_difficulty_weight": (
        "G = 16 taken as the large-G limit", lambda: s6_difficulty_weight.difficulty_weight_outcome(
            CTX, G_values=(2, 3, 8, 16)), "refuted"),
    "stdid_d18_big_math_numbers": (
        "a printed factor of 1.5 in place of 1.78", lambda: s7_s8_data.big_math_outcome(
            CTX, values={**BIG_MATH, "extreme_factor": 1.5}), "refuted"),
}


@pytest.mark.slow
def test_planted_table2_cell_flips_the_verdict():
    from paper_values.group_std_identity import TABLE2

    wrong = {**TABLE2, 0.5: ((8, 5), (11, 10), (51, 50))}
    assert s4_group_size.table2_outcome(CTX, table=wrong).verdict == "refuted"


def test_planted_sample_covers_every_computed_verdict():
    assert {EXPECTED_STD_IDENTITY[c] for c in PLANTED} == set(EXPECTED_STD_IDENTITY.values())


@pytest.mark.parametrize("claim_id", list(PLANTED))
def test_planted_error_flips_the_verdict(claim_id: str) -> None:
    what, planted, implied = PLANTED[claim_id]
    out = planted()
    assert out.verdict != EXPECTED_STD_IDENTITY[claim_id], what
    assert out.verdict == implied, (claim_id, what, out.verdict, out.evidence)
