"""Sec. 2 of arXiv 2607.00152: the binary-reward std (D1), the score identity with a baseline
(D2), Proposition 1 (D3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import formulas as F

SECTION = "2. Setup: binary rewards, baselines, Proposition 1"


def _binary(G: int) -> np.ndarray:
    return ((np.arange(2**G)[:, None] >> np.arange(G)) & 1).astype(float)


def binary_std_outcome(ctx: CheckContext, *, ddof: int = 0) -> Outcome:
    """Every reward vector of G = 2..12: the std (``ddof``) against sqrt(k(G-k))/G."""
    worst = 0.0
    bessel_ratio = []
    for G in range(2, 13):
        Y = _binary(G)
        k = Y.sum(1)
        worst = max(worst, float(np.abs(Y.std(1, ddof=ddof) - F.sigma_printed(k, G)).max()))
        mid = Y[(k > 0) & (k < G)]
        bessel_ratio.append(float((mid.std(1, ddof=1) / mid.std(1, ddof=0)).max()
                                  / np.sqrt(G / (G - 1))))
    ok = worst < 1e-12
    ev = {"max_abs_error_std_vs_sqrt_k_G_minus_k_over_G": worst, "ddof": ddof,
          "bessel_over_population_divided_by_sqrt_G_over_G_minus_1_max": max(bessel_ratio)}
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else f"with ddof = {ddof} the std differs from "
                   f"sqrt(k(G-k))/G by up to {worst:.3g} (Bessel: times sqrt(G/(G-1)))",
                   short=(f"sqrt(k(G-k))/G to {worst:.1e} (G <= 12); Bessel: times sqrt(G/(G-1))"
                          if ok else f"std off by {worst:.2g}"))


@claim(
    "stdid_d1_binary_std",
    location="Sec. 2, Eq. (2), paragraph 'Binary rewards'",
    text="With R_i in {0,1} and k successes, mu = k/G and the (population) std is sigma = "
    "sqrt(mu(1-mu)) = sqrt(k(G-k))/G exactly; sigma = 0 when k = 0 or G.",
    check="Every reward vector of G = 2..12: numpy's population std against sqrt(k(G-k))/G; the "
    "Bessel std (divisor G - 1, as the frameworks use) is sqrt(G/(G-1)) times it (evidence).",
    kind="derivation",
)
def _d1(ctx: CheckContext) -> Outcome:
    return binary_std_outcome(ctx)


def score_identity_outcome(ctx: CheckContext, *, baselines: tuple[float, ...] = (0.0, 0.3, 1.7)
                           ) -> Outcome:
    """Softmax bandit: E[(R - b) grad log pi] against grad p for several b."""
    from sims.bandit import SoftmaxBandit

    b = SoftmaxBandit(np.array([0.4, -0.2, 0.1]), np.array([0.9, 0.2, 0.5]))
    pi, mu, S = b.probs, b.arm_means, b.scores()
    worst = max(float(np.abs((pi * (mu - c)) @ S - b.grad_J()).max()) for c in baselines)
    fd = np.zeros(3)
    for i in range(3):
        e = np.zeros(3)
        e[i] = 1e-6
        fd[i] = (SoftmaxBandit(b.logits + e, mu).J() - SoftmaxBandit(b.logits - e, mu).J()) / 2e-6
    ev = {"max_abs_error_over_baselines": worst,
          "max_abs_error_grad_p_vs_fd": float(np.abs(b.grad_J() - fd).max())}
    ok = worst < 1e-12
    return Outcome(verdict_from(ok, computed=ev["max_abs_error_grad_p_vs_fd"] < 1e-8), ev,
                   correction=None if ok else
                   f"E[(R - b) score] differs from grad p by {worst:.3g}",
                   short=f"E[(R - b) score] = grad p to {worst:.1e} for b in {list(baselines)}"
                   if ok else f"score identity off by {worst:.2g}")


@claim(
    "stdid_d2_score_identity_baseline",
    location="Sec. 2, Eq. (3)",
    text="For any baseline b that does not depend on y, E_{y ~ pi_theta}[(R(y) - b) grad log "
    "pi_theta(y|x)] = grad p_x(theta).",
    check="A 3-arm softmax bandit with Bernoulli rewards: the exact expectation for b = 0, 0.3, "
    "1.7 against grad p (itself against central finite differences).",
    kind="derivation",
)
def _d2(ctx: CheckContext) -> Outcome:
    return score_identity_outcome(ctx)


def _printed_factor(G: int) -> float:
    """Proposition 1's constant (G - 1)/G."""
    return (G - 1) / G


def rloo_outcome(ctx: CheckContext, *, factor: Callable[[int], float] = _printed_factor
                 ) -> Outcome:
    """Random real rewards: R_i - mean against ((G-1)/G)(R_i - b_i) (registry ``grpo`` and
    ``rloo``); the expected updates' ratio in a bandit."""
    from grpo_theory import compute_advantages
    from grpo_theory.question_weights import group_mean_factor

    rng = ctx.rng(2801)
    worst = 0.0
    for G in range(2, 10):
        R = rng.normal(size=(50, G))
        f = factor(G)
        worst = max(worst, float(np.abs(np.asarray(compute_advantages("grpo", R))
                                        - f * np.asarray(compute_advantages("rloo", R))).max()))
    ev: dict[str, Any] = {"max_abs_error_identity": worst,
                          "group_mean_factor_G4_from_registry": group_mean_factor(4)}
    ok = worst < 1e-12
    return Outcome(verdict_from(ok), ev, correction=None if ok else
                   f"R_i - mean is not the printed constant times (R_i - b_i): error {worst:.3g}",
                   short=f"R_i - mu = (G-1)/G (R_i - b_i) to {worst:.1e}" if ok
                   else f"identity off by {worst:.2g}")


@claim(
    "stdid_d3_prop1_rescaled_rloo",
    location="Sec. 2, Proposition 1 and proof",
    text="For any rewards R_1..R_G (G >= 2) and the leave-one-out baseline b_i, R_i - mu = "
    "((G-1)/G)(R_i - b_i): mean-centring changes the expected update only by (G-1)/G.",
    check="50 random real reward vectors per G = 2..9: the registry's mean-centred ('grpo') and "
    "RLOO advantages against the identity; the registry's group-mean factor (G = 4).",
    kind="derivation",
)
def _d3(ctx: CheckContext) -> Outcome:
    return rloo_outcome(ctx)
