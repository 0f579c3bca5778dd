"""Claims about rank: Sec. 7 (Table 1, "max rank R - 1", "effective rank ~2 for every R"),
Sec. 5.1 (2), Sec. 8 (RLOO, rank collapse as sigma_r -> 0) and the paper's cross-references.

The gradient matrix is ``G = diag(A) Psi`` (rows ``A_i psi_i``); its spectrum comes from
:func:`grpo_theory.spectral_metrics` on the Gram ``K = Psi Psi^T``: finite-``d`` Gaussian scores
(generic), and the closed-form limit Grams of :mod:`sims.psi_models` (isotropic, clustered by the
reward label, common component).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from grpo_theory import compute_advantages, spectral_metrics

from ._common import STD
from .paper_values import PAPER_CROSS_REFERENCES, PAPER_LABELLED_STATEMENTS, PAPER_TABLE1
from .registry import CheckContext, Outcome, claim, verdict_from

__all__ = ["effective_rank_range", "expected_metric"]

SEC7 = "7. Experiments and Table 1"
SEC8 = "8-9. Discussion and related work"
PSI_MODELS: dict[str, dict[str, float]] = {
    "isotropic": {},
    "clustered (noise 0.1)": {"within": 1.0, "between": 0.0, "noise": 0.1},
    "clustered (noise 0.01)": {"within": 1.0, "between": 0.0, "noise": 0.01},
    "common (strength 4)": {"strength": 4.0},
}


def effective_rank_range(top1: float, rank: int) -> tuple[float, float]:
    """Range of the paper's effective rank ``(sum s)^2 / sum s^2`` given the top-1 fraction
    ``f = s_1^2 / sum s^2`` and the number of nonzero singular values ``rank``.

    With ``sum s^2 = 1``: the maximum spreads ``1 - f`` evenly over the other ``rank - 1`` values,
    ``(sqrt f + sqrt((rank - 1)(1 - f)))^2``; the minimum packs it into as few values as possible,
    each at most ``s_1``: ``m = floor((1 - f)/f)`` copies of ``sqrt f`` and a remainder.

    Raises:
        ValueError: if no spectrum has that ``f`` and ``rank`` (``f < 1/rank`` or ``f > 1``, or
            ``f < 1`` with ``rank = 1``).
    """
    if rank < 1 or not (0 < top1 <= 1):
        raise ValueError(f"need rank >= 1 and 0 < top1 <= 1, got rank={rank}, top1={top1}")
    if rank == 1 and top1 < 1:
        raise ValueError(f"rank 1 forces top1 = 1, got {top1}")
    if top1 < 1.0 / rank - 1e-12:
        raise ValueError(f"top1={top1} < 1/rank={1 / rank}: infeasible (s_1 is the largest)")
    f = top1
    hi = (math.sqrt(f) + math.sqrt((rank - 1) * (1 - f))) ** 2
    m = math.floor((1 - f) / f + 1e-12)
    rem = max(0.0, 1 - f - m * f)
    lo = (math.sqrt(f) * (1 + m) + math.sqrt(rem)) ** 2
    return lo, hi


def _limit_gram(model: str, labels: np.ndarray) -> np.ndarray:
    from sims.psi_models import limit_gram

    name = model.split(" ")[0]
    return limit_gram(name, labels, **PSI_MODELS[model])


def expected_metric(model: str, estimator: str, *, R: int, p: float, key: str,
                    **opts: float) -> float:
    """``E[metric | group not degenerate]`` over ``k ~ Binomial(R, p)`` for a limit-Gram model."""
    ks = np.arange(R + 1)
    rows = (np.arange(R)[None, :] < ks[:, None]).astype(np.float64)
    A = np.asarray(compute_advantages(estimator, rows, **opts))
    vals, w = [], []
    for k in ks:
        m = spectral_metrics(_limit_gram(model, rows[k]), A[k])
        if not m.degenerate:
            vals.append(getattr(m, key))
            w.append(binom.pmf(k, R, p))
    w = np.array(w) / np.sum(w)
    return float(np.dot(w, vals))


@claim(
    "sec7_max_rank_r_minus_1",
    location="Sec. 7.2 and Table 1 (MAX RANK column)",
    text="The theoretical maximum rank of the GRPO gradient matrix G (rows A_i psi_i) is R - 1.",
    check="Generic scores (Gaussian psi, d=64): numerical rank (grpo_theory, rtol 1e-6) of "
    "diag(A) Psi for every non-constant binary group, R in {2,4,8,16}, mean-centred, "
    "std-normalised and RLOO; the row sum of G (= R g_hat) is not zero.",
    variants=("grpo", "grpo_std", "rloo"),
    section=SEC7,
)
def _max_rank(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(70)
    ev: dict[str, float] = {}
    all_full = True
    for R in (2, 4, 8, 16):
        Psi = rng.normal(size=(R, 64))
        K = Psi @ Psi.T
        ranks = []
        for k in range(1, R):
            row = np.array([[1.0] * k + [0.0] * (R - k)])
            for est, opts in (("grpo", {}), ("grpo_std", STD), ("rloo", {})):
                A = np.asarray(compute_advantages(est, row, **opts))[0]
                ranks.append(spectral_metrics(K, A).rank)
        ev[f"min_rank_R{R}"] = min(ranks)
        ev[f"max_rank_R{R}"] = max(ranks)
        ev[f"paper_max_rank_R{R}"] = R - 1
        all_full = all_full and min(ranks) == R
    A = np.asarray(compute_advantages("grpo", np.array([[1.0, 0.0, 0.0, 1.0]])))[0]
    Psi = rng.normal(size=(4, 64))
    ev["norm_of_row_sum_R4"] = float(np.linalg.norm(A @ Psi))
    return Outcome(
        verdict_from(not all_full),
        ev,
        short=("generic scores give rank R (the rows A_i psi_i do not sum to 0); R-1 needs a zero "
               "advantage or dependent scores") if all_full else None,
        correction=(
            "the zero-sum constraint is on the advantages, not on the rows A_i psi_i (their sum "
            "is R g_hat != 0): for generic scores every non-constant binary group gives rank "
            "exactly R (= min(R, d)); rank R - 1 needs a zero advantage or linearly dependent "
            "scores"
        ) if all_full else None,
    )


@claim(
    "table1_internal_consistency",
    location="Table 1",
    text="Table 1's rows (max rank, effective rank ~2, top-1 fraction) describe possible spectra.",
    check="Effective rank <= rank (Cauchy-Schwarz); the range of effective rank allowed by the "
    "printed top-1 fraction range with the printed max rank and with the corrected max rank R; "
    "top-1 fraction >= 1/rank.",
    section=SEC7,
)
def _table1_consistency(ctx: CheckContext) -> Outcome:
    ev: dict[str, float] = {}
    bad_rows = []
    for R, row in PAPER_TABLE1.items():
        mr, eff = int(row["max_rank"]), float(row["eff_rank"])
        f_lo, f_hi = row["top1"]
        ev[f"R{R}_printed_max_rank"] = mr
        ev[f"R{R}_printed_eff_rank"] = eff
        feasible_printed = True
        try:
            lo1, hi1 = effective_rank_range(f_hi, mr)
            lo2, hi2 = effective_rank_range(f_lo, mr)
            ev[f"R{R}_eff_rank_range_with_printed_rank_lo"] = min(lo1, lo2)
            ev[f"R{R}_eff_rank_range_with_printed_rank_hi"] = max(hi1, hi2)
            feasible_printed = min(lo1, lo2) - 0.1 <= eff <= max(hi1, hi2) + 0.1
        except ValueError:
            feasible_printed = False
            ev[f"R{R}_printed_rank_admits_printed_top1"] = False
        lo1, hi1 = effective_rank_range(f_hi, R)
        lo2, hi2 = effective_rank_range(f_lo, R)
        ev[f"R{R}_eff_rank_range_with_rank_R_lo"] = min(lo1, lo2)
        ev[f"R{R}_eff_rank_range_with_rank_R_hi"] = max(hi1, hi2)
        ev[f"R{R}_eff_rank_exceeds_printed_max_rank"] = eff > mr
        if not feasible_printed or eff > mr:
            bad_rows.append(R)
    ev["n_inconsistent_rows"] = len(bad_rows)
    return Outcome(
        verdict_from(not bad_rows),
        ev,
        short=f"row(s) R = {bad_rows} impossible: eff. rank <= rank, and top-1 < 1 needs "
        "rank >= 2" if bad_rows else None,
        correction=(
            f"row(s) R = {bad_rows} are impossible: effective rank <= rank always, and a top-1 "
            "fraction below 1 needs rank >= 2, so 'max rank 1, eff. rank ~2, top-1 0.6-0.7' "
            "cannot describe one spectrum; with the correct max rank R the printed effective "
            "ranks are feasible (ranges above)"
        ) if bad_rows else None,
    )


@claim(
    "sec7_rank2_intrinsic_from_zero_sum",
    location="Abstract; Contribution 3; Sec. 7.2; Sec. 10",
    text="The gradient matrix has an intrinsic rank-2 structure arising from the zero-sum "
    "constraint, independent of the group size R.",
    check="Expected effective rank of diag(A) Psi over non-constant groups (k ~ Bin(R, 1/2)) for "
    "R in {2,4,8,16} under psi models: isotropic, clustered by reward label (noise 0.1, 0.01), "
    "common component; mean-centred advantages (std-normalised and RLOO give the same per-group "
    "spectra up to scale).",
    variants=("grpo",),
    section=SEC7,
)
def _rank2(ctx: CheckContext) -> Outcome:
    Rs = (2, 4, 8, 16)
    table = {m: [expected_metric(m, "grpo", R=R, p=0.5, key="effective_rank") for R in Rs]
             for m in PSI_MODELS}
    ev: dict[str, float] = {}
    for m, vals in table.items():
        tag = m.replace(" (", "_").replace(")", "").replace(" ", "_")
        for R, v in zip(Rs, vals, strict=True):
            ev[f"{tag}_R{R}"] = v
    iso = table["isotropic"]
    grows = iso[-1] > 2 * iso[1]

    def plot(ax) -> None:
        for m, vals in table.items():
            ax.plot(Rs, vals, "o-", label=m)
        ax.axhline(2.0, c="k", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size R")
        ax.set_ylabel("E[effective rank | non-constant group]")
        ax.set_title("p = 0.5, mean-centred GRPO")
        ax.legend(fontsize=7)

    return Outcome(
        verdict_from(not grows),
        ev,
        short=f"isotropic scores: eff. rank 4k(R-k)/R, expected {iso[0]:.2f}, {iso[1]:.2f}, "
        f"{iso[2]:.2f}, {iso[3]:.2f} for R = 2, 4, 8, 16; ~2 is score geometry"
        if grows else None,
        correction=(
            "zero-sum advantages do not cap the effective rank: with isotropic scores it is "
            f"4k(R-k)/R (expected {iso[0]:.2f}, {iso[1]:.2f}, {iso[2]:.2f}, {iso[3]:.2f} for R = "
            "2, 4, 8, 16); effective rank ~2 independent of R is a property of the score "
            "geometry (scores clustered by reward label give <= 2), not of the advantages"
        ) if grows else None,
        plot=plot,
        plot_title="Effective rank vs R by trajectory-score model",
    )


@claim(
    "sec5_1_clustered_scores_concentrate",
    location="Sec. 5.1 (2)",
    text="If the trajectory scores are similar (rollouts from the same prompt share structure), "
    "the directions psi_i cluster and the gradient concentrates in a low-dimensional subspace.",
    check="Effective rank of diag(A) Psi (limit Grams, sims.psi_models): scores clustered by the "
    "reward label as the within-cluster noise shrinks (1, 0.1, 0.01, 0; expectation over "
    "k ~ Bin(8, 1/2)), and scores sharing a common component of strength 0, 1, 10, 100 (R=8, "
    "k=4; closed form (sqrt(sR+1) + R-1)^2 / (sR + R) as a second route), vs isotropic scores.",
    variants=("grpo",),
    section="5. Sparse updates",
)
def _clustered(ctx: CheckContext) -> Outcome:
    from sims.psi_models import limit_gram

    ev: dict[str, float] = {}
    R = 8
    ks = np.arange(1, R)
    w = binom.pmf(ks, R, 0.5)
    w = w / w.sum()
    for noise in (1.0, 0.1, 0.01, 0.0):
        vals = []
        for k in ks:
            lab = np.array([1.0] * k + [0.0] * (R - k))
            A = np.asarray(compute_advantages("grpo", lab[None, :]))[0]
            K = limit_gram("clustered", lab, within=1.0, between=0.0, noise=noise)
            vals.append(spectral_metrics(K, A).effective_rank)
        ev[f"clustered_noise{noise:g}_R8"] = float(w @ vals)
    ev["isotropic_R8"] = expected_metric("isotropic", "grpo", R=R, p=0.5, key="effective_rank")
    lab = np.array([1.0] * 4 + [0.0] * 4)
    A = np.asarray(compute_advantages("grpo", lab[None, :]))[0]
    common, route_gap = [], 0.0
    for strength in (0.0, 1.0, 10.0, 100.0):
        er = spectral_metrics(limit_gram("common", lab, strength=strength), A).effective_rank
        closed = (np.sqrt(strength * R + 1) + R - 1) ** 2 / (strength * R + R)
        route_gap = max(route_gap, abs(er - closed))
        ev[f"common_strength{strength:g}_R8_k4"] = er
        common.append(er)
    ev["common_max_abs_error_closed_form"] = route_gap
    ok = (ev["clustered_noise0_R8"] <= 2 + 1e-9 and ev["isotropic_R8"] > 2
          and bool(np.all(np.diff(common) < 0)) and common[-1] < 2)
    c = ", ".join(f"{v:.2f}" for v in common)
    return Outcome(
        verdict_from(ok, computed=route_gap < 1e-9, agrees="holds-with-conditions"),
        ev,
        conditions="the shared structure must dominate the rollout-specific part of the scores: "
        "the effective rank of G falls as the energy the scores share (a common component, or "
        "centres of clusters by reward label) grows against their per-rollout variation "
        f"(common strength 0, 1, 10, 100 at R=8, k=4: {c}; label clusters with noise 1, 0.1, "
        f"0.01, 0: {ev['clustered_noise1_R8']:.2f}, {ev['clustered_noise0.1_R8']:.2f}, "
        f"{ev['clustered_noise0.01_R8']:.2f}, {ev['clustered_noise0_R8']:.2f}); mild similarity "
        "(shared energy equal to the idiosyncratic energy) barely helps, and the paper neither "
        "states how similar the scores must be nor shows that they are",
        short=f"only when shared score structure dominates (common strength 0/1/10/100: eff. rank "
        f"{c} at R=8); strength unstated",
        correction=None if ok else "shared structure does not concentrate the spectrum",
    )


@claim(
    "sec7_step_moves_along_two_directions",
    location="Sec. 7.2, Interpretation",
    text="Each GRPO gradient step moves the parameters along only ~2 directions, whatever R.",
    check="The update is g_hat = (1/R) sum_i A_i psi_i, one vector: rank of the update vs the "
    "effective rank of G for isotropic scores (d=256, R=8, k=4).",
    variants=("grpo",),
    section=SEC7,
)
def _two_dirs(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(72)
    R = 8
    Psi = rng.normal(size=(R, 256))
    A = np.asarray(compute_advantages("grpo", np.array([[1.0] * 4 + [0.0] * 4])))[0]
    g = A @ Psi / R
    m = spectral_metrics(Psi @ Psi.T, A)
    rank_update = int(np.linalg.matrix_rank(g[None, :]))
    return Outcome(
        verdict_from(False, computed=rank_update == 1),
        {"rank_of_update": rank_update, "effective_rank_of_G": m.effective_rank,
         "rank_of_G": m.rank},
        short=("one step moves along one direction, g_hat; the eff. rank of G counts how the rows "
               "spread"),
        correction=(
            "a step moves along exactly one direction, g_hat (rank "
            f"{rank_update}); the effective rank of G ({m.effective_rank:.2f} here) counts how "
            "many directions the per-rollout contributions spread over, which says nothing about "
            "the number of directions of one step; over many steps the updates span as many "
            "directions as the scores do"
        ),
    )


@claim(
    "fig3_gradient_is_psi_plus_minus_psi_minus",
    location="Figure 3 caption",
    text="The GRPO gradient points along the advantage direction psi_+ - psi_- (mean score of "
    "successes minus that of failures).",
    check="Exact identity for binary rewards: g_hat = k(R-k)/R^2 (psi_bar_S - psi_bar_F) for "
    "mean-centred GRPO; std-normalised and RLOO are per-group rescalings; random psi, all k.",
    variants=("grpo", "grpo_std", "rloo"),
    section=SEC7,
)
def _fig3(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(73)
    worst = 0.0
    cos_min = 1.0
    for R in (2, 4, 8):
        Psi = rng.normal(size=(R, 20))
        for k in range(1, R):
            row = np.array([[1.0] * k + [0.0] * (R - k)])
            d = Psi[:k].mean(0) - Psi[k:].mean(0)
            for est, opts in (("grpo", {}), ("grpo_std", STD), ("rloo", {})):
                g = np.asarray(compute_advantages(est, row, **opts))[0] @ Psi / R
                cos_min = min(cos_min, float(g @ d / np.linalg.norm(g) / np.linalg.norm(d)))
                if est == "grpo":
                    worst = max(worst, float(np.max(np.abs(g - k * (R - k) / R**2 * d))))
    ok = worst < 1e-12 and cos_min > 1 - 1e-12
    return Outcome(verdict_from(ok),
                   {"max_abs_error_identity": worst, "min_cosine_all_estimators": cos_min},
                   correction=None if ok else "gradient not along psi_+ - psi_-")


@claim(
    "sec8_rloo_breaks_rank2",
    location="Sec. 8, Future directions (1)",
    text="Leave-one-out (RLOO) baselines might break the rank-2 bottleneck.",
    check="Spectral metrics of diag(A) Psi for the same group under GRPO, RLOO and "
    "std-normalised GRPO (random psi, R in {4,8}, every k): RLOO = R/(R-1) GRPO exactly.",
    variants=("grpo", "rloo", "grpo_std"),
    section=SEC8,
)
def _rloo_rank(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(80)
    worst_scale = worst_metric = 0.0
    for R in (4, 8):
        Psi = rng.normal(size=(R, 32))
        K = Psi @ Psi.T
        for k in range(1, R):
            row = np.array([[1.0] * k + [0.0] * (R - k)])
            a_g = np.asarray(compute_advantages("grpo", row))[0]
            a_r = np.asarray(compute_advantages("rloo", row))[0]
            a_s = np.asarray(compute_advantages("grpo_std", row, **STD))[0]
            worst_scale = max(worst_scale, float(np.max(np.abs(a_r - R / (R - 1) * a_g))))
            mg, mr, ms = (spectral_metrics(K, a) for a in (a_g, a_r, a_s))
            for key in ("effective_rank", "top1_fraction", "rank"):
                worst_metric = max(worst_metric, abs(getattr(mg, key) - getattr(mr, key)),
                                   abs(getattr(mg, key) - getattr(ms, key)))
    same = worst_scale < 1e-12 and worst_metric < 1e-9
    return Outcome(
        verdict_from(not same),
        {"max_abs_rloo_minus_scaled_grpo": worst_scale,
         "max_abs_metric_difference": worst_metric},
        short="RLOO = R/(R-1) x GRPO in every group: identical rank, eff. rank and top-1"
        if same else None,
        correction=(
            "RLOO's advantages are R/(R-1) times GRPO's in every group, and std-normalisation "
            "rescales each group too: rank, effective rank and top-1 fraction are identical "
            "(largest difference "
            f"{worst_metric:.1e}); RLOO removes the (R-1)/R bias but cannot change the spectrum"
        ) if same else None,
    )


@claim(
    "sec8_rank_falls_as_sigma_to_zero",
    location="Sec. 8, Future directions (3)",
    text="The theory predicts the effective rank should decrease as sigma_r -> 0.",
    check="Expected effective rank over non-constant groups as the solve rate p -> 0 (sigma_r -> "
    "0), R = 8, psi isotropic and clustered; sims training run: Spearman correlation of the "
    "effective rank with sigma_r over steps.",
    variants=("grpo",),
    section=SEC8,
)
def _rank_sigma(ctx: CheckContext) -> Outcome:
    ev: dict[str, float] = {}
    ok = True
    for m in ("isotropic", "clustered (noise 0.1)"):
        vals = [expected_metric(m, "grpo", R=8, p=p, key="effective_rank")
                for p in (0.5, 0.2, 0.05, 0.01)]
        tag = m.split(" ")[0]
        for p, v in zip((0.5, 0.2, 0.05, 0.01), vals, strict=True):
            ev[f"{tag}_R8_p{p:g}"] = v
        ok = ok and bool(np.all(np.diff(vals) < 0))
    from sims.training import summarize_training

    from .claims_structure import training_run

    summ = summarize_training(training_run(ctx))
    vals_t = {"training_spearman_effrank_sigma": summ["spearman_effrank_sigma"],
              "training_eff_rank_first": summ["eff_rank_first_last"][0],
              "training_eff_rank_last": summ["eff_rank_first_last"][1],
              "training_sigma_r_first": summ["sigma_r_first_last"][0],
              "training_sigma_r_last": summ["sigma_r_first_last"][1]}
    for key, val in vals_t.items():
        if np.isfinite(val):
            ev[key] = float(val)
        else:  # e.g. the last step has no group with a nonzero advantage: no spectrum at all
            ev[f"{key}_undefined_no_gradient"] = True
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions", otherwise="inconclusive"),
        ev,
        short="among groups with signal, under isotropic/clustered score models; not a "
        "consequence of Thm 4.1; no gradient at sigma_r = 0",
        conditions="among the groups that still have a gradient, under the isotropic and "
        "clustered score models (rank falls toward the k = 1 value); it does not follow from "
        "Theorem 4.1, which says nothing about scores, and when sigma_r = 0 there is no gradient "
        "and no rank",
    )


@claim(
    "cross_references_resolve",
    location="Sec. 8 (\"Theorem 4.2\"); App. A.2 (\"Proof of ??\", \"So ??\")",
    text="The paper's cross-references point to statements it contains.",
    check="Each printed reference is looked up among the labelled statements the paper states.",
    section="Cross-references",
)
def _xref(ctx: CheckContext) -> Outcome:
    broken = [(w, t) for w, t, lab in PAPER_CROSS_REFERENCES
              if lab is None or lab not in PAPER_LABELLED_STATEMENTS]
    ev = {"n_references": len(PAPER_CROSS_REFERENCES), "n_unresolved": len(broken)}
    return Outcome(
        verdict_from(not broken),
        ev,
        short="'Theorem 4.2' does not exist; App. A.2 proves an unstated statement ('??')"
        if broken else None,
        correction=("unresolved: " + "; ".join(f"{w}: '{t}'" for w, t in broken)
                    + ". 'Theorem 4.2' does not exist (Corollary 4.2 is meant, and it is about "
                    "gradient size, not rank); App. A.2 proves a baseline-concentration statement "
                    "that is never stated in the body") if broken else None,
    )


@claim(
    "table1_empirical_values",
    location="Table 1; Sec. 7; Figures 1-2 (Nemotron-4B, GSM8K)",
    text="Measured on Nemotron-4B/GSM8K: effective rank ~2 for R in {2,4,8}, top-1 fractions "
    "0.6-0.7, 0.7-0.8, 0.5-0.6.",
    check="Not reproducible here (no Nemotron-4B training run); the toy-world Table 1 "
    "(tables.table1) and the real_model package measure the same quantities on other models.",
    section=SEC7,
)
def _table1_emp(ctx: CheckContext) -> Outcome:
    return Outcome("inconclusive", {"rows_printed": len(PAPER_TABLE1)},
                   short="needs GRPO runs of Nemotron-4B on GSM8K, which are not available here")
