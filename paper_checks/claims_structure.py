"""Claims of Sections 3 and 5 and Theorem 4.1 (i): uniform credit, the factorisation (Eq. 19),
zero-sum advantages, sparsity and "advantages become small".

Exact tier: token-level constructions with :mod:`grpo_theory.multiturn` / aggregation, every
binary group enumerated with the paper's mean-centred GRPO and the std-normalised GRPO that
practitioners run (ddof=1, eps=0); a :mod:`sims.training` run for the sparsity-over-training claim.
"""

from __future__ import annotations

import numpy as np

from grpo_theory import compute_advantages

from ._common import STD, training_run
from ._exact import advantage_values
from .registry import CheckContext, Outcome, claim, verdict_from

SEC3 = "3. Credit assignment"
SEC4 = "4. Structural constraints on advantages"
SEC5 = "5. Sparse updates"


@claim(
    "thm3_1_uniform_token_credit",
    location="Sec. 3, Theorem 3.1, Eq. (16)",
    text="Under output-only reward and gamma = 1 every token of rollout i gets the same "
    "advantage r_i - v_hat_R.",
    check="Per-token advantages of Eq. 22's construction applied to per-step rewards "
    "(0, ..., 0, r_i) [P, R, T] (grpo_theory.multiturn, mode total_minus_group_mean) and of the "
    "reward-to-go minus group mean: spread over t within each rollout.",
    variants=("grpo",),
    section=SEC3,
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
    "remark3_2_no_intra_rollout_credit",
    location="Sec. 3, Remark 3.2",
    text="GRPO gives inter-rollout credit (which rollouts are good) but no intra-rollout credit "
    "(which tokens are good), although the true per-token advantages differ.",
    check="sims token MDP (V=3, T=4): spread of the true advantages A(s_t, a_t) along each "
    "sequence (probability-weighted), vs the GRPO token advantages (zero spread by Thm 3.1).",
    variants=("grpo",),
    section=SEC3,
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
    "eq19_gradient_factorisation",
    location="Sec. 3.1, Eqs. (17)-(19)",
    text="With uniform credit the GRPO gradient factors as (1/R) sum_i A_i psi_i, psi_i the sum of "
    "the token score vectors.",
    check="Random token gradients [R, T_i, d]: the token-level sum of Eq. 15 (the sequence-sum "
    "loss the paper writes) vs Eq. 19. The length-normalised losses GRPO is run with: "
    "eq19_gradient_factorisation_practised_aggregation.",
    variants=("grpo",),
    section=SEC3,
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
    "eq19_gradient_factorisation_practised_aggregation",
    location="Sec. 3.1, Eq. (19), as practised (length-normalised loss aggregation)",
    text="The gradient GRPO is run with is (1/R) sum_i A_i psi_i: the weight on psi_i is A_i.",
    check="Random token gradients [R, T_i, d] with unequal lengths: the gradient of GRPO's "
    "published loss (mean over each sequence's tokens, then over sequences) and of a batch "
    "token mean (grpo_theory.aggregation) vs Eq. 19; the per-rollout weights they put on psi_i.",
    variants=("grpo",),
    section=SEC3,
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
    )


@claim(
    "sec3_1_uniform_credit_enables_rank_reduction",
    location="Sec. 3.1, after Eq. (19)",
    text="Token-level advantages could not be factored this way; uniform credit is what enables "
    "this rank-reducing factorisation.",
    check="Random token gradients (R=4, T=6, d=40): rank of the R x d matrix of per-rollout "
    "contributions with uniform credit (rows A_i psi_i) vs with token-level advantages "
    "(rows sum_t A_it grad log pi_t).",
    variants=("grpo",),
    section=SEC3,
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
        correction=(
            f"token-level advantages also give one vector per rollout, phi_i = sum_t A_it "
            f"grad log pi_t, so both gradient matrices have R rows and rank <= R (computed: "
            f"{r_u} and {r_t}); uniform credit fixes the direction of each row to psi_i, it does "
            "not reduce the rank"
        ) if refuted else None,
    )


