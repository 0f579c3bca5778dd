"""arXiv 2503.06639 v4, Sec. 3: GRPO dynamics as a fixed-point iteration of the PoS.

Theorem 1 (the optimal policy), Theorem 2 (the PoS recursion ``h_{eps, p_ref}``), Remark 1
(``varepsilon > 0`` is needed), Proposition 1 (existence, shape, sigmoid form of ``h``) and the
discussion of Fig. 2 (limits are fixed points; fixed points are not unique; "p* = 1 is almost
always a fixed point").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_theory.success_dynamics import sigmoid
from grpo_theory.tilted_policies import (
    grpo_policy_iterates,
    kl_divergence,
    regularised_objective,
    tilt,
)
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import printed_formulas as P
from .worlds_and_scans import (
    IDENTITY_TOL,
    exact_zero,
    fixed_point_scan,
    orbit_scan,
    random_world,
    simplex_maximiser,
)

SECTION = "3. PoS fixed-point iteration"


def check_theorem1(seed: int = 0, policy: Callable[..., np.ndarray] = P.theorem1_policy
                   ) -> Outcome:
    """M6: the printed optimal policy against SLSQP on the simplex, and the gap identity."""
    rng = np.random.default_rng([seed, 3101])
    worst = worst_gap = worst_norm = 0.0
    better = 0.0  # how much SLSQP beats the printed policy (should be <= ~0)
    for trial in range(6):
        pi_ref, s = random_world(rng, K=5, n_success=2)
        beta = (0.5, 1.0, 3.0)[trial % 3]
        p_prev = float(rng.uniform(0.05, 0.95))
        wp, wm = (float(w) for w in P.weights_eq4(p_prev, 1e-3))
        printed_pi = policy(pi_ref, s, wp, wm, beta)
        worst_norm = max(worst_norm, abs(float(printed_pi.sum()) - 1.0))
        num = simplex_maximiser(pi_ref, s, wp, wm, beta)
        worst = max(worst, float(np.max(np.abs(num - printed_pi))))
        j = regularised_objective(printed_pi / printed_pi.sum(), s, a_plus=wp, a_minus=wm,
                                  beta=beta, anchor=pi_ref)
        jn = regularised_objective(num, s, a_plus=wp, a_minus=wm, beta=beta, anchor=pi_ref)
        better = max(better, jn - j)
        star = tilt(pi_ref, s, a_plus=wp, a_minus=wm, beta=beta)
        j_star = regularised_objective(star, s, a_plus=wp, a_minus=wm, beta=beta, anchor=pi_ref)
        for _ in range(4):
            q = rng.dirichlet(np.ones(pi_ref.size))
            jq = regularised_objective(q, s, a_plus=wp, a_minus=wm, beta=beta, anchor=pi_ref)
            worst_gap = max(worst_gap, abs((j_star - jq) - beta * kl_divergence(q, star)))
    ev = {"max_abs_printed_minus_slsqp": worst, "slsqp_objective_above_printed": better,
          "printed_policy_sum_minus_1": worst_norm,
          "max_abs_gap_identity_error_J_star_minus_J_q_minus_beta_KL": worst_gap}
    ok = worst < 1e-5 and better < 1e-9 and worst_norm < 1e-12
    return Outcome(verdict_from(ok, computed=worst_gap < 1e-12), ev,
                   correction=None if ok else f"the printed policy is not the maximiser (SLSQP "
                   f"differs by {worst:.3g} and reaches an objective {better:.3g} higher)",
                   short=None if ok else "printed policy is not the maximiser")


@claim("effloss_thm1_optimal_policy", kind="derivation",
       location="Sec. 3, Theorem 1; proof in App. C",
       text="The maximiser of (GRPO Iterations) is pi_n = pi_ref exp((omega+(p_{n-1}) 1{r=1} - "
       "omega-(p_{n-1}) 1{r=0}) / beta) / Z_{n-1}, Z_{n-1} = p_ref e^{omega+/beta} + (1 - p_ref) "
       "e^{-omega-/beta} (a concave problem solved by its first-order condition).",
       check="6 random worlds (5 outputs), beta in {0.5, 1, 3}, smoothing 1e-3: the printed "
       "policy against scipy's SLSQP over the simplex (tolerance 1e-5; SLSQP must not reach a "
       "higher objective); the gap identity J(pi*) - J(pi) = beta KL(pi || pi*) at random pi "
       "(tolerance 1e-12) as a cross-check.")
def _thm1(ctx: CheckContext) -> Outcome:
    return check_theorem1(ctx.seed)


def check_theorem2(seed: int = 0, h: Callable[..., Any] = P.h_thm2) -> Outcome:
    """M7: PoS of the exact policy iterates (tilts) against the printed ``h`` iterated."""
    rng = np.random.default_rng([seed, 3201])
    worst = 0.0
    n_cases = 0
    for trial in range(8):
        pi_ref, s = random_world(rng, K=6, n_success=int(rng.integers(1, 5)))
        beta = (0.3, 1.0, 2.0, 5.0)[trial % 4]
        eps = (1e-5, 1e-2)[trial % 2]
        pis = grpo_policy_iterates(pi_ref, s, beta=beta, eps=eps, n_steps=8)
        p_ref = float(pi_ref[s].sum())
        p = p_ref
        for pi in pis[1:]:
            p = float(h(np.float64(p), p_ref, beta, eps))
            worst = max(worst, abs(float(pi[s].sum()) - p))
            n_cases += 1
    ok = worst < 1e-12
    return Outcome(verdict_from(ok), {"steps_compared": n_cases, "max_abs_difference": worst},
                   correction=None if ok else f"the PoS of the optimal iterates differs from h "
                   f"iterated by up to {worst:.3g}",
                   short=None if ok else "PoS recursion is not h")


@claim("effloss_thm2_pos_fixed_point_iteration", kind="derivation",
       location="Sec. 3, Theorem 2, Eq. (8)",
       text="For p_ref > 0 and beta > 0, p_n = h_{eps, p_ref}(p_{n-1}) with p_0 = p_ref and "
       "h(p) = 1 / (1 + (1-p_ref)/p_ref exp(-(1/beta) / sqrt(p(1-p) + eps))).",
       check="8 random worlds (6 outputs, 1-4 successes), beta in {0.3, 1, 2, 5}, eps in "
       "{1e-5, 1e-2}: the PoS of the exact maximisers (tilts of pi_ref, grpo_theory."
       "tilted_policies) for n = 1..8 against the printed h iterated (tolerance 1e-12).")
def _thm2(ctx: CheckContext) -> Outcome:
    return check_theorem2(ctx.seed)


def check_remark1(h: Callable[..., Any] = P.h_thm2, p_ref: float = 0.5, beta: float = 1.0
                  ) -> Outcome:
    """M8: with eps = 0, the one-sided limits of h at 0 and 1 (50+ digits), and the fixed points
    under the two ways to define h there."""
    import mpmath as mp

    mp.mp.dps = 60
    ks = range(1, 16)
    gaps0 = [float(1 - h(mp.mpf(10) ** -k, mp.mpf(p_ref), mp.mpf(beta), 0, xp=mp)) for k in ks]
    gaps1 = [float(1 - h(1 - mp.mpf(10) ** -k, mp.mpf(p_ref), mp.mpf(beta), 0, xp=mp))
             for k in ks]
    lim_is_one = gaps0[-1] < 1e-50 and gaps1[-1] < 1e-50 and all(
        b <= a for a, b in zip(gaps0, gaps0[1:], strict=False))
    # zero-advantage convention: h(0) = h(1) = p_ref; interior f = h(p) - p on a fine grid
    grid = np.linspace(1e-6, 1 - 1e-6, 200_001)
    f = h(grid, p_ref, beta, 0.0) - grid
    interior_min = float(f.min())
    t = 2.0  # the proof margin: 1 - h <= e^{-1/sqrt(1-p)} < 1 - p since t - 2 ln t >= 2 - 2 ln 2
    margin = t - 2 * math.log(t)
    none_anywhere = interior_min > 0 and p_ref not in (0.0, 1.0)
    ev = {"one_minus_h_at_p_1e-k_k1_to_15": gaps0, "one_minus_h_at_1_minus_1e-k": gaps1,
          "limits_at_0_and_1_equal_1": lim_is_one, "example_p_ref": p_ref, "example_beta": beta,
          "min_over_interior_of_h_minus_p": interior_min,
          "analytic_margin_t_minus_2_ln_t_at_t2": margin,
          "no_fixed_point_under_zero_advantage_convention": none_anywhere}
    ok = lim_is_one and none_anywhere
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=None if not ok else (
            "only under the implementations' zero-advantage convention at p in {0, 1} (a group "
            "without variance gets advantage 0, so h(0) = h(1) = p_ref): then h jumps at 0 and 1 "
            f"and, e.g. at p_ref = {p_ref}, beta = {beta}, h(p) > p on all of (0, 1) (at each "
            "of 200 001 interior points; analytically 1 - h(p) < exp(-1/sqrt(1-p)) < 1 - p, "
            "since t - 2 ln t >= 2 - 2 ln 2 > 0), so no fixed point exists. Read as a formula, "
            "h with eps = 0 is "
            "undefined at 0 and 1 but both one-sided limits equal 1, so it extends continuously "
            "with h(1) = 1 and the fixed point p* = 1 (Brouwer still applies)"),
        short=None if not ok else "only under the zero-advantage convention at p in {0,1}; "
        "the continuous extension (h(0) = h(1) = 1) keeps the fixed point 1",
        correction=None if ok else "the limits or the example do not behave as described")


@claim("effloss_remark1_eps_needed", kind="derivation", location="Sec. 3, Remark 1",
       text="If eps = 0, h_{eps, p_ref} is no longer continuous at 0 and 1 and the existence of a "
       "fixed point in [0, 1] is no longer guaranteed.",
       check="The printed h with eps = 0 at p = 10^-k and 1 - 10^-k, k = 1..15, in 60-digit "
       "arithmetic (mpmath): the one-sided limits; then, with the zero-advantage convention "
       "h(0) = h(1) = p_ref, h(p) - p on 200 001 interior points at p_ref = 1/2, beta = 1.")
def _remark1(ctx: CheckContext) -> Outcome:
    return check_remark1()


def check_prop1_existence(h: Callable[..., Any] = P.h_thm2) -> Outcome:
    """M9 (i): h maps [0, 1] into [0, 1] (in fact into (p_ref, 1)); certified fixed points."""
    grid = np.linspace(0.0, 1.0, 2001)
    in_range = below_ref = 0
    scan = fixed_point_scan()
    for (p_ref, beta, eps), _ in scan:
        v = np.asarray(h(grid, p_ref, beta, eps))
        in_range += int(np.all((v >= 0) & (v <= 1)))
        below_ref += int(np.any(v <= p_ref))
    found = sum(len(fp.points) > 0 for _, fp in scan)
    certified = all(fp.certified for _, fp in scan)
    ev = {"grid_points": len(scan), "maps_into_0_1": in_range,
          "grid_points_where_h_reaches_p_ref_or_below": below_ref,
          "with_a_certified_fixed_point": found, "all_searches_certified": certified}
    ok = in_range == len(scan) and found == len(scan)
    return Outcome(verdict_from(ok, computed=certified), ev,
                   correction=None if ok else "h leaves [0, 1] or has no fixed point somewhere",
                   short=None if ok else "no fixed point at some grid point")


@claim("effloss_prop1_i_fixed_point_exists", kind="derivation",
       location="Sec. 3, Proposition 1 (i); App. C",
       text="For eps > 0, h_{eps, p_ref} is continuous from [0, 1] to [0, 1] and has at least one "
       "fixed point (not necessarily unique).",
       check="Grid p_ref in {0.001 ... 0.99} x beta in {0.05 ... 50} x eps in {1e-5, 1e-2, 1/4} "
       "(240 points): the printed h on 2001 points of [0, 1] stays in [0, 1]; every fixed point "
       "by a certified search in log-odds (grpo_theory.success_dynamics.fixed_points: Lipschitz "
       "root exclusion, sign-change brackets).")
def _prop1_i(ctx: CheckContext) -> Outcome:
    return check_prop1_existence()


def check_prop1_derivative(h: Callable[..., Any] = P.h_thm2,
                           h_prime: Callable[..., Any] = P.h_prime_prop1) -> Outcome:
    """M9 (ii): sympy derivative of h against the printed h'; the sign pattern and the minimum."""
    import sympy as sp

    p, pr, b, e = sp.symbols("p p_ref beta eps", positive=True)
    resid = exact_zero(sp.diff(h(p, pr, b, e, xp=sp), p) - h_prime(p, pr, b, e, xp=sp),
                       {p: (0.0, 1.0), pr: (0.0, 1.0), b: (0.1, 5.0), e: (1e-4, 0.5)})
    grid = np.linspace(0.0, 1.0, 2001)
    shape_ok = True
    for (p_ref, beta, eps), _ in fixed_point_scan():
        d = np.asarray(h_prime(grid, p_ref, beta, eps))
        v = np.asarray(h(grid, p_ref, beta, eps))
        shape_ok &= bool(np.all(d[grid < 0.5] <= 0) and np.all(d[grid > 0.5] >= 0)
                         and v.min() >= float(h(np.float64(0.5), p_ref, beta, eps)) - 1e-15)
    ev = {"max_abs_residual_d_dp_h_minus_printed_h_prime": resid,
          "sign_and_minimum_at_half_on_all_grid_points": shape_ok}
    ok = resid < IDENTITY_TOL and shape_ok
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else f"d/dp h differs from the printed h' (residual "
                   f"{resid:.3g}) or the shape differs",
                   short=None if ok else "printed derivative is wrong")


