"""Dr. GRPO (arXiv 2503.20783) App. A: the policy gradient with a baseline (Eqs. 4-5), the
group-mean baseline (Eq. 6) and the RLOO remark ("Unbiasedness of A~").

Exact tier: every response of the token MDP enumerated with its token scores and states
(:class:`sims.length_worlds.AnswerLengthMDP`), exact expected updates of group estimators
(:mod:`grpo_theory.length_bias`) in the three worlds of :mod:`.worlds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from .worlds import GROUP_SIZES, TOL, answer_mdp, proportionality, question_mix, response_bandit

SECTION = "Dr. GRPO App. A: the policy gradient with a group baseline"


def baseline_outcome(ctx: CheckContext, *,
                     baselines: Mapping[str, np.ndarray] | None = None) -> Outcome:
    """``E[sum_t grad log pi(o_t | s_t) (R - B_t)]`` by enumeration, for baselines given per
    (response, token) ``[n_out, T]``; default: functions of the state only."""
    m = answer_mdp(ctx)
    scores, states = m.token_structure
    P, mu = m.probs(), m.means
    st = np.maximum(states, 0)
    tables = dict(baselines) if baselines is not None else {
        "zero": np.zeros(states.shape), "state_value": m.state_values()[st],
        "random_function_of_state": ctx.rng(2541).standard_normal(m.n_states)[st]}
    gJ = m.grad_J()
    ev: dict[str, Any] = {"J": m.J()}
    worst = 0.0
    for name, B in tables.items():
        coef = (mu[:, None] - B) * (states >= 0)  # [n_out, T]
        g = np.einsum("o,ot,otd->d", P, coef, scores)
        err = float(np.max(np.abs(g - gJ)))
        ev[f"max_abs_error_E_grad_vs_grad_J_{name}"] = err
        worst = max(worst, err)
    # the identity behind it: sum_a pi(a|s) grad log pi(a|s) = 0 at every state
    ev["max_abs_expected_score_per_state"] = _expected_score_per_state(m)
    zero = ev["max_abs_expected_score_per_state"]
    ok = worst < TOL
    return Outcome(verdict_from(ok, computed=zero < TOL), ev,
                   correction=None if ok else "a baseline changed the expected gradient: it "
                   "depends on the current token",
                   short=None if ok else "baseline biased the gradient")


def _expected_score_per_state(m: Any) -> float:
    """``max_s |sum_a pi(a | s) grad log pi(a | s)|`` over the decision states, by enumeration
    of the token taken at each state (weights: probability of reaching the state)."""
    scores, states = m.token_structure
    P = m.probs()
    worst = 0.0
    for s in range(m.n_states):
        hit = states == s
        if not hit.any():
            continue
        o, t = np.nonzero(hit)
        # each response visits s at most once; the first token after s decides the branch
        reach = P[o].sum()
        if reach == 0:
            continue
        worst = max(worst, float(np.max(np.abs((P[o][:, None] * scores[o, t]).sum(0) / reach))))
    return worst


@claim(
    "drgrpo_eq5_baseline_no_bias", kind="derivation",
    location="App. A, Eqs. (4)-(5) and the display after Eq. (5)",
    text="grad J = E[sum_t grad log pi(o_t | q, o_<t) (sum_{t' >= t} r_t' - B(q, o_<t))] for any "
    "baseline B that does not depend on o_t, because E_{o_t}[grad log pi(o_t | .) B] = "
    "B grad sum_{o_t} pi = 0; for an outcome reward the reward-to-go is R(q, o).",
    check="Token MDP (answer token, answer-dependent stop), every response enumerated with its "
    "per-token scores: E[sum_t score_t (R - B(s_t))] vs the exact grad J for B = 0, B = V(s_t) "
    "(exact) and a random function of the state; and the identity sum_a pi(a|s) grad log "
    "pi(a|s) = 0 at every state (probability-weighted over the responses through it).",
)
def _eq5(ctx: CheckContext) -> Outcome:
    return baseline_outcome(ctx)


def _group_worlds(ctx: CheckContext) -> dict[str, Any]:
    return {"response_bandit": response_bandit(), "answer_mdp": answer_mdp(ctx),
            "question_mix": question_mix(ctx)}


def eq6_equality_outcome(ctx: CheckContext, *, estimator: str = "dr_grpo") -> Outcome:
    """``E[(1/G) sum_i A_i psi_i]`` with ``estimator`` (default: the group-mean baseline) vs
    ``grad J``: the display of Eq. (6) as an equality."""
    from grpo_theory.question_weights import group_mean_factor
    from sims.length_dynamics import LossSpec, expected_update, true_gradient

    spec = LossSpec(estimator, "sequence_sum")
    ev: dict[str, Any] = {}
    equal, prop = True, True
    for name, w in _group_worlds(ctx).items():
        for G in GROUP_SIZES:
            c, rel = proportionality(expected_update(w, spec, G=G), true_gradient(w))
            ev[f"{name}_G{G}_scale"] = c
            ev[f"{name}_G{G}_relative_residual"] = rel
            equal = equal and abs(c - 1.0) < TOL and rel < TOL
            prop = prop and rel < TOL
    for G in GROUP_SIZES:
        ev[f"group_mean_factor_G{G}"] = group_mean_factor(G)
    ok = equal
    scales = ", ".join(f"{ev[f'answer_mdp_G{G}_scale']:.4f} at G = {G}" for G in GROUP_SIZES)
    return Outcome(
        verdict_from(ok, computed=prop), ev,
        correction=None if ok else f"the right-hand side of Eq. (6) is ((G-1)/G) grad J, not "
        f"grad J ({scales}): the group mean contains R(q, o_i), so the baseline of response i "
        "depends on o_i, against the condition of Eq. (5). Equality holds with the leave-one-out "
        "mean (RLOO), i.e. with the factor G/(G-1) that App. A's next paragraph introduces. The "
        "seed paper's Eq. (15) makes the same step (eq15_grpo_gradient_is_unbiased_reinforce).",
        short=None if ok else "= ((G-1)/G) grad J, not grad J (the mean includes R_i)",
        finding=None if ok else (
            "E[(1/G) sum_i (R_i - mean) psi_i] = c grad J with c = "
            + ", ".join(f"{ev[f'answer_mdp_G{G}_scale']:.3f}" for G in GROUP_SIZES)
            + f" at G = {', '.join(str(G) for G in GROUP_SIZES)}, i.e. (G-1)/G: the group mean "
            "contains R_i; the leave-one-out mean gives equality"))


@claim(
    "drgrpo_eq6_group_mean_baseline", kind="derivation",
    location="App. A, Eq. (6)",
    text="Taking B = mean({R(q, o_1..G)}) in Eq. (5) gives grad J = E[(1/G) sum_i sum_t "
    "grad log pi(o_it | q, o_i,<t) (R(q, o_i) - mean(R))] (the std struck out).",
    check="Exact E[(1/G) sum_i (R_i - mean(R)) psi_i] (registered dr_grpo estimator, the plain "
    "token sum) vs the exact grad J in a softmax over 4 responses, the token MDP and a mix of 3 "
    "questions, G = 2, 4, 8: least-squares scale and relative residual.",
    variants=("dr_grpo",),
)
def _eq6(ctx: CheckContext) -> Outcome:
    return eq6_equality_outcome(ctx)


def eq6_conclusion_outcome(ctx: CheckContext, *, plain: str = "dr_grpo",
                           with_std: str = "grpo_std", length_mode: str = "sequence_mean"
                           ) -> Outcome:
    """Does ``E[g]`` stay a multiple of ``grad J`` without std and 1/|o|, and leave it with
    either (std: across questions; 1/|o|: across lengths)?"""
    from sims.length_dynamics import LossSpec, expected_update, true_gradient

    q, m = question_mix(ctx), answer_mdp(ctx)
    std_opts = {"ddof": 1, "eps": 1e-8} if with_std == "grpo_std" else {}
    cases = {
        "plain_question_mix": (q, LossSpec(plain, "sequence_sum")),
        "plain_answer_mdp": (m, LossSpec(plain, "sequence_sum")),
        "std_question_mix": (q, LossSpec(with_std, "sequence_sum", std_opts)),
        "std_single_question": (m, LossSpec(with_std, "sequence_sum", std_opts)),
        "length_answer_mdp": (m, LossSpec(plain, length_mode)),
    }
    ev: dict[str, Any] = {}
    for name, (w, spec) in cases.items():
        for G in (4, 8):
            ev[f"{name}_G{G}_relative_residual_off_grad_J"] = proportionality(
                expected_update(w, spec, G=G), true_gradient(w))[1]
    res = {k: v for k, v in ev.items()}
    plain_ok = all(v < TOL for k, v in res.items() if k.startswith("plain"))
    std_breaks = all(v > 1e-3 for k, v in res.items() if k.startswith("std_question"))
    len_breaks = all(v > 1e-3 for k, v in res.items() if k.startswith("length"))
    ok = plain_ok and std_breaks and len_breaks
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "std or 1/|o| kept the expected update along "
                   "grad J, or the plain estimator did not",
                   short=None if ok else "std / 1/|o| do not bias the update here")


@claim(
    "drgrpo_eq6_no_std_no_length", kind="derivation",
    location="App. A, the sentence after Eq. (6)",
    text="Applying the PPO surrogate to this estimator, neither std(R) nor 1/|o_i| should "
    "appear: without them the update follows the policy gradient, with either of them it "
    "does not.",
    check="Relative residual of the exact E[g] off grad J (G = 4, 8): mean-centred advantages "
    "with a plain token sum (mix of 3 questions; token MDP) vs std-normalised advantages "
    "(Bessel + 1e-8) in the question mix and in a single question, and the 1/|o_i| "
    "normaliser in the token MDP.",
    variants=("dr_grpo", "grpo_std"),
)
def _eq6_concl(ctx: CheckContext) -> Outcome:
    return eq6_conclusion_outcome(ctx)


def rloo_outcome(ctx: CheckContext, *, factor: Any = None) -> Outcome:
    """``factor(G) * A~ == A^RLOO`` (default ``G/(G-1)``); RLOO exactly unbiased; the same
    sampled-step dynamics with the learning rate rescaled."""
    from grpo_theory import compute_advantages
    from sims.length_dynamics import LossSpec, expected_update, sampled_gradients, true_gradient

    fac = factor or (lambda G: G / (G - 1))
    rng = ctx.rng(2542)
    ident = 0.0
    for G in range(2, 9):
        R = np.concatenate([(rng.random((50, G)) < 0.5).astype(float), rng.random((50, G))])
        ident = max(ident, float(np.max(np.abs(
            fac(G) * np.asarray(compute_advantages("dr_grpo", R))
            - np.asarray(compute_advantages("rloo", R))))))
    ev: dict[str, Any] = {"max_abs_error_scaled_dr_grpo_vs_rloo": ident}
    unb = 0.0
    for w in _group_worlds(ctx).values():
        for G in GROUP_SIZES:
            g = expected_update(w, LossSpec("rloo", "sequence_sum"), G=G)
            unb = max(unb, float(np.max(np.abs(g - true_gradient(w)))))
    ev["max_abs_error_E_rloo_update_vs_grad_J"] = unb
    # same sampled groups: lr * factor * g_dr equals lr * g_rloo group by group
    m = answer_mdp(ctx)
    g_dr = sampled_gradients(m, LossSpec("dr_grpo", "sequence_sum"), G=4, n_groups=200,
                             rng=ctx.rng(2543))
    g_rl = sampled_gradients(m, LossSpec("rloo", "sequence_sum"), G=4, n_groups=200,
                             rng=ctx.rng(2543))
    ev["max_abs_error_sampled_steps_rescaled_lr"] = float(np.max(np.abs(fac(4) * g_dr - g_rl)))
    ok = max(ev.values()) < TOL
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "(G/(G-1)) A~ is not the RLOO advantage, or RLOO "
                   "is not unbiased",
                   short=None if ok else "the RLOO identity fails")


@claim(
    "drgrpo_appa_rloo_scale", kind="derivation",
    location="App. A, paragraph \"Unbiasedness of A~\"",
    text="(G/(G-1)) A~_i = R(q, o_i) - (1/(G-1)) sum_{j != i} R(q, o_j), the RLOO advantage "
    "(an unbiased estimator); the factor G/(G-1) can be absorbed into the learning rate "
    "without changing the RL dynamics.",
    check="The registered dr_grpo and rloo estimators on 100 random groups per G = 2..8 (binary "
    "and continuous); exact E[(1/G) sum_i A^RLOO_i psi_i] = grad J in the three worlds "
    "(G = 2, 4, 8); and on 200 sampled groups of the token MDP the Dr. GRPO step with learning "
    "rate x G/(G-1) equals the RLOO step group by group (so SGD dynamics coincide exactly; "
    "Adam is invariant to a constant gradient scale up to its epsilon).",
    variants=("dr_grpo", "rloo"),
)
def _rloo(ctx: CheckContext) -> Outcome:
    return rloo_outcome(ctx)
