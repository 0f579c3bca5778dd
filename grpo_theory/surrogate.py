"""The clipped policy-gradient surrogates of PPO, GRPO and Dr. GRPO as written (one group).

Dr. GRPO (Liu et al. 2025, arXiv 2503.20783) writes three objectives with the same per-token
term ``f(rho, A) = min(rho A, clip(rho, 1 - eps, 1 + eps) A)``, ``rho`` the token's likelihood
ratio ``pi_theta / pi_theta_old``, and different normalisers:

* PPO, Eq. (2): ``sum_t f(rho_t, A_t)`` per response (no ``1/|o|``): ``mode="token_sum"``;
* GRPO, Eq. (3): ``(1/G) sum_i (1/|o_i|) sum_t f(rho_it, A_i)``: ``mode="sequence_mean"``;
* Dr. GRPO, Sec. 3.2: ``(1/G) sum_i sum_t f(rho_it, A_i)`` (``mode="sequence_sum"``), implemented
  as a masked sum divided by the constant ``MAX_TOKENS`` (``mode="dr_grpo"``).

:func:`clipped_surrogate` evaluates any of them with the weights of
:func:`grpo_theory.aggregation.aggregation_weights` (``w_i`` multiplies response ``i``'s token
sum). Differentiating it (e.g. by finite differences of ``theta``) gives the on-policy gradient
``sum_i w_i A_i psi_i`` at ``rho = 1``, because the clip is inactive on a neighbourhood of 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._validate import real_option
from .aggregation import aggregation_weights

__all__ = ["clipped_surrogate", "ppo_clip_objective"]


def ppo_clip_objective(ratio: Any, advantage: Any, *, clip: float) -> np.ndarray:
    """``f_c(x, y) = min(x y, clip(x, 1 - c, 1 + c) y)`` elementwise: PPO's clipped term
    (Dr. GRPO arXiv 2503.20783 Eq. 2; GRPO-Clip of arXiv 2503.06639; ``clip = inf`` gives ``x y``).

    >>> ppo_clip_objective(2.0, 0.5, clip=0.2).tolist()
    0.6
    """
    x = np.asarray(ratio, dtype=np.float64)
    y = np.asarray(advantage, dtype=np.float64)
    c = float(clip)
    if not c >= 0:
        raise ValueError(f"clip must be >= 0, got {clip!r}")
    return np.minimum(x * y, np.clip(x, 1.0 - c, 1.0 + c) * y)


def clipped_surrogate(
    ratios: Any,
    advantages: Any,
    mask: Any,
    *,
    clip_eps: float = 0.2,
    mode: str = "sequence_mean",
    max_tokens: int | None = None,
) -> float:
    """``sum_i w_i sum_t mask_it min(rho_it A_it, clip(rho_it, 1 - eps, 1 + eps) A_it)``.

    Args:
        ratios: ``[G, T]`` token likelihood ratios ``rho`` (> 0; entries outside ``mask``
            ignored).
        advantages: ``[G]`` (one per response, GRPO) or ``[G, T]`` (per token, PPO).
        mask: ``[G, T]`` 0/1, the response's tokens; ``|o_i| = mask[i].sum()``.
        clip_eps: PPO's ``epsilon`` in ``[0, 1)``. Default 0.2.
        mode: loss aggregation of :mod:`grpo_theory.aggregation` (``"token_sum"``: Eq. 2 summed
            over the group; ``"sequence_mean"``: Eq. 3; ``"sequence_sum"`` / ``"dr_grpo"``:
            Dr. GRPO).
        max_tokens: the constant of ``mode="dr_grpo"``.

    Returns:
        The objective (to be maximised), a float.

    >>> clipped_surrogate([[1.5, 1.0]], [2.0], [[1, 1]], clip_eps=0.2, mode="sequence_mean")
    2.2
    """
    rho = np.asarray(ratios, dtype=np.float64)
    m = np.asarray(mask, dtype=np.float64)
    if rho.ndim != 2 or m.shape != rho.shape:
        raise ValueError(f"ratios and mask must be [G, T] of one shape, got {rho.shape}, {m.shape}")
    if np.any((m != 0) & (m != 1)):
        raise ValueError("mask must hold 0/1")
    if np.any(~np.isfinite(rho[m == 1])) or np.any(rho[m == 1] <= 0):
        raise ValueError("ratios must be finite and > 0 on the mask")
    A = np.asarray(advantages, dtype=np.float64)
    if A.shape == (rho.shape[0],):
        A = np.broadcast_to(A[:, None], rho.shape)
    if A.shape != rho.shape or not np.all(np.isfinite(A)):
        raise ValueError(f"advantages must be finite, shaped [G] or [G, T]={rho.shape}, got "
                         f"{np.shape(advantages)}")
    eps = real_option(clip_eps, "clip_eps", minimum=0.0, maximum=1.0)
    if eps >= 1.0:
        raise ValueError(f"clip_eps must be < 1, got {clip_eps}")
    kw = {"max_tokens": max_tokens} if mode == "dr_grpo" else {}
    w = aggregation_weights(m.sum(1)[None, :], mode=mode, **kw)[0]  # type: ignore[arg-type]
    rho = np.where(m == 1, rho, 1.0)
    term = ppo_clip_objective(rho, A, clip=eps) * m
    return float(w @ term.sum(1))