@claim(
    "thm4_1_i_zero_sum",
    location="Sec. 4, Theorem 4.1 (i); App. A.1",
    text="The GRPO advantages of a group sum to zero.",
    check="Every binary group (all 2^R reward vectors, R = 2..8) and 1000 continuous groups: "
    "max |sum_i A_i| for mean-centred GRPO, std-normalised GRPO and RLOO; AsymGRPO(0.5) as a "
    "contrast (not zero-sum).",
    variants=("grpo", "grpo_std", "rloo", "asym_grpo"),
    section=SEC4,
)
def _thm4_1_i(ctx: CheckContext) -> Outcome:
    ev: dict[str, float] = {}
    rng = ctx.rng(40)
    for est, opts in (("grpo", {}), ("grpo_std", STD), ("rloo", {}), ("asym_grpo", {"delta": 0.5})):
        worst = 0.0
        for R in range(2, 9):
            rows = ((np.arange(2**R)[:, None] >> np.arange(R)) & 1).astype(float)
            worst = max(worst, float(np.max(np.abs(
                np.asarray(compute_advantages(est, rows, **opts)).sum(1)))))
        cont = rng.random((1000, 8))
        worst = max(worst, float(np.max(np.abs(
            np.asarray(compute_advantages(est, cont, **opts)).sum(1)))))
        ev[f"max_abs_sum_{est}"] = worst
    ok = max(ev["max_abs_sum_grpo"], ev["max_abs_sum_grpo_std"], ev["max_abs_sum_rloo"]) < 1e-9
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "advantages do not sum to zero")


@claim(
    "sec5_1_binary_advantage_values",
    location="Sec. 5.1 (1)",
    text="With binary reward and k of R correct, correct rollouts get 1 - k/R and incorrect "
    "ones -k/R.",
    check="grpo_theory advantages of every binary group with k = 1..R-1, R = 2..16.",
    variants=("grpo",),
    section=SEC5,
)
def _sec5_1_vals(ctx: CheckContext) -> Outcome:
    worst = 0.0
    for R in range(2, 17):
        for k in range(1, R):
            s, f = advantage_values("grpo", R=R, k=k)
            worst = max(worst, abs(s - (1 - k / R)), abs(f + k / R))
    return Outcome(verdict_from(worst < 1e-12), {"max_abs_error": worst},
                   correction=None if worst < 1e-12 else "values differ")


