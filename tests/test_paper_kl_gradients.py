"""The KL-estimator papers' audit (arXiv 2506.09477, 2510.01555, 2512.21852): one test per
registered claim asserting its computed verdict (recorded here from the computation), and
planted errors in the checks' inputs that must flip the verdict (a check whose verdict cannot
move is no check)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_theory.kl import kl_estimate
from paper_checks.claims.kl_gradients import (
    ce_comedy,
    estimators,
    liu_rethinking,
    tm_pitfalls,
)
from paper_checks.registry import KINDS, REGISTRY, CheckContext, ordered_ids

CTX = CheckContext(seed=0, quick=True)

#: claim id -> the verdict its quick check computes (seed 0)
EXPECTED_KL_GRADIENTS = {
    "klgrad_d1_estimator_values": "holds",
    "klgrad_d2_fig1_mse": "inconclusive",
    "klgrad_d3_k1_loss_zero_gradient": "holds",
    "klgrad_d4_k3_loss_forward_kl": "holds",
    "klgrad_d8_rkl_gradient_k1_in_reward": "holds",
    "klgrad_d10_token_level_partial_gradient": "holds",
    "klgrad_d11_incorrect_look_fine_at_low_kl": "holds",
    "klgrad_d18_code_bases": "inconclusive",
    "klgrad_d5_k3_coefficient_bias_asymmetry": "holds",
    "klgrad_d6_k3_coefficient_variance": "holds",
    "klgrad_d7_gaussian_condition": "holds",
    "klgrad_d7_gaussian_run_values": "inconclusive",
    "klgrad_d9_theorem51_k2_loss_equals_k1_reward": "holds",
    "klgrad_d9_theorem51_token_level": "refuted",
    "klgrad_d12_off_policy_correction": "holds",
    "klgrad_d17_empirical_k1_like_no_kl": "inconclusive",
    "klgrad_d13_on_policy_classification": "holds-with-conditions",
    "klgrad_d14_off_policy_none_unbiased": "holds-with-conditions",
    "klgrad_d14_sequence_level_open_problem": "inconclusive",
    "klgrad_d15_score_pathwise_decomposition": "inconclusive",
    "klgrad_d16_empirical_instability": "inconclusive",
}
#: the quick checks that take ~0.3 s or more of CPU: their per-claim tests are in the slow tier
SLOW = {"klgrad_d5_k3_coefficient_bias_asymmetry", "klgrad_d7_gaussian_condition",
        "klgrad_d11_incorrect_look_fine_at_low_kl", "klgrad_d16_empirical_instability",
        "klgrad_d17_empirical_k1_like_no_kl"}


def test_expected_table_covers_every_registered_claim_in_report_order():
    assert list(EXPECTED_KL_GRADIENTS) == ordered_ids("kl-gradients")


@pytest.mark.parametrize("claim_id", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW
                                      else c for c in EXPECTED_KL_GRADIENTS])
def test_claim(claim_id: str, audit_record, quick_claim) -> None:
    r = quick_claim(claim_id)
    audit_record(r.paper, claim_id, r.verdict)
    assert REGISTRY[claim_id].kind in KINDS
    assert r.evidence and "computation_failed" not in r.evidence, r.evidence
    assert r.verdict == EXPECTED_KL_GRADIENTS[claim_id], (r.verdict, r.evidence)
    if r.verdict != "holds":
        assert r.summary and "\n" not in r.summary
    if r.verdict == "refuted":
        assert r.correction and r.short
        pytest.xfail(f"REFUTED {claim_id} ({r.location}): {r.correction}")


def _k3_plus_one(lr, *, estimator):
    return kl_estimate(lr, estimator=estimator) + (1.0 if estimator == "k3" else 0.0)


#: claim id -> (the planted error, the check called with it, the verdict it implies)
PLANTED = {
    "klgrad_d1_estimator_values": (
        "k3 without its -1", lambda: estimators.estimator_values_outcome(
            CTX, estimate=_k3_plus_one), "refuted"),
    "klgrad_d3_k1_loss_zero_gradient": (
        "k2 as the loss in place of k1", lambda: tm_pitfalls.k1_loss_outcome(CTX, name="k2_loss"),
        "refuted"),
    "klgrad_d4_k3_loss_forward_kl": (
        "k2 as the loss in place of k3", lambda: tm_pitfalls.k3_loss_outcome(CTX, name="k2_loss"),
        "refuted"),
    "klgrad_d10_token_level_partial_gradient": (
        "the KL-to-go form replaced by k1 on its own token",
        lambda: tm_pitfalls.partial_gradient_outcome(CTX, kl_to_go="k1_reward"), "refuted"),
    "klgrad_d5_k3_coefficient_bias_asymmetry": (
        "the coefficient delta - 1", lambda: liu_rethinking.k3_coefficient_outcome(
            CTX, coefficient=lambda d: d - 1), "refuted"),
    "klgrad_d6_k3_coefficient_variance": (
        "chi^2 in the other direction", lambda: liu_rethinking.k3_variance_outcome(
            CTX, chi2=lambda P, Q: float(np.sum(Q**2 / P) - 1)), "refuted"),
    "klgrad_d9_theorem51_k2_loss_equals_k1_reward": (
        "k2 as a per-token loss", lambda: liu_rethinking.theorem51_outcome(CTX, k2_loss="k2_loss"),
        "refuted"),
    "klgrad_d12_off_policy_correction": (
        "PPO's per-token ratio as the correction",
        lambda: liu_rethinking.off_policy_correction_outcome(CTX, weight="token"), "refuted"),
    "klgrad_d9_theorem51_token_level": (
        "k2 at sequence level", lambda: liu_rethinking.theorem51_token_level_outcome(
            CTX, k2_loss="seq_k2_loss"), "holds"),
    "klgrad_d13_on_policy_classification": (
        "k1 as a loss called 'K1 in reward'",
        lambda: ce_comedy.on_policy_classification_outcome(CTX, k1_in_reward="k1_loss"),
        "refuted"),
    "klgrad_d2_fig1_mse": (
        "a figure setting near the reference", lambda: estimators.fig1_mse_outcome(
            CTX, setting=(0.1, 0.5)), "holds"),
    "klgrad_d7_gaussian_run_values": (
        "a run whose k1 SD is 0.45 (a size that decides it)",
        lambda: liu_rethinking.gaussian_run_outcome(CTX, sd_k1=0.45), "refuted"),
}


def test_planted_sample_covers_every_computed_verdict():
    assert {EXPECTED_KL_GRADIENTS[c] for c in PLANTED} == set(EXPECTED_KL_GRADIENTS.values())


@pytest.mark.parametrize("claim_id", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW
                                      else c for c in PLANTED])
def test_planted_error_flips_the_verdict(claim_id: str) -> None:
    what, planted, implied = PLANTED[claim_id]
    out = planted()
    assert out.verdict != EXPECTED_KL_GRADIENTS[claim_id], what
    assert out.verdict == implied, (claim_id, what, out.verdict, out.evidence)
