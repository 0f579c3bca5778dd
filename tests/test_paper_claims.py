"""The audit as a test suite: one test per registered claim of arXiv 2606.29238, of the FADE
abstract (arXiv 2607.01490), of Dr. GRPO (arXiv 2503.20783) and of arXiv 2503.06639 v4 (GRPO's
effective loss).

``pytest -k <claim id>`` audits one claim. Each test runs the claim's quick check and asserts the
verdict that the computation gives (recorded below from the computation, not from the paper). A
claim whose computed verdict is ``refuted`` then calls ``pytest.xfail`` with the computed
correction (the counterexample or the correct value) as its reason, so every refutation is
listed as XFAIL with its evidence in pytest's summary while the suite exits 0; if a refuted
claim stopped being refuted (or any verdict changed), the verdict assertion fails the test.
Every computed verdict is also recorded for the audit summary that ``tests/conftest.py`` prints
at the end of the run (counts by verdict and the refuted ids, per paper).
"""

from __future__ import annotations

import math

import pytest

from paper_checks.registry import VERDICTS, ordered_ids, run_claim

# Verdicts as computed by the quick checks (seed 0). A change is a regression or a finding:
# look at the claim's evidence before updating this table.
EXPECTED = {
    "def2_1_value_functions": "holds",
    "eq4_policy_gradient_theorem": "holds",
    "eq5_reinforce_unbiased": "holds",
    "sec2_3_return_unbiased_for_q": "holds",
    "eq6_baseline_zero_expectation": "holds",
    "eq7_baseline_keeps_unbiased": "holds",
    "sec2_4_value_is_variance_minimising_baseline": "refuted",
    "eq8_return_equals_one_step_bootstrap": "refuted",
    "eq9_td_error_is_advantage_in_expectation": "holds",
    "eq10_advantage_policy_gradient": "holds",
    "eq11_orm_return_constant": "holds",
    "eq12_td_error_under_orm": "holds-with-conditions",
    "eq13_single_scalar_advantage": "holds-with-conditions",
    "eq14_group_mean_unbiased": "holds",
    "sec2_5_clip_and_kl_keep_the_structure": "refuted",
    "eq15_grpo_gradient_is_unbiased_reinforce": "refuted",
    "abstract_baseline_optimality_conditions": "refuted",
    "thm3_1_uniform_token_credit": "holds",
    "remark3_2_no_intra_rollout_credit": "holds",
    "eq19_gradient_factorisation": "holds",
    "eq19_gradient_factorisation_practised_aggregation": "refuted",
    "sec3_1_uniform_credit_enables_rank_reduction": "refuted",
    "thm4_1_i_zero_sum": "holds",
    "thm4_1_ii_variance": "holds",
    "thm4_1_ii_variance_std_normalised": "refuted",
    "thm4_1_iii_covariance": "holds",
    "thm4_1_iii_covariance_std_normalised": "refuted",
    "thm4_1_iv_chebyshev_sparsity_bound": "holds",
    "thm4_1_iv_chebyshev_sparsity_bound_std_normalised": "refuted",
    "cor4_2_signal_scales_with_sigma": "holds-with-conditions",
    "cor4_2_std_normalised_scale_invariance": "refuted",
    "cor4_2_constant_group_zero_gradient": "holds",
    "sec4_curriculum_max_variance": "holds",
    "sec5_1_binary_advantage_values": "holds",
    "sec5_1_small_advantages_near_extremes": "refuted",
    "abstract_sparsity_intensifies_over_training": "holds-with-conditions",
    "sec5_1_clustered_scores_concentrate": "holds-with-conditions",
    "sec6_grpo_exact_single_turn": "refuted",
    "eq21_advantage_one_step_form": "holds-with-conditions",
    "sec6_multiturn_advantage_biased": "holds",
    "eq23_a3_bias_formula": "refuted",
    "a3_past_rewards_fixed": "holds-with-conditions",
    "a3_bias_grows_linearly_in_h": "refuted",
    "a3_bias_bound": "holds",
    "sec6_multiturn_gradient_bias": "refuted",
    "a3_true_stage_advantage": "holds",
    "eq26_a3_conditional_expectation": "refuted",
    "eq27_a3_add_subtract_value": "holds",
    "sec7_max_rank_r_minus_1": "refuted",
    "table1_internal_consistency": "refuted",
    "sec7_rank2_intrinsic_from_zero_sum": "refuted",
    "sec7_step_moves_along_two_directions": "refuted",
    "fig3_gradient_is_psi_plus_minus_psi_minus": "holds",
    "table1_empirical_values": "inconclusive",
    "sec7_1_effective_rank_definition": "holds",
    "sec7_1_metrics_joint_range": "holds",
    "sec7_1_top1_is_variance_explained": "refuted",
    "sec9_rloo_removes_o1r_bias": "holds",
    "sec8_rloo_breaks_rank2": "refuted",
    "sec8_rank_falls_as_sigma_to_zero": "holds-with-conditions",
    "cross_references_resolve": "refuted",
    "a1_eq24_25_variance_steps": "holds",
    "a2_hoeffding_derivation": "holds",
    "a2_cell_r2_eps0_3": "refuted",
    "a2_cell_r2_eps0_2": "holds",
    "a2_cell_r2_eps0_1": "holds",
    "a2_cell_r4_eps0_3": "refuted",
    "a2_cell_r4_eps0_2": "refuted",
    "a2_cell_r4_eps0_1": "holds",
    "a2_cell_r8_eps0_3": "refuted",
    "a2_cell_r8_eps0_2": "holds",
    "a2_cell_r8_eps0_1": "refuted",
    "a2_cell_r16_eps0_3": "refuted",
    "a2_cell_r16_eps0_2": "refuted",
    "a2_cell_r16_eps0_1": "refuted",
    "a2_nontrivial_only_for_large_r_or_eps": "holds",
    "a2_advantage_error_identity": "holds",
}

