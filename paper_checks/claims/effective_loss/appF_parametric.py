"""arXiv 2503.06639 v4, App. F: back to parametric iterates (Assumption 1, Theorem 10), and the
population assumption relaxed: GRPO iterates computed from sampled groups of finite size G
(:mod:`sims.success_dynamics`), checked by seeded Monte Carlo against exact enumeration
(|estimate - exact| <= 4 SE) and compared with the population recursion."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from grpo_theory.success_dynamics import fixed_points
from grpo_theory.tilted_policies import grpo_policy_iterates, total_variation
from paper_checks.claim_support import K_SE
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import printed_formulas as P

SECTION = "App. F. Parametric iterates"

PI_REF = np.array([0.1, 0.2, 0.3, 0.4])
SUCCESS = np.array([True, True, False, False])


def _perturbed_iterates(d: float, n_steps: int = 60) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Population iterates pi_n (KL to pi_ref, beta = 5, eps = 1e-5) and approximations pi~_n at
    TV distance exactly d: even n move d within the successes (PoS unchanged), odd n move d from
    the failures to the successes (PoS + d)."""
    pis = grpo_policy_iterates(PI_REF, SUCCESS, beta=5.0, eps=1e-5, n_steps=n_steps)
    approx = [pis[0]]
    for n, pi in enumerate(pis[1:], start=1):
        q = pi.copy()
        if n % 2 == 0:
            q[0] -= d
            q[1] += d
        else:
            q[3] -= d
            q[0] += d
        approx.append(q)
    return pis, approx


def check_theorem10(d: float = 0.05, factor: float = P.thm10_bound_factor) -> Outcome:
    """A sequence that satisfies Assumption 1 with delta* = d: is lim |p~_n - p*| <= factor d?"""
    pis, approx = _perturbed_iterates(d)
    tv = np.array([total_variation(a, b) for a, b in zip(approx, pis, strict=True)])
    deltas = np.maximum(0.0, np.diff(tv))  # the smallest delta_n that Assumption 1 admits
    delta_star = float(deltas.sum())
    p_star = fixed_points(float(PI_REF[SUCCESS].sum()), beta=5.0, eps=1e-5).points[0].p
    gap = np.array([abs(float(a[SUCCESS].sum()) - p_star) for a in approx])
    tail = gap[-20:]
    lim_sup, lim_inf = float(tail.max()), float(tail.min())
    tight = float(max(abs(float(a[SUCCESS].sum()) - float(b[SUCCESS].sum())) - t
                      for a, b, t in zip(approx, pis, tv, strict=True)))
    ev = {"delta_star": delta_star, "assumption_1_holds": delta_star < 1,
          "limsup_abs_p_tilde_minus_p_star": lim_sup, "liminf_abs_p_tilde_minus_p_star": lim_inf,
          "printed_bound_factor_times_delta_star": factor * delta_star,
          "max_of_abs_p_tilde_minus_p_minus_TV": tight}
    bound_ok = lim_sup <= factor * delta_star + 1e-12
    no_limit = lim_sup - lim_inf > 0.5 * d
    loose = factor > 1 and tight <= 1e-12 and lim_sup >= delta_star - 1e-9
    conditional = no_limit or loose
    return Outcome(
        verdict_from(bound_ok, agrees="holds-with-conditions" if conditional else "holds"), ev,
        conditions=None if not (bound_ok and conditional) else (
            "read 'lim' as 'limsup': here the gap alternates between "
            f"{lim_inf:.3g} and {lim_sup:.3g}, so the limit does not exist; and the factor 2 is "
            "loose: |p~_n - p_n| <= TV(pi~_n, pi_n) (the PoS is the probability of one set), so "
            f"limsup |p~_n - p*| <= delta*, attained here ({lim_sup:.3g} = delta*)"),
        short=None if not (bound_ok and conditional) else "as a limsup (the limit need not exist)"
        ", with delta* in place of 2 delta* (tight)",
        correction=None if bound_ok else (
            f"the bound fails: limsup |p~_n - p*| = {lim_sup:.3g} > {factor:g} delta* = "
            f"{factor * delta_star:.3g}; what holds is limsup <= delta*"))


@claim("effloss_thm10_parametric_bound", kind="derivation",
       location="App. F, Assumption 1 and Theorem 10",
       text="If TV(pi~_n, pi_n) <= TV(pi~_{n-1}, pi_{n-1}) + delta_n with sum delta_i -> delta* in "
       "[0, 1), pi~_0 = pi_0 = pi_ref, and p_n -> p*, then lim_n |p~_n - p*| <= 2 delta*; the "
       "parametric PoS converges to p* when delta* = 0.",
       check="Exact construction in a 4-output world (KL to pi_ref, beta = 5, eps = 1e-5, "
       "p* = 0.392): pi~_n at TV distance exactly d = 0.05 from pi_n, alternately moving mass "
       "within the successes and from failures to successes (Assumption 1 with delta* = d); "
       "limsup and liminf of |p~_n - p*| over the last 20 of 60 steps against 2 delta*, and "
       "|p~_n - p_n| against TV.")