@claim("effloss_prop1_ii_derivative_and_shape", kind="derivation",
       location="Sec. 3, Proposition 1 (ii)",
       text="h'(p) = -h(p)(1 - h(p))(1 - 2p) / (2 beta [p(1-p) + eps]^(3/2)): h decreases on "
       "p < 1/2, increases on p > 1/2, and is smallest at p = 1/2.",
       check="sympy d/dp of the printed h minus the printed h' at random rational (p, p_ref, beta, "
       "eps), 60 digits; signs of h' and the minimum at 1/2 on 2001 points for the 240-point grid.")
def _prop1_ii(ctx: CheckContext) -> Outcome:
    return check_prop1_derivative()


def check_prop1_sigmoid(h: Callable[..., Any] = P.h_thm2,
                        h_sig: Callable[..., Any] = P.h_sigmoid_prop1) -> Outcome:
    """M9 (iii): the two printed forms of h agree identically."""
    import sympy as sp

    p, pr, b, e = sp.symbols("p p_ref beta eps", positive=True)
    resid = exact_zero(h(p, pr, b, e, xp=sp) - h_sig(p, pr, b, e, xp=sp),
                       {p: (0.0, 1.0), pr: (0.0, 1.0), b: (0.1, 5.0), e: (1e-4, 0.5)})
    ok = resid < IDENTITY_TOL
    return Outcome(verdict_from(ok), {"max_abs_residual_at_60_digit_points": resid},
                   correction=None if ok else f"the two forms differ (residual {resid:.3g})",
                   short=None if ok else "the sigmoid form differs from h")


