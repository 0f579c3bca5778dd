"""Section 3, Credit assignment failure: Theorem 3.1, Remark 3.2 and the gradient factorisation of
Sec. 3.1 (Eqs. 17-19), as stated (sequence-sum loss) and as practised (length-normalised loss
aggregation).

Exact tier: token-level constructions with :mod:`grpo_theory.multiturn` and
:mod:`grpo_theory.aggregation`, every binary group enumerated; a token MDP of :mod:`sims.token_mdp`
for the credit a rollout's tokens receive.
"""

from __future__ import annotations

import numpy as np

from grpo_theory import compute_advantages
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "3. Credit assignment failure"


@claim(
    "thm3_1_uniform_token_credit", kind="derivation",
    location="Sec. 3, Theorem 3.1, Eq. (16)",
    text="Under output-only reward and gamma = 1 every token of rollout i gets the same "
    "advantage r_i - v_hat_R.",
    check="Per-token advantages of Eq. 22's construction applied to per-step rewards "
    "(0, ..., 0, r_i) [P, R, T] (grpo_theory.multiturn, mode total_minus_group_mean) and of the "
    "reward-to-go minus group mean: spread over t within each rollout.",
    variants=("grpo",),
)
def _thm3_1(ctx: CheckContext) -> Outcome:
    from grpo_theory.multiturn import multiturn_advantages

    rng = ctx.rng(31)
    P, R, T = 50, 8, 6
    stage = np.zeros((P, R, T))
    stage[:, :, -1] = (rng.random((P, R)) < 0.4).astype(float)
    A = np.asarray(multiturn_advantages(stage, mode="total_minus_group_mean"))
    spread = float(np.max(np.ptp(A, axis=2)))
    ref = stage.sum(2) - stage.sum(2).mean(1, keepdims=True)
    gap = float(np.max(np.abs(A[:, :, 0] - ref)))
    ok = spread == 0.0 and gap < 1e-12
    return Outcome(verdict_from(ok),
                   {"max_spread_over_tokens": spread, "max_gap_to_r_minus_mean": gap},
                   correction=None if ok else "token advantages differ within a rollout")


@claim(
    "remark3_2_no_intra_rollout_credit", kind="derivation",
    location="Sec. 3, Remark 3.2",
    text="GRPO gives inter-rollout credit (which rollouts are good) but no intra-rollout credit "
    "(which tokens are good), although the true per-token advantages differ.",
    check="sims token MDP (V=3, T=4): spread of the true advantages A(s_t, a_t) along each "
    "sequence (probability-weighted), vs the GRPO token advantages (zero spread by Thm 3.1).",
    variants=("grpo",),
)
def _remark3_2(ctx: CheckContext) -> Outcome:
    from grpo_theory.multiturn import multiturn_advantages
    from sims.token_mdp import TokenMDP

    m = TokenMDP.random(ctx.rng(32), vocab=3, length=4, success_fraction=0.4)
    adv = m.advantages()
    per_tok = adv[m.state_index, m.sequences]  # [V^T, T] true A(s_t, a_t) along each sequence
    spread = np.ptp(per_tok, axis=1)
    w = m.seq_probs()
    # GRPO's token advantages of sampled groups in the same MDP (Eq. 22 with output-only reward:
    # stage rewards (0, ..., 0, r_i)), computed, not assumed
    idx, rew = m.sample(200, 8, ctx.rng(33))
    stage = np.zeros(idx.shape + (m.length,))
    stage[..., -1] = rew
    A = np.asarray(multiturn_advantages(stage, mode="total_minus_group_mean"))
    grpo_spread = float(np.max(np.ptp(A, axis=2)))
    ev = {"expected_spread_true_token_advantages": float(w @ spread),
          "max_spread_true_token_advantages": float(spread.max()),
          "max_spread_grpo_token_advantages_200_groups_R8": grpo_spread,
          "fraction_of_groups_with_nonzero_grpo_advantage": float(
              np.mean(np.any(np.abs(A[..., 0]) > 0, axis=1)))}
    ok = ev["expected_spread_true_token_advantages"] > 1e-6 and grpo_spread == 0.0
    return Outcome(verdict_from(ok, otherwise="inconclusive"), ev,
                   correction=None if ok else "no spread of the true token advantages found, or "
                   "GRPO's token advantages vary within a rollout")


