"""Dr. GRPO (arXiv 2503.20783) Sec. 3.1: GRPO's response-level length bias and question-level
difficulty bias (Fig. 5), and the length-normalised losses of open-source PPO (Listing 1,
Table 2).

Exact tier: expected on-policy gradients of every (estimator, aggregation) pair by
:func:`grpo_theory.length_bias.expected_aggregated_gradient` (cross-checked by enumerating every
joint group), exact expected-step dynamics (:func:`sims.length_dynamics.flow`), the per-question
weight :func:`grpo_theory.question_weights.question_weight` (cross-checked by the exact sympy
moments). Statistical tier: sampled groups, ``|estimate - exact| <= 4 SE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from paper_checks.plotting import plot_merged
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from .worlds import (
    GROUP_SIZES,
    TOL,
    answer_mdp,
    mc_projection_check,
    proportionality,
    question_mix,
    response_bandit,
)

SECTION = "Dr. GRPO Sec. 3.1: GRPO's length and difficulty biases"


def _authors_std() -> dict[str, Any]:
    """The authors' std convention (one source: :data:`sims.length_dynamics.AUTHORS_STD`)."""
    from sims.length_dynamics import AUTHORS_STD

    return dict(AUTHORS_STD)


def _binary_groups(G: int) -> np.ndarray:
    return ((np.arange(2**G)[:, None] >> np.arange(G)) & 1).astype(np.float64)


def fig5_effective_advantage_outcome(ctx: CheckContext, *, mode: str = "sequence_mean",
                                     options: Mapping[str, Any] | None = None) -> Outcome:
    """Library weights ``G w_i A_i`` (grpo_std, aggregation ``mode``) vs the paper's
    ``A~_i / (std(R) |o_i|)`` (numpy std, Bessel + 1e-8) on every binary group and random
    continuous rewards with random lengths."""
    from grpo_theory import compute_advantages, effective_weights

    opts = dict(options) if options is not None else _authors_std()
    rng = ctx.rng(2521)
    worst = 0.0
    n = 0
    for G in range(2, 9):
        for R in (_binary_groups(G), rng.random((20, G))):
            L = rng.integers(1, 50, size=R.shape).astype(float)
            A = np.asarray(compute_advantages("grpo_std", R, **opts))
            lib = effective_weights(A, L, mode=mode) * R.shape[0] * G  # undo the 1/(P G)
            c = R - R.mean(1, keepdims=True)
            sd = R.std(1, ddof=1, keepdims=True)
            paper = np.where(sd > 0, c / (sd + 1e-8), 0.0) / L
            worst = max(worst, float(np.max(np.abs(lib - paper))))
            n += R.shape[0]
    ok = worst < 1e-9
    return Outcome(verdict_from(ok), {"groups_checked": n,
                                      "max_abs_error_effective_advantage": worst},
                   correction=None if ok else "GRPO's per-token weight is not A~/(std |o|)",
                   short=None if ok else "effective advantage differs")


@claim(
    "drgrpo_fig5_effective_advantage", kind="derivation",
    location="Sec. 3.1, Fig. 5 caption",
    text="GRPO's effective per-token advantage is A~_i / (std(R) |o_i|) with A~_i = R_i - "
    "mean(R) the unbiased (Dr. GRPO) advantage: GRPO reweights by 1/std(R) per question and "
    "by 1/|o_i| per response.",
    check="Every binary group of G = 2..8 and 20 random continuous groups per G, random lengths "
    "1..49: G times the library's effective weight w_i A_i (grpo_std with the authors' std, "
    "Bessel + 1e-8; aggregation 'sequence_mean') vs (R_i - mean)/(std + 1e-8)/|o_i| computed "
    "directly (0 for a constant group).",
    variants=("grpo_std",),
)
def _fig5(ctx: CheckContext) -> Outcome:
    return fig5_effective_advantage_outcome(ctx)


# --- response-level length bias: the softmax over whole responses -------------------------------
def _bandit_gaps(world: Any, loss: Any, G: int) -> tuple[float, float]:
    """``(d/dt logit gap long - short among incorrect, among correct)`` along ``E[g]``."""
    from sims.length_dynamics import expected_update, true_gradient

    g = true_gradient(world) if loss is None else expected_update(world, loss, G=G)
    return float(g[3] - g[2]), float(g[1] - g[0])