@claim(
    "sec5_1_small_advantages_near_extremes",
    location="Sec. 5.1 (1)",
    text="When k is close to 0 or R the advantages become small and the gradient vanishes.",
    check="Exact advantages for k = 1 and k = R-1 (the minority rollout and the majority) vs "
    "k = R/2, R in {4,8,16}, mean-centred and std-normalised; the group's sum of squares "
    "k(R-k)/R.",
    variants=("grpo", "grpo_std"),
    section=SEC5,
)
def _sec5_1_small(ctx: CheckContext) -> Outcome:
    ev: dict[str, float] = {}
    for R in (4, 8, 16):
        for est, opts in (("grpo", {}), ("grpo_std", STD)):
            ev[f"minority_abs_adv_k1_{est}_R{R}"] = abs(advantage_values(est, R=R, k=1, **opts)[0])
            ev[f"majority_abs_adv_k1_{est}_R{R}"] = abs(advantage_values(est, R=R, k=1, **opts)[1])
            ev[f"abs_adv_k_half_{est}_R{R}"] = abs(advantage_values(est, R=R, k=R // 2, **opts)[0])
        for k, tag in ((1, "k1"), (R // 2, "k_half")):
            A = np.asarray(compute_advantages("grpo", np.array([[1.0] * k + [0.0] * (R - k)])))
            ev[f"sum_sq_grpo_{tag}_R{R}"] = float((A**2).sum())
    refuted = ev["minority_abs_adv_k1_grpo_R8"] > ev["abs_adv_k_half_grpo_R8"]
    Rp = 8

    def plot(ax) -> None:
        ks = np.arange(1, Rp)
        for est, opts, m in (("grpo", {}, "o"), ("grpo_std", STD, "s")):
            ax.plot(ks, [advantage_values(est, R=Rp, k=int(k), **opts)[0] for k in ks],
                    m + "-", label=f"success, {est}")
            ax.plot(ks, [abs(advantage_values(est, R=Rp, k=int(k), **opts)[1]) for k in ks],
                    m + "--", label=f"|failure|, {est}")
        ax.set_xlabel(f"successes k of R = {Rp}")
        ax.set_ylabel("|advantage|")
        ax.legend(fontsize=7)

    return Outcome(
        verdict_from(not refuted),
        ev,
        correction=(
            "only the MAJORITY's advantages become small; the minority rollout's advantage "
            f"grows toward 1: at R=8, k=1 the success gets {ev['minority_abs_adv_k1_grpo_R8']:.3f}"
            f" (mean-centred) and {ev['minority_abs_adv_k1_grpo_std_R8']:.3f} (std-normalised) "
            f"vs {ev['abs_adv_k_half_grpo_R8']:.3f} and "
            f"{ev['abs_adv_k_half_grpo_std_R8']:.3f} at k=R/2; the group's sum of squares "
            f"k(R-k)/R shrinks (R=8: {ev['sum_sq_grpo_k_half_R8']:.3f} at k=4, "
            f"{ev['sum_sq_grpo_k1_R8']:.3f} at k=1) but the gradient vanishes only at k in {{0, R}}"
        ) if refuted else None,
        short="only the majority's advantages shrink; the minority's grows toward 1 (R=8, k=1: "
        f"{ev['minority_abs_adv_k1_grpo_R8']:.3f} vs {ev['abs_adv_k_half_grpo_R8']:.3f} at k=4)"
        if refuted else None,
        plot=plot,
        plot_title="Sec. 5.1: advantages by number of successes (R = 8)",
    )


@claim(
    "abstract_sparsity_intensifies_over_training",
    location="Abstract; Sec. 5 intro",
    text="Output-only reward induces gradient sparsity that intensifies over training.",
    check="Exact fraction of zero-gradient (constant) groups p^R + (1-p)^R as a function of the "
    "solve rate p, R in {2,4,8,16}; sims training run (softmax bandit prompts, GRPO): "
    "fraction of zero-advantage groups early vs late.",
    variants=("grpo",),
    section=SEC5,
)
def _abstract_sparsity(ctx: CheckContext) -> Outcome:
    ev: dict[str, float] = {}
    mono = True
    for R in (2, 4, 8, 16):
        ps = np.linspace(0.5, 0.999, 200)
        z = ps**R + (1 - ps) ** R
        mono = mono and bool(np.all(np.diff(z) > 0))
        ev[f"zero_group_fraction_R{R}_p0.5"] = float(z[0])
        ev[f"zero_group_fraction_R{R}_p0.95"] = float(0.95**R + 0.05**R)
    run = training_run(ctx)
    steps = run["config"]["steps"]
    h = {k: np.asarray(v, dtype=np.float64) for k, v in run["history"].items()}
    m = max(1, steps // 10)
    ev["training_steps"] = steps
    ev["training_zero_adv_frac_first_10pct"] = float(h["zero_adv_frac"][:m].mean())
    ev["training_zero_adv_frac_last_10pct"] = float(h["zero_adv_frac"][-m:].mean())
    ev["training_expected_zero_adv_frac_first_10pct"] = float(h["zero_adv_frac_exact"][:m].mean())
    ev["training_expected_zero_adv_frac_last_10pct"] = float(h["zero_adv_frac_exact"][-m:].mean())
    ev["training_J_first"] = float(h["J"][0])
    ev["training_J_last"] = float(h["J"][-1])
    return Outcome(
        verdict_from(mono, agrees="holds-with-conditions"),
        ev,
        short="only if training drives solve rates toward 0 or 1; sparsity = whole prompts with "
        "zero advantage, not sparse parameter updates",
        conditions="the zero-gradient fraction p^R + (1-p)^R rises monotonically as the solve "
        "rate moves away from 1/2, so sparsity intensifies IF training drives per-prompt solve "
        "rates toward 0 or 1; 'sparsity' here means whole prompts with zero advantage, not "
        "sparse parameter updates",
        correction=None if mono else "zero-group fraction is not monotone",
    )

