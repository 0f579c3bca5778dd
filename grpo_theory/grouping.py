"""Groups of unequal size and unscored completions: any per-group estimator on ragged batches.

verl groups a flat batch by an ``index`` array, so groups may differ in size; TRL leaves NaN
rewards (completions no reward function scored) out of their group's statistics. Both apply an
estimator of :mod:`grpo_theory.advantages` group by group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ._backend import as_float64
from .registry import get_estimator

__all__ = ["grouped_advantages", "nan_excluding_advantages"]

Array = Any  # np.ndarray or torch.Tensor


def grouped_advantages(
    estimator: str | Callable[..., Any],
    rewards: Array,
    group_ids: Array,
    *,
    singleton: Literal["raise", "zero", "raw"] = "raise",
    **options: Any,
) -> np.ndarray:
    """Any per-group estimator on groups of unequal size, given a flat batch and group ids.

    verl groups a flat batch by an ``index`` array (``uid``), so groups may differ in size; TRL
    after excluding NaN rewards does too. Each group is passed to ``estimator`` as one row
    ``[1, n_g]`` and the results scattered back. Only estimators whose value for a group depends on
    that group alone are meaningful here (not ``std_scope="batch"``, GPG, the whitening ones).

    Args:
        estimator: registry name or callable ``(rewards [1, n], **options) -> [1, n]``.
        rewards: ``[B]`` flat rewards.
        group_ids: ``[B]`` hashable ids, any order.
        singleton: rule for one-sample groups: ``"raise"`` (default; our estimators need
            ``R >= 2``), ``"zero"`` (advantage 0: TRL, where ``nanstd`` of one value is NaN and
            NaN advantages become 0) or ``"raw"`` (mean 0, std 1: the reward itself, verl's
            ``grpo``/``rloo``; with ``eps`` verl's ``grpo`` divides by ``1 + eps``, not done here).
        **options: passed to the estimator.

    Returns:
        ``[B]`` float64 advantages.

    >>> grouped_advantages("grpo", [1.0, 0.0, 6.0, 0.0, 0.0], [7, 7, 3, 3, 3]).tolist()
    [0.5, -0.5, 4.0, -2.0, -2.0]
    """

    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    r = as_float64(rewards, "rewards", ndim=1)
    ids = list(group_ids.tolist() if hasattr(group_ids, "tolist") else group_ids)
    if len(ids) != r.size:
        raise ValueError(f"group_ids has {len(ids)} entries, rewards has {r.size}")
    if singleton not in ("raise", "zero", "raw"):
        raise ValueError(f"singleton must be 'raise', 'zero' or 'raw', got {singleton!r}")
    members: dict[Any, list[int]] = {}
    for pos, g in enumerate(ids):
        members.setdefault(g, []).append(pos)
    out = np.zeros_like(r)
    for g, idx in members.items():
        if len(idx) == 1:
            if singleton == "raise":
                raise ValueError(
                    f"group {g!r} has one sample; pass singleton='zero' (TRL) or 'raw' (verl)"
                )
            out[idx[0]] = 0.0 if singleton == "zero" else r[idx[0]]
            continue
        out[idx] = np.asarray(fn(r[idx][None, :], **options), dtype=np.float64)[0]
    return out


def nan_excluding_advantages(
    estimator: str | Callable[..., Any], rewards: Array, **options: Any
) -> np.ndarray:
    """TRL 1.16.0's NaN rule as an option for any per-group estimator.

    ``GRPOTrainer``/``RLOOTrainer``: a completion whose reward is NaN (every reward function
    returned ``None``) is left out of its group's mean and std (``nanmean``/``nanstd``, ddof 1 over
    the scored ones) and its advantage is set to 0; a group left with one scored completion gets
    0 too (``nanstd`` of one value is NaN). This runs ``estimator`` on each group's scored rewards
    (:func:`grouped_advantages` with ``singleton="zero"``) and puts 0 at the NaN entries.

    Args:
        estimator: registry name or callable.
        rewards: ``[P, R]`` rewards, NaN marking unscored completions (inf is an error).
        **options: estimator options (e.g. ``ddof=1, eps=1e-4`` for TRL's ``grpo_std``).

    Returns:
        ``[P, R]`` float64 advantages.

    >>> nan_excluding_advantages("grpo", [[1.0, float("nan"), 0.0]]).tolist()
    [[0.5, 0.0, -0.5]]
    """
    x = as_float64(rewards, "rewards", finite=False)
    if np.any(np.isinf(x)):
        raise ValueError("rewards contain inf (NaN marks unscored completions; inf is an error)")
    P, R = x.shape
    ok = ~np.isnan(x)
    out = np.zeros((P, R))
    if ok.any():
        ids = np.repeat(np.arange(P), R).reshape(P, R)[ok]
        out[ok] = grouped_advantages(estimator, x[ok], ids, singleton="zero", **options)
    return out