@claim("effloss_prop1_iii_sigmoid_form", kind="derivation", location="Sec. 3, Proposition 1 (iii)",
       text="h_{eps, p_ref}(p) = sigma(logit(p_ref) + Omega_eps(p) / beta) with Omega_eps(p) = "
       "(p(1-p) + eps)^(-1/2).",
       check="sympy: the printed Theorem 2 form minus the printed sigmoid form at random rational "
       "(p, p_ref, beta, eps), 60 digits.")
def _prop1_iii(ctx: CheckContext) -> Outcome:
    return check_prop1_sigmoid()


def check_limit_is_fixed_point() -> Outcome:
    """M10 (a): where the iterates converge, the limit is one of the certified fixed points."""
    fps = dict(fixed_point_scan())
    converged = matched = 0
    worst = 0.0
    for g, kind, (_, last) in orbit_scan():
        if kind != "fixed point":
            continue
        converged += 1
        cands = [abs(float(sigmoid(f.logit)) - last) for f in fps[g].points]
        d = min(cands) if cands else math.inf
        worst = max(worst, d)
        matched += int(d < 1e-9 or (last == 1.0 and any(f.one_minus_p < 1e-15
                                                         for f in fps[g].points)))
    ev = {"grid_points_converged": converged, "limit_is_a_certified_fixed_point": matched,
          "max_abs_distance_limit_to_nearest_fixed_point": worst}
    ok = converged > 0 and matched == converged
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "a limit of the iteration is not a fixed point",
                   short=None if ok else "limit is not a fixed point")