def length_bias_bandit_outcome(ctx: CheckContext, *,
                               biased: Sequence[str] = ("grpo", "grpo_ddof0"),
                               unbiased: Sequence[str] = ("dr_grpo",)) -> Outcome:
    """Sign of the drift of P(long | incorrect) and P(long | correct) under the ``biased``
    losses, and ties under the ``unbiased`` ones and the exact gradient."""
    from grpo_theory.length_bias import brute_force_aggregated_gradient
    from paper_checks.claim_support import mc_evidence
    from sims.length_dynamics import LOSSES, expected_update, flow

    b = response_bandit()
    ev: dict[str, Any] = {"J": b.J(), "lengths_short_long": [4, 12]}
    favours, ties = True, True
    for G in GROUP_SIZES:
        for loss in biased:
            inc, cor = _bandit_gaps(b, loss, G)
            ev[f"{loss}_G{G}_dlogit_long_minus_short_incorrect"] = inc
            ev[f"{loss}_G{G}_dlogit_long_minus_short_correct"] = cor
            favours = favours and inc > TOL and cor < -TOL
        for loss in (*unbiased, None):
            inc, cor = _bandit_gaps(b, loss, G)
            lab = loss or "policy_gradient"
            ev[f"{lab}_G{G}_max_abs_dlogit_gap"] = max(abs(inc), abs(cor))
            ties = ties and max(abs(inc), abs(cor)) < TOL
    p, mu, psi = b.outcome_model()
    bf = 0.0
    for loss in ("grpo", "dr_grpo"):
        s = LOSSES[loss]
        ref = brute_force_aggregated_gradient(
            s.estimator, probs=p, means=mu, lengths=b.lengths, psi=psi, G=4, mode=s.mode,
            max_tokens=s.max_tokens(b), estimator_options=dict(s.options))
        bf = max(bf, float(np.max(np.abs(ref - expected_update(b, loss, G=4)))))
    ev["max_abs_error_exact_vs_enumerated_groups_G4"] = bf
    n = 4000 if ctx.quick else 40_000
    mc = [mc_projection_check(b, "grpo", G=4, direction=np.array([0, 0, -1.0, 1.0]),
                              name="grpo G4 dlogit gap incorrect", n_groups=n, rng=ctx.rng(2522))]
    mc_ev, mc_ok = mc_evidence(mc, "mc_")
    ev.update(mc_ev)
    steps = 60 if ctx.quick else 200
    paths = {lab: flow(b, loss, G=4, lr=2.0, steps=steps)
             for lab, loss in (("grpo", "grpo"), ("dr_grpo", "dr_grpo"), ("pg", None))}
    for lab, f in paths.items():
        ev[f"flow_{lab}_final_mean_length_incorrect"] = float(f["mean_length_incorrect"][-1])
        ev[f"flow_{lab}_final_mean_length_correct"] = float(f["mean_length_correct"][-1])
    ok = favours and ties

    def plot(ax: Any) -> None:
        series = [(f"{lab}: {what}", "-" if what == "incorrect" else "--", f[f"mean_length_{what}"])
                  for lab, f in paths.items() for what in ("incorrect", "correct")]
        plot_merged(ax, series)
        ax.set_xlabel("exact expected step (lr 2, G = 4)")
        ax.set_ylabel("E[length | correctness]")
        ax.legend(fontsize=7)

    return Outcome(
        verdict_from(ok, computed=bf < TOL and mc_ok), ev,
        correction=None if ok else "in this world GRPO does not favour long incorrect / short "
        "correct responses, or Dr. GRPO does not keep the pairs tied",
        short=None if ok else "no length bias of the stated sign", plot=plot,
        plot_title="Softmax over 4 responses: mean length by correctness under exact steps")


