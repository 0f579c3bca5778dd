"""Multi-turn advantages from per-stage rewards ``[P, R, H]`` (Sec. 6 of arXiv 2606.29238).

Rollout ``i`` of a group receives rewards ``r_{i,1..H}`` at its ``H`` stages. Write
``G_i = sum_h r_{i,h}`` (total return) and ``Q_{i,h} = sum_{h' >= h} r_{i,h'}`` (reward-to-go;
``Q_{i,1} = G_i``). Modes (the output is ``[P, R, H]``, stage ``h`` on the last axis):

=====================================  ===================================================
mode                                   ``A_{i,h}``
=====================================  ===================================================
``"total_minus_group_mean"``           ``G_i - b(G)_i``: Eq. (22), the same at every stage
``"reward_to_go_minus_stage_mean"``    ``Q_{i,h} - b(Q_{., h})_i``: per-stage group baseline
``"reward_to_go_minus_group_mean"``    ``Q_{i,h} - b(G)_i``: reward-to-go, initial-state baseline
=====================================  ===================================================

``b(x)_i`` is the group baseline of the values ``x_1..x_R``: ``baseline="group_mean"`` (default,
includes rollout ``i``: ``(1/R) sum_j x_j``, GRPO's) or ``"leave_one_out"``
(``(1/(R-1)) sum_{j != i} x_j``, RLOO's). The difference between Eq. (22) and
``reward_to_go_minus_group_mean`` is exactly the past reward ``sum_{h' < h} r_{i,h'}`` of
Eq. (23)'s "past reward leakage" term (:func:`past_rewards`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._backend import pow2_scale, where
from ._validate import as_rewards, check_group_size, is_torch

__all__ = ["MULTITURN_MODES", "multiturn_advantages", "reward_to_go", "past_rewards"]

MULTITURN_MODES = (
    "total_minus_group_mean",
    "reward_to_go_minus_stage_mean",
    "reward_to_go_minus_group_mean",
)


def _flip(x: Any, axis: int) -> Any:
    if is_torch(x):
        return x.flip(axis)
    return np.flip(x, axis=axis)


def _cumsum(x: Any, axis: int) -> Any:
    if is_torch(x):
        return x.cumsum(dim=axis)
    return np.cumsum(x, axis=axis)


def reward_to_go(stage_rewards: Any) -> Any:
    """``Q_{i,h} = sum_{h' >= h} r_{i,h'}`` for ``[P, R, H]`` stage rewards (same backend).

    >>> reward_to_go([[[1.0, 0.0, 2.0]]]).tolist()
    [[[3.0, 2.0, 2.0]]]
    """
    r = as_rewards(stage_rewards, name="stage_rewards", ndim=3)
    return _flip(_cumsum(_flip(r, 2), 2), 2)


def past_rewards(stage_rewards: Any) -> Any:
    """``sum_{h' < h} r_{i,h'}`` (0 at the first stage): the past-reward leakage of Eq. (23)."""
    r = as_rewards(stage_rewards, name="stage_rewards", ndim=3)
    return _cumsum(r, 2) - r


def _baseline(x: Any, kind: str) -> Any:
    """Group baseline along axis 1 of ``x`` shaped ``[P, R, ...]``; where the group's values are
    all equal the baseline is that value exactly (so ``x - baseline`` is exactly 0 there)."""
    Rn = x.shape[1]
    if is_torch(x):
        total = x.sum(dim=1, keepdim=True)
        const = x.amax(dim=1, keepdim=True) == x.amin(dim=1, keepdim=True)
    else:
        total = x.sum(axis=1, keepdims=True)
        const = x.max(axis=1, keepdims=True) == x.min(axis=1, keepdims=True)
    b = total / Rn + 0 * x if kind == "group_mean" else (total - x) / (Rn - 1)
    return where(const, x, b)


def multiturn_advantages(
    stage_rewards: Any,
    *,
    mode: Literal[
        "total_minus_group_mean", "reward_to_go_minus_stage_mean", "reward_to_go_minus_group_mean"
    ] = "total_minus_group_mean",
    baseline: Literal["group_mean", "leave_one_out"] = "group_mean",
) -> Any:
    """Per-stage advantages ``[P, R, H]`` from per-stage rewards ``[P, R, H]``.

    Args:
        stage_rewards: ``[P, R, H]`` rewards (NumPy array-like or torch tensor), ``R >= 2``.
        mode: see the module table. Default ``"total_minus_group_mean"`` (Eq. 22).
        baseline: ``"group_mean"`` (default, includes self) or ``"leave_one_out"``.

    Returns:
        ``[P, R, H]`` advantages, same backend as the input.

    >>> multiturn_advantages([[[1.0, 0.0], [0.0, 0.0]]]).tolist()
    [[[0.5, 0.5], [-0.5, -0.5]]]
    >>> x = [[[1.0, 0.0], [0.0, 0.0]]]
    >>> multiturn_advantages(x, mode="reward_to_go_minus_stage_mean").tolist()
    [[[0.5, 0.0], [-0.5, 0.0]]]
    """
    r = as_rewards(stage_rewards, name="stage_rewards", ndim=3)
    check_group_size(r.shape[1], minimum=2, estimator=f"multiturn ({mode})")
    if mode not in MULTITURN_MODES:
        raise ValueError(f"unknown multi-turn mode {mode!r}; choose one of {MULTITURN_MODES}")
    if baseline not in ("group_mean", "leave_one_out"):
        raise ValueError(f"baseline must be 'group_mean' or 'leave_one_out', got {baseline!r}")
    # Scaled form: divide by a power of two k >= max|r| / 2 (exact), compute, multiply back, so
    # no intermediate sum overflows for finite rewards near the float limit; a result that is
    # itself beyond the float range is refused (never a silent inf).
    k = pow2_scale(r, None)
    u = r / k
    q = _flip(_cumsum(_flip(u, 2), 2), 2)  # reward-to-go
    g = q[:, :, :1]  # total return, [P, R, 1]
    if mode == "total_minus_group_mean":
        A = (g - _baseline(g, baseline)) + 0 * u
    elif mode == "reward_to_go_minus_stage_mean":
        A = q - _baseline(q, baseline)
    else:
        A = q - _baseline(g, baseline)
    with np.errstate(over="ignore"):  # a result beyond the float range is refused below
        out = A * k
    if is_torch(out):
        import torch

        finite = bool(torch.isfinite(out).all())
    else:
        finite = bool(np.isfinite(out).all())
    if not finite:
        raise ValueError(
            f"multiturn ({mode}): the advantages overflow the float range (returns or their "
            "differences exceed the largest float); rescale the stage rewards"
        )
    return out
