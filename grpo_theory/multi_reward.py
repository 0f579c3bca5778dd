"""Several reward functions per completion: GDPO's normalise-then-sum (arXiv 2601.05242).

Rewards are ``[num_prompts, group_size, K]`` for ``K`` reward functions; each function is
std-normalised within its group, the normalised values are summed with weights, and the sums are
std-normalised over the batch (TRL 1.16.0 ``multi_objective_aggregation="normalize_then_sum"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._backend import as_float64
from ._validate import real_option
from .normalisation import whiten

__all__ = ["gdpo_advantages"]

Array = Any  # np.ndarray or torch.Tensor


# --- multi-reward, token-level, ragged and NaN forms (not [P, R] -> [P, R]) ----------------------
def gdpo_advantages(
    rewards_per_func: Array,
    *,
    weights: Sequence[float] | None = None,
    group_eps: float = 1e-4,
    batch_eps: float = 1e-4,
) -> np.ndarray:
    """GDPO (arXiv 2601.05242): normalise each reward function per group, sum, whiten the batch.

    TRL 1.16.0 ``GRPOConfig(multi_objective_aggregation="normalize_then_sum")``
    (``grpo_trainer.py``): ``z_ik = (r_ik - mean_k) / (std_k + 1e-4)`` per group and function
    (ddof 1), ``s_i = sum_k w_k z_ik``, ``A_i = (s_i - mean(s)) / (std(s) + 1e-4)`` over the batch
    (ddof 1). NaN rewards are excluded from every statistic (``nanmean``/``nanstd``) and a NaN
    ``z_ik`` drops out of the sum; a completion whose every function is NaN gets advantage 0.

    Args:
        rewards_per_func: ``[P, R, K]`` rewards of ``K`` reward functions (NaN = not scored).
        weights: ``K`` weights; default all 1.
        group_eps: added to each per-group std. Default 1e-4 (TRL).
        batch_eps: added to the batch std. Default 1e-4 (TRL).

    Returns:
        ``[P, R]`` float64 advantages.

    >>> gdpo_advantages([[[1.0, 0.0], [0.0, 1.0]]], group_eps=0.0, batch_eps=0.0).tolist()
    [[0.0, 0.0]]
    """
    x = as_float64(rewards_per_func, "rewards_per_func", ndim=3, finite=False)
    if np.any(np.isinf(x)):
        raise ValueError(
            "rewards_per_func contains inf (NaN marks unscored entries; inf is an error)"
        )
    group_eps = real_option(group_eps, "group_eps", minimum=0.0)
    batch_eps = real_option(batch_eps, "batch_eps", minimum=0.0)
    P, R, K = x.shape
    w = np.ones(K) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (K,):
        raise ValueError(f"weights must have one entry per reward function (K={K}), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be finite, got {w.tolist()}")
    z = np.full_like(x, np.nan)
    for p in range(P):
        for k in range(K):
            col = x[p, :, k]
            ok = ~np.isnan(col)
            if ok.sum() >= 2:
                z[p, ok, k] = _std_normalise(col[ok], ddof=1, eps=group_eps)
    unscored = np.all(np.isnan(x), axis=2)
    s = np.nansum(z * w, axis=2)
    flat = s[~unscored]
    out = np.zeros((P, R))
    if flat.size >= 2:
        out[~unscored] = _std_normalise(flat, ddof=1, eps=batch_eps)
    return out


def _std_normalise(v: np.ndarray, *, ddof: int, eps: float) -> np.ndarray:
    """``(v - mean) / (std + eps)`` for a 1-D vector; 0 when all entries are equal."""
    if v.max() == v.min():
        return np.zeros_like(v)
    return whiten(v[None, :], ddof=ddof, eps=eps, eps_mode="add_std")[0]
