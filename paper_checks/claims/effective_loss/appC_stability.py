"""arXiv 2503.06639 v4, App. C.2: stability of the fixed points with KL to the reference.

Lemma 1 (h' at a fixed point), the sufficient condition beta > B(p*), Theorem 6 (local
convergence), Table 1's global contraction condition, the discussion of Fig. 5 ("divergent
behaviour" at beta = 5, p_ref = 0.001) and the staged practice (a new reference per stage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_theory.success_dynamics import (
    fixed_points,
    orbit_kinds,
    pos_trajectories,
    pos_trajectory,
    sigmoid,
)
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import printed_formulas as P
from .worlds_and_scans import fixed_point_scan, orbit_scan

SECTION = "App. C.2. Stability of fixed points"


def _interior_points() -> list[tuple[tuple[float, float, float], Any]]:
    """Certified fixed points at the grid whose PoS is resolvable in float (1 - p* > 1e-9)."""
    return [(g, f) for g, fp in fixed_point_scan() for f in fp.points if f.one_minus_p > 1e-9]


def check_lemma1(h: Callable[..., Any] = P.h_thm2,
                 lemma: Callable[..., Any] = P.h_prime_lemma1) -> Outcome:
    """Lemma 1 at every certified fixed point: the printed formula against the map's multiplier
    (log-odds route) and a central finite difference of the printed h."""
    worst_mult = worst_fd = 0.0
    pts = _interior_points()
    for (p_ref, beta, eps), f in pts:
        lem = float(lemma(np.float64(f.p), beta, eps))
        worst_mult = max(worst_mult, abs(lem - f.multiplier) / max(1.0, abs(f.multiplier)))
        d = 1e-4 * min(f.p, f.one_minus_p)
        fd = float((h(f.p + d, p_ref, beta, eps) - h(f.p - d, p_ref, beta, eps)) / (2 * d))
        worst_fd = max(worst_fd, abs(lem - fd) / max(1.0, abs(fd)))
    ev = {"fixed_points": len(pts), "max_rel_error_vs_log_odds_multiplier": worst_mult,
          "max_rel_error_vs_central_difference": worst_fd}
    ok = worst_mult < 1e-8 and worst_fd < 1e-3
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "Lemma 1's h'(p*) differs from the derivative",
                   short=None if ok else "Lemma 1's formula is wrong")


@claim("effloss_lemma1_derivative_at_fixed_point", kind="derivation", location="App. C.2, Lemma 1",
       text="At a fixed point, h'(p*) = p*(1-p*)(2p*-1) / (2 beta [p*(1-p*) + eps]^(3/2)).",
       check="Every certified fixed point of the 240-point grid with 1 - p* > 1e-9: the printed "
       "formula against the multiplier of the log-odds map (relative 1e-8) and a central "
       "difference of the printed h (step 1e-4 min(p*, 1 - p*), relative 1e-3).")
def _lemma1(ctx: CheckContext) -> Outcome:
    return check_lemma1()


def check_beta_condition(bound: Callable[..., Any] = P.beta_bound_appc2) -> Outcome:
    """|h'(p*)| < 1 iff beta > B(p*), at every certified fixed point."""
    agree = 0
    pts = _interior_points()
    per_setting: dict[tuple[float, float], list[tuple[bool, float]]] = {}
    for (_, beta, eps), f in pts:
        b = float(bound(np.float64(f.p), eps))
        agree += int((abs(f.multiplier) < 1) == (beta > b))
        per_setting.setdefault((beta, eps), []).append((f.attracting, b))
    # Remark 2: every prompt's fixed points attracting <=> beta > sup over prompts of B(p*)
    uniform = sum(int(all(a for a, _ in v) == (beta > max(b for _, b in v)))
                  for (beta, _), v in per_setting.items())
    ok = agree == len(pts) and uniform == len(per_setting)
    return Outcome(verdict_from(ok), {"fixed_points": len(pts), "condition_agrees": agree,
                                      "beta_eps_settings": len(per_setting),
                                      "remark2_uniform_condition_agrees": uniform},
                   correction=None if ok else f"beta > B(p*) and |h'(p*)| < 1 disagree at "
                   f"{len(pts) - agree} fixed points", short=None if ok else "wrong bound")


@claim("effloss_appc2_beta_condition", kind="derivation",
       location="App. C.2, the condition after Lemma 1; Remark 2",
       text="|h'(p*)| < 1 holds if beta > B(p*) = p*(1-p*)|2p*-1| / (2 [p*(1-p*) + eps]^(3/2)); "
       "uniformly over prompts q it needs the supremum over q of these bounds (Remark 2).",
       check="Every certified fixed point of the grid: |multiplier| < 1 against beta > printed "
       "B(p*) (an equivalence, since h'(p*) = +-B(p*)/beta); per (beta, eps), the prompts p_ref "
       "of the grid as a population: all fixed points attracting against beta > sup B.")
