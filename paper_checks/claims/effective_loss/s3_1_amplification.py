"""arXiv 2503.06639 v4, Sec. 3.1: the odds form, Theorem 3 (success amplification), the
abstract's convergence statement, and the degenerate references p_ref in {0, 1}."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_theory.success_dynamics import fixed_points, pos_trajectory, pos_update
from grpo_theory.tilted_policies import grpo_policy_iterates
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import printed_formulas as P
from .worlds_and_scans import IDENTITY_TOL, exact_zero, fixed_point_scan, orbit_scan

SECTION = "3.1 Success amplification"


def check_odds_form(h: Callable[..., Any] = P.h_thm2,
                    odds: Callable[..., Any] = P.odds_form_logit) -> Outcome:
    """M11: ``logit(h(p))`` against the printed odds form, exactly (60-digit points)."""
    import sympy as sp

    p, pr, b, e = sp.symbols("p p_ref beta eps", positive=True)
    hv = h(p, pr, b, e, xp=sp)
    resid = exact_zero(sp.log(hv / (1 - hv)) - odds(p, pr, b, e, xp=sp),
                       {p: (0.0, 1.0), pr: (0.0, 1.0), b: (0.1, 5.0), e: (1e-4, 0.5)})
    ok = resid < IDENTITY_TOL
    return Outcome(verdict_from(ok), {"max_abs_residual_at_60_digit_points": resid},
                   correction=None if ok else f"logit(h) differs from the odds form ({resid:.3g})",
                   short=None if ok else "odds form is wrong")


@claim("effloss_sec3_1_odds_form", kind="derivation", location="Sec. 3.1, display before Theorem 3",
       text="logit(p_n) = logit(p_ref) + Omega_eps(p_{n-1}) / beta.",
       check="sympy: logit of the printed h minus the printed odds form at random rational "
       "(p, p_ref, beta, eps), 60 digits.")
def _odds(ctx: CheckContext) -> Outcome:
    return check_odds_form()


def _plot_h_map(ax: Any) -> None:
    grid = np.linspace(0.0, 1.0, 801)
    eps = P.FIG2_EPS
    for i, (p_ref, beta) in enumerate(((0.01, 1.0), (0.1, 2.0), (0.3, 5.0), (0.001, 5.0))):
        c = f"C{i}"
        ax.plot(grid, P.h_thm2(grid, p_ref, beta, eps), c=c,
                label=f"h, p_ref={p_ref:g}, beta={beta:g}")
        fp = fixed_points(p_ref, beta=beta, eps=eps)
        ax.plot(fp.p, fp.p, "o", c=c, ms=5)
        ax.axvline(p_ref, c=c, lw=0.6, ls=":")
    ax.plot(grid, grid, "k--", lw=0.8, label="y = p")
    ax.set_xlabel("p")
    ax.set_ylabel("h(p)")
    ax.legend(fontsize=7)


def check_theorem3(h: Callable[..., Any] = P.h_thm2) -> Outcome:
    """M12: every certified fixed point exceeds p_ref; and h(p) > p_ref on [0, 1] (the proof)."""
    below = 0
    margin = np.inf
    grid = np.linspace(0.0, 1.0, 2001)
    h_above = 0
    scan = fixed_point_scan()
    for (p_ref, beta, eps), fp in scan:
        v = np.asarray(h(grid, p_ref, beta, eps))
        h_above += int(np.all(v > p_ref))
        for f in fp.points:
            # compare through the map under test: a fixed point of h is h(p*) (= p*)
            hv = float(h(np.float64(f.p), p_ref, beta, eps))
            margin = min(margin, hv - p_ref)
            below += int(hv <= p_ref)
    ev = {"grid_points": len(scan), "fixed_points_checked": sum(len(f.points) for _, f in scan),
          "fixed_points_not_above_p_ref": below, "smallest_p_star_minus_p_ref": margin,
          "grid_points_with_h_above_p_ref_on_0_1": h_above}
    ok = below == 0 and h_above == len(scan)
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else f"{below} fixed points do not exceed p_ref",
                   short=None if ok else "a fixed point is not above p_ref",
                   plot=_plot_h_map,
                   plot_title="h_{eps,p_ref} (eps = 1e-5), y = p and its certified fixed points")


@claim("effloss_thm3_amplification", kind="derivation",
       location="Sec. 3.1, Theorem 3; proof App. C.1; abstract",
       text="If 0 < p_ref < 1 and p* is any fixed point of h_{eps, p_ref}, then p* > p_ref "
       "(GRPO amplifies the probability of success).",
       check="Every certified fixed point at the 240 grid points: h(p*) - p_ref; and the proof's "
       "step, h(p) > p_ref on 2001 points of [0, 1] (the exponential factor is below 1).")
def _thm3(ctx: CheckContext) -> Outcome:
    return check_theorem3()


def check_abstract_converges(orbits: tuple[Any, ...] | None = None) -> Outcome:
    """The abstract: the PoS recurrence 'converges to a fixed point' (unconditionally)."""
    orbits = orbit_scan() if orbits is None else orbits
    bad = [(g, k, last) for g, k, last in orbits if k != "fixed point"]
    ev: dict[str, Any] = {"grid_points": len(orbits), "not_converging": len(bad)}
    for i, (g, k, last) in enumerate(bad[:4]):
        ev[f"counterexample{i}_p_ref_beta_eps"] = list(g)
        ev[f"counterexample{i}_kind"] = k
        ev[f"counterexample{i}_last_two_p"] = list(last)
    ok = not bad
    g0 = bad[0] if bad else None
    return Outcome(
        verdict_from(ok), ev,
        correction=None if ok else (
            f"the recurrence does not always converge: at p_ref = {g0[0][0]:g}, beta = "
            f"{g0[0][1]:g}, eps = {g0[0][2]:g} the iterates settle on a {g0[1]} orbit "
            f"{g0[2][0]:.4g} <-> {g0[2][1]:.4g} (the fixed point there is repelling, |h'| > 1; "
            f"{len(bad)} of {len(orbits)} grid points). What holds: convergence when the "
            "iterates enter the basin of a fixed point with |h'(p*)| < 1 (Thm 6)"),
        short=None if ok else f"a 2-cycle at p_ref={g0[0][0]:g}, beta={g0[0][1]:g}, "
        f"eps={g0[0][2]:g} ({len(bad)} of {len(orbits)} grid points)")


@claim("effloss_abstract_pos_converges", kind="derivation",
       location="Abstract; Introduction (contributions)",
       text="Iterating results in a sequence whose PoS obeys a simple recurrence that converges "
       "to a fixed point determined by the reference PoS and the regularisation strength.",
       check="The 240-point grid: 3000 steps of the recurrence from p_ref (log-odds), classified "
       "as converged, period 2 or other (grpo_theory.success_dynamics.orbit_kinds).")
def _abstract(ctx: CheckContext) -> Outcome:
    return check_abstract_converges()


def _degenerate_world(p_ref: float) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([True, True, False, False, False])
    if p_ref == 0.0:
        return np.array([0.0, 0.0, 0.2, 0.3, 0.5]), s
    return np.array([0.4, 0.6, 0.0, 0.0, 0.0]), s


def check_degenerate_absorbing() -> Outcome:
    """M13 (a): p_ref = 0 stays 0 and p_ref = 1 stays 1, for the three KL anchors (exact tilts)."""
    ev: dict[str, Any] = {}
    ok = True
    for p_ref in (0.0, 1.0):
        pi_ref, s = _degenerate_world(p_ref)
        for alpha, name in ((1.0, "reference"), (0.0, "mirror"), (0.5, "two_kl")):
            pis = grpo_policy_iterates(pi_ref, s, beta=1.0, eps=1e-5, n_steps=20, alpha=alpha)
            ps = [float(pi[s].sum()) for pi in pis]
            dev = max(abs(x - p_ref) for x in ps)
            ev[f"p_ref{p_ref:g}_{name}_max_abs_p_n_minus_p_ref_n_le_20"] = dev
            ok &= dev == 0.0
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "a degenerate reference moves",
                   short=None if ok else "a degenerate reference moves")


@claim("effloss_sec3_1_degenerate_references_absorbing", kind="derivation",
       location="Sec. 3.1, text after Theorem 3; Sec. 6 'Coverage and exploration'; Table 1",
       text="If p_ref = 0 the iteration gives p* = 0 (GRPO does not create successes; 0 is "
       "absorbing in all variants); if p_ref = 1 it gives p* = 1.",
       check="Exact tilts (the maximisers over every policy) for 20 steps from a reference with "
       "no mass on the successes, or none on the failures, with KL to pi_ref, to pi_{n-1} and to "
       "both (alpha = 1/2): p_n compared with p_ref exactly.")
def _degenerate(ctx: CheckContext) -> Outcome:
    return check_degenerate_absorbing()


def check_degenerate_stability(beta_bound: Callable[..., Any] = P.beta_bound_appc2) -> Outcome:
    """M13 (b): with p_ref in {0, 1} the map is constant (h' = 0): stable for every beta; the
    App. C.2 bound B(p*) at p* in {0, 1}; the sensitivity to p_ref instead."""
    grid = np.linspace(0.0, 1.0, 1001)
    const = True
    for p_ref in (0.0, 1.0):
        for beta in (0.05, 1.0, 50.0):
            v = pos_update(grid, p_anchor=p_ref, beta=beta, eps=1e-5)
            const &= bool(np.all(v == p_ref))
    bounds = [float(beta_bound(np.float64(q), 1e-5)) for q in (0.0, 1.0)]
    needs_condition = max(bounds) > 0
    jumps = {f"one_minus_p1_from_p_ref_1e-{k}_beta1_eps1e-5":
             float(pos_trajectory(10.0**-k, beta=1.0, eps=1e-5, n_steps=1).one_minus_p[1])
             for k in (3, 6, 9)}
    ev = {"h_constant_for_p_ref_0_and_1": const, "app_c2_bound_B_at_p_star_0_and_1": bounds,
          **jumps}
    ok = const and needs_condition  # the statement: a condition on beta is needed
    return Outcome(
        verdict_from(ok), ev,
        correction=None if ok else (
            "for p_ref in {0, 1} the map h is constant (h = p_ref for every p), so h' = 0 and "
            "the fixed point is super-stable for every beta > 0; App. C.2's bound B(p*) is 0 at "
            "p* in {0, 1}, so every beta satisfies it. What is fragile is the dependence on "
            "p_ref: a tiny p_ref jumps far in one step (p_ref = 1e-6, beta = 1, eps = 1e-5 gives "
            f"1 - p_1 = {jumps['one_minus_p1_from_p_ref_1e-6_beta1_eps1e-5']:.3g})"),
        short=None if ok else "h is constant for p_ref in {0,1}: stable for every beta; B(0) = "
        "B(1) = 0",
        finding=None if ok else (
            "for p_ref in {0, 1} h is constant, so the fixed point is stable for every beta; "
            f"App. C.2's bound is B = {bounds[0]:g} at p* = 0 and {bounds[1]:g} at p* = 1"))


@claim("effloss_sec3_1_degenerate_fixed_point_stability", kind="derivation",
       location="Sec. 3.1, text after Theorem 3 (refers to App. C.2)",
       text="For p_ref = 0 or 1 the fixed point (0 or 1) is not necessarily stable, and a "
       "condition on beta is needed for its stability (App. C.2).",
       check="The PoS map with p_ref in {0, 1} on 1001 points (beta in {0.05, 1, 50}); the "
       "printed App. C.2 bound B(p*) at p* in {0, 1}; one step from p_ref = 1e-3, 1e-6, 1e-9.")
def _degenerate_stability(ctx: CheckContext) -> Outcome:
    return check_degenerate_stability()

