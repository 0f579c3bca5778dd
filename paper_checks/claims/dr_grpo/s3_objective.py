"""Dr. GRPO (arXiv 2503.20783) Sec. 3: the RL objective (Eq. 1), PPO (Eq. 2), GRPO (Eq. 3).

Definitions are checked by computing with them: the exact gradient of Eq. (1) against finite
differences of ``J(theta)``; Eq. (2) and Eq. (3) as written (the clipped surrogate of
:func:`grpo_theory.surrogate.clipped_surrogate`, differentiated by finite differences at
``theta = theta_old``) against the policy gradient and against the library's (estimator, loss
aggregation) pair. Worlds: :mod:`.worlds`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from .worlds import (
    answer_mdp,
    finite_difference,
    proportionality,
    question_mix,
    response_bandit,
    surrogate_gradient,
)

SECTION = "Dr. GRPO Sec. 3: the objective, PPO and GRPO"
FD_TOL = 1e-7  # central differences, h = 1e-6


def eq1_gradient_outcome(ctx: CheckContext, *,
                         gradient: Callable[[Any], np.ndarray] | None = None) -> Outcome:
    """Exact ``grad J`` (``gradient``, default :func:`sims.length_dynamics.true_gradient`) vs
    central differences of ``J(theta)`` in the three worlds."""
    from sims.length_dynamics import true_gradient

    grad = gradient or true_gradient
    ev: dict[str, Any] = {}
    for name, w in (("response_bandit", response_bandit()), ("answer_mdp", answer_mdp(ctx)),
                    ("question_mix", question_mix(ctx))):
        fd = finite_difference(lambda th, w=w: w.with_theta(th).J(), w.theta)
        ev[f"{name}_J"] = w.J()
        ev[f"{name}_max_abs_error_grad_J_vs_finite_differences"] = float(
            np.max(np.abs(grad(w) - fd)))
    ok = max(v for k, v in ev.items() if k.endswith("differences")) < FD_TOL
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "the gradient used as ground truth is not grad J",
                   short=None if ok else "ground-truth gradient wrong")


@claim(
    "drgrpo_eq1_objective_gradient", kind="derivation",
    location="Sec. 3, Eq. (1) (beta = 0 from there on)",
    text="The RL objective is J(pi) = E_q E_{o~pi(.|q)} R(q, o) - beta KL(pi || pi_ref), with "
    "beta = 0 throughout, so the target is J(pi) = E_q E_o R(q, o): the ground truth whose exact "
    "gradient every other check compares with.",
    check="sims.length_worlds (a softmax over 4 whole responses, a token MDP with an answer token "
    "and answer-dependent stop logits) and sims.question_mix (3 questions): the exact "
    "grad J = sum_o P(o) mu_o psi_o vs central differences of J(theta) (h = 1e-6, tolerance "
    "1e-7).",
)
def _eq1(ctx: CheckContext) -> Outcome:
    return eq1_gradient_outcome(ctx)


def _reference_probs(world: Any, ctx: CheckContext) -> dict[str, np.ndarray]:
    """Reference policies over whole responses: uniform over responses, uniform over tokens
    (each decision uniform), a seeded random one."""
    n = len(world.lengths)
    token_uniform = world.with_theta(np.zeros(world.theta.size)).probs()
    rnd = world.with_theta(ctx.rng(2511).standard_normal(world.theta.size)).probs()
    return {"uniform_over_responses": np.full(n, 1.0 / n), "uniform_over_tokens": token_uniform,
            "random": rnd}


def eq1_kl_entropy_outcome(ctx: CheckContext, *,
                           references: Mapping[str, np.ndarray] | None = None) -> Outcome:
    """``grad (-KL(pi || pi_ref) - H(pi)) = grad E_pi[log pi_ref]`` by finite differences: zero
    iff the KL term is an entropy bonus up to a constant."""
    w = answer_mdp(ctx)
    refs = dict(references) if references is not None else _reference_probs(w, ctx)

    def neg_kl_minus_entropy(th: np.ndarray, ref: np.ndarray) -> float:
        p = w.with_theta(th).probs()
        kl = float(p @ (np.log(p) - np.log(ref)))
        h = -float(p @ np.log(p))
        return -kl - h

    ev: dict[str, Any] = {}
    for name, ref in refs.items():
        g = finite_difference(lambda th, ref=ref: neg_kl_minus_entropy(th, ref), w.theta)
        ev[f"norm_grad_of_minus_KL_minus_entropy_{name}"] = float(np.linalg.norm(g))
    zero = {k: v < FD_TOL for k, v in ev.items()}
    if all(zero.values()):
        verdict = verdict_from(True)
    else:
        uniform_ok = zero.get("norm_grad_of_minus_KL_minus_entropy_uniform_over_responses", False)
        verdict = verdict_from(uniform_ok, agrees="holds-with-conditions")
    cond = ("the KL term is an entropy bonus (up to a constant) only when pi_ref is uniform over "
            "whole responses; a reference uniform over tokens adds a length term "
            "(-KL = H(pi) - E_pi[log(1/pi_ref)], and log(1/pi_ref(o)) grows with the number of "
            "tokens chosen), and a general pi_ref is not an entropy bonus. Immaterial to the "
            "paper's results: beta = 0 throughout.")
    return Outcome(verdict, ev,
                   conditions=cond if verdict == "holds-with-conditions" else None,
                   short=("entropy bonus only for pi_ref uniform over whole responses; beta = 0 "
                          "anyway") if verdict == "holds-with-conditions" else None,
                   correction=None if verdict != "refuted" else
                   "even a reference uniform over responses does not give an entropy bonus")


@claim(
    "drgrpo_eq1_kl_is_entropy_regularisation", kind="reference",
    location="Sec. 3, Eq. (1) and the sentence introducing it",
    text="The objective of Eq. (1) is called entropy-regularised although it writes a KL term "
    "to a reference policy.",
    check="Token MDP with answer-dependent lengths: central-difference gradient of "
    "-KL(pi || pi_ref) - H(pi) = E_pi[log pi_ref] (the part of the KL term that is not an "
    "entropy bonus) for three references: uniform over whole responses, uniform over tokens "
    "(every decision uniform), a seeded random policy. Zero gradient = an entropy bonus up to "
    "a constant.",
)
def _eq1_kl(ctx: CheckContext) -> Outcome:
    return eq1_kl_entropy_outcome(ctx)


def eq2_ppo_outcome(ctx: CheckContext, *, baselines: Mapping[str, np.ndarray] | None = None,
                    per_response_mean: bool = False) -> Outcome:
    """Expected PPO surrogate (Eq. 2, one response, ``A_t = R - b(s_t)``) differentiated by
    finite differences at ``theta_old`` vs ``grad J``; ``per_response_mean`` plants a ``1/|o|``."""
    from grpo_theory.surrogate import clipped_surrogate

    w = answer_mdp(ctx)
    old, mask = w.token_probs()
    P_old = w.probs()
    states = w.token_structure[1]
    bl = dict(baselines) if baselines is not None else {
        "zero": np.zeros(w.n_states), "state_value": w.state_values(),
        "random": ctx.rng(2512).standard_normal(w.n_states)}
    weight = P_old / w.lengths if per_response_mean else P_old
    ev: dict[str, Any] = {"J": w.J()}
    errs = []
    for name, b in bl.items():
        adv = (w.means[:, None] - b[np.maximum(states, 0)]) * weight[:, None]

        def objective(th: np.ndarray, adv: np.ndarray = adv) -> float:
            new = w.with_theta(th).token_probs()[0]
            return clipped_surrogate(new / old, adv, mask, clip_eps=0.2, mode="token_sum")

        g = finite_difference(objective, w.theta)
        errs.append(float(np.max(np.abs(g - w.grad_J()))))
        ev[f"max_abs_error_E_grad_eq2_vs_grad_J_baseline_{name}"] = errs[-1]
        ev[f"relative_residual_off_grad_J_baseline_{name}"] = proportionality(g, w.grad_J())[1]
    ok = max(errs) < FD_TOL
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "E[grad of Eq. 2] at theta_old is not grad J",
                   short=None if ok else "Eq. 2's expected gradient is not grad J")


@claim(
    "drgrpo_eq2_ppo_unbiased", kind="derivation",
    location="Sec. 3, Eq. (2) and footnote 3 (\"PPO is unbiased by formulation\")",
    text="PPO's surrogate sums the clipped token terms over the response with no 1/|o| factor, "
    "so (with A_t = reward-to-go minus a baseline of the state) it is unbiased: at "
    "theta = theta_old its expected gradient is the policy gradient.",
    check="Token MDP (answer token, answer-dependent stop, outcome reward): the expectation over "
    "o ~ pi_old of Eq. (2) as written (clip eps 0.2, rho = pi_theta/pi_old per token), "
    "differentiated by central differences at theta_old, vs the exact grad J, for the baselines "
    "b = 0, b = V(s_t) (exact) and a random b(s_t).",
)
def _eq2(ctx: CheckContext) -> Outcome:
    return eq2_ppo_outcome(ctx)


def eq3_grpo_outcome(ctx: CheckContext, *, mode: str = "sequence_mean",
                     estimator: str = "grpo_std",
                     options: Mapping[str, Any] | None = None) -> Outcome:
    """Eq. (3) as written, differentiated per sampled group, vs ``(1/G) sum_i A_i/|o_i| psi_i``
    with ``A = (R - mean)/std`` (the definition's gradient; ``mode``/``estimator`` are what the
    library is asked to compute, perturbable)."""
    from grpo_theory import compute_advantages

    opts = dict(options) if options is not None else {"ddof": 1, "eps": 1e-8}
    w = answer_mdp(ctx)
    rng = ctx.rng(2513)
    idx, rew = w.sample(4, 4, rng)
    _, _, psi = w.outcome_model()
    L = w.lengths[idx]
    ev: dict[str, Any] = {}
    err = 0.0
    for g_i in range(idx.shape[0]):
        r = rew[g_i]
        c = r - r.mean()
        sd = r.std(ddof=1)
        paper_A = np.zeros_like(r) if sd == 0 else c / (sd + 1e-8)
        A = np.asarray(compute_advantages(estimator, r[None, :], **opts))[0]
        fd = surrogate_gradient(w, idx[g_i], A, mode=mode,
                                max_tokens=w.max_length if mode == "dr_grpo" else None)
        paper = (paper_A / L[g_i]) @ psi[idx[g_i]] / len(r)
        err = max(err, float(np.max(np.abs(fd - paper))))
        ev[f"group{g_i}_rewards"] = r.tolist()
        ev[f"group{g_i}_lengths"] = L[g_i].tolist()
    ev["max_abs_error_grad_eq3_vs_sum_A_over_G_len_psi"] = err
    ok = err < FD_TOL
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "the library's GRPO loss is not Eq. (3)",
                   short=None if ok else "library loss differs from Eq. 3")


@claim(
    "drgrpo_eq3_grpo_objective", kind="derivation",
    location="Sec. 3 (before 3.1) and Sec. 3.1, Eq. (3)",
    text="GRPO gives every token of o_i the advantage (R_i - mean(R))/std(R) and maximises "
    "(1/G) sum_i (1/|o_i|) sum_t min(rho_it A_i, clip(rho_it, 1-eps, 1+eps) A_i) (beta = 0).",
    check="Token MDP, 4 seeded groups of G = 4: Eq. (3) as written (clipped surrogate, "
    "std with the authors' convention, Bessel + 1e-8) differentiated by central differences at "
    "theta_old vs (1/G) sum_i A_i / |o_i| psi_i; the advantages and weights come from the "
    "library (grpo_std, aggregation 'sequence_mean'), so this is also the check that the "
    "library's GRPO loss is Eq. (3).",
    variants=("grpo_std",),
)
def _eq3(ctx: CheckContext) -> Outcome:
    return eq3_grpo_outcome(ctx)