@claim(
    "drgrpo_sec3_1_length_bias_response_level", kind="derivation",
    location="Sec. 3.1, first bullet (\"Response-level length bias\"); abstract; Fig. 1 caption",
    text="The 1/|o_i| factor makes the per-token weight |A_i|/|o_i|: among correct responses "
    "(A > 0) shorter ones get larger updates, so the policy prefers brevity; among incorrect "
    "ones (A < 0) longer ones are penalised less, so the policy comes to prefer longer incorrect "
    "responses. Dr. GRPO (no 1/|o_i|) has no such preference.",
    check="Softmax over 4 whole responses {short 4, long 12} x {correct, incorrect}, equal "
    "logits within each correctness class: exact E[g] (every (estimator, aggregation) pair of "
    "grpo_theory.length_bias, G = 2, 4, 8) for GRPO (grpo_std Bessel + 1e-8 and population std, "
    "per-response mean), Dr. GRPO (sum / MAX_TOKENS) and the exact grad J: the drift of the "
    "logit gap long - short inside each class (> 0 among incorrect, < 0 among correct for GRPO; "
    "0 for Dr. GRPO and grad J). Cross-checks: every joint group enumerated (G = 4); 4000 "
    "sampled groups (40000 full), k = 4 SE; exact expected-step paths of the mean lengths.",
    variants=("grpo_std", "dr_grpo"),
)
def _len_bandit(ctx: CheckContext) -> Outcome:
    return length_bias_bandit_outcome(ctx)


# --- the token MDP: stop probability depends on the answer token ---------------------------------
def _stop_block(world: Any) -> slice:
    return slice(world.K, world.theta.size)


def _plot_length_paths(paths: dict[str, np.ndarray], answer_means: np.ndarray, ax: Any) -> None:
    """E[length | answer] along the exact expected steps, per loss and answer."""
    plot_merged(ax, [(f"{lab}: answer {a} ({'correct' if answer_means[a] else 'wrong'})",
                      "-" if answer_means[a] else ":", per[:, a])
                     for lab, per in paths.items() for a in range(len(answer_means))])
    ax.set_xlabel("exact expected step (lr 2, G = 4)")
    ax.set_ylabel("E[length | answer]")
    ax.legend(fontsize=6)


