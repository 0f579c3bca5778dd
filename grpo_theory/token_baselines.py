"""Token-level baselines: a baseline per position of the completion, not per rollout.

verl 0.9.1's optimal token baseline (OTB) weights each trajectory's return-to-go by a per-token
variance proxy built from the policy's token probabilities; its inputs are token-level
quantities ``[num_prompts, group_size, T]``, not outcome rewards.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import as_float64

__all__ = ["optimal_token_baseline_advantages"]

Array = Any  # np.ndarray or torch.Tensor


def optimal_token_baseline_advantages(
    token_rewards: Array,
    mask: Array,
    token_probs: Array,
    sum_pi_squared: Array,
    *,
    is_weights: Array | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> np.ndarray:
    """verl 0.9.1 ``compute_optimal_token_baseline_advantage`` (OTB), per token, per group.

    Needs token-level quantities from the policy (inputs, not rewards): ``pi_t`` the probability
    of each sampled token and ``sum_pi_squared`` (``sum_v pi(v)^2`` at each position). With
    returns-to-go ``G_t`` and ``W_t = sum_{j <= t} m_j w_j``, ``w_j = (1 - 2 pi_j + sum pi^2)
    rho_j^2`` (``rho`` the optional importance weights), each group of ``R`` trajectories gets the
    per-position baseline ``B_t = sum_i G_it W_it m_it / (sum_i W_it m_it + eps)`` and
    ``A_it = (G_it - B_t) m_it``. A one-trajectory group gets ``B = 0``. With
    ``handle_zero_tail`` the positions of a group's unique longest trajectory beyond the
    second-longest length get ``B = 0``.

    Args:
        token_rewards, mask, token_probs, sum_pi_squared: ``[P, R, T]``.
        is_weights: ``[P, R, T]`` or ``None``.
        handle_zero_tail: Default True (verl).
        eps: Default 1e-8 (verl).

    Returns:
        ``[P, R, T]`` float64 advantages.
    """
    r = as_float64(token_rewards, "token_rewards", ndim=3)
    m = as_float64(mask, "mask", ndim=3)
    pi = as_float64(token_probs, "token_probs", ndim=3)
    sp2 = as_float64(sum_pi_squared, "sum_pi_squared", ndim=3)
    for name, a in (("mask", m), ("token_probs", pi), ("sum_pi_squared", sp2)):
        if a.shape != r.shape:
            raise ValueError(f"{name} shape {a.shape} does not match token_rewards {r.shape}")
    G = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
    wt = 1.0 - 2.0 * pi + sp2
    if is_weights is not None:
        wt = wt * as_float64(is_weights, "is_weights", ndim=3) ** 2
    W = np.cumsum(wt * m, -1)
    P, R, T = r.shape
    B = np.zeros_like(G)
    if R > 1:
        B[:] = ((G * W * m).sum(1) / ((W * m).sum(1) + eps))[:, None, :]
        if handle_zero_tail:
            lens = m.sum(-1)
            for p in range(P):
                srt = np.sort(lens[p])
                top = np.flatnonzero(lens[p] == srt[-1])
                if top.size == 1 and srt[-1] > srt[-2]:
                    B[p, top[0], int(srt[-2]) :] = 0.0
    return (G - B) * m
