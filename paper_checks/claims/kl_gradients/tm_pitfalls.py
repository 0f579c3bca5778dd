"""[TM] Tang and Munos, arXiv 2506.09477: k1 and k3 as losses (D3, D4), the correct gradient
(D8, shared with [LIU] and [CE]), token-level losses give a partial gradient (D10), incorrect
implementations can look fine at low KL (D11), and which code bases contain the pitfalls (D18).

The abstract and the opening of Sec. 1 were read; everything else comes from secondary summaries
(the Notion summary, the themoonlight review, chatpaper), named in each location."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from .worlds import TOL, bandit, classify, mc_projection, option, rel, token_mdp, worlds

SECTION = "[TM] Tang and Munos, arXiv 2506.09477: the two pitfalls"


def k1_loss_outcome(ctx: CheckContext, *, name: str = "k1_loss") -> Outcome:
    """Exact expected gradient of k1 (or ``name``) as a loss, token and sequence level, for two
    references: zero, and the same for both references."""
    from sims.kl_dynamics import option_gradient

    ev: dict[str, Any] = {}
    worst, dep = 0.0, 0.0
    for wname, w in worlds().items():
        from dataclasses import replace

        for level in ("token", "sequence"):
            opt = option(name, level=level)
            g = option_gradient(w, opt)
            g2 = option_gradient(replace(w, ref_logits=w.ref_logits + 1.3, _cache={}), opt)
            ev[f"{wname}_{level}_norm_expected_gradient"] = float(np.linalg.norm(g))
            worst = max(worst, float(np.linalg.norm(g)))
            dep = max(dep, float(np.linalg.norm(g - g2)))
    ev["norm_grad_reverse_kl_token_mdp"] = float(np.linalg.norm(
        token_mdp().targets()["reverse_sequence"]))
    mc_ev, mc_ok = mc_projection(ctx, token_mdp(), option(name), 2602,
                                 "k1 loss gradient projection")
    ev.update(mc_ev)
    ev.update(max_norm_expected_gradient=worst, max_change_with_reference=dep)
    ok = worst < TOL and dep < TOL
    return Outcome(verdict_from(ok, computed=mc_ok), ev,
                   correction=None if ok else f"the expected gradient has norm {worst:.3g}",
                   short=(f"expected gradient 0 (norm {worst:.1e}) against |grad KL| "
                          f"{ev['norm_grad_reverse_kl_token_mdp']:.3g}") if ok
                   else f"expected gradient norm {worst:.2g}, not 0")


@claim(
    "klgrad_d3_k1_loss_zero_gradient",
    location="[TM] first pitfall (via the Notion summary); [LIU] 'k1 as loss' counterexample",
    text="Differentiating k1 at samples y ~ pi_theta gives grad log pi_theta(y), whose "
    "expectation is exactly 0: it does not depend on pi_ref and adds only noise, so it gives no "
    "KL regularisation in expectation.",
    check="Exact expected gradient of k1 as a loss (token-level sum and sequence level) over "
    "every response of a 3-arm bandit and a token MDP (V = 2, T = 3), with two references; "
    "4000 sampled responses (40000 full) projected on a fixed direction, k = 4 SE.",
    kind="derivation",
)
def _d3(ctx: CheckContext) -> Outcome:
    return k1_loss_outcome(ctx)


def k3_loss_outcome(ctx: CheckContext, *, name: str = "k3_loss",
                    fd_targets: Any = None) -> Outcome:
    """k3 as a loss against finite-difference gradients of KL(pi_ref || pi) and KL(pi || pi_ref):
    one token (bandit), the whole response (sequence level), and token-level sums."""
    from sims.kl_dynamics import finite_difference_targets, option_gradient

    ev: dict[str, Any] = {}
    fds = fd_targets or {n: finite_difference_targets(w) for n, w in worlds().items()}
    b = option_gradient(bandit(), option(name))
    ev["bandit_rel_error_vs_fd_forward_kl"] = rel(b, fds["bandit"]["forward_sequence"])
    ev["bandit_rel_error_vs_fd_reverse_kl"] = rel(b, fds["bandit"]["reverse_sequence"])
    t = token_mdp()
    seq = option_gradient(t, option(name, level="sequence"))
    tok = option_gradient(t, option(name))
    fd = fds["token_mdp"]
    ev["token_mdp_sequence_rel_error_vs_fd_forward_kl"] = rel(seq, fd["forward_sequence"])
    ev["token_mdp_token_sum_rel_error_vs_fd_forward_kl"] = rel(tok, fd["forward_sequence"])
    ev["token_mdp_token_sum_rel_error_vs_fd_per_token_forward_kl"] = rel(tok, fd["forward_token"])
    ev["token_mdp_token_sum_rel_error_vs_fd_reverse_kl"] = rel(tok, fd["reverse_sequence"])
    mc_ev, mc_ok = mc_projection(ctx, t, option(name), 2603, "k3 loss gradient projection")
    ev.update(mc_ev)
    fd_tol = 1e-6
    ok = (ev["bandit_rel_error_vs_fd_forward_kl"] < fd_tol
          and ev["bandit_rel_error_vs_fd_reverse_kl"] > 1e-3
          and ev["token_mdp_sequence_rel_error_vs_fd_forward_kl"] < fd_tol)
    return Outcome(
        verdict_from(ok, computed=mc_ok), ev,
        correction=None if ok else (
            "k3 as a loss does not give grad KL(pi_ref || pi): relative error "
            f"{ev['bandit_rel_error_vs_fd_forward_kl']:.3g} (bandit), "
            f"{ev['token_mdp_sequence_rel_error_vs_fd_forward_kl']:.3g} (sequence level)"),
        short=(f"grad KL(pi_ref || pi) to {ev['bandit_rel_error_vs_fd_forward_kl']:.1e} (one "
               f"token); {ev['bandit_rel_error_vs_fd_reverse_kl']:.3g} from the reverse one") if ok
        else "k3 as a loss is not the forward-KL gradient "
        f"({ev['bandit_rel_error_vs_fd_forward_kl']:.2g} off)")


@claim(
    "klgrad_d4_k3_loss_forward_kl",
    location="[TM] first pitfall (via the Notion summary)",
    text="Differentiating the variance-reduced estimate k3 at samples y ~ pi_theta gives, in "
    "expectation, the gradient of KL(pi_ref || pi_theta), not of KL(pi_theta || pi_ref): "
    "minimising it minimises the other direction.",
    check="Exact expected gradient of k3 as a loss against central finite differences of both "
    "KLs (a route without the score identity): a 3-arm bandit (one step) and the whole response "
    "of a token MDP (V = 2, T = 3, sequence-level k3); the token-level sum is compared with the "
    "sequence and the per-token forward KL (evidence); Monte Carlo cross-check, k = 4 SE.",
    kind="derivation",
)
def _d4(ctx: CheckContext) -> Outcome:
    return k3_loss_outcome(ctx)


def rkl_gradient_outcome(ctx: CheckContext, *, names: Sequence[str] = (
        "k1_reward_sum", "k1_reward_to_go", "seq_k1_reward")) -> Outcome:
    """grad RKL = E[LR psi] against finite differences; k1 detached on the score gives it."""
    from sims.kl_dynamics import finite_difference_targets, option_gradient

    ev: dict[str, Any] = {}
    fd_err, worst = 0.0, 0.0
    for wname, w in worlds().items():
        fd = finite_difference_targets(w)
        score_route = w.targets()["reverse_sequence"]
        fd_err = max(fd_err, rel(score_route, fd["reverse_sequence"]))
        for n in names:
            g = option_gradient(w, option(n))
            ev[f"{wname}_{n}_rel_error_vs_grad_reverse_kl"] = rel(g, score_route)
            worst = max(worst, rel(g, score_route))
    mc_ev, mc_ok = mc_projection(ctx, token_mdp(), option(names[0]), 2604,
                                 "k1 in reward gradient projection")
    ev.update(mc_ev)
    ev.update(max_rel_error_score_formula_vs_fd=fd_err, max_rel_error_k1_in_reward=worst)
    ok = worst < TOL
    return Outcome(verdict_from(ok, computed=mc_ok and fd_err < 1e-6), ev,
                   correction=None if ok else f"k1 in the reward is biased: relative error "
                   f"{worst:.3g}",
                   short=(f"k1 in the reward = grad KL(pi || pi_ref) to {worst:.1e}; score "
                          f"formula = finite differences to {fd_err:.1e}") if ok
                   else f"k1 in reward biased ({worst:.2g})")


@claim(
    "klgrad_d8_rkl_gradient_k1_in_reward",
    location="[TM] 'correct implementation' (via the Notion summary); [LIU] abstract ('k1 in "
    "reward ... is the principled loss for Reverse KL'); [CE] findings (via emergentmind)",
    text="grad KL(pi_theta || pi_ref) = E_{y ~ pi_theta}[log(pi_theta(y)/pi_ref(y)) grad log "
    "pi_theta(y)]; using k1 as a detached coefficient of the score ('k1 in reward', or the loss "
    "sg[k1] log pi_theta) gives an unbiased estimate on-policy.",
    check="The score formula against central finite differences of KL(pi || pi_ref) (bandit, "
    "token MDP V = 2, T = 3); exact expected gradients of k1 in the reward summed over the "
    "response, summed to go, and sequence-level; Monte Carlo cross-check, k = 4 SE.",
    kind="derivation",
)
def _d8(ctx: CheckContext) -> Outcome:
    return rkl_gradient_outcome(ctx)


def partial_gradient_outcome(ctx: CheckContext, *, token_sums: Sequence[str] = (
        "k2_loss", "k1_reward"), kl_to_go: str = "k1_reward_to_go") -> Outcome:
    """Token-level sums (per-token estimators; per-token analytic KLs with the state law frozen)
    against the sequence gradient; the KL-to-go weighting against it."""
    from grpo_theory import kl
    from sims.kl_dynamics import finite_difference_targets, option_gradient

    w = token_mdp()
    t = w.targets()
    fd = finite_difference_targets(w)
    analytic = kl.tabular_partial_kl_gradients(w.logits, w.ref_logits, vocab=w.vocab,
                                               length=w.length)
    ev: dict[str, Any] = {
        "rel_gap_partial_vs_sequence_gradient": rel(t["reverse_token"], t["reverse_sequence"]),
        "rel_error_fd_frozen_state_sum_vs_partial": rel(fd["reverse_token"], t["reverse_token"]),
        "rel_error_analytic_per_state_vs_partial": rel(analytic["reverse_token"],
                                                       t["reverse_token"]),
    }
    partial_ok = True
    for n in token_sums:
        g = option_gradient(w, option(n))
        ev[f"{n}_rel_error_vs_partial"] = rel(g, t["reverse_token"])
        ev[f"{n}_rel_error_vs_sequence_gradient"] = rel(g, t["reverse_sequence"])
        partial_ok = partial_ok and ev[f"{n}_rel_error_vs_partial"] < TOL
    g = option_gradient(w, option(kl_to_go))
    ev["kl_to_go_rel_error_vs_sequence_gradient"] = rel(g, t["reverse_sequence"])
    ev["bandit_rel_gap_partial_vs_sequence"] = rel(bandit().targets()["reverse_token"],
                                                   bandit().targets()["reverse_sequence"])
    gap = ev["rel_gap_partial_vs_sequence_gradient"]
    ok = (partial_ok and gap > 1e-3 and ev["kl_to_go_rel_error_vs_sequence_gradient"] < TOL)
    computed = (ev["rel_error_fd_frozen_state_sum_vs_partial"] < 1e-6
                and ev["rel_error_analytic_per_state_vs_partial"] < TOL)
    return Outcome(
        verdict_from(ok, computed=computed), ev,
        correction=None if ok else (
            f"token-level sums give the sequence gradient here (gap {gap:.3g}) or the KL-to-go "
            f"weighting does not (error {ev['kl_to_go_rel_error_vs_sequence_gradient']:.3g})"),
        short=(f"token-level sums are {gap:.3g} (relative) from the sequence gradient; "
               "KL-to-go is exact") if ok else f"partial gap {gap:.2g}")


@claim(
    "klgrad_d10_token_level_partial_gradient",
    location="[TM] second pitfall; abstract ('a partial gradient at best'); Notion summary "
    "(the KL-to-go form)",
    text="Summing per-token KL terms (per-token estimators or per-token analytic KLs) and "
    "differentiating ignores how the distribution at token t changes the later tokens' "
    "distributions: only part of the gradient of the sequence-level KL. The correct gradient is "
    "E[sum_t grad log pi(y_t|y_<t) sum_{s >= t} log(pi(y_s|y_<s)/pi_ref(y_s|y_<s))].",
    check="Token MDP (V = 2, T = 3, prefix-dependent conditionals): the per-token sum's gradient "
    "by three routes (k2 as loss and k1 on its own token, exact; finite differences of the "
    "per-state KLs with the state law frozen; the softmax per-state gradients) against the "
    "sequence gradient; the KL-to-go weighting (k1 summed to go) against it; the bandit as the "
    "one-token control (no gap).",
    kind="derivation",
)
def _d10(ctx: CheckContext) -> Outcome:
    return partial_gradient_outcome(ctx)


def low_kl_outcome(ctx: CheckContext, *, names: Sequence[str] = ("k3_loss", "k2_loss", "k1_loss"),
                   beta: float = 0.2) -> Outcome:
    """Along logits ref + t (theta - ref), t -> 0: each incorrect option's error against grad
    RKL (relative for k3/k2, absolute for k1); then where the exact expected flows of
    J - beta KL end (bandit) against the Gibbs tilt."""
    from sims.kl_dynamics import expected_flow, gibbs_tilt, option_gradient

    w = token_mdp()
    ev: dict[str, Any] = {}
    ts = (1.0, 0.5, 0.25, 0.125)
    errs: dict[str, list[float]] = {n: [] for n in names}
    for t in ts:
        wt = w.with_logits(w.ref_logits + t * (w.logits - w.ref_logits))
        target = wt.targets()["reverse_sequence"]
        for n in names:
            g = option_gradient(wt, option(n))
            e = float(np.linalg.norm(g - target))
            errs[n].append(e / float(np.linalg.norm(target)) if n != "k1_loss" else e)
            ev[f"{n}_t{t:g}_{'rel_' if n != 'k1_loss' else 'abs_'}error_vs_grad_reverse_kl"] = \
                errs[n][-1]
    shrink = all(all(b < a for a, b in zip(v, v[1:], strict=False)) for v in errs.values())
    b = bandit()
    steps = 200 if ctx.quick else 600
    tilt = gibbs_tilt(b, beta)
    ends = {}
    for n in ("k1_reward", *names):
        f = expected_flow(b, option(n), beta=beta, lr=5.0, steps=steps)
        ends[n] = float(np.abs(f["probs"] - tilt).max())
        ev[f"bandit_flow_{n}_final_max_abs_diff_to_gibbs_tilt"] = ends[n]
        ev[f"bandit_flow_{n}_final_reverse_kl"] = float(f["reverse_kl"][-1])
    ev["bandit_gibbs_tilt_reverse_kl"] = float(tilt @ (np.log(tilt) - b.ref_logp[:, 0]))
    off = [n for n in names if ends[n] > 10 * ends["k1_reward"] + 1e-6]
    ok = shrink and bool(off)
    return Outcome(
        verdict_from(ok, computed=ends["k1_reward"] < 1e-4), ev,
        correction=None if ok else "the incorrect options' errors do not shrink toward "
        "pi_ref, or they reach the same optimum as the correct gradient",
        short=(f"k3 loss error {errs['k3_loss'][0]:.3g} -> {errs['k3_loss'][-1]:.3g} toward "
               f"pi_ref; flows end {max(ends[n] for n in off):.3g} from the tilt") if ok
        else "no low-KL agreement / high-KL difference")


@claim(
    "klgrad_d11_incorrect_look_fine_at_low_kl",
    location="[TM] introduction/discussion (via the chatpaper summary)",
    text="Incorrect implementations may appear to work, especially when the KL is small, but do "
    "not enforce the intended regularisation in expectation; in high-KL settings they can behave "
    "sub-optimally or diverge.",
    check="Token MDP (V = 2, T = 3) on the path logits ref + t (theta - ref), t = 1 .. 1/8: the "
    "error of k3 and k2 as per-token losses relative to grad KL(pi || pi_ref) and the absolute "
    "error of k1 as a loss (its gradient is 0); bandit, beta = 0.2: exact expected flows of "
    "J - beta KL (200 steps, lr 5; 600 full) with each option, against the Gibbs tilt "
    "pi_ref exp(r / beta) / Z that the correct gradient (k1 in the reward) reaches.",
    kind="interpretation",
)
def _d11(ctx: CheckContext) -> Outcome:
    return low_kl_outcome(ctx)


def code_bases_outcome(ctx: CheckContext) -> Outcome:
    """What the implementations named by [TM] deliver, in grpo_theory's terms, where the
    implementation is known from the formula alone: k3 per token in the loss (GRPO's
    pseudocode, Shao et al. 2024)."""
    t = token_mdp()
    c = classify(t, option("k3_loss"))
    words = {"forward_token": "the per-token forward-KL gradient",
             "reverse_token": "the per-token reverse-KL gradient"}.get(c.label, c.label)
    ev = {"k3_per_token_loss_token_mdp": c.label, "k3_per_token_loss_cos_reverse": c.cos_reverse,
          "k3_per_token_loss_rel_error_reverse": c.rel_error_reverse}
    return Outcome("inconclusive", ev,
                   correction="the 2025 commits of TRL and Open Instruct were not read, and the "
                   "code has changed since (`grpo-audit frameworks --framework trl` audits the "
                   "release in hand). GRPO's published objective puts k3 per token in the loss, "
                   f"which gives {words} (cos {c.cos_reverse:.3f} with grad "
                   "KL(pi || pi_ref)) in the token MDP; reading the named commits would decide "
                   "the rest",
                   short=f"2025 code not read; k3 per token in the loss gives {words}")


@claim(
    "klgrad_d18_code_bases",
    location="[TM] introduction (via the chatpaper summary)",
    text="The pitfalls appear in TRL, Open Instruct and in GRPO pseudocode (Shao et al. 2024; "
    "Guo et al. 2025).",
    check="Not checkable as mathematics: the code bases at the 2025 commits were not read. "
    "Evidence: what k3 per token in the loss (GRPO's objective) gives in the token MDP.",
    kind="reference",
)
def _d18(ctx: CheckContext) -> Outcome:
    return code_bases_outcome(ctx)
