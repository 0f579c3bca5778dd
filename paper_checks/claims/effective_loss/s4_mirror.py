"""arXiv 2503.06639 v4, Sec. 4: Mirror GRPO (KL to the previous iterate only, alpha = 0):
Theorem 4 (optimal policy, PoS recurrence) and Theorem 5 (monotone improvement, absorbing fixed
points)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_theory.success_dynamics import pos_trajectories, pos_trajectory
from grpo_theory.tilted_policies import grpo_policy_iterates, regularised_objective
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import printed_formulas as P
from .worlds_and_scans import BETAS, EPSS, P_REFS, policy_log_odds, random_world, simplex_maximiser

SECTION = "4. Mirror GRPO"


def check_theorem4(seed: int = 0, policy: Callable[..., np.ndarray] = P.theorem1_policy,
                   recurrence: Callable[..., Any] = P.mirror_logit) -> Outcome:
    """M16: the printed mirror policy (Theorem 1's form with pi_{n-1} as anchor) against SLSQP,
    and the PoS of the exact mirror iterates against the printed log-odds recurrence."""
    rng = np.random.default_rng([seed, 4101])
    worst_pol = worst_rec = better = 0.0
    compared = 0
    for trial in range(6):
        pi_ref, s = random_world(rng, K=5, n_success=2)
        beta, eps = (0.5, 1.0, 3.0)[trial % 3], (1e-5, 1e-2)[trial % 2]
        pis = grpo_policy_iterates(pi_ref, s, beta=beta, eps=eps, n_steps=6, alpha=0.0)
        for prev, cur in zip(pis[:-1], pis[1:], strict=True):
            p_prev = float(prev[s].sum())
            L_prev, L_cur = policy_log_odds(prev, s), policy_log_odds(cur, s)
            if not np.isfinite(L_cur):  # P(F) underflowed: PoS 1 to float precision
                break
            L = float(recurrence(L_prev, p_prev, beta, eps))
            worst_rec = max(worst_rec, abs(L - L_cur) / max(1.0, abs(L_cur)))
            compared += 1
        prev = pis[2]
        wp, wm = (float(w) for w in P.weights_eq4(float(prev[s].sum()), eps))
        printed_pi = policy(prev, s, wp, wm, beta)
        num = simplex_maximiser(prev, s, wp, wm, beta)
        worst_pol = max(worst_pol, float(np.max(np.abs(num - printed_pi))))
        better = max(better, regularised_objective(num, s, a_plus=wp, a_minus=wm, beta=beta,
                                                   anchor=prev)
                     - regularised_objective(printed_pi / printed_pi.sum(), s, a_plus=wp,
                                             a_minus=wm, beta=beta, anchor=prev))
    ev = {"max_abs_printed_policy_minus_slsqp": worst_pol,
          "slsqp_objective_above_printed": better,
          "steps_compared": compared,
          "max_rel_logit_error_exact_iterates_vs_printed_recurrence": worst_rec}
    ok = worst_pol < 1e-5 and better < 1e-9 and worst_rec < 1e-10 and compared > 10
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "the printed mirror policy or recurrence is not "
                   "the exact one", short=None if ok else "mirror policy/recurrence differ")


@claim("effloss_thm4_mirror_policy_and_recurrence", kind="derivation",
       location="Sec. 4, Eqs. (9)-(10), Theorem 4, Eqs. (11)-(12)",
       text="With KL to pi_{n-1} only (alpha = 0), pi_n is pi_{n-1} tilted by exp((omega+ 1{r=1} "
       "- omega- 1{r=0}) / beta) with Z = p_{n-1} e^{omega+/beta} + (1 - p_{n-1}) "
       "e^{-omega-/beta}, and logit(p_n) = logit(p_{n-1}) + Omega_eps(p_{n-1}) / beta.",
       check="6 random worlds (5 outputs), beta in {0.5, 1, 3}, eps in {1e-5, 1e-2}: the printed "
       "policy at pi_2 against SLSQP over the simplex (tolerance 1e-5); the log-odds of the exact "
       "mirror iterates (6 steps, until P(F) underflows) against the printed recurrence (relative "
       "tolerance 1e-10).")
def _thm4(ctx: CheckContext) -> Outcome:
    return check_theorem4(ctx.seed)


def _plot_mirror(ax: Any) -> None:
    for i, (p_ref, beta) in enumerate(((0.01, 1.0), (0.1, 5.0), (0.3, 10.0), (0.7, 50.0))):
        t = pos_trajectory(p_ref, beta=beta, eps=1e-5, n_steps=60, alpha=0.0)
        ax.plot(t.p, "-", c=f"C{i}", label=f"mirror, p_ref={p_ref:g}, beta={beta:g}")
        r = pos_trajectory(p_ref, beta=beta, eps=1e-5, n_steps=60, alpha=1.0)
        ax.plot(r.p, ":", c=f"C{i}")
    ax.set_xlabel("iteration n (dotted: KL to pi_ref)")
    ax.set_ylabel("PoS p_n")
    ax.legend(fontsize=7)


def check_theorem5(n_steps: int = 400, alpha: float = 0.0) -> Outcome:
    """M17: strict increase, no interior fixed point (the log-odds step is >= Omega_min / beta > 0),
    limit 1, and 0 absorbing; every (p_ref, beta, eps) of the grid."""
    g = np.array([(p, b, e) for e in EPSS for b in BETAS for p in P_REFS])
    L = pos_trajectories(g[:, 0], beta=g[:, 1], eps=g[:, 2], n_steps=n_steps, alpha=alpha)
    dL = np.diff(L, axis=0)
    om_min = (0.25 + g[:, 2]) ** -0.5
    n = len(g)
    increasing = int(np.sum(np.all(dL > 0, axis=0)))
    min_step_ratio = float(np.min(dL.min(0) * g[:, 1] / om_min))
    # L_n >= L_ref + n Omega_min / beta -> infinity: the limit is 1
    to_one = int(np.sum(L[-1] >= L[0] + n_steps * om_min / g[:, 1] * (1 - 1e-12)))
    zero = pos_trajectory(0.0, beta=1.0, eps=1e-5, n_steps=50, alpha=alpha).p
    ev = {"grid_points": n, "strictly_increasing": increasing,
          "smallest_log_odds_step_over_Omega_min_over_beta": min_step_ratio,
          "log_odds_grow_at_least_linearly": to_one, "p_ref_0_stays_0": bool(np.all(zero == 0))}
    ok = increasing == n and to_one == n and ev["p_ref_0_stays_0"]
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else f"not monotone to 1 at {n - increasing} grid points",
                   short=None if ok else "not monotone", plot=_plot_mirror,
                   plot_title="Mirror GRPO (solid) vs KL to pi_ref (dotted), eps = 1e-5")


@claim("effloss_thm5_mirror_monotone_to_one", kind="derivation",
       location="Sec. 4, Theorem 5; proof App. D",
       text="Mirror GRPO: for p_{n-1} in (0, 1), p_n > p_{n-1}; no fixed point in (0, 1), only 0 "
       "and 1; for p_ref in (0, 1), p_n increases to 1 (globally stable); for p_ref = 0, p_n = 0.",
       check="The 240-point grid, 400 steps of the exact log-odds recurrence: every step is at "
       "least Omega_min / beta = (1/4 + eps)^(-1/2) / beta > 0 (so no interior fixed point and "
       "L_n -> infinity, i.e. p_n -> 1); p_ref = 0 for 50 steps.")
def _thm5(ctx: CheckContext) -> Outcome:
    return check_theorem5()