def length_bias_token_mdp_outcome(ctx: CheckContext, *, biased: str = "grpo",
                                  unbiased: Sequence[str] = ("dr_grpo",)) -> Outcome:
    """Exact expected-step paths of the per-answer mean lengths; the shared-stop control; the
    closed form of the stop-logit gradient; a Monte Carlo projection."""
    from grpo_theory.bernoulli import exact_advantage_moments
    from paper_checks.claim_support import mc_evidence
    from sims.length_dynamics import LOSSES, expected_update, flow

    from .worlds import finite_difference

    m = answer_mdp(ctx)
    steps = 60 if ctx.quick else 150
    ev: dict[str, Any] = {"J0": m.J(), "answer_means": m.answer_means.tolist(),
                          "mean_length_given_answer_0": m.mean_length_given_answer().tolist()}
    paths: dict[str, np.ndarray] = {}
    for lab, loss in ((biased, biased), *((u, u) for u in unbiased), ("pg", None)):
        f = flow(m, loss, G=4, lr=2.0, steps=steps)
        per = np.array([m.with_theta(th).mean_length_given_answer() for th in f["theta"]])
        paths[lab] = per
        ev[f"{lab}_final_J"] = float(f["J"][-1])
        ev[f"{lab}_final_mean_length_given_answer"] = per[-1].tolist()
        ev[f"{lab}_final_mean_length_incorrect"] = float(f["mean_length_incorrect"][-1])
        ev[f"{lab}_max_abs_change_mean_length_given_answer"] = float(
            np.max(np.abs(per - per[0])))
    inc, cor = m.answer_means == 0, m.answer_means == 1
    d = np.diff(paths[biased], axis=0)
    grows = bool(np.all(d[:, inc] > 0) and np.all(d[:, cor] < 0))
    ev[f"{biased}_incorrect_lengths_rise_and_correct_fall_every_step"] = grows
    flat = all(ev[f"{u}_max_abs_change_mean_length_given_answer"] < 1e-9
               for u in (*unbiased, "pg"))
    # negative control: one row of stop logits for every answer -> no coupling, no drift
    shared = answer_mdp(ctx, shared_stop=True)
    g_sh = expected_update(shared, biased, G=4)[_stop_block(shared)]
    ev["shared_stop_control_max_abs_stop_gradient"] = float(np.max(np.abs(g_sh)))
    # closed form (aggregations whose weight depends on the own length only): stop block of
    # answer a = G pi(a) E[A_1 | r_1 = r_a] grad E[w(L) | a]  (GRPO: w = 1/(G L))
    from grpo_theory.length_bias import rollout_weight

    s = LOSSES[biased] if isinstance(biased, str) else biased
    mom = exact_advantage_moments(s.estimator, R=4, p=m.J(), **dict(s.options))
    cond = {1.0: float(mom["cond_mean_success"]), 0.0: float(mom["cond_mean_failure"])}
    pi_old = m.answer_probs
    w_of_n = np.array([rollout_weight(n + 2, 3 * (n + 2), G=4, mode=s.mode,
                                      max_tokens=s.max_tokens(m)) for n in range(m.N + 1)])

    def weighted(th: np.ndarray) -> float:  # G sum_a pi_old(a) E[A_1 | r_a] E_theta[w(L) | a]
        w = m.with_theta(th)
        cond_len = w.probs().reshape(w.K, -1) / w.answer_probs[:, None]  # P(n | a)
        return 4.0 * float(sum(pi_old[a] * cond[w.answer_means[a]] * (cond_len[a] @ w_of_n)
                               for a in range(w.K)))

    own_length_only = s.mode in ("sequence_mean", "sequence_sum", "dr_grpo", "token_sum")
    closed = finite_difference(weighted, m.theta)[_stop_block(m)]
    exact = expected_update(m, biased, G=4)[_stop_block(m)]
    ev["max_abs_error_stop_gradient_vs_closed_form"] = (
        float(np.max(np.abs(closed - exact))) if own_length_only else 0.0)
    u = np.zeros(m.theta.size)
    u[_stop_block(m)] = exact / max(float(np.linalg.norm(exact)), 1e-300)
    if not np.any(u):
        u[_stop_block(m)] = 1.0 / np.sqrt(m.theta.size - m.K)
    mc, mc_ok = mc_evidence([mc_projection_check(
        m, biased, G=4, direction=u, name=f"{biased} G4 stop-logit gradient",
        n_groups=4000 if ctx.quick else 40_000, rng=ctx.rng(2523))], "mc_")
    ev.update(mc)
    computed = ev["max_abs_error_stop_gradient_vs_closed_form"] < 1e-7 and mc_ok
    ok = grows and flat and ev["shared_stop_control_max_abs_stop_gradient"] < TOL
    return Outcome(
        verdict_from(ok, computed=computed), ev,
        correction=None if ok else "in the token MDP GRPO's expected steps do not lengthen "
        "incorrect and shorten correct responses (or the unbiased losses move lengths)",
        short=None if ok else "no length drift of the stated sign in the token MDP",
        plot=partial(_plot_length_paths, paths, m.answer_means),
        plot_title="Token MDP (stop depends on the answer): E[length | answer]")


@claim(
    "drgrpo_sec3_1_length_bias_token_mdp", kind="derivation",
    location="Sec. 3.1, first bullet; abstract (\"progressively longer incorrect responses\")",
    text="Under GRPO's objective the policy drifts towards longer incorrect and shorter correct "
    "responses; the unbiased objective does not move response lengths that the reward does "
    "not depend on.",
    check="Token MDP: answer token (1 correct of 3), then up to 5 fillers, eos with probability "
    "sigmoid(z[answer, position]) (the stop probability depends on the earlier answer token). "
    "Exact expected steps (lr 2, G = 4, 60 steps quick / 150 full) of GRPO (std Bessel + 1e-8, "
    "per-response mean), Dr. GRPO and grad J: E[length | answer] rises for every incorrect "
    "answer and falls for the correct one at every GRPO step, and stays fixed (1e-9) under "
    "Dr. GRPO and grad J. Control: with one row of stop logits for all answers GRPO's expected "
    "stop-logit gradient is 0 (no coupling, no bias). Cross-checks: the stop-logit gradient "
    "equals the closed form pi(a) E[A_1 | r_1 = r_a] grad E[1/L | a] (exact sympy moments, "
    "finite differences); 4000 sampled groups (40000 full), k = 4 SE.",
    variants=("grpo_std", "dr_grpo"),
)
def _len_mdp(ctx: CheckContext) -> Outcome:
    return length_bias_token_mdp_outcome(ctx)