@claim("effloss_sec3_limit_is_fixed_point", kind="derivation",
       location="Sec. 3, text after Proposition 1",
       text="If p_n converges, its limit is a fixed point of h (by continuity).",
       check="The 240-point grid: iterate 3000 steps from p_ref (log-odds); where the last two "
       "iterates agree, compare the limit with the certified fixed points.")
def _limit(ctx: CheckContext) -> Outcome:
    return check_limit_is_fixed_point()


def check_not_unique() -> Outcome:
    """M10 (b): grid points with more than one certified fixed point."""
    counts: dict[str, int] = {}
    multi_fig2 = 0
    for (_, _, eps), fp in fixed_point_scan():
        counts[str(len(fp.points))] = counts.get(str(len(fp.points)), 0) + 1
        multi_fig2 += int(len(fp.points) > 1 and eps == P.FIG2_EPS)
    multi = sum(v for k, v in counts.items() if int(k) > 1)
    ev = {"grid_points_by_number_of_fixed_points": counts,
          "grid_points_with_several_fixed_points": multi,
          "of_which_at_fig2_eps_1e-5": multi_fig2}
    ok = multi > 0
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "every grid point has a single fixed point",
                   short=None if ok else "fixed point unique on the grid")


@claim("effloss_sec3_fixed_points_not_unique", kind="derivation",
       location="Sec. 3, discussion of Fig. 2",
       text="The fixed points of h are not unique in general (Fig. 2, eps = 1e-5).",
       check="Number of certified fixed points at each of the 240 grid points.")