def _beta_condition(ctx: CheckContext) -> Outcome:
    return check_beta_condition()


def check_theorem6(offset: float = 1e-3) -> Outcome:
    """Thm 6: from p* +- delta, iterates converge to an attracting p* and leave a repelling one."""
    pts = _interior_points()
    conv = att = rep_left = rep = 0
    p0, pr, be, ep, target, attracting = [], [], [], [], [], []
    for (p_ref, beta, eps), f in pts:
        d = offset * min(f.p, f.one_minus_p)
        for start in (f.p - d, f.p + d):
            p0.append(start)
            pr.append(p_ref)
            be.append(beta)
            ep.append(eps)
            target.append(f.p)
            attracting.append(f.attracting)
    L = pos_trajectories(np.array(pr), beta=np.array(be), eps=np.array(ep), n_steps=3000,
                         p_start=np.array(p0))[-1]
    p = sigmoid(L)
    tgt = np.array(target)
    att_mask = np.array(attracting)
    close = np.abs(p - tgt) < 1e-8 * np.maximum(tgt, 1e-300)
    att, rep = int(att_mask.sum()), int((~att_mask).sum())
    conv = int((close & att_mask).sum())
    rep_left = int((~close & ~att_mask).sum())
    ev = {"starts_near_attracting_fixed_points": att, "converged": conv,
          "starts_near_repelling_fixed_points": rep, "left_the_repelling_point": rep_left,
          "relative_offset": offset}
    ok = att > 0 and conv == att
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else f"{att - conv} starts near an attracting fixed point "
                   "did not converge", short=None if ok else "no local convergence")


@claim("effloss_thm6_local_convergence", kind="derivation",
       location="App. C.2, Theorem 6 (with Theorem 7)",
       text="If p* is a fixed point with |h'(p*)| < 1, there is delta > 0 such that p_n -> p* "
       "whenever p_0 lies in [p* - delta, p* + delta].",
       check="Every certified fixed point of the grid (1 - p* > 1e-9): 3000 steps of h from "
       "p* -+ 1e-3 min(p*, 1 - p*); convergence (relative 1e-8) for every attracting one; for "
       "contrast, how many starts leave a repelling one.")
def _thm6(ctx: CheckContext) -> Outcome:
    return check_theorem6()


def check_global_contraction(n_grid: int = 20001) -> Outcome:
    """Table 1: where sup_p |h'(p)| < 1 (dense grid), one fixed point and convergence from p_ref."""
    grid = np.linspace(0.0, 1.0, n_grid)
    orbits = {g: k for g, k, _ in orbit_scan()}
    contracting = unique = converged = 0
    for g, fp in fixed_point_scan():
        sup = float(np.max(np.abs(P.h_prime_prop1(grid, *g))))
        if sup < 1:
            contracting += 1
            unique += int(len(fp.points) == 1)
            converged += int(orbits[g] == "fixed point")
    ev = {"grid_points": len(orbits), "with_sup_abs_h_prime_below_1": contracting,
          "of_which_one_fixed_point": unique, "of_which_converged_from_p_ref": converged}
    ok = contracting > 0 and unique == contracting and converged == contracting
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "a contracting h fails to converge",
                   short=None if ok else "contraction does not imply convergence here")


@claim("effloss_table1_global_contraction", kind="derivation",
       location="Table 1, row (No-clip) GRPO (mean-var)",
       text="The iteration converges if h is a contraction, sup_p |h'(p)| < 1.",
       check="The 240-point grid: sup |h'| of the printed Prop. 1 derivative on 20 001 points; "
       "where below 1, the number of certified fixed points and the orbit from p_ref.")
def _contraction(ctx: CheckContext) -> Outcome:
    return check_global_contraction()


FIG5_BETAS = (0.5, 1.0, 2.0, 5.0, 10.0)
FIG5_P_REFS = (0.001, 0.01, 0.1, 0.5)


def _plot_fig5(ax: Any) -> None:
    b, pr = P.FIG5_DIVERGENT["beta"], P.FIG5_DIVERGENT["p_ref"]
    for i, (p_ref, beta) in enumerate(((pr, b), (pr, 10.0), (0.01, 1.0), (0.1, 2.0))):
        t = pos_trajectory(p_ref, beta=beta, eps=P.FIG5_EPS, n_steps=40)
        ax.plot(t.p, "o-", ms=2.5, c=f"C{i}", label=f"p_ref={p_ref:g}, beta={beta:g}")
    ax.set_xlabel("iteration n")
    ax.set_ylabel("PoS p_n (KL to pi_ref, eps = 1e-5)")
    ax.legend(fontsize=7)


