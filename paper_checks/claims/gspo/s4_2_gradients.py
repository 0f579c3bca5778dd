"""GSPO Sec. 4.2: the GSPO gradient (D10), GRPO's gradient, its clipped token weights and the
'fundamental distinction' (D11)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import formulas as F

SECTION = "4.2 Gradient analysis"


def gspo_gradient_outcome(ctx: CheckContext, *,
                          printed: Callable[[Any, np.ndarray], np.ndarray] = F.grad_gspo_printed
                          ) -> Outcome:
    """Finite differences of Eq. (5) (no clipping: eps large) at theta != theta_old and at
    theta_old against Eq. (10)."""
    g, theta = F.group()
    ev: dict[str, Any] = {}
    worst = 0.0
    for lab, x in (("theta", theta), ("theta_old", g.old_logits)):
        fd = F.fd_gradient(lambda th: F.j_gspo(g, th, eps_low=0.99, eps_high=10.0), x)
        e = F.rel(printed(g, x), fd)
        ev[f"rel_error_eq10_vs_fd_at_{lab}"] = e
        worst = max(worst, e)
    ok = worst < 1e-6
    return Outcome(verdict_from(ok), ev, correction=None if ok else
                   f"Eq. (10) differs from the objective's gradient by {worst:.3g} (relative)",
                   short=f"Eq. (10) = finite differences to {worst:.1e}" if ok
                   else f"Eq. (10) off by {worst:.2g}")


@claim(
    "gspo_d10_gspo_gradient",
    location="Sec. 4.2, Eqs. (8)-(10)",
    text="Without clipping, grad J_GSPO = E[(1/G) sum_i s_i(theta) A_i (1/|y_i|) sum_t grad log "
    "pi_theta(y_it | x, y_i,<t)].",
    check="A group of lengths 4, 2, 3, 1 in a token MDP (V = 2, T = 4): central finite "
    "differences of Eq. (5) with the clip inactive, at theta != theta_old and at theta_old, "
    "against Eq. (10).",
    kind="derivation",
)
def _d10(ctx: CheckContext) -> Outcome:
    return gspo_gradient_outcome(ctx)


def grpo_gradient_outcome(ctx: CheckContext, *,
                          printed: Callable[[Any, np.ndarray], np.ndarray] = F.grad_grpo_printed,
                          eps: float = 0.2) -> Outcome:
    """Finite differences of Eq. (2) (no clipping) against Eq. (12); the w-derivative of the
    clipped term on a grid (where a token's weight carries gradient); GSPO's per-token weights
    within a response."""
    g, theta = F.group()
    fd = F.fd_gradient(lambda th: F.j_grpo(g, th, eps_low=0.99, eps_high=10.0), theta)
    ev: dict[str, Any] = {"rel_error_eq12_vs_fd": F.rel(printed(g, theta), fd)}
    w = np.linspace(0.01, 3.0, 2991)
    h = 1e-7
    for sign in (1.0, -1.0):
        d = (F.clip_term(w + h, sign, eps, eps) - F.clip_term(w - h, sign, eps, eps)) / (2 * h)
        live = w[np.abs(d) > 1e-6]
        ev[f"A{'pos' if sign > 0 else 'neg'}_weights_with_gradient_min"] = float(live.min())
        ev[f"A{'pos' if sign > 0 else 'neg'}_weights_with_gradient_max"] = float(live.max())
    s = F.sequence_ratio(g, theta)
    per_token = s[:, None] * g.advantages[:, None] / g.lengths[:, None] * g.mask
    ev["gspo_max_spread_of_token_weights_within_a_response"] = float(max(
        np.ptp(per_token[i, : g.lengths[i]]) for i in range(len(s))))
    ok = (ev["rel_error_eq12_vs_fd"] < 1e-6
          and ev["Apos_weights_with_gradient_max"] <= 1 + eps + 1e-3
          and ev["Aneg_weights_with_gradient_min"] >= 1 - eps - 1e-3
          and ev["Aneg_weights_with_gradient_max"] >= 2.99
          and ev["gspo_max_spread_of_token_weights_within_a_response"] < 1e-15)
    return Outcome(verdict_from(ok), ev, correction=None if ok else
                   "Eq. (12) or the clipped weight ranges differ: " + str(ev),
                   short=(f"Eq. (12) to {ev['rel_error_eq12_vs_fd']:.1e}; weights with gradient: "
                          f"A > 0 up to {ev['Apos_weights_with_gradient_max']:.3f}, A < 0 from "
                          f"{ev['Aneg_weights_with_gradient_min']:.3f}") if ok
                   else f"Eq. (12) off by {ev['rel_error_eq12_vs_fd']:.2g} or the clip ranges "
                   "differ")


@claim(
    "gspo_d11_grpo_gradient_token_weights",
    location="Sec. 4.2, Eqs. (11)-(12) and the paragraph after them",
    text="Without clipping, grad J_GRPO = E[(1/G) sum_i A_i (1/|y_i|) sum_t w_it grad log "
    "pi(y_it | ...)]; with clipping the token weights that carry gradient range over (0, 1+eps] "
    "when A_i > 0 and [1-eps, +inf) when A_i < 0. GRPO weights each token by its own w_it, "
    "GSPO weights all the tokens of a response equally.",
    check="A group of lengths 4, 2, 3, 1: finite differences of Eq. (2) with the clip inactive "
    "against Eq. (12); the derivative of min(w A, clip(w) A) in w on w in [0.01, 3] for A = +-1, "
    "eps = 0.2; the spread of GSPO's per-token weights s_i A_i / |y_i| within each response.",
    kind="derivation",
)
def _d11(ctx: CheckContext) -> Outcome:
    return grpo_gradient_outcome(ctx)
