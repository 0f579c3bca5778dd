"""GSPO Sec. 4.3: GSPO-token, its gradient (D12), and its equality with GSPO when the
advantages are shared (D13)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import formulas as F

SECTION = "4.3 GSPO-token"


def _token_advantages(g: Any, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(g.mask.shape) * g.mask


def gspo_token_gradient_outcome(ctx: CheckContext, *, printed: Callable[..., np.ndarray] =
                                F.grad_gspo_token_printed) -> Outcome:
    """Eq. (14)'s s_it equals s_i in value; finite differences of Eq. (13) with the
    stop-gradients frozen at theta (per-token advantages) against Eq. (17)."""
    g, theta = F.group()
    At = _token_advantages(g, 2707)
    s = F.sequence_ratio(g, theta)
    fd = F.fd_gradient(lambda th: F.j_gspo_token(g, th, theta, token_advantages=At,
                                                 eps_low=0.99, eps_high=10.0), theta)
    ev = {"rel_error_eq17_vs_fd": F.rel(printed(g, theta, At), fd),
          "max_abs_s_it_minus_s_i_at_theta": float(np.abs(
              (s[:, None] * np.exp((g.logp(theta) - g.logp(theta)) * g.mask)) - s[:, None]).max())}
    ok = ev["rel_error_eq17_vs_fd"] < 1e-6 and ev["max_abs_s_it_minus_s_i_at_theta"] < 1e-15
    return Outcome(verdict_from(ok), ev, correction=None if ok else
                   f"Eq. (17) differs from the objective's gradient by "
                   f"{ev['rel_error_eq17_vs_fd']:.3g}",
                   short=(f"Eq. (17) = finite differences to {ev['rel_error_eq17_vs_fd']:.1e}"
                          if ok else f"Eq. (17) off by {ev['rel_error_eq17_vs_fd']:.2g}"))


@claim(
    "gspo_d12_gspo_token_gradient",
    location="Sec. 4.3, Eqs. (13)-(17)",
    text="GSPO-token: J = E[(1/G) sum_i (1/|y_i|) sum_t min(s_it A_it, clip(s_it) A_it)] with "
    "s_it = sg[s_i] pi(y_it) / sg[pi(y_it)], numerically equal to s_i; without clipping its "
    "gradient is E[(1/G) sum_i s_i (1/|y_i|) sum_t A_it grad log pi(y_it | ...)].",
    check="A group of lengths 4, 2, 3, 1 with random per-token advantages: the stop-gradients "
    "frozen at theta, central finite differences of Eq. (13) (clip inactive) against Eq. (17); "
    "s_it against s_i at theta.",
    kind="derivation",
)
def _d12(ctx: CheckContext) -> Outcome:
    return gspo_token_gradient_outcome(ctx)


def equivalence_outcome(ctx: CheckContext, *, eps: float = 0.05) -> Outcome:
    """With A_it = A_i: values, clip decisions and finite-difference gradients of Eq. (13) and
    Eq. (5) at a point where some responses are clipped."""
    g, _ = F.group()
    rng = ctx.rng(2708)
    x = g.old_logits + 0.5 * rng.standard_normal(g.old_logits.size)
    s = F.sequence_ratio(g, x)
    At = np.broadcast_to(g.advantages[:, None], g.mask.shape)
    v5 = F.j_gspo(g, x, eps_low=eps, eps_high=eps)
    v13 = F.j_gspo_token(g, x, x, token_advantages=At, eps_low=eps, eps_high=eps)
    f5 = F.fd_gradient(lambda th: F.j_gspo(g, th, eps_low=eps, eps_high=eps), x)
    f13 = F.fd_gradient(lambda th: F.j_gspo_token(g, th, x, token_advantages=At, eps_low=eps,
                                                  eps_high=eps), x)
    ev = {"responses_clipped": int(np.sum(np.abs(s - 1) > eps)),
          "abs_diff_values": abs(v5 - v13), "rel_diff_fd_gradients": F.rel(f13, f5)}
    ok = ev["abs_diff_values"] < 1e-14 and ev["rel_diff_fd_gradients"] < 1e-6
    computed = ev["responses_clipped"] > 0
    return Outcome(verdict_from(ok, computed=computed), ev, correction=None if ok else
                   f"GSPO-token and GSPO differ: values {ev['abs_diff_values']:.3g}, gradients "
                   f"{ev['rel_diff_fd_gradients']:.3g}",
                   short=(f"identical with {ev['responses_clipped']} responses clipped (gradients "
                          f"to {ev['rel_diff_fd_gradients']:.1e})") if ok
                   else f"gradients differ by {ev['rel_diff_fd_gradients']:.2g}")


@claim(
    "gspo_d13_gspo_token_equals_gspo",
    location="Sec. 4.3, final paragraph",
    text="If A_it = A_i for all tokens of y_i, GSPO-token and GSPO are numerically identical in "
    "the objective, the clipping condition and the gradient.",
    check="A group of lengths 4, 2, 3, 1 at a point where some responses are clipped (eps 0.05): "
    "the values of Eqs. (13) and (5), and their central finite-difference gradients (the "
    "stop-gradients frozen at the point).",
    kind="derivation",
)
def _d13(ctx: CheckContext) -> Outcome:
    return equivalence_outcome(ctx)
