"""[CE] Shah et al., arXiv 2512.21852 (abstract and summaries; Sec. 3 quoted by emergentmind):
the on-policy classification (D13), off-policy (D14, and its open problem), the score-function
/ pathwise decomposition (D15), the training runs (D16)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from .worlds import TOL, bandit, classify, option, rel, stale_logits, token_mdp

SECTION = "[CE] Shah et al., arXiv 2512.21852: a comedy of estimators"


def on_policy_classification_outcome(ctx: CheckContext, *, k1_in_reward: str = "k1_reward_sum",
                                     biased: Sequence[str] = ("k1_loss", "k3_reward_sum")
                                     ) -> Outcome:
    """Token MDP, token-level estimators: K1 in reward (summed over the response; to go; on its
    own token), K1 in loss, K3 in reward, K3 in loss, classified against the exact targets."""
    t = token_mdp()
    ev: dict[str, Any] = {}
    for n in (k1_in_reward, "k1_reward_to_go", "k1_reward", *biased, "k3_loss"):
        c = classify(t, option(n))
        ev[f"{n}_is"] = c.label
        ev[f"{n}_rel_error_vs_grad_reverse_kl"] = c.rel_error_reverse
    unbiased_ok = ev[f"{k1_in_reward}_rel_error_vs_grad_reverse_kl"] < TOL
    biased_ok = all(ev[f"{n}_rel_error_vs_grad_reverse_kl"] > 1e-3 for n in biased)
    own = ev["k1_reward_rel_error_vs_grad_reverse_kl"]
    ok = unbiased_ok and biased_ok
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=(f"K1 in the reward is unbiased for the sequence-level reverse KL only when the "
                    f"per-token k1 enter the reward summed over the response or to go; on its own "
                    f"token only it gives the per-token (partial) gradient, {own:.3g} (relative) "
                    "from grad KL(pi || pi_ref). [CE]'s exact definitions were not seen"),
        correction=None if ok else "the classification differs: "
        + ", ".join(f"{n} is {ev[f'{n}_is']}" for n in (k1_in_reward, *biased)),
        short=(f"needs k1 summed over the response; own-token k1 is partial ({own:.2g})" if ok
               else "classification differs"))


@claim(
    "klgrad_d13_on_policy_classification",
    location="[CE] Sec. 3, 'Inspecting KL estimators'; findings (via emergentmind)",
    text="On-policy, 'K1 in reward' gives an unbiased gradient of the sequence-level reverse KL; "
    "'K1 in loss' and 'K3 in reward' give biased gradients (estimators applied per token and "
    "summed over the sequence).",
    check="Token MDP (V = 2, T = 3): exact expected gradients of k1 in the reward (summed over "
    "the response, summed to go, on its own token), k1 in the loss, k3 in the reward (summed) "
    "and k3 in the loss (not classified by the text reached), classified against grad "
    "KL(pi || pi_ref), grad KL(pi_ref || pi) and their per-token forms.",
    kind="derivation",
)
def _d13(ctx: CheckContext) -> Outcome:
    return on_policy_classification_outcome(ctx)


def _old_state_partial(world: Any, old_logits: np.ndarray) -> np.ndarray:
    """sum_s d_old(s) grad KL(pi_s || ref_s): the per-token reverse-KL gradient under pi_old's
    state law (softmax per-state gradients)."""
    from grpo_theory import kl

    V, T = world.vocab, world.length
    seqs, states = kl.tabular_sequences(V, T)
    P_old = np.exp(kl.tabular_token_log_probs(old_logits, vocab=V, length=T).sum(1))
    d = np.zeros(world.logits.shape[0])
    for t in range(T):
        d += np.bincount(states[:, t], weights=P_old, minlength=d.size)
    pol = np.exp(world.logits - world.logits.max(1, keepdims=True))
    pol /= pol.sum(1, keepdims=True)
    ref = np.exp(world.ref_logits - world.ref_logits.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    lr = np.log(pol / ref)
    return (d[:, None] * pol * (lr - (pol * lr).sum(1, keepdims=True))).reshape(-1)


def off_policy_outcome(ctx: CheckContext, *, configurations: Sequence[str] = (
        "k1_reward_sum", "k1_loss", "k3_reward_sum", "k3_loss")) -> Outcome:
    """Samples from pi_old: the four configurations (no weight) against grad KL(pi || pi_ref);
    the KL in the loss times a differentiable token ratio omega_t against the per-token
    reverse-KL gradient at pi's and at pi_old's state law."""
    from sims.kl_dynamics import option_gradient

    ev: dict[str, Any] = {}
    biased = True
    for wname, w in (("bandit", bandit()), ("token_mdp", token_mdp())):
        old = stale_logits(w)
        t = w.targets()
        for n in configurations:
            e = rel(option_gradient(w, option(n), old_logits=old), t["reverse_sequence"])
            ev[f"{wname}_{n}_rel_error_vs_grad_reverse_kl"] = e
            biased = biased and e > 1e-3
        for est in ("k1", "k3"):
            g = option_gradient(w, option(f"{est}_loss", placement="loss_ratio_weighted"),
                                old_logits=old)
            ev[f"{wname}_{est}_times_omega_rel_error_vs_per_token_rkl_at_pi"] = rel(
                g, t["reverse_token"])
            ev[f"{wname}_{est}_times_omega_rel_error_vs_per_token_rkl_at_pi_old_states"] = rel(
                g, _old_state_partial(w, old))
    omega_old = max(ev[f"{w}_{e}_times_omega_rel_error_vs_per_token_rkl_at_pi_old_states"]
                    for w in ("bandit", "token_mdp") for e in ("k1", "k3"))
    omega_pi = ev["token_mdp_k3_times_omega_rel_error_vs_per_token_rkl_at_pi"]
    ok = biased and omega_old < TOL
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=("the token-ratio-weighted KL loss is unbiased for the per-token reverse-KL "
                    "gradient with the prefixes drawn from pi_old (exact here); against the "
                    f"per-token gradient at pi's own prefix law it is {omega_pi:.3g} (relative) "
                    "off, and it is never the sequence-level gradient; one token (bandit): exact"),
        correction=None if ok else "a configuration is unbiased off-policy, or the token ratio "
        "does not give the per-token gradient",
        short=(f"omega_t: unbiased per token under pi_old's prefixes only ({omega_pi:.2g} off at "
               "pi's)" if ok else "off-policy classification differs"))


@claim(
    "klgrad_d14_off_policy_none_unbiased",
    location="[CE] Sec. 3, 'Inspecting KL estimators' (quoted by emergentmind)",
    text="Off-policy (samples from a delayed pi_theta_old), none of the four configurations "
    "(K1/K3, in reward/in loss) gives an unbiased sequence-level reverse-KL gradient; "
    "multiplying the KL estimate in the loss by a token-level importance ratio omega_t gives an "
    "unbiased estimate of the token-level reverse-KL gradient (attributed to Zhang et al. 2025).",
    check="Bandit and token MDP, pi_old = pi moved by a seeded perturbation: exact expected "
    "gradients of the four configurations with samples from pi_old against grad KL(pi || "
    "pi_ref); k1 and k3 in the loss times a differentiable omega_t (TRL's "
    "use_bias_correction_kl) against sum_s d(s) grad KL(pi_s || ref_s) with d the prefix law of "
    "pi and of pi_old.",
    kind="derivation",
)
def _d14(ctx: CheckContext) -> Outcome:
    return off_policy_outcome(ctx)


def sequence_is_outcome(ctx: CheckContext) -> Outcome:
    """The plain sequence-level importance-weighted k1 in the reward, off-policy: its bias
    (exact) and the trace of its covariance against the on-policy one."""
    from sims.kl_dynamics import option_gradient

    ev: dict[str, Any] = {}
    for wname, w in (("bandit", bandit()), ("token_mdp", token_mdp())):
        old = stale_logits(w)
        t = w.targets()["reverse_sequence"]
        opt = option("seq_k1_reward", importance="sequence")
        ev[f"{wname}_rel_error_vs_grad_reverse_kl"] = rel(option_gradient(w, opt, old_logits=old),
                                                          t)
        from grpo_theory import kl

        lo = w.logp - kl.tabular_token_log_probs(old, vocab=w.vocab, length=w.length)
        per_old = np.einsum("nt,ntd->nd", opt.coefficients(w.log_ratio, lo), w.scores)
        q_old = np.exp((w.logp - lo).sum(1))
        per_on = np.einsum("nt,ntd->nd", option("seq_k1_reward").coefficients(w.log_ratio),
                           w.scores)
        tr = [float(q @ ((x - q @ x) ** 2).sum(1)) for q, x in ((q_old, per_old),
                                                                 (w.probs, per_on))]
        ev[f"{wname}_trace_cov_sequence_is"], ev[f"{wname}_trace_cov_on_policy"] = tr
    e = max(ev["bandit_rel_error_vs_grad_reverse_kl"], ev["token_mdp_rel_error_vs_grad_reverse_kl"])
    return Outcome(
        "inconclusive", ev,
        correction=("the sequence-level importance weight pi(y)/pi_old(y) on k1 in the reward is "
                    f"unbiased off-policy (relative error {e:.1e} here; variance "
                    f"{ev['token_mdp_trace_cov_sequence_is']:.3g} against "
                    f"{ev['token_mdp_trace_cov_on_policy']:.3g} on-policy in the token MDP); "
                    "whether [CE]'s open problem asks for more (a token-level form, bounded "
                    "variance) is not in the text reached, and would decide it"),
        short=(f"the sequence-IS k1 reward is unbiased (error {e:.1e}); what [CE] requires is "
               "unknown"))


@claim(
    "klgrad_d14_sequence_level_open_problem",
    location="[CE] Sec. 3 (quoted by emergentmind, open-problem page)",
    text="An unbiased sequence-level reverse-KL gradient estimator for off-policy training is "
    "left as future work.",
    check="Bandit and token MDP with samples from pi_old: k1 in the reward (sequence level) "
    "times the detached sequence ratio pi(y)/pi_old(y), exact expected gradient against grad "
    "KL(pi || pi_ref), and the trace of its covariance against the on-policy estimator's. "
    "Inconclusive: the problem's requirements were not reached.",
    kind="interpretation",
)
def _d14_open(ctx: CheckContext) -> Outcome:
    return sequence_is_outcome(ctx)


def decomposition_outcome(ctx: CheckContext) -> Outcome:
    """For k1 and k3 (sequence level): score term E[k psi] + pathwise term E[grad k] against
    grad E[k] = grad KL(pi || pi_ref) (finite differences); 'in reward' = score term, 'in loss' =
    pathwise term."""
    from sims.kl_dynamics import finite_difference_targets, option_gradient

    ev: dict[str, Any] = {}
    worst = 0.0
    for wname, w in (("bandit", bandit()), ("token_mdp", token_mdp())):
        fd = finite_difference_targets(w)["reverse_sequence"]
        for est in ("k1", "k3"):
            score = option_gradient(w, option(f"seq_{est}_loss", placement="reward"))
            path = option_gradient(w, option(f"seq_{est}_loss"))
            e = rel(score + path, fd)
            ev[f"{wname}_{est}_score_plus_pathwise_rel_error_vs_fd_grad_reverse_kl"] = e
            ev[f"{wname}_{est}_score_term_rel_error_vs_grad_reverse_kl"] = rel(score, fd)
            ev[f"{wname}_{est}_pathwise_term_norm"] = float(np.linalg.norm(path))
            worst = max(worst, e)
    return Outcome(
        "inconclusive", ev,
        correction=("our reading holds: the two terms sum to grad KL(pi || pi_ref) for k1 and k3 "
                    f"(relative error {worst:.1e} against finite differences), 'in reward' is the "
                    "score term and 'in loss' the pathwise term; [CE]'s Eq. (6) itself was not "
                    "seen (the attribution is low confidence), and reading it would decide"),
        short=f"our reading holds (error {worst:.1e}); Eq. (6) not seen")


@claim(
    "klgrad_d15_score_pathwise_decomposition",
    location="[CE] Eq. (6) (as a reviewer describes it on tomesphere; low confidence)",
    text="For an estimator k(y; theta), grad E_{pi_theta}[k] = E[k grad log pi_theta] (score "
    "function) + E[grad_theta k] (pathwise); 'in reward' implementations estimate only the "
    "first term and 'in loss' implementations only the second.",
    check="Bandit and token MDP, k1 and k3 at sequence level: the exact score and pathwise terms "
    "(k detached on the score; k differentiated) summed, against central finite differences of "
    "E[k] = KL(pi || pi_ref). Inconclusive: the equation was not seen.",
    kind="derivation",
)
def _d15(ctx: CheckContext) -> Outcome:
    return decomposition_outcome(ctx)


def ce_runs_outcome(ctx: CheckContext, *, beta: float = 0.2) -> Outcome:
    """Toy evidence only: the bandit's exact expected flows of J - beta KL with each
    configuration (where they end: J, KL(pi || pi_ref))."""
    from sims.kl_dynamics import expected_flow, gibbs_tilt

    b = bandit()
    steps = 200 if ctx.quick else 600
    ev: dict[str, Any] = {}
    tilt = gibbs_tilt(b, beta)
    for n in ("k1_reward_sum", "k1_loss", "k3_reward_sum", "k3_loss"):
        f = expected_flow(b, option(n), beta=beta, lr=5.0, steps=steps)
        ev[f"{n}_final_J"] = float(f["J"][-1])
        ev[f"{n}_final_reverse_kl"] = float(f["reverse_kl"][-1])
        ev[f"{n}_final_max_abs_diff_to_gibbs_tilt"] = float(np.abs(f["probs"] - tilt).max())
    return Outcome("inconclusive", ev,
                   correction="needs the LLM runs (Qwen2.5-7B, Llama-3.1-8B-Instruct); in the "
                   "bandit the biased configurations end away from the regularised optimum "
                   "(evidence), which says nothing about instability at scale",
                   short="LLM runs needed")


@claim(
    "klgrad_d16_empirical_instability",
    location="[CE] abstract and experiments (via the arXiv listing mirror and emergentmind)",
    text="RL fine-tuning of Qwen2.5-7B and Llama-3.1-8B-Instruct: on-policy, configurations with "
    "biased gradients can cause training instabilities (complete or partial collapse), unbiased "
    "ones give better in-domain and out-of-domain performance; off-policy, KL regularisation "
    "helps stabilise training.",
    check="Not checkable here (LLM training). Toy evidence: the bandit's exact expected flows of "
    "J - 0.2 KL with K1/K3 in reward/in loss (200 steps, lr 5; 600 full), against the Gibbs tilt.",
    kind="empirical",
)
def _d16(ctx: CheckContext) -> Outcome:
    return ce_runs_outcome(ctx)