def _thm10(ctx: CheckContext) -> Outcome:
    return check_theorem10()


#: The two worlds of the relaxation: (label, beta). Same pi_ref, eps = 1e-5, G = 8.
RELAX_WORLDS: tuple[tuple[str, float], ...] = (("interior_p_star_beta5", 5.0),
                                               ("p_star_near_1_beta1", 1.0))
RELAX_G = 8
RELAX_EPS = 1e-5
RELAX_STEPS = 30


@lru_cache(maxsize=4)
def _relaxation(seed: int, quick: bool) -> tuple[tuple[str, Any], ...]:
    from sims.success_dynamics import (
        FiniteWorld,
        exact_sampled_expectation,
        simulate_sampled_iterates,
    )

    world = FiniteWorld(PI_REF, SUCCESS)
    runs = 4000 if quick else 20_000
    ev: dict[str, Any] = {"G": RELAX_G, "eps": RELAX_EPS, "runs": runs, "steps": RELAX_STEPS}
    for i, (label, beta) in enumerate(RELAX_WORLDS):
        ex = exact_sampled_expectation(world, G=RELAX_G, beta=beta, eps=RELAX_EPS, n_steps=2)
        mc = simulate_sampled_iterates(world, G=RELAX_G, beta=beta, eps=RELAX_EPS,
                                       n_steps=RELAX_STEPS, n_runs=runs,
                                       rng=np.random.default_rng([seed, 10_100 + i]))
        p = mc["p"]
        for n in (1, 2):
            est = float(p[n].mean())
            se = float(p[n].std(ddof=1) / np.sqrt(runs))
            ev[f"{label}_E_p{n}_exact"] = float(ex["mean_p"][n])
            ev[f"{label}_E_p{n}_mc"] = est
            ev[f"{label}_E_p{n}_se"] = se
            ev[f"{label}_E_p{n}_z"] = (est - float(ex["mean_p"][n])) / se
        late = p[-10:].mean(0)  # per-run average over the last 10 steps
        ev[f"{label}_population_p_star"] = float(mc["p_population"][-1])
        ev[f"{label}_population_one_minus_p_star"] = float(
            fixed_points(float(world.p_ref), beta=beta, eps=RELAX_EPS).points[0].one_minus_p)
        ev[f"{label}_population_p_star_attracting_certified"] = bool(
            fixed_points(float(world.p_ref), beta=beta, eps=RELAX_EPS).points[0].attracting)
        ev[f"{label}_sampled_long_run_mean_p"] = float(late.mean())
        ev[f"{label}_sampled_long_run_mean_p_se"] = float(late.std(ddof=1) / np.sqrt(runs))
        ev[f"{label}_sampled_long_run_sd_across_runs"] = float(p[-1].std(ddof=1))
        ev[f"{label}_mean_TV_to_population_last_step"] = float(mc["tv"][-1].mean())
        deltas = np.maximum(0.0, np.diff(mc["tv"], axis=0))  # smallest delta_n, per run
        sums = deltas.sum(0)
        rate = float(deltas[RELAX_STEPS // 2:].mean())  # per step, once the chain has settled
        ev[f"{label}_mean_sum_delta_n_over_{RELAX_STEPS}_steps"] = float(sums.mean())
        ev[f"{label}_fraction_runs_sum_delta_ge_1"] = float(np.mean(sums >= 1.0))
        ev[f"{label}_mean_delta_n_per_step_steps_15_to_30"] = rate
        ev[f"{label}_steps_until_sum_delta_reaches_1_at_that_rate"] = (
            float(np.ceil(1.0 / rate)) if rate > 0 else float("inf"))
        gap = float(late.mean()) - float(mc["p_population"][-1])
        ev[f"{label}_long_run_gap_z"] = gap / ev[f"{label}_sampled_long_run_mean_p_se"]
        ev[f"{label}_p_population_trajectory"] = mc["p_population"][:11].tolist()
        ev[f"{label}_p_sampled_mean_trajectory"] = p.mean(1)[:11].tolist()
    return tuple(ev.items())


def _plot_relaxation(ev: dict[str, Any]):
    def plot(ax: Any) -> None:
        for i, (label, beta) in enumerate(RELAX_WORLDS):
            ax.plot(ev[f"{label}_p_population_trajectory"], "--", c=f"C{i}",
                    label=f"population recursion, beta={beta:g}")
            ax.plot(ev[f"{label}_p_sampled_mean_trajectory"], "o-", ms=3, c=f"C{i}",
                    label=f"sampled groups G={RELAX_G}, mean of {ev['runs']} runs")
        ax.set_xlabel("iteration n")
        ax.set_ylabel("PoS")
        ax.legend(fontsize=7)
    return plot


def check_relaxation(seed: int = 0, quick: bool = True, close: float = 0.05) -> Outcome:
    """Finite G: Monte Carlo checked against exact enumeration, then compared with p*."""
    ev = dict(_relaxation(seed, quick))
    stat_ok = all(abs(ev[f"{lab}_E_p{n}_z"]) <= K_SE for lab, _ in RELAX_WORLDS for n in (1, 2))
    gaps = {lab: abs(ev[f"{lab}_sampled_long_run_mean_p"] - ev[f"{lab}_population_p_star"])
            for lab, _ in RELAX_WORLDS}
    for lab, g in gaps.items():
        ev[f"{lab}_abs_gap_sampled_long_run_mean_minus_p_star"] = g
    near = {lab: g < close for lab, g in gaps.items()}
    a, b = (lab for lab, _ in RELAX_WORLDS)
    ok = any(near.values())
    cond = not all(near.values())
    return Outcome(
        verdict_from(ok, computed=stat_ok,
                     agrees="holds-with-conditions" if cond else "holds"), ev,
        conditions=None if not (ok and cond) else (
            f"with sampled groups of G = {RELAX_G} the per-step sampling error never vanishes: "
            "the smallest delta_n of Assumption 1 averages "
            f"{ev[f'{a}_mean_delta_n_per_step_steps_15_to_30']:.3g} / "
            f"{ev[f'{b}_mean_delta_n_per_step_steps_15_to_30']:.3g} per step once the chain has "
            "settled, so sum delta_n grows without bound (past 1 after about "
            f"{ev[f'{a}_steps_until_sum_delta_reaches_1_at_that_rate']:.0f} / "
            f"{ev[f'{b}_steps_until_sum_delta_reaches_1_at_that_rate']:.0f} steps) and "
            "Theorem 10 says nothing; the sampled PoS then stays near p* only in some worlds: "
            f"|E p~ - p*| = {gaps[a]:.3g} (a bias of {ev[f'{a}_long_run_gap_z']:.0f} SE) where "
            f"p* = {ev[f'{a}_population_p_star']:.3f} is interior, but {gaps[b]:.3g} where "
            f"p* ~ 1 (the sampled mean settles at {ev[f'{b}_sampled_long_run_mean_p']:.3f}): "
            "once p is high an all-success group is likely, its advantages are all 0, and with "
            "the KL to pi_ref the argmax is then pi_ref itself"),
        short=None if not (ok and cond) else f"fixed G = {RELAX_G}: Assumption 1 fails; near p* "
        f"only where p* is interior (gap {gaps[a]:.2g}), not where p* ~ 1 (gap {gaps[b]:.2g})",
        correction=None if ok else "the sampled iterates stay far from p* in every world",
        plot=_plot_relaxation(ev),
        plot_title="Population recursion vs sampled groups (App. F relaxed)")


@claim("effloss_appf_sampled_groups_near_fixed_point", kind="interpretation",
       location="App. F, text after Theorem 10; Algorithm 1 (Sec. 2.4)",
       text="delta_n stands for statistical, approximation and optimisation errors: as long as "
       "these remain small, the PoS of GRPO's parametric iterates (estimated from samples) stays "
       "close to the fixed point p*.",
       check="The population assumption relaxed (sims.success_dynamics): each step draws G = 8 "
       "outputs from pi_{n-1}, computes the registry's grpo_std advantages (ddof 0, eps 1e-5 "
       "under the root: Eq. 4 at p_hat) and takes the exact argmax over every policy of the "
       "importance-sampled surrogate with KL to pi_ref. Two worlds (same 4-output pi_ref, "
       "p_ref = 0.3): beta = 5 (interior p* = 0.392) and beta = 1 (p* ~ 1). E[p_1], E[p_2] by "
       "exact enumeration of every draw against the Monte Carlo means (4000 runs, 20 000 full; "
       "|est - exact| <= 4 SE), then 30 steps: the long-run mean against p*, TV to the "
       "population iterate, and the smallest delta_n of Assumption 1 per run.",
       variants=("grpo_std",))
def _relax(ctx: CheckContext) -> Outcome:
    return check_relaxation(ctx.seed, ctx.quick)
