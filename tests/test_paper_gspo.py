"""The GSPO audit (arXiv 2507.18071): one test per registered claim asserting its computed verdict
(recorded here from the computation), and planted errors in the checks' inputs (the printed
formulas, the ratio, the aggregation) that must flip the verdict."""

from __future__ import annotations

import numpy as np
import pytest

from paper_checks.claims.gspo import formulas as F
from paper_checks.claims.gspo import (
    s2_preliminaries,
    s3_motivation,
    s4_1_sequence_ratio,
    s4_2_gradients,
    s4_3_gspo_token,
    s5_experiments,
)
from paper_checks.registry import KINDS, REGISTRY, CheckContext, ordered_ids

CTX = CheckContext(seed=0, quick=True)

#: claim id -> the verdict its quick check computes (seed 0)
EXPECTED_GSPO = {
    "gspo_d1_factorisation": "holds",
    "gspo_d2_ppo_objective": "holds-with-conditions",
    "gspo_d3_grpo_objective": "holds",
    "gspo_d4_single_sample_importance_weight": "refuted",
    "gspo_d5_noise_accumulates": "inconclusive",
    "gspo_d6_sequence_ratio_is_importance_sampling": "refuted",
    "gspo_d7_objective_and_ratio": "holds",
    "gspo_d8_length_normalisation": "holds-with-conditions",
    "gspo_d9_clipping_ranges": "holds-with-conditions",
    "gspo_d10_gspo_gradient": "holds",
    "gspo_d11_grpo_gradient_token_weights": "holds",
    "gspo_d12_gspo_token_gradient": "holds",
    "gspo_d13_gspo_token_equals_gspo": "holds",
    "gspo_d14_clipped_token_fractions": "inconclusive",
    "gspo_d15_moe_routing_replay": "inconclusive",
    "gspo_d15_sequence_likelihood_stability": "holds-with-conditions",
    "gspo_d16_precision_tolerance": "holds-with-conditions",
    "gspo_d17_headline_results": "inconclusive",
}


def test_expected_table_covers_every_registered_claim_in_report_order():
    assert list(EXPECTED_GSPO) == ordered_ids("gspo")


@pytest.mark.parametrize("claim_id", list(EXPECTED_GSPO))
def test_claim(claim_id: str, audit_record, quick_claim) -> None:
    r = quick_claim(claim_id)
    audit_record(r.paper, claim_id, r.verdict)
    assert REGISTRY[claim_id].kind in KINDS
    assert r.evidence and "computation_failed" not in r.evidence, r.evidence
    assert r.verdict == EXPECTED_GSPO[claim_id], (r.verdict, r.evidence)
    if r.verdict != "holds":
        assert r.summary and "\n" not in r.summary
    if r.verdict == "refuted":
        assert r.correction and r.short
        pytest.xfail(f"REFUTED {claim_id} ({r.location}): {r.correction}")


def _gspo_token_without_s(g, th, At):
    m = g.mask
    S = np.einsum("it,itd->id", At * m, g.scores(th)) / m.sum(1)[:, None]
    return S.sum(0) / m.shape[0]


#: claim id -> (the planted error, the check called with it, the verdict it implies)
PLANTED = {
    "gspo_d3_grpo_objective": (
        "the batch token mean in place of Eq. (2)'s per-response mean",
        lambda: s2_preliminaries.grpo_gradient_outcome(CTX, mode="token_mean"), "refuted"),
    "gspo_d10_gspo_gradient": (
        "GRPO's Eq. (12) as GSPO's gradient",
        lambda: s4_2_gradients.gspo_gradient_outcome(CTX, printed=F.grad_grpo_printed),
        "refuted"),
    "gspo_d12_gspo_token_gradient": (
        "Eq. (17) without s_i", lambda: s4_3_gspo_token.gspo_token_gradient_outcome(
            CTX, printed=_gspo_token_without_s), "refuted"),
    "gspo_d11_grpo_gradient_token_weights": (
        "GSPO's Eq. (10) as GRPO's gradient",
        lambda: s4_2_gradients.grpo_gradient_outcome(CTX, printed=F.grad_gspo_printed),
        "refuted"),
    "gspo_d4_single_sample_importance_weight": (
        "no importance weight (w = 1)", lambda: s3_motivation.importance_sampling_outcome(
            CTX, weight=lambda P, Q: np.ones_like(P)), "holds"),
    "gspo_d6_sequence_ratio_is_importance_sampling": (
        "the un-normalised ratio rho in place of s",
        lambda: s4_1_sequence_ratio.sequence_ratio_is_outcome(
            CTX, ratio=lambda log_rho, L: np.exp(log_rho)), "holds"),
    "gspo_d15_sequence_likelihood_stability": (
        "the sequence likelihood ratio rho as the quantity",
        lambda: s5_experiments.stability_outcome(CTX, quantity="sequence"), "refuted"),
    "gspo_d2_ppo_objective": (
        "equal lengths in place of the unequal ones",
        lambda: s2_preliminaries.ppo_length_weights_outcome(CTX, lengths=(3, 3, 3, 3)),
        "refuted"),
}


def test_planted_sample_covers_every_decidable_verdict():
    """The inconclusive GSPO claims are measurements on models (no input to plant)."""
    assert {EXPECTED_GSPO[c] for c in PLANTED} == {"holds", "holds-with-conditions", "refuted"}


@pytest.mark.parametrize("claim_id", list(PLANTED))
def test_planted_error_flips_the_verdict(claim_id: str) -> None:
    what, planted, implied = PLANTED[claim_id]
    out = planted()
    assert out.verdict != EXPECTED_GSPO[claim_id], what
    assert out.verdict == implied, (claim_id, what, out.verdict, out.evidence)