# --- question-level difficulty bias ---------------------------------------------------------------
def difficulty_per_group_outcome(ctx: CheckContext, *, estimator: str = "grpo_std",
                                 options: Mapping[str, Any] | None = None) -> Outcome:
    """``A_GRPO / A~`` per group is ``1/(std + eps)`` (group scope) and one number for a whole
    batch (batch scope)."""
    from grpo_theory import compute_advantages, estimator_spec

    opts = dict(options) if options is not None else _authors_std()
    rng = ctx.rng(2524)
    worst = 0.0
    spread_batch = 0.0
    mult: dict[int, list[float]] = {}
    for G in range(2, 9):
        for R in (_binary_groups(G), rng.random((20, G))):
            A = np.asarray(compute_advantages(estimator, R, **opts))
            Ad = np.asarray(compute_advantages("dr_grpo", R))
            sd = R.std(1, ddof=1, keepdims=True)
            want = np.where(sd > 0, Ad / (sd + 1e-8), 0.0)
            worst = max(worst, float(np.max(np.abs(A - want))))
            if "std_scope" in estimator_spec(estimator).options:
                Ab = np.asarray(compute_advantages(estimator, R, **opts, std_scope="batch"))
                nz = np.abs(Ad) > 1e-12
                spread_batch = max(spread_batch, float(np.ptp(Ab[nz] / Ad[nz])))
        k = np.arange(1, G)
        mult[G] = (1.0 / np.sqrt(k * (G - k) / G / (G - 1))).tolist()
    ev: dict[str, Any] = {"max_abs_error_A_grpo_vs_A_dr_over_std": worst,
                          "max_spread_of_batch_scope_multiplier_within_a_batch": spread_batch}
    for G in (4, 8):
        ev[f"multiplier_1_over_std_by_k_successes_G{G}"] = mult[G]
    ok = worst < 1e-9 and spread_batch < 1e-9
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "the per-question multiplier is not 1/std(R)",
                   short=None if ok else "multiplier is not 1/std")


@claim(
    "drgrpo_sec3_1_difficulty_bias_per_group", kind="derivation",
    location="Sec. 3.1, second bullet (\"Question-level difficulty bias\"); Fig. 5 caption",
    text="Dividing the centred reward by the question's std(R) multiplies that question's "
    "advantages by 1/std(R), unlike ordinary advantage normalisation, which uses one "
    "batch-wide scale for every question.",
    check="Every binary group of G = 2..8 and random continuous groups: grpo_std (Bessel + "
    "1e-8) equals dr_grpo / (std + 1e-8) group by group; with std_scope='batch' the ratio to "
    "dr_grpo is one number for the whole batch. Evidence: 1/std by number of successes k.",
    variants=("grpo_std", "dr_grpo"),
)
def _diff_group(ctx: CheckContext) -> Outcome:
    return difficulty_per_group_outcome(ctx)


def _question_mix_evidence(ctx: CheckContext, estimator: str, options: dict[str, Any],
                           ev: dict[str, Any]) -> bool:
    """The question mix: ``E[g]`` of ``estimator`` with a constant normaliser (difficulty only)
    against ``sum_q c(p_q) grad p_q``, and a Monte Carlo projection (written into ``ev``);
    True when the Monte Carlo agrees."""
    from grpo_theory.question_weights import question_weight
    from paper_checks.claim_support import mc_evidence
    from sims.length_dynamics import LossSpec, expected_update, true_gradient

    q = question_mix(ctx)
    spec = LossSpec(estimator, "dr_grpo", options)
    g = expected_update(q, spec, G=8)
    c_q = question_weight(estimator, G=8, p=q.success_rates(), **options)
    pred = np.concatenate([c_q[i] / q.max_length * q.weights[i] * w.grad_J()
                           for i, w in enumerate(q.worlds)])
    ev["question_mix_solve_rates"] = q.success_rates().tolist()
    ev["question_mix_weights_c_p"] = c_q.tolist()
    ev["question_mix_max_abs_error_E_g_vs_sum_c_p_grad_p"] = float(np.max(np.abs(g - pred)))
    ev["question_mix_relative_residual_E_g_off_grad_J"] = proportionality(
        g, true_gradient(q))[1]
    mc, mc_ok = mc_evidence([mc_projection_check(
        q, spec, G=8, direction=g / np.linalg.norm(g), name="std-normalised G8 question mix",
        n_groups=3000 if ctx.quick else 30_000, rng=ctx.rng(2525))], "mc_")
    ev.update(mc)
    return mc_ok


