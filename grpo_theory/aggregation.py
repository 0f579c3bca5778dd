"""Effective per-rollout weights of the common loss aggregations.

A policy-gradient loss over a batch of ``P`` prompts x ``R`` rollouts with per-token terms
``l_it = -A_i log pi(a_t | s_t)`` is reduced to a scalar by an *aggregation*. With uniform
(output-only) credit, the gradient of every aggregation below is ``-sum_i w_i A_i psi_i`` with
``psi_i`` the trajectory score of Eq. (18) (sum of token scores) and a per-rollout weight ``w_i``
that depends only on the lengths ``L_i`` (completion tokens of rollout ``i``). So the factor that
multiplies ``psi_i`` is ``w_i A_i``, not ``A_i``: the aggregation changes the relative weights of
long and short rollouts.

Modes, their weight ``w_i`` and who uses them:

* ``sequence_sum``: ``w_i = 1 / (P R)``. The seed paper's Eq. (15)/(19), averaged over prompts;
  verl ``loss_agg_mode=seq-mean-token-sum``.
* ``token_mean``: ``w_i = 1 / sum_{all j} L_j`` (mean over every token of the batch). DAPO; TRL
  ``loss_type="dapo"`` (default) and ``"bnpo"``; verl ``token-mean`` (default); OpenRLHF
  ``token_level_loss=True`` (default).
* ``sequence_mean``: ``w_i = 1 / (P R L_i)`` (0 if ``L_i = 0``): mean within each sequence, then
  over sequences. GRPO as published (Shao et al. 2024); TRL ``loss_type="grpo"``; verl
  ``seq-mean-token-mean``; OpenRLHF ``token_level_loss=False``.
* ``dr_grpo``: ``w_i = 1 / (P R max_tokens)``, a constant. Dr.GRPO (Liu et al. 2025); TRL
  ``loss_type="dr_grpo"`` with ``max_tokens = max_completion_length``.

verl's ``seq-mean-token-sum-norm`` is ``sum / loss_scale_factor`` without the ``1 / (P R)``: it is
``dr_grpo`` times the constant ``P R``. TRL's gradient-accumulation and data-parallel rescalings
are constants common to all rollouts and are left out.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._validate import real_option

__all__ = ["AGGREGATION_MODES", "aggregation_weights", "effective_weights"]

AGGREGATION_MODES = ("sequence_sum", "token_mean", "sequence_mean", "dr_grpo")

Mode = Literal["sequence_sum", "token_mean", "sequence_mean", "dr_grpo"]


def _lengths(lengths: Any) -> np.ndarray:
    x = lengths.detach().cpu().numpy() if hasattr(lengths, "detach") else lengths
    L = np.asarray(x)
    if L.ndim != 2:
        raise ValueError(f"lengths must be 2-D [num_prompts, group_size], got shape {L.shape}")
    if L.size == 0:
        raise ValueError(f"lengths has an empty axis: shape {L.shape}")
    Lf = L.astype(np.float64)
    if not np.all(np.isfinite(Lf)) or np.any(Lf < 0) or np.any(Lf != np.round(Lf)):
        raise ValueError("lengths must be non-negative integers (completion token counts)")
    return Lf


def aggregation_weights(lengths: Any, *, mode: Mode, max_tokens: int | None = None) -> np.ndarray:
    """Per-rollout weight ``w_i`` of a loss aggregation (see the module table).

    The aggregated policy-gradient estimate is ``sum_i w_i A_i psi_i`` (Eq. 19 generalised).

    Args:
        lengths: ``[P, R]`` completion lengths ``L_i`` (non-negative ints).
        mode: ``"sequence_sum"`` (``1/(P R)``), ``"token_mean"`` (``1/sum L``),
            ``"sequence_mean"`` (``1/(P R L_i)``, 0 for an empty completion) or ``"dr_grpo"``
            (``1/(P R max_tokens)``).
        max_tokens: the constant of ``"dr_grpo"`` (e.g. TRL's ``max_completion_length``); must be
            ``>= max L_i``. Required for ``"dr_grpo"``, rejected otherwise.

    Returns:
        ``[P, R]`` float64 weights.

    Raises:
        ValueError: bad shape/values, unknown mode, missing/invalid ``max_tokens``, or
            ``"token_mean"`` with no tokens at all.

    >>> aggregation_weights([[1, 3]], mode="sequence_mean").tolist()
    [[0.5, 0.16666666666666666]]
    >>> aggregation_weights([[1, 3]], mode="token_mean").tolist()
    [[0.25, 0.25]]
    """
    L = _lengths(lengths)
    P, R = L.shape
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
    if mode != "dr_grpo" and max_tokens is not None:
        raise ValueError(f"max_tokens is only used by mode='dr_grpo', got mode={mode!r}")
    if mode == "sequence_sum":
        return np.full_like(L, 1.0 / (P * R))
    if mode == "token_mean":
        total = L.sum()
        if total <= 0:
            raise ValueError("token_mean: the batch has no completion tokens (sum of lengths is 0)")
        return np.full_like(L, 1.0 / total)
    if mode == "sequence_mean":
        safe = np.where(L > 0, L, 1.0)
        return np.where(L > 0, 1.0 / (P * R * safe), 0.0)
    if max_tokens is None:
        raise ValueError("mode='dr_grpo' needs max_tokens > 0, got None")
    max_tokens = real_option(max_tokens, "max_tokens", positive=True)
    if L.max() > max_tokens:
        raise ValueError(
            f"max_tokens={max_tokens} is smaller than the longest completion ({int(L.max())})"
        )
    return np.full_like(L, 1.0 / (P * R * max_tokens))


def effective_weights(
    advantages: Any, lengths: Any, *, mode: Mode, max_tokens: int | None = None
) -> np.ndarray:
    """``w_i A_i``: the scalar that multiplies ``psi_i`` in the aggregated gradient.

    Args:
        advantages: ``[P, R]`` advantages.
        lengths: ``[P, R]`` completion lengths.
        mode: aggregation mode.
        max_tokens: for ``"dr_grpo"``.

    Returns:
        ``[P, R]`` float64 array; feed one row to :func:`grpo_theory.spectral_metrics`.
    """
    a = advantages.detach().cpu().numpy() if hasattr(advantages, "detach") else advantages
    A = np.asarray(a, dtype=np.float64)
    w = aggregation_weights(lengths, mode=mode, max_tokens=max_tokens)
    if A.shape != w.shape:
        raise ValueError(f"advantages shape {A.shape} does not match lengths shape {w.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("advantages contain NaN or inf")
    return A * w
