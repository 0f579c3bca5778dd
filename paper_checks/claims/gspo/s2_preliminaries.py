"""GSPO Sec. 2: notation (D1), PPO as written (D2), GRPO (D3)."""

from __future__ import annotations

from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import formulas as F

SECTION = "2. Preliminaries: notation, PPO and GRPO as written"


def factorisation_outcome(ctx: CheckContext) -> Outcome:
    """Every sequence of a token MDP: the product of the token probabilities is a law
    (sums to 1) and equals sims' sequence law."""
    from grpo_theory.kl import tabular_token_log_probs
    from sims.token_mdp import TokenMDP

    m = TokenMDP.random(ctx.rng(2701), vocab=F.V, length=F.T)
    prod = np.exp(tabular_token_log_probs(m.logits, vocab=F.V, length=F.T).sum(1))
    ev = {"sum_over_sequences": float(prod.sum()),
          "max_abs_diff_to_sims_sequence_law": float(np.abs(prod - m.seq_probs()).max()),
          "rewards_in_0_1": bool(np.all((m.seq_means >= 0) & (m.seq_means <= 1)))}
    ev["abs_sum_minus_1"] = abs(ev["sum_over_sequences"] - 1)
    ok = (abs(ev["sum_over_sequences"] - 1) < 1e-12
          and ev["max_abs_diff_to_sims_sequence_law"] < 1e-12)
    return Outcome(verdict_from(ok), ev, correction=None if ok else "the product of token "
                   "probabilities is not the sequence law",
                   short=(f"sum = 1 to {ev['abs_sum_minus_1']:.1e}; equals sims' "
                          "law") if ok else f"sums to {ev['sum_over_sequences']:.6g}")


@claim(
    "gspo_d1_factorisation",
    location="Sec. 2, 'Notation'",
    text="pi_theta(y|x) = prod_t pi_theta(y_t | x, y_<t); the verifier's reward r(x, y) is in "
    "[0, 1].",
    check="A tabular token MDP (V = 2, T = 4): the product of the token probabilities over every "
    "sequence sums to 1 and equals sims.token_mdp's sequence law; its rewards lie in [0, 1] "
    "(a definition).",
    kind="derivation",
)
def _d1(ctx: CheckContext) -> Outcome:
    return factorisation_outcome(ctx)


def ppo_length_weights_outcome(ctx: CheckContext, *, lengths: tuple[int, ...] = (4, 2, 3, 1)
                               ) -> Outcome:
    """Per-response gradient weights at ratio 1 of Eq. (1) (1/|y| per response: grpo_theory's
    sequence_mean) against PPO's average over time steps (token_mean) and its sum (token_sum),
    for unequal and equal lengths."""
    from grpo_theory.aggregation import aggregation_weights

    ev: dict[str, Any] = {}
    prop = {}
    for lab, L in (("unequal", np.array([lengths])), ("equal", np.full((1, len(lengths)), 3))):
        eq1 = aggregation_weights(L, mode="sequence_mean")[0]
        for ppo in ("token_mean", "token_sum"):
            r = eq1 / aggregation_weights(L, mode=ppo)[0]  # type: ignore[arg-type]
            ev[f"{lab}_lengths_eq1_over_{ppo}_weight_ratios"] = r.tolist()
            prop[(lab, ppo)] = bool(np.ptp(r) < 1e-12 * r.max())
    ok = prop[("equal", "token_mean")] and not prop[("unequal", "token_mean")]
    spread = ev["unequal_lengths_eq1_over_token_mean_weight_ratios"]
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=("Eq. (1) is PPO's clipped surrogate averaged per response: with responses of "
                    f"lengths {list(lengths)} its per-token weights are "
                    f"{np.round(spread, 3).tolist()} "
                    "times those of PPO's average over time steps (a response's tokens weigh "
                    "1/|y|); the two agree up to a constant only when all lengths are equal"),
        correction=None if ok else "the 1/|y| average changes nothing here",
        short="PPO only up to per-response length weights 1/|y|")


@claim(
    "gspo_d2_ppo_objective",
    location="Sec. 2, Eq. (1)",
    text="J_PPO(theta) = E_{x, y ~ pi_old}[(1/|y|) sum_t min(w_t A_t, clip(w_t, 1 - eps, 1 + eps) "
    "A_t)] with A_t from a value model: the objective carries a 1/|y| token average.",
    check="At ratio 1, the per-token gradient weights of Eq. (1) (grpo_theory.aggregation "
    "'sequence_mean') against PPO's average over time steps ('token_mean') and its sum "
    "('token_sum'), for lengths (4, 2, 3, 1) and for equal lengths.",
    kind="derivation",
)
def _d2(ctx: CheckContext) -> Outcome:
    return ppo_length_weights_outcome(ctx)


def grpo_gradient_outcome(ctx: CheckContext, *, mode: str = "sequence_mean") -> Outcome:
    """Finite differences of Eq. (2) at theta = theta_old against sum_i w_i A_i psi_i with the
    weights of grpo_theory.aggregation ``mode``."""
    from grpo_theory.aggregation import effective_weights

    g, _ = F.group()
    x = g.old_logits
    fd = F.fd_gradient(lambda th: F.j_grpo(g, th), x)
    w = effective_weights(g.advantages[None, :], g.lengths[None, :], mode=mode)[0]  # type: ignore[arg-type]
    lib = w @ g.scores(x).sum(1)
    e = F.rel(fd, lib)
    ok = e < 1e-6
    return Outcome(verdict_from(ok), {"rel_error_fd_vs_aggregation_weights": e},
                   correction=None if ok else f"Eq. (2)'s gradient is not grpo_theory's '{mode}' "
                   f"(relative error {e:.3g})",
                   short=f"Eq. (2)'s gradient = '{mode}' weights to {e:.1e}" if ok
                   else f"differs ({e:.2g})")


@claim(
    "gspo_d3_grpo_objective",
    location="Sec. 2, Eqs. (2)-(3)",
    text="J_GRPO(theta) = E[(1/G) sum_i (1/|y_i|) sum_t min(w_it A_i, clip(w_it, 1 - eps, 1 + "
    "eps) A_i)] with A_i = (r_i - mean) / std shared by every token of y_i.",
    check="A group of 4 responses of lengths 4, 2, 3, 1 in a token MDP (V = 2, T = 4): central "
    "finite differences of Eq. (2) at theta = theta_old against sum_i w_i A_i psi_i with "
    "grpo_theory.aggregation's 'sequence_mean' weights 1/(G |y_i|).",
    kind="derivation",
)
def _d3(ctx: CheckContext) -> Outcome:
    return grpo_gradient_outcome(ctx)
