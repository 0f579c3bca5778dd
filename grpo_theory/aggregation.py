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

* ``token_sum``: ``w_i = 1``: the plain sum over every token. verl ``loss_agg_mode=token-sum``.

verl 0.9.1's ``seq-mean-token-sum-norm`` is ``sum / global_batch_size / loss_scale_factor``
(``verl/trainer/ppo/core_algos.py``, ``agg_loss``): ``dr_grpo`` with ``max_tokens =
loss_scale_factor`` (default: the padded response width). (An older verl commit omitted the
``1 / global_batch_size``, which made it ``dr_grpo`` times ``P R``; 0.9.1 does not.)

Empty completions. verl 0.9.1 and OpenRLHF 0.11.2 divide their sequence means by the number of
*non-empty* completions (``global_batch_size = (mask.sum(-1) > 0).sum()``); TRL 1.16.0 divides by
all ``B`` completions. ``empty_completions="skip"`` (verl, OpenRLHF) or ``"count"`` (TRL, the
default) selects the divisor of the sequence modes.

At the on-policy point (every ratio 1) the policy losses of the frameworks reduce to these
weights (:func:`policy_loss_weights`, :data:`POLICY_LOSSES`): the ratio's gradient there is the
token score, soft gates (SAPO) have slope 1, and the detached coefficients (CISPO, VESPO) equal 1
(TRL's CISPO caps the ratio at ``epsilon_high`` itself, so its coefficient is
``min(1, epsilon_high)``: 0.2 with TRL's default ``epsilon_high = epsilon = 0.2``). A
sequence-level ratio (GSPO) has gradient ``psi_i / L_i`` and is then summed over the ``L_i``
tokens, so GSPO keeps the weights of its aggregation. TRL's gradient-accumulation and
data-parallel rescalings are constants common to all rollouts and are left out.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._backend import to_float64
from ._validate import check_lengths, real_option

__all__ = [
    "AGGREGATION_MODES",
    "POLICY_LOSSES",
    "aggregation_weights",
    "effective_weights",
    "policy_loss_weights",
]

AGGREGATION_MODES = ("sequence_sum", "token_mean", "sequence_mean", "dr_grpo", "token_sum")

Mode = Literal["sequence_sum", "token_mean", "sequence_mean", "dr_grpo", "token_sum"]


def aggregation_weights(
    lengths: Any,
    *,
    mode: Mode,
    max_tokens: int | None = None,
    empty_completions: Literal["count", "skip"] = "count",
) -> np.ndarray:
    """Per-rollout weight ``w_i`` of a loss aggregation (see the module table).

    The aggregated policy-gradient estimate is ``sum_i w_i A_i psi_i`` (Eq. 19 generalised).

    Args:
        lengths: ``[P, R]`` completion lengths ``L_i`` (non-negative ints).
        mode: ``"sequence_sum"`` (``1/(P R)``), ``"token_mean"`` (``1/sum L``),
            ``"sequence_mean"`` (``1/(P R L_i)``, 0 for an empty completion), ``"dr_grpo"``
            (``1/(P R max_tokens)``) or ``"token_sum"`` (``1``).
        max_tokens: the constant of ``"dr_grpo"`` (e.g. TRL's ``max_completion_length``, verl's
            ``loss_scale_factor``); must be ``>= max L_i``. Required for ``"dr_grpo"``, rejected
            otherwise.
        empty_completions: the ``P R`` of the sequence modes (``sequence_sum``,
            ``sequence_mean``, ``dr_grpo``) counts every completion (``"count"``, default: TRL) or
            only the non-empty ones (``"skip"``: verl, OpenRLHF). Empty completions get weight 0
            under ``"skip"``.

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
    L = check_lengths(lengths)
    P, R = L.shape
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
    if mode != "dr_grpo" and max_tokens is not None:
        raise ValueError(f"max_tokens is only used by mode='dr_grpo', got mode={mode!r}")
    if empty_completions not in ("count", "skip"):
        raise ValueError(f"empty_completions must be 'count' or 'skip', got {empty_completions!r}")
    if mode == "token_sum":
        return np.ones_like(L)
    n_seq = float(P * R) if empty_completions == "count" else float((L > 0).sum())
    keep = np.ones_like(L) if empty_completions == "count" else (L > 0).astype(np.float64)
    if n_seq == 0 and mode != "token_mean":
        raise ValueError(f"mode={mode!r}: every completion is empty (no sequence to average)")
    if mode == "sequence_sum":
        return keep / n_seq
    if mode == "token_mean":
        total = L.sum()
        if total <= 0:
            raise ValueError("token_mean: the batch has no completion tokens (sum of lengths is 0)")
        return np.full_like(L, 1.0 / total)
    if mode == "sequence_mean":
        safe = np.where(L > 0, L, 1.0)
        return np.where(L > 0, 1.0 / (n_seq * safe), 0.0)
    if max_tokens is None:
        raise ValueError("mode='dr_grpo' needs max_tokens > 0, got None")
    max_tokens = real_option(max_tokens, "max_tokens", positive=True)
    if L.max() > max_tokens:
        raise ValueError(
            f"max_tokens={max_tokens} is smaller than the longest completion ({int(L.max())})"
        )
    return keep / (n_seq * max_tokens)


POLICY_LOSSES: dict[str, tuple[str, str]] = {
    "cispo": (
        "token_mean",
        "TRL 1.16.0 loss_type='cispo' (times min(1, epsilon_high)); verl 0.9.1 "
        "policy_loss 'cispo' keeps loss_agg_mode (default token-mean)",
    ),
    "sapo": (
        "sequence_mean",
        "TRL 1.16.0 loss_type='sapo'; verl 0.9.1 policy_loss 'sapo' (forces seq-mean-token-mean)",
    ),
    "luspo": (
        "sequence_sum",
        "TRL 1.16.0 loss_type='luspo' (sum over tokens, mean over sequences)",
    ),
    "vespo": ("token_mean", "TRL 1.16.0 loss_type='vespo' (Gamma weight phi(1) = 1, detached)"),
    "gspo": (
        "sequence_mean",
        "TRL 1.16.0 importance_sampling_level='sequence' with "
        "loss_type='grpo'; OpenRLHF 0.11.2 policy_loss_type='gspo'",
    ),
}
"""Policy losses -> (aggregation mode they reduce to at ratio 1, who ships them)."""


def policy_loss_weights(
    lengths: Any,
    *,
    loss: str,
    epsilon_high: float | None = None,
    empty_completions: Literal["count", "skip"] = "count",
) -> np.ndarray:
    """Per-sequence gradient weight ``w_i`` of a framework policy loss at ratio 1.

    The gradient of the loss at the on-policy point is ``-sum_i w_i A_i psi_i`` (see the module
    docstring for why each loss reduces to an aggregation mode there).

    * ``"cispo"`` (MiniMax-M1, arXiv 2506.13585): ``-sg(clip(r)) A log pi`` summed over tokens /
      total tokens: ``token_mean`` times ``min(1, epsilon_high)`` when ``epsilon_high`` is given
      (TRL caps the ratio at ``epsilon_high``; its default 0.2 scales every weight by 0.2).
      ``epsilon_high=None`` (verl, ratio clipped to ``[1 - eps, 1 + eps]``): factor 1.
    * ``"sapo"`` (arXiv 2511.20347): gate ``sigmoid(tau (r - 1)) 4 / tau`` has slope 1 at
      ``r = 1`` for every ``tau``: ``sequence_mean``.
    * ``"luspo"`` (arXiv 2602.05261): per-sequence token sum, mean over sequences:
      ``sequence_sum``.
    * ``"vespo"`` (arXiv 2602.10693): detached ``phi(w) = e^lambda w^k e^(-lambda w)`` is 1 at
      ``w = 1``, token sum / total tokens: ``token_mean``.
    * ``"gspo"`` (arXiv 2507.18071): ratio ``exp(mean_t log r_t)``, per-sequence mean:
      ``sequence_mean``.

    Args:
        lengths: ``[P, R]`` completion lengths.
        loss: a key of :data:`POLICY_LOSSES`.
        epsilon_high: TRL's CISPO cap (only for ``loss="cispo"``); ``None`` = no cap.
        empty_completions: as in :func:`aggregation_weights`.

    Returns:
        ``[P, R]`` float64 weights.

    >>> policy_loss_weights([[1, 3]], loss="cispo", epsilon_high=0.2).tolist()
    [[0.05, 0.05]]
    >>> policy_loss_weights([[1, 3]], loss="luspo").tolist()
    [[0.5, 0.5]]
    """
    if loss not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {loss!r}; choose one of {sorted(POLICY_LOSSES)}")
    if epsilon_high is not None and loss != "cispo":
        raise ValueError(f"epsilon_high is only used by loss='cispo', got loss={loss!r}")
    mode = POLICY_LOSSES[loss][0]
    w = aggregation_weights(lengths, mode=mode, empty_completions=empty_completions)  # type: ignore[arg-type]
    if epsilon_high is not None:
        w = w * min(1.0, real_option(epsilon_high, "epsilon_high", positive=True))
    return w


def effective_weights(
    advantages: Any,
    lengths: Any,
    *,
    mode: Mode,
    max_tokens: int | None = None,
    empty_completions: Literal["count", "skip"] = "count",
) -> np.ndarray:
    """``w_i A_i``: the scalar that multiplies ``psi_i`` in the aggregated gradient.

    Args:
        advantages: ``[P, R]`` advantages.
        lengths: ``[P, R]`` completion lengths.
        mode: aggregation mode.
        max_tokens: for ``"dr_grpo"``.
        empty_completions: as in :func:`aggregation_weights`.

    Returns:
        ``[P, R]`` float64 array; feed one row to :func:`grpo_theory.spectral_metrics`.
    """
    A = to_float64(advantages)
    w = aggregation_weights(
        lengths, mode=mode, max_tokens=max_tokens, empty_completions=empty_completions
    )
    if A.shape != w.shape:
        raise ValueError(f"advantages shape {A.shape} does not match lengths shape {w.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("advantages contain NaN or inf")
    return A * w