def _plot_question_weight(estimator: str, options: dict[str, Any], ax: Any) -> None:
    """The expected per-question weight relative to Dr. GRPO against p, for a few G."""
    from grpo_theory.question_weights import (
        group_mean_factor,
        population_std_question_weight,
        question_weight,
    )

    pp = np.linspace(0.01, 0.99, 197)
    for G in (2, 4, 8, 16):
        ax.plot(pp, question_weight(estimator, G=G, p=pp, **options) / group_mean_factor(G),
                label=f"G = {G}")
    ax.plot(pp, population_std_question_weight(pp), "k:",
            label="G -> inf (diverges at p -> 0, 1; cut at 8)")
    ax.set_ylim(0, 8)
    ax.set_xlabel("question success probability p")
    ax.set_ylabel("weight relative to Dr. GRPO")
    ax.legend(fontsize=7)


def difficulty_weight_outcome(ctx: CheckContext, *, estimator: str = "grpo_std",
                              options: Sequence[Mapping[str, Any]] = ({"ddof": 1, "eps": 1e-8},
                                                                      {"ddof": 0, "eps": 0.0}),
                              group_sizes: Sequence[int] = tuple(range(2, 17))) -> Outcome:
    """Shape of ``c(p) / c_Dr`` in ``p`` for each ``G``: symmetric, decreasing on (0, 1/2] for
    ``G >= 3``, flat at ``G = 2``, bounded at finite ``G``; the question mix's ``E[g]``."""
    from grpo_theory.bernoulli import exact_advantage_moments
    from grpo_theory.question_weights import (
        group_mean_factor,
        population_std_question_weight,
        question_weight,
    )

    ps = np.linspace(0.005, 0.5, 100)
    ev: dict[str, Any] = {}
    u_shaped, flat_at = [], []
    for opts in options:
        tag = f"ddof{opts.get('ddof', 1)}"
        for G in group_sizes:
            rel = question_weight(estimator, G=G, p=ps, **opts) / group_mean_factor(G)
            sym = float(np.max(np.abs(rel - question_weight(estimator, G=G, p=1 - ps, **opts)
                                      / group_mean_factor(G))))
            dec = bool(np.all(np.diff(rel) < 0))
            if float(np.ptp(rel)) < 1e-12:
                flat_at.append(G)
            elif dec and sym < 1e-9:
                u_shaped.append(G)
            if G in (2, 4, 8, 16):
                ev[f"{tag}_G{G}_relative_weight_p_to_0"] = float(rel[0])
                ev[f"{tag}_G{G}_relative_weight_p_half"] = float(rel[-1])
                ev[f"{tag}_G{G}_max_over_min"] = float(rel[0] / rel[-1])
    ev["G_with_decreasing_symmetric_weight"] = sorted(set(u_shaped))
    ev["G_with_flat_weight"] = sorted(set(flat_at))
    ev["population_limit_weight_at_p_0.005_over_p_half"] = float(
        population_std_question_weight(0.005) / population_std_question_weight(0.5))
    # second route: exact sympy moments at a few p
    route = 0.0
    for G in (3, 8):
        for p in (0.1, 0.37):
            mom = exact_advantage_moments(estimator, R=G, p=p, **dict(options[0]))
            route = max(route, abs(float(mom["cond_mean_success"] - mom["cond_mean_failure"])
                                   - float(question_weight(estimator, G=G, p=p,
                                                           **dict(options[0])))))
    ev["max_abs_error_weight_vs_exact_moments"] = route
    mc_ok = _question_mix_evidence(ctx, estimator, dict(options[0]), ev)
    computed = route < 1e-9 and ev["question_mix_max_abs_error_E_g_vs_sum_c_p_grad_p"] < TOL \
        and mc_ok
    all_u = set(u_shaped) == set(group_sizes)
    some_u = bool(u_shaped)
    verdict = verdict_from(some_u, computed=computed,
                           agrees="holds" if all_u else "holds-with-conditions")
    bound8 = ev.get("ddof1_G8_max_over_min", float("nan"))
    g_min = min(u_shaped) if u_shaped else None
    cond = (f"only for groups of G >= {g_min}: for G in {sorted(set(flat_at))} the expected "
            "weight c(p) is the same for every p (at G = 2 and 3 every non-constant group has "
            "the same std, so the larger 1/std of a lopsided group never occurs), and at finite G "
            f"the extra weight is bounded (near-0-or-1 over p = 1/2: {bound8:.3f} at G = 8, "
            f"{ev.get('ddof1_G16_max_over_min', float('nan')):.3f} at G = 16); it grows without "
            "bound only in the population limit 1/sqrt(p(1-p)). The paper gives no numbers.")
    plot = partial(_plot_question_weight, estimator, dict(options[0]))

    return Outcome(verdict, ev,
                   conditions=cond if verdict == "holds-with-conditions" else None,
                   short=f"needs G >= {g_min} (flat in p at G = 2, 3); bounded at finite G"
                   if verdict == "holds-with-conditions" else
                   ("no difficulty weighting" if verdict == "refuted" else None),
                   correction=None if verdict != "refuted" else
                   "the expected per-question weight does not favour easy/hard questions",
                   plot=plot, plot_title="Expected per-question weight of std-normalised GRPO")