#: The FADE abstract (arXiv 2607.01490), quick checks, seed 0.
EXPECTED_FADE = {
    "fade_mass_decomposition": "holds",
    "fade_sign_axis_entropy": "inconclusive",
    "fade_sign_axis_weight_geometry": "inconclusive",
    "fade_difficulty_axis_tradeoff": "holds-with-conditions",
    "fade_tradeoffs_shift_during_training": "inconclusive",
    "fade_schedules_from_training_statistics": "inconclusive",
}

#: arXiv 2503.06639 v4 (GRPO's effective loss, dynamics and success amplification), quick
#: checks, seed 0.
EXPECTED_EFFLOSS = {
    "effloss_eq3_whitened_binary_advantage": "holds",
    "effloss_sec2_1_calibrated_weights_monotone": "holds",
    "effloss_sec2_2_clipped_objective_is_weighted_contrastive": "holds",
    "effloss_sec2_2_clip_helper_identity_as_printed": "refuted",
    "effloss_sec2_3_no_clip_is_pos_contrast": "holds-with-conditions",
    "effloss_sec2_4_nonparametric_iteration": "holds",
    "effloss_thm1_optimal_policy": "holds",
    "effloss_thm2_pos_fixed_point_iteration": "holds",
    "effloss_remark1_eps_needed": "holds-with-conditions",
    "effloss_prop1_i_fixed_point_exists": "holds",
    "effloss_prop1_ii_derivative_and_shape": "holds",
    "effloss_prop1_iii_sigmoid_form": "holds",
    "effloss_sec3_limit_is_fixed_point": "holds",
    "effloss_sec3_fixed_points_not_unique": "holds",
    "effloss_sec3_p_one_almost_always_fixed": "refuted",
    "effloss_sec3_1_odds_form": "holds",
    "effloss_thm3_amplification": "holds",
    "effloss_abstract_pos_converges": "refuted",
    "effloss_sec3_1_degenerate_references_absorbing": "holds",
    "effloss_sec3_1_degenerate_fixed_point_stability": "refuted",
    "effloss_thm4_mirror_policy_and_recurrence": "holds",
    "effloss_thm5_mirror_monotone_to_one": "holds",
    "effloss_sec5_mean_only_dynamics": "holds",
    "effloss_sec5_variance_normalisation_is_adaptive_beta": "holds",
    "effloss_sec6_takeaway_beta_eff_sigma": "holds-with-conditions",
    "effloss_appa_gsm8k_amplification": "inconclusive",
    "effloss_alg1_plugin_advantage_is_grpo_std": "holds",
    "effloss_alg1_plugin_advantage_practised_bessel": "refuted",
    "effloss_xpaper_mean_only_is_dr_grpo_with_group_factor": "holds",
    "effloss_lemma1_derivative_at_fixed_point": "holds",
    "effloss_appc2_beta_condition": "holds",
    "effloss_thm6_local_convergence": "holds",
    "effloss_table1_global_contraction": "holds",
    "effloss_fig5_trajectories": "holds-with-conditions",
    "effloss_appc2_staged_grpo": "holds",
    "effloss_thm8_general_weights_anchor": "refuted",
    "effloss_lemma2_geometric_mean": "holds",
    "effloss_lemma3_pos_geometric_mean": "holds",
    "effloss_appe_conditionals_as_printed": "refuted",
    "effloss_thm9_two_kl_recurrence": "holds",
    "effloss_appe_amplification_if_renyi_ordered": "holds",
    "effloss_sec4_renyi_correction_encodes_mismatch": "holds-with-conditions",
    "effloss_table1_two_kl_fixed_point": "holds",
    "effloss_sec4_mixing_loses_monotonicity": "holds",
    "effloss_thm10_parametric_bound": "holds-with-conditions",
    "effloss_appf_sampled_groups_near_fixed_point": "holds-with-conditions",
}


