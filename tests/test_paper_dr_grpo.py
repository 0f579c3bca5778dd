"""Dr. GRPO audit: a planted error in a check's input flips its verdict.

Every registered Dr. GRPO claim calls a public ``*_outcome(ctx, **inputs)`` function of its
section module with the faithful inputs (the paper's estimator, normaliser, constant, the
printed numbers). Here a sample of claims, at least one of each verdict the audit computes
(holds, holds-with-conditions, refuted, inconclusive), is re-run with one input changed to a
wrong one, and the verdict must change to the one the planted error implies. A check whose
verdict did not move would be a check that cannot fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from expected_verdicts import EXPECTED_DR_GRPO

from paper_checks.claims.dr_grpo import (
    appA_policy_gradient,
    appD_response_length,
    cross_paper,
    s1_s2_headline,
    s3_1_biases,
    s3_2_dr_grpo,
    s3_objective,
)
from paper_checks.claims.dr_grpo.worlds import answer_mdp
from paper_checks.registry import REGISTRY, CheckContext, get_claim

CTX = CheckContext(seed=0, quick=True)


def _response_dependent_baseline():
    m = answer_mdp(CTX)
    return {"reward_of_the_response": np.repeat(m.means[:, None], m.N + 2, axis=1)}


def _uniform_reference_only():
    n = len(answer_mdp(CTX).lengths)
    return {"uniform_over_responses": np.full(n, 1.0 / n)}


#: claim id -> (the planted error, the section function called with it, the verdict it implies)
PLANTED = {
    # holds -> refuted
    "drgrpo_eq5_baseline_no_bias": (
        "a baseline that depends on the response (its own reward)",
        lambda: appA_policy_gradient.baseline_outcome(
            CTX, baselines=_response_dependent_baseline()), "refuted"),
    "drgrpo_appa_rloo_scale": (
        "the factor (G+1)/G instead of G/(G-1)",
        lambda: appA_policy_gradient.rloo_outcome(CTX, factor=lambda G: (G + 1) / G), "refuted"),
    "drgrpo_eq3_grpo_objective": (
        "the batch token mean instead of Eq. (3)'s per-response mean",
        lambda: s3_objective.eq3_grpo_outcome(CTX, mode="token_mean"), "refuted"),
    "drgrpo_fig5_effective_advantage": (
        "the batch token mean as GRPO's normaliser",
        lambda: s3_1_biases.fig5_effective_advantage_outcome(CTX, mode="token_mean"), "refuted"),
    "drgrpo_sec3_1_length_bias_token_mdp": (
        "GRPO with a constant length normaliser (std kept)",
        lambda: s3_1_biases.length_bias_token_mdp_outcome(CTX, biased="std_const"), "refuted"),
    "drgrpo_eq1_objective_gradient": (
        "a ground-truth gradient scaled by 0.9",
        lambda: s3_objective.eq1_gradient_outcome(CTX, gradient=lambda w: 0.9 * w.grad_J()),
        "refuted"),
    "drgrpo_cross_std_convention": (
        "the population std (ddof 0) where the authors use Bessel's",
        lambda: cross_paper.std_convention_outcome(CTX, options={"ddof": 0, "eps": 1e-8}),
        "refuted"),
    # holds-with-conditions -> refuted / holds
    "drgrpo_sec3_1_difficulty_bias_expected_weight": (
        "the mean-only estimator in place of the std-normalised one",
        lambda: s3_1_biases.difficulty_weight_outcome(CTX, estimator="dr_grpo", options=({},)),
        "refuted"),
    "drgrpo_sec3_2_unbiased_policy_gradient": (
        "GRPO's loss in place of Dr. GRPO's",
        lambda: s3_2_dr_grpo.unbiased_outcome(CTX, loss="grpo"), "refuted"),
    "drgrpo_sec2_no_template_gain": (
        "a printed 1.5B average of 31.5 instead of 33.1",
        lambda: s1_s2_headline.no_template_gain_outcome(
            CTX, values={"Qwen2.5-Math-1.5B": (19.7, 31.5), "Qwen2.5-Math-7B": (23.8, 38.2)}),
        "holds"),
    "drgrpo_eq1_kl_is_entropy_regularisation": (
        "only the reference uniform over whole responses",
        lambda: s3_objective.eq1_kl_entropy_outcome(CTX, references=_uniform_reference_only()),
        "holds"),
    # refuted -> holds
    "drgrpo_eq6_group_mean_baseline": (
        "the leave-one-out mean (RLOO) as the baseline",
        lambda: appA_policy_gradient.eq6_equality_outcome(CTX, estimator="rloo"), "holds"),
    # inconclusive -> holds-with-conditions
    "drgrpo_appd_selection_effect_attribution": (
        "an optimiser without length bias (Dr. GRPO) for R1-Zero",
        lambda: appD_response_length.attribution_outcome(CTX, optimiser="dr_grpo"),
        "holds-with-conditions"),
}


def test_planted_sample_covers_every_computed_verdict_kind():
    kinds = {EXPECTED_DR_GRPO[c] for c in PLANTED}
    assert kinds == set(EXPECTED_DR_GRPO.values())
    assert len(PLANTED) >= 5


@pytest.mark.parametrize("claim_id", list(PLANTED), ids=list(PLANTED))
def test_planted_error_flips_the_verdict(claim_id: str) -> None:
    what, planted, implied = PLANTED[claim_id]
    get_claim(claim_id)  # registered
    faithful = EXPECTED_DR_GRPO[claim_id]
    out = planted()
    assert out.verdict != faithful, f"{claim_id}: planting {what} left the verdict {faithful!r}"
    assert out.verdict == implied, (claim_id, what, out.verdict, out.evidence)


def test_registered_checks_call_the_section_functions_with_the_faithful_inputs():
    """The registered claim and its section function with default inputs agree (so the
    planted tests perturb the function the audit runs)."""
    for cid, fn in (("drgrpo_eq6_group_mean_baseline", appA_policy_gradient.eq6_equality_outcome),
                    ("drgrpo_appa_rloo_scale", appA_policy_gradient.rloo_outcome)):
        reg = REGISTRY[cid].fn(CTX)
        direct = fn(CTX)
        assert reg.verdict == direct.verdict == EXPECTED_DR_GRPO[cid]
        assert reg.evidence == direct.evidence