@claim(
    "eq19_gradient_factorisation", kind="derivation",
    location="Sec. 3.1, Eqs. (17)-(19)",
    text="With uniform credit the GRPO gradient factors as (1/R) sum_i A_i psi_i, psi_i the sum of "
    "the token score vectors.",
    check="Random token gradients [R, T_i, d]: the token-level sum of Eq. 15 (the sequence-sum "
    "loss the paper writes) vs Eq. 19. The length-normalised losses GRPO is run with: "
    "eq19_gradient_factorisation_practised_aggregation.",
    variants=("grpo",),
)
def _eq19(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(19)
    R, d = 4, 30
    lengths = np.array([3, 7, 5, 12])
    toks = [rng.normal(size=(L, d)) for L in lengths]
    r = np.array([[1.0, 0.0, 1.0, 0.0]])
    A = np.asarray(compute_advantages("grpo", r))[0]
    eq15 = sum(A[i] * toks[i][t] for i in range(R) for t in range(lengths[i])) / R
    psi = np.stack([t.sum(0) for t in toks])
    eq19 = (A @ psi) / R
    err = float(np.max(np.abs(eq15 - eq19)))
    ok = err < 1e-12
    return Outcome(verdict_from(ok), {"max_abs_error_eq15_vs_eq19": err},
                   correction=None if ok else f"Eq. 15 and Eq. 19 differ by {err:.3g}")


@claim(
    "eq19_gradient_factorisation_practised_aggregation", kind="as-practised",
    location="Sec. 3.1, Eq. (19), as practised (length-normalised loss aggregation)",
    text="The gradient GRPO is run with is (1/R) sum_i A_i psi_i: the weight on psi_i is A_i.",
    check="Random token gradients [R, T_i, d] with unequal lengths: the gradient of GRPO's "
    "published loss (mean over each sequence's tokens, then over sequences) and of a batch "
    "token mean (grpo_theory.aggregation) vs Eq. 19; the per-rollout weights they put on psi_i.",
    variants=("grpo",),
)
def _eq19_practised(ctx: CheckContext) -> Outcome:
    from grpo_theory.aggregation import aggregation_weights

    rng = ctx.rng(19)
    R, d = 4, 30
    lengths = np.array([3, 7, 5, 12])
    toks = [rng.normal(size=(L, d)) for L in lengths]
    A = np.asarray(compute_advantages("grpo", np.array([[1.0, 0.0, 1.0, 0.0]])))[0]
    psi = np.stack([t.sum(0) for t in toks])
    eq19 = (A @ psi) / R
    w_seq = np.asarray(aggregation_weights(lengths[None, :], mode="sequence_mean"))[0]
    w_tok = np.asarray(aggregation_weights(lengths[None, :], mode="token_mean"))[0]
    # the published loss, token by token: (1/R) sum_i (1/|o_i|) sum_t A_i grad log pi_t
    g_seq = sum(A[i] / lengths[i] * toks[i][t] for i in range(R) for t in range(lengths[i])) / R
    fact_err = float(np.max(np.abs(g_seq - (w_seq * A) @ psi)))
    rel_gap = float(np.linalg.norm(g_seq / np.linalg.norm(g_seq) - eq19 / np.linalg.norm(eq19)))
    ev = {"max_abs_error_sequence_mean_gradient_vs_sum_i_w_i_A_i_psi_i": fact_err,
          "sequence_mean_weight_ratio_longest_over_shortest": float(w_seq[3] / w_seq[0]),
          "token_mean_weight_ratio_longest_over_shortest": float(w_tok[3] / w_tok[0]),
          "distance_between_unit_directions_sequence_mean_vs_eq19": rel_gap}
    same = rel_gap < 1e-9
    return Outcome(
        verdict_from(same, computed=fact_err < 1e-12), ev,
        correction=None if same else (
            "GRPO as published averages each sequence's tokens, so its gradient is "
            "(1/R) sum_i (A_i/|o_i|) psi_i (verified to "
            f"{fact_err:.0e}): the weight on psi_i is A_i times an aggregation weight "
            f"(ratio {ev['sequence_mean_weight_ratio_longest_over_shortest']:.3f} between the "
            "longest and shortest rollout here; a batch token mean gives A_i/(total tokens)); "
            "the factorisation into one scalar times psi_i survives, with weight A_i w_i, and "
            "the direction differs from Eq. 19 "
            f"(distance between unit directions {rel_gap:.3f})"),
        short=None if same else "weight on psi_i is A_i/|o_i| (sequence mean) or A_i/(total "
        "tokens), not A_i; one scalar per rollout survives",
        finding=None if same else (
            "the published loss weights psi_i by A_i/|o_i|, not A_i (weight ratio "
            f"{ev['sequence_mean_weight_ratio_longest_over_shortest']:.3f} between the longest "
            f"and shortest rollout here); the direction moves off Eq. 19 by {rel_gap:.3f} (unit "
            "vectors)"),
    )


@claim(
    "sec3_1_uniform_credit_enables_rank_reduction", kind="derivation",
    location="Sec. 3.1, after Eq. (19)",
    text="Token-level advantages could not be factored this way; uniform credit is what enables "
    "this rank-reducing factorisation.",
    check="Random token gradients (R=4, T=6, d=40): rank of the R x d matrix of per-rollout "
    "contributions with uniform credit (rows A_i psi_i) vs with token-level advantages "
    "(rows sum_t A_it grad log pi_t).",
    variants=("grpo",),
)
def _sec3_1(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(32)
    R, T, d = 4, 6, 40
    toks = rng.normal(size=(R, T, d))
    A = np.asarray(compute_advantages("grpo", np.array([[1.0, 0.0, 0.0, 1.0]])))[0]
    G_uniform = A[:, None] * toks.sum(1)
    A_tok = rng.normal(size=(R, T))
    G_token = np.einsum("rt,rtd->rd", A_tok, toks)
    r_u = int(np.linalg.matrix_rank(G_uniform))
    r_t = int(np.linalg.matrix_rank(G_token))
    refuted = r_t <= R and r_u == r_t
    return Outcome(
        verdict_from(not refuted),
        {"rank_uniform_credit": r_u, "rank_token_level_credit": r_t, "R": R},
        short=("token-level credit also gives one vector per rollout (rank <= R); uniform credit "
               "fixes the row directions, not the rank") if refuted else None,
        finding=(f"token-level credit also gives one vector per rollout: rank {r_t} with it and "
                 f"{r_u} with uniform credit (R = {R}); uniform credit fixes the rows' "
                 "directions, not the rank") if refuted else None,
        correction=(
            f"token-level advantages also give one vector per rollout, phi_i = sum_t A_it "
            f"grad log pi_t, so both gradient matrices have R rows and rank <= R (computed: "
            f"{r_u} and {r_t}); uniform credit fixes the direction of each row to psi_i, it does "
            "not reduce the rank"
        ) if refuted else None,
    )
