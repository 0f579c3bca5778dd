"""The PAPER'S printed values of "GRPO, Dr. GRPO, and DAPO Are Three Operations on One Number:
The Group-Standard-Deviation Identity" (Bay and Yearick, arXiv 2607.00152), and of the checks its
authors publish (``scripts/checks.py``), typed in once, here only.

Nothing here is a result of ours: the numbers as the LaTeX source and the generated tables print
them (digest ``shared/papers/grpo-std-identity-2607.00152.md``). Data only: imports nothing.
"""

from __future__ import annotations

__all__ = ["TABLE2", "TABLE2_TARGETS", "SEC4_TEXT", "COROLLARY1_EXAMPLE", "PENALTY",
           "DIFFICULTY_WEIGHT", "BIG_MATH", "CONTROLLED_RUN", "DAPO_FIT", "AUTHORS_CHECKS"]

#: Fidelity targets of Table 2's columns.
TABLE2_TARGETS: tuple[float, ...] = (0.90, 0.95, 0.99)
#: Table 2: p -> per target (exact smallest G with phi >= target, G* in parentheses).
TABLE2: dict[float, tuple[tuple[int, int], ...]] = {
    0.50: ((7, 5), (11, 10), (51, 50)),
    0.30: ((9, 6), (14, 12), (61, 60)),
    0.10: ((22, 14), (36, 28), (144, 139)),
    0.05: ((42, 26), (69, 53), (273, 263)),
}
#: Sec. 4 text and Sec. 1: the numbers quoted around Table 2.
SEC4_TEXT: dict[str, float] = {
    "G_95_at_p_half": 11, "phi_G8_p_half_percent": 93, "G_95_at_p_0.05": 69,
    "times_coin_flip_budget": 6.0, "phi_G8_p_0.05": 0.54, "G_star_99_p_0.05": 263,
    "exact_99_p_0.05": 273, "coin_flip_faithful_G": 10, "five_percent_G": 70,
}
#: Corollary 1: at G = 8, p = 0.05, the exact realised fraction against the expansion.
COROLLARY1_EXAMPLE: dict[str, float] = {"G": 8, "p": 0.05, "exact": 0.54, "expansion": 0.67}
#: Corollary 2: the penalty 1/(4 p (1-p)) at p = 1/2, 0.1, 0.05.
PENALTY: dict[float, float] = {0.5: 1.0, 0.1: 2.8, 0.05: 5.3}
#: Sec. 6: the difficulty weight w(p) = 1/sqrt(p(1-p)): w(1/2) = 2, about 4.6 at p = 0.05.
DIFFICULTY_WEIGHT: dict[float, float] = {0.5: 2.0, 0.05: 4.6}
#: Sec. 7, Tables 3-4 (Big-Math, N = 215,608 problems, Llama-3.1-8B solve rates k/64).
BIG_MATH: dict[str, object] = {
    "N": 215_608, "never_solved_percent": 4.0, "always_solved_percent": 7.2,
    "silent_every_G_percent": 11.2, "extreme_share_dr_grpo_percent": 13.9,
    "extreme_share_grpo_percent": 24.7, "extreme_factor": 1.78,
    "medium_share_dr_grpo_percent": 22.8, "medium_share_grpo_percent": 17.5,
    "silent_closed_form_percent": {4: 59, 8: 44, 16: 32, 32: 23, 64: 17},
    "silent_subsampled_percent": {4: 59, 8: 43, 16: 30},
}
#: Sec. 8: the controlled run (M = 6000 prompts, 150 steps, G = 8).
CONTROLLED_RUN: dict[str, float] = {
    "M": 6000, "steps": 150, "G": 8, "lr": 0.5, "silent_R2": 0.999,
    "extreme_share_grpo_percent": 17.0, "extreme_share_dr_grpo_percent": 14.3,
    "hardest_quartile_final_p_grpo": 0.99, "hardest_quartile_final_p_dr_grpo": 0.88,
    "dapo_oversampling": 3.5,
}
#: Sec. 5: the fit of E_p[p^32] to DAPO's Fig. 3b.
DAPO_FIT: dict[str, float] = {"R2": 0.92, "R2_boot_low": 0.91, "R2_boot_high": 0.96,
                              "R2_two_parameter": 0.98, "avg_at": 32, "dapo_G": 16}
#: scripts/checks.py (numpy population std), as the digest describes it.
AUTHORS_CHECKS: dict[str, object] = {
    "closed_form_pairs": "four (k, G) pairs (not listed)",
    "scalar_G": (5, 8, 16), "scalar_offset": 0.3,
    "vector_trials": 5000, "vector_G": (2, 19), "vector_d": (1, 7), "vector_tol": 1e-12,
    "attenuation_G": 8, "attenuation_p": (0.5, 0.25, 0.1, 0.05),
    "attenuation_gap_below_at_half": 0.01, "attenuation_gap_above_at_0.05": 0.1,
    "phi_8_half": 0.9278, "phi_8_0.05": 0.5390,
    "mc_G": 64, "mc_groups": 200_000, "mc_tol_grpo": 0.02, "mc_tol_unnormalised": 2e-3,
    "group_size_for_epsilon_example": {"epsilon": 0.1, "p": 0.1, "G": 14},
}