@claim(
    "drgrpo_sec3_1_difficulty_bias_expected_weight", kind="derivation",
    location="Sec. 3.1, second bullet; Fig. 5 caption",
    text="Std normalisation gives more weight to questions whose rewards have a low std, i.e. "
    "too easy or too hard questions (success rate near 1 or 0): different questions get "
    "different weights in the objective.",
    check="Binary rewards, one question with success probability p: E[g] = c(p) grad p with "
    "c(p) = E[A_1 | r_1 = 1] - E[A_1 | r_1 = 0] (grpo_theory.question_weights; Dr. GRPO's is "
    "(G-1)/G). c(p) relative to Dr. GRPO on 100 p in (0, 1/2], G = 2..16, Bessel + 1e-8 and "
    "population std: symmetric about 1/2 and decreasing towards 1/2? Cross-checks: the exact "
    "sympy moments; in a mix of 3 token-MDP questions (p = 0.2, 0.5, 0.8) the exact E[g] of "
    "std-normalised GRPO (constant length normaliser) equals sum_q P(q) c(p_q) grad p_q and is "
    "not a multiple of grad J; 3000 sampled groups (30000 full), k = 4 SE.",
    variants=("grpo_std", "dr_grpo"),
)
def _diff_weight(ctx: CheckContext) -> Outcome:
    return difficulty_weight_outcome(ctx)


# --- Listing 1: length-normalised PPO losses ---------------------------------------------------
def listing1_outcome(ctx: CheckContext, *,
                     normalised: Sequence[str] = ("mean_seq_mean", "mean_token_mean"),
                     constant: Sequence[str] = ("dr_grpo", "dr_grpo_sum")) -> Outcome:
    """Relative residual of ``E[g]`` off ``grad J`` for length-normalised and constant
    aggregations (mean-centred advantages, so only the normaliser differs)."""
    from grpo_theory.length_bias import brute_force_aggregated_gradient
    from sims.length_dynamics import LOSSES, expected_update, true_gradient

    from .worlds import finite_difference

    m = answer_mdp(ctx)
    gJ = true_gradient(m)
    ev: dict[str, Any] = {}
    biased, unbiased = True, True
    for G in GROUP_SIZES:
        for loss in (*normalised, *constant):
            g = expected_update(m, loss, G=G)
            rel = proportionality(g, gJ)[1]
            ev[f"{loss}_G{G}_relative_residual_off_grad_J"] = rel
            if loss in normalised:
                biased = biased and rel > 1e-3
                # direction of the drift of E[L | incorrect] along E[g]
                dL = finite_difference(
                    lambda t, g=g: float(np.asarray(
                        m.with_theta(m.theta + t[0] * g).mean_length_given_answer())[1:].mean()),
                    np.zeros(1))[0]
                ev[f"{loss}_G{G}_d_mean_length_incorrect_answers_along_E_g"] = dL
            else:
                unbiased = unbiased and rel < TOL
    p, mu, psi = m.outcome_model()
    bf = 0.0
    for loss in (*normalised, *constant):
        s = LOSSES[loss]
        ref = brute_force_aggregated_gradient(
            s.estimator, probs=p, means=mu, lengths=m.lengths, psi=psi, G=2, mode=s.mode,
            max_tokens=s.max_tokens(m), estimator_options=dict(s.options))
        bf = max(bf, float(np.max(np.abs(ref - expected_update(m, loss, G=2)))))
    ev["max_abs_error_exact_vs_enumerated_groups_G2"] = bf
    ok = biased and unbiased
    return Outcome(verdict_from(ok, computed=bf < TOL), ev,
                   correction=None if ok else "a length-normalised aggregation gave an expected "
                   "gradient proportional to grad J (or a constant one did not)",
                   short=None if ok else "no length bias from the normaliser")