#: Dr. GRPO (arXiv 2503.20783 v1), quick checks, seed 0.
EXPECTED_DR_GRPO = {
    "drgrpo_headline_empirical_numbers": "inconclusive",
    "drgrpo_sec2_no_template_gain": "holds-with-conditions",
    "drgrpo_eq1_objective_gradient": "holds",
    "drgrpo_eq1_kl_is_entropy_regularisation": "holds-with-conditions",
    "drgrpo_eq2_ppo_unbiased": "holds",
    "drgrpo_eq3_grpo_objective": "holds",
    "drgrpo_fig5_effective_advantage": "holds",
    "drgrpo_sec3_1_length_bias_response_level": "holds",
    "drgrpo_sec3_1_length_bias_token_mdp": "holds",
    "drgrpo_sec3_1_difficulty_bias_per_group": "holds",
    "drgrpo_sec3_1_difficulty_bias_expected_weight": "holds-with-conditions",
    "drgrpo_listing1_length_normalised_losses": "holds",
    "drgrpo_table2_repositories_length_bias": "inconclusive",
    "drgrpo_sec3_2_definition": "holds",
    "drgrpo_sec3_2_unbiased_policy_gradient": "holds-with-conditions",
    "drgrpo_fig6_length_growth_empirical": "inconclusive",
    "drgrpo_fig6_length_growth_mechanism": "holds",
    "drgrpo_fig8_llama_double_increase": "inconclusive",
    "drgrpo_eq5_baseline_no_bias": "holds",
    "drgrpo_eq6_group_mean_baseline": "refuted",
    "drgrpo_eq6_no_std_no_length": "holds",
    "drgrpo_appa_rloo_scale": "holds",
    "drgrpo_table5_r1_zero_lengths": "inconclusive",
    "drgrpo_appd_selection_effect_mechanism": "holds",
    "drgrpo_appd_selection_effect_attribution": "inconclusive",
    "drgrpo_cross_group_mean_factor": "holds",
    "drgrpo_cross_std_convention": "holds",
    "drgrpo_cross_population_weights": "holds",
}


def test_expected_table_covers_every_registered_claim():
    assert set(EXPECTED) == set(ordered_ids())
    assert set(EXPECTED_FADE) == set(ordered_ids("fade"))
    assert set(EXPECTED_DR_GRPO) == set(ordered_ids("dr-grpo"))
    assert set(EXPECTED_EFFLOSS) == set(ordered_ids("grpo-effective-loss"))
    assert (set(EXPECTED.values()) | set(EXPECTED_FADE.values())
            | set(EXPECTED_DR_GRPO.values()) | set(EXPECTED_EFFLOSS.values())) <= set(VERDICTS)


def _numbers(ev, path=""):
    if isinstance(ev, dict):
        for k, v in ev.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(ev, list):
        for i, v in enumerate(ev):
            yield from _numbers(v, f"{path}[{i}]")
    else:
        yield path, ev


ALL_EXPECTED = {**EXPECTED, **EXPECTED_FADE, **EXPECTED_DR_GRPO, **EXPECTED_EFFLOSS}


@pytest.mark.parametrize("claim_id", list(ALL_EXPECTED), ids=list(ALL_EXPECTED))
def test_claim(claim_id: str, audit_record) -> None:
    r = run_claim(claim_id, seed=0, quick=True)
    audit_record(r.paper, claim_id, r.verdict)
    assert r.evidence, f"{claim_id}: no evidence"
    for path, v in _numbers(r.evidence):
        assert isinstance(v, bool | int | float | str), f"{claim_id}{path}: {v!r}"
        if isinstance(v, float):
            assert math.isfinite(v), f"{claim_id}{path} = {v}"
    assert "computation_failed" not in r.evidence, r.evidence
    assert r.verdict == ALL_EXPECTED[claim_id], (
        f"{claim_id}: computed verdict {r.verdict!r}, recorded {ALL_EXPECTED[claim_id]!r}; "
        f"evidence {r.evidence}"
    )
    if r.verdict == "holds-with-conditions":
        assert r.conditions and r.short
    if r.verdict in ("refuted", "inconclusive"):
        assert r.summary, f"{claim_id}: a {r.verdict} claim needs its short form"
    if r.verdict == "refuted":
        assert r.correction and r.short
        pytest.xfail(f"REFUTED {claim_id} ({r.location}): {r.correction}")