def check_fig5(case: dict[str, float] | None = None) -> Outcome:
    """Fig. 5 text: mostly fast convergence; 'divergent' at the printed (beta, p_ref)."""
    case = P.FIG5_DIVERGENT if case is None else case
    pr = np.array([p for p in FIG5_P_REFS for _ in FIG5_BETAS])
    be = np.array([b for _ in FIG5_P_REFS for b in FIG5_BETAS])
    kinds, _ = orbit_kinds(pr, beta=be, eps=P.FIG5_EPS, n_steps=3000)
    kind, last = orbit_kinds([case["p_ref"]], beta=[case["beta"]], eps=P.FIG5_EPS, n_steps=3000)
    fp = fixed_points(case["p_ref"], beta=case["beta"], eps=P.FIG5_EPS)
    inner = min(fp.points, key=lambda f: f.p)
    ev = {"fig5_like_grid_points": int(kinds.size),
          "converged": int(np.sum(kinds == "fixed point")),
          "case_beta": case["beta"], "case_p_ref": case["p_ref"], "case_orbit": str(kind[0]),
          "case_last_two_p": last[0].tolist(),
          "case_inner_fixed_point": inner.p, "case_inner_multiplier": inner.multiplier}
    bounded = bool(np.all((last >= 0) & (last <= 1)))
    non_convergent = kind[0] != "fixed point"
    mostly = ev["converged"] > kinds.size / 2
    ok = non_convergent and mostly
    two = kind[0] == "period 2" and bounded
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions" if two else "holds"), ev,
        conditions=None if not (ok and two) else (
            "'divergent' can only mean 'does not converge': the iterates are bounded and settle "
            f"on an attracting 2-cycle {last[0][0]:.4g} <-> {last[0][1]:.4g} around the "
            f"repelling fixed point p* = {inner.p:.4g} (h'(p*) = {inner.multiplier:.3f} < -1), "
            "a period-doubling (App. A reports oscillating GSM8K trajectories too)"),
        short=None if not (ok and two) else f"not divergent: a 2-cycle {last[0][0]:.3g} <-> "
        f"{last[0][1]:.3g} around a repelling p* (h' = {inner.multiplier:.2f})",
        correction=None if ok else (
            f"at beta = {case['beta']:g}, p_ref = {case['p_ref']:g} the iterates converge "
            f"(to {last[0][1]:.4g})" if not non_convergent else "most cases do not converge"),
        plot=_plot_fig5, plot_title="PoS iterates with KL to pi_ref (App. C.2, Fig. 5)")


@claim("effloss_fig5_trajectories", kind="interpretation",
       location="App. C.2, text on Fig. 5 (App. G)",
       text="In most cases there is a sharp transition to fast convergence to 1 or to a fixed "
       "point p*; for beta = 5 and p_ref = 0.001 (eps = 1e-5) the iteration shows divergent "
       "behaviour.",
       check="3000 steps of the recurrence (eps = 1e-5) for beta in {0.5, 1, 2, 5, 10} x p_ref in "
       "{0.001, 0.01, 0.1, 0.5}, classified; at the printed case the orbit, its last two values "
       "and the certified fixed point it circles with its multiplier.")
def _fig5(ctx: CheckContext) -> Outcome:
    return check_fig5()


def check_staged(stages: int = 5, steps: int = 60) -> Outcome:
    """Staged GRPO: each stage's iterates exceed that stage's reference (Thm 3 per stage)."""
    g = np.array([gi for gi, _ in fixed_point_scan()])
    ref = g[:, 0].copy()
    worst = np.inf
    n = 0
    for _ in range(stages):
        live = ref < 1.0
        if not live.any():
            break
        L = pos_trajectories(ref[live], beta=g[live, 1], eps=g[live, 2], n_steps=steps)
        worst = min(worst, float(np.min(L[1:] - L[0])))  # log-odds gain (exact near 1)
        n += int(live.sum())
        ref[live] = sigmoid(L[-1])
    ev = {"stages_run": n, "smallest_log_odds_gain_over_the_stage_reference": worst}
    ok = worst > 0
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "a stage does not amplify its reference",
                   short=None if ok else "a stage loses PoS")


@claim("effloss_appc2_staged_grpo", kind="derivation",
       location="App. C.2, paragraph 'Practical Implications'",
       text="When pi_ref is reset to the last iterate at each stage (DeepSeekMath's practice), "
       "each stage amplifies the PoS relative to its new reference.",
       check="The 240-point grid, up to 5 stages of 60 steps each, the reference reset to the "
       "last iterate: every iterate's log-odds minus the stage reference's.")
def _staged(ctx: CheckContext) -> Outcome:
    return check_staged()
