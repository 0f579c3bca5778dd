"""Sec. 2 / Sec. 10 of arXiv 2607.00152: the scope statement on clipping and KL (D20)."""

from __future__ import annotations

from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "10. Scope: clipping and KL at the first step"


def scope_outcome(ctx: CheckContext, *, beta: float = 0.1) -> Outcome:
    """At ratio 1 the clipped surrogate's gradient equals the unclipped one (finite
    differences); every KL estimate and coefficient is 0 at pi = pi_ref; away from it, a KL in
    the reward changes the group's advantages."""
    from grpo_theory import compute_advantages, kl
    from grpo_theory.surrogate import clipped_surrogate

    rng = ctx.rng(2806)
    A = np.array([1.0, -0.5, 0.7, -1.2])
    mask = np.ones((4, 3))
    h = 1e-6
    diffs = []
    for i in range(4):
        for t in range(3):
            for eps in (0.2, 1e9):
                r = np.ones((4, 3))
                r[i, t] += h
                up = clipped_surrogate(r, A, mask, clip_eps=min(eps, 0.999999))
                r[i, t] -= 2 * h
                dn = clipped_surrogate(r, A, mask, clip_eps=min(eps, 0.999999))
                diffs.append((up - dn) / (2 * h))
    d = np.array(diffs).reshape(12, 2)
    ev: dict[str, Any] = {"max_abs_diff_clipped_vs_unclipped_gradient_at_ratio_1": float(
        np.abs(d[:, 0] - d[:, 1]).max())}
    zero = 0.0
    for est in kl.KL_ESTIMATORS:
        for pl in ("loss", "reward_to_go", "reward_sum"):
            if (est, pl) == ("k1", "loss"):
                continue
            zero = max(zero, float(np.abs(kl.kl_coefficients(np.zeros((4, 3)), estimator=est,
                                                              placement=pl)).max()))
    ev["max_abs_kl_coefficient_at_pi_ref_excluding_k1_loss"] = zero
    lr = rng.normal(0, 0.3, (1, 4, 3))
    R = np.array([[1.0, 0.0, 1.0, 0.0]])
    k1 = lr.sum(-1)
    base = np.asarray(compute_advantages("grpo_std", R, ddof=1, eps=1e-6))
    shaped = np.asarray(compute_advantages("grpo_std", R - beta * k1, ddof=1, eps=1e-6))
    ev["max_abs_change_of_advantages_kl_in_reward_off_reference"] = float(
        np.abs(shaped - base).max())
    ev["beta"] = beta
    ok = (ev["max_abs_diff_clipped_vs_unclipped_gradient_at_ratio_1"] < 1e-6 and zero == 0.0)
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=("for the clip, at ratio 1 (exact); for the KL, only at a step where pi_theta "
                    "= pi_ref (every estimate and coefficient is 0 there; k1 as a loss still adds "
                    "zero-mean noise) or for a KL in the loss, which leaves the advantage alone; a "
                    "KL in the reward (verl use_kl_in_reward, OpenRLHF's default) changes the "
                    "advantages once pi_theta != pi_ref (by up to "
                    f"{ev['max_abs_change_of_advantages_kl_in_reward_off_reference']:.3g} here, "
                    f"beta = {beta:g})"),
        correction=None if ok else "the clipped surrogate's gradient differs at ratio 1",
        short="clip: yes at ratio 1; KL: only at pi = pi_ref or in the loss")


@claim(
    "stdid_d20_scope_clip_kl",
    location="Sec. 2, paragraph 'GRPO advantages'; Sec. 10, 'Limitations'",
    text="The clipping and KL terms do not affect the advantage's expectation at the first, "
    "on-policy step (ratio = 1); the identity concerns binary rewards and that step.",
    check="grpo_theory.surrogate: central differences of the clipped surrogate at ratio 1 with "
    "eps = 0.2 and without clip; grpo_theory.kl: every estimator's coefficient at pi = pi_ref; a "
    "group's std-normalised advantages with and without a KL in the reward (beta = 0.1, random "
    "token log-ratios).",
    kind="derivation",
)
def _d20(ctx: CheckContext) -> Outcome:
    return scope_outcome(ctx)