@claim(
    "drgrpo_listing1_length_normalised_losses", kind="derivation",
    location="Sec. 3.1, \"Length Bias Also Exists in Open-Source PPO Implementations\"; "
    "Listing 1",
    text="Normalising the loss by response length, per response (masked mean, then mean over "
    "responses) or per batch (one masked mean over all tokens), makes the expected update "
    "differ from the policy gradient once lengths vary; a constant normaliser (Dr. GRPO) "
    "removes the effect.",
    check="Token MDP with answer-dependent lengths, mean-centred advantages (dr_grpo) so that "
    "only the normaliser differs: relative residual of the exact E[g] off grad J for "
    "'sequence_mean' (1/(G |o_i|)) and 'token_mean' (1/sum_j |o_j|) vs 'dr_grpo' "
    "(1/(G MAX_TOKENS)) and 'sequence_sum' (1/G), G = 2, 4, 8; the derivative of the incorrect "
    "answers' mean length along E[g]; every joint group enumerated at G = 2.",
    variants=("dr_grpo",),
)
def _listing1(ctx: CheckContext) -> Outcome:
    return listing1_outcome(ctx)


@claim(
    "drgrpo_table2_repositories_length_bias", kind="empirical",
    location="Sec. 3.1, Table 2 and the paragraph before Listing 1",
    text="trl, OpenRLHF, verl, SimpleRL-Zero and Open-Reasoner-Zero (as of March 2025) normalise "
    "the loss by response length; the habit probably comes from pretraining, where tokens "
    "are packed into a fixed-length context.",
    check="Not decidable by computation: it is a statement about those repositories' code at "
    "the time. The mathematical part is drgrpo_listing1_length_normalised_losses. Evidence: the "
    "per-rollout weights (grpo_theory.aggregation) of the modes that the frameworks audit of "
    "this project documents as the current defaults (TRL 1.16.0, verl 0.9.1, OpenRLHF 0.11.2: "
    "token mean) and of GRPO's per-response mean, for a group with lengths 4 and 12.",
)
def _table2(ctx: CheckContext) -> Outcome:
    from grpo_theory import aggregation_weights
    from grpo_theory.conventions import CONVENTIONS

    L = np.array([[4.0, 12.0]])
    ev: dict[str, Any] = {}
    for mode in ("sequence_mean", "token_mean"):
        w = aggregation_weights(L, mode=mode)[0]
        ev[f"{mode}_per_token_weight_long_over_short"] = float(w[1] / w[0])
    # current defaults (grpo_theory.conventions, read from the released code): does the
    # normaliser depend on the lengths? (rollout 1's weight for lengths [4, 12], [4, 4], [12, 12])
    for c in CONVENTIONS:
        if c.is_default and c.aggregation in ("token_mean", "sequence_mean", "sequence_sum",
                                              "dr_grpo", "token_sum"):
            kw = {"max_tokens": 16} if c.aggregation == "dr_grpo" else {}
            w1 = {tuple(r): float(aggregation_weights(np.array([r], float), mode=c.aggregation,
                                                      **kw)[0, 0])
                  for r in ([4, 12], [4, 4], [12, 12])}
            ev[f"current_default_{c.framework}_{c.aggregation}_normaliser_depends_on_lengths"] = \
                len(set(w1.values())) > 1
    return Outcome(
        "inconclusive", ev,
        correction="decided by reading each repository's loss code at its March 2025 commit "
        "(and the pretraining origin by its authors' account); this project's frameworks audit "
        "(docs/frameworks_audit.md) reads the current versions only",
        short="needs the repositories' March 2025 code")