def _not_unique(ctx: CheckContext) -> Outcome:
    return check_not_unique()


def check_p_one_fixed(h: Callable[..., Any] = P.h_thm2) -> Outcome:
    """M10 (c): is h(1) = 1? ``1 - h(1)`` in arbitrary precision (mpmath, enough digits for
    ``exp(-1/(beta sqrt(eps)))``) at every grid point with 0 < p_ref < 1."""
    import mpmath as mp

    never, float_one, near_one = 0, 0, 0
    smallest: tuple[float, Any] = (math.inf, None)
    scan = [(g, fp) for g, fp in fixed_point_scan() if g[2] == P.FIG2_EPS]  # Fig. 2's eps
    for (p_ref, beta, eps), fp in scan:
        mp.mp.dps = 40 + int(1.0 / (beta * math.sqrt(eps)) / 2.3 + 20)
        gap = 1 - h(mp.mpf(1), mp.mpf(p_ref), mp.mpf(beta), mp.mpf(eps), xp=mp)
        never += int(gap > 0)
        float_one += int(float(h(np.float64(1.0), p_ref, beta, eps)) == 1.0)
        near_one += int(any(f.one_minus_p < 1e-12 for f in fp.points))
        lg = float(mp.log10(gap)) if gap > 0 else -math.inf
        if lg < smallest[0]:
            smallest = (lg, (p_ref, beta, eps))
    mp.mp.dps = 15
    n = len(scan)
    ev = {"grid_points": n, "where_1_minus_h_of_1_is_positive": never,
          "where_float64_h_of_1_equals_1": float_one,
          "with_a_fixed_point_within_1e-12_of_1": near_one,
          "smallest_log10_1_minus_h_of_1": smallest[0],
          "at_p_ref_beta_eps": list(smallest[1])}
    ok = never < n  # the statement needs h(1) = 1 at (almost) every point
    return Outcome(
        verdict_from(ok), ev,
        correction=None if ok else (
            "p = 1 is a fixed point only when p_ref = 1: 1 - h(1) = sigma(-(logit p_ref + "
            "1/(beta sqrt eps))) > 0 at every grid point (as small as 10^"
            f"{smallest[0]:.0f}). What holds: for small beta there is a fixed point p* < 1 with "
            "1 - p* of that order, which float64 rounds to 1 (h(1) == 1.0 in float64 at "
            f"{float_one} of {n} grid points; a fixed point within 1e-12 of 1 at {near_one})"),
        short=None if ok else "1 is never a fixed point for 0 < p_ref < 1; a fixed point "
        "within ~sigma(-(logit p_ref + 1/(beta sqrt eps))) of 1 exists for small beta",
        finding=None if ok else (
            f"1 - h(1) > 0 at {never} of {n} grid points (down to 10^{smallest[0]:.0f}): p = 1 is "
            "a fixed point only when p_ref = 1; float64 rounds h(1) to 1 at "
            f"{float_one} of them"))


@claim("effloss_sec3_p_one_almost_always_fixed", kind="derivation",
       location="Sec. 3, discussion of Fig. 2",
       text="p* = 1 is almost always a fixed point of h (Fig. 2, eps = 1e-5).",
       check="1 - h(1) for the printed h at the 80 grid points with Fig. 2's eps = 1e-5 (p_ref x "
       "beta), in mpmath with enough digits to resolve exp(-1/(beta sqrt(eps))); beside it "
       "float64's h(1) and the certified fixed points within 1e-12 of 1.")
def _p_one(ctx: CheckContext) -> Outcome:
    return check_p_one_fixed()
