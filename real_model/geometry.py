"""Per-group gradient geometry of a real model: spectra of ``G = diag(w) Psi`` and their causes.

For one group of ``R`` rollouts with binary rewards ``r [R]`` and completion lengths ``L [R]``:

* ``K [R, R]``: Gram of the trajectory scores, ``K_ij = <psi_i, psi_j>`` (Eq. 18), from
  :func:`real_model.gram.trajectory_gram` (one batched forward+backward, exact).
* weights ``w_i = A_i * c_i``: advantages of a ``grpo_theory`` estimator (``compute_advantages``)
  times the aggregation weight ``c_i`` of ``grpo_theory.aggregation.aggregation_weights`` (the
  factor of ``A_i psi_i`` that a loss aggregation such as token-mean induces).
* spectral metrics of ``G G^T = diag(w) K diag(w)`` via ``grpo_theory.spectral.spectral_metrics``
  (rank, effective rank ``(sum s)^2 / sum s^2``, top-1 ``s_1^2 / sum s^2``, ...; Sec. 7.1).
* the geometry: per-rollout norms ``||psi_i|| = sqrt(K_ii)``; cosines ``C = D^-1/2 K D^-1/2``
  averaged within successes, within failures and between the two; the common-component share
  ``lambda_max(C) / R`` (1 when all scores are parallel, ``1/R`` when orthogonal) and
  ``lambda_max(K) / tr K``; FADE masses ``(m_S, m_F)`` from ``grpo_theory.mass.gradient_mass``.

**Nested groups.** :func:`nested_group_geometry` computes ``K`` once at the largest ``R`` and takes
the leading ``R' x R'`` block for each smaller ``R'``: the first ``R'`` of ``R`` exchangeable i.i.d.
rollouts are themselves an i.i.d. group of size ``R'``. Advantages are recomputed on the subgroup
(its own mean), so the small-``R`` metrics are exactly those of a group sampled at size ``R'``;
the groups at different ``R'`` are dependent (they share rollouts), which matters only for
comparisons across ``R'``, not for each ``R'`` on its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_theory.advantages import compute_advantages
from grpo_theory.aggregation import AGGREGATION_MODES, aggregation_weights
from grpo_theory.mass import gradient_mass
from grpo_theory.spectral import DEFAULT_RTOL, spectral_metrics

__all__ = [
    "group_gram",
    "rollout_weights",
    "score_geometry",
    "group_geometry",
    "nested_group_geometry",
    "AGGREGATIONS",
]

AGGREGATIONS = AGGREGATION_MODES


def _aggregation_weights(lengths: np.ndarray, *, mode: str, max_tokens: int | None) -> np.ndarray:
    """``aggregation_weights`` of grpo_theory; ``max_tokens`` is passed for dr_grpo only."""
    mt = max_tokens if mode == "dr_grpo" else None
    return np.asarray(aggregation_weights(lengths, mode=mode, max_tokens=mt), dtype=np.float64)


def _gradient_mass(adv: np.ndarray, rewards: np.ndarray) -> tuple[float, float]:
    mS, mF = gradient_mass(adv[None, :], rewards[None, :])
    return float(np.asarray(mS).reshape(-1)[0]), float(np.asarray(mF).reshape(-1)[0])


def group_gram(model: Any, batch: Any, *, method: str = "exact") -> np.ndarray:
    """``K [R, R]`` (float64) of a rollout batch, by :func:`real_model.gram.trajectory_gram`."""
    from .gram import trajectory_gram

    K = trajectory_gram(
        model, batch.input_ids, batch.attention_mask, batch.completion_mask, method=method
    )
    return K.detach().cpu().double().numpy()


def rollout_weights(
    rewards: Any,
    lengths: Any,
    *,
    estimator: str = "grpo",
    aggregation: str = "sequence_sum",
    max_tokens: int | None = None,
    estimator_options: Mapping[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages ``A [R]`` and effective weights ``w = A * c [R]`` of one group.

    Args:
        rewards: ``[R]`` rewards.
        lengths: ``[R]`` completion lengths (tokens).
        estimator: ``grpo_theory`` registry name (default ``"grpo"``, Eq. 15).
        aggregation: loss aggregation (default ``"sequence_sum"``: ``c_i = 1``).
        max_tokens: the constant of ``"dr_grpo"`` aggregation.
        estimator_options: keyword options of the estimator.
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(1, -1)
    L = np.asarray(lengths, dtype=np.float64).reshape(1, -1)
    if r.shape != L.shape:
        raise ValueError(f"rewards and lengths must have the same shape, got {r.shape}, {L.shape}")
    adv = np.asarray(compute_advantages(estimator, r, **dict(estimator_options or {})), dtype=float)
    c = _aggregation_weights(L, mode=aggregation, max_tokens=max_tokens)
    return adv[0], (adv * c)[0]


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def score_geometry(K: Any, rewards: Any) -> dict[str, Any]:
    """Geometry of the trajectory scores (independent of the estimator).

    Args:
        K: ``[R, R]`` Gram of the scores.
        rewards: ``[R]`` binary rewards (success: ``r > 0.5``).

    Returns:
        dict with ``norms`` [R], ``cos_within_success``, ``cos_within_failure``, ``cos_between``
        (means over distinct pairs; ``None`` when no pair exists), ``common_share`` =
        ``lambda_max(C)/R`` of the cosine matrix ``C``, ``top_eig_share`` = ``lambda_max(K)/tr K``.
    """
    k = np.asarray(K, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    if k.ndim != 2 or k.shape[0] != k.shape[1] or k.shape[0] != r.size:
        raise ValueError(f"K must be [R, R] with R = len(rewards), got {k.shape} and {r.shape}")
    if not np.all(np.isfinite(k)):
        raise ValueError("K contains NaN or inf")
    d = np.sqrt(np.clip(np.diag(k), 0.0, None))
    if np.any(d <= 0):
        raise ValueError("a trajectory score has zero norm (empty completion?)")
    C = k / np.outer(d, d)
    s = r > 0.5
    off = ~np.eye(r.size, dtype=bool)

    def mean_of(mask: np.ndarray) -> float | None:
        return float(C[mask].mean()) if mask.any() else None

    ev_c = np.linalg.eigvalsh(0.5 * (C + C.T))
    ev_k = np.linalg.eigvalsh(0.5 * (k + k.T))
    return {
        "norms": [float(x) for x in d],
        "cos_within_success": mean_of(np.outer(s, s) & off),
        "cos_within_failure": mean_of(np.outer(~s, ~s) & off),
        "cos_between": mean_of(np.outer(s, ~s)),
        "common_share": float(ev_c[-1] / r.size),
        "top_eig_share": float(ev_k[-1] / np.trace(k)),
    }


def group_geometry(
    K: Any,
    rewards: Any,
    lengths: Any,
    *,
    estimators: Sequence[str] = ("grpo",),
    aggregation: str = "sequence_sum",
    max_tokens: int | None = None,
    estimator_options: Mapping[str, Mapping[str, Any]] | None = None,
    rtol: float = DEFAULT_RTOL,
) -> dict[str, Any]:
    """Spectral metrics per estimator plus the score geometry of one group.

    Args:
        K: ``[R, R]`` Gram of the trajectory scores.
        rewards: ``[R]`` rewards.
        lengths: ``[R]`` completion lengths.
        estimators: registry names (default ``("grpo",)``).
        aggregation: loss aggregation mode (default ``"sequence_sum"``).
        max_tokens: constant of ``"dr_grpo"`` aggregation.
        estimator_options: per-estimator keyword options, e.g. ``{"fade": {"alpha": 2}}``.
        rtol: numerical-rank tolerance (default ``1e-6``).

    Returns:
        JSON-ready dict: ``R``, ``num_success``, ``mixed``, the :func:`score_geometry` fields, and
        ``estimators[name]`` = {``advantages``, ``weights``, ``max_rank`` (= #nonzero weights, the
        rank bound of ``diag(w) Psi``), ``m_S``, ``m_F``, and the spectral metrics}; NaN -> None.
    """
    k = np.asarray(K, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    out: dict[str, Any] = {
        "R": int(r.size),
        "num_success": int((r > 0.5).sum()),
        "mixed": bool(r.min() != r.max()),
        "rewards": [float(x) for x in r],
        "lengths": [int(x) for x in np.asarray(lengths).reshape(-1)],
    }
    out.update(score_geometry(k, r))
    per: dict[str, Any] = {}
    for name in estimators:
        opts = (estimator_options or {}).get(name, {})
        adv, w = rollout_weights(
            r,
            lengths,
            estimator=name,
            aggregation=aggregation,
            max_tokens=max_tokens,
            estimator_options=opts,
        )
        m = spectral_metrics(k, w, rtol=rtol).as_dict()
        mS, mF = _gradient_mass(adv, r)
        entry = {
            "advantages": [float(x) for x in adv],
            "weights": [float(x) for x in w],
            "max_rank": int(np.count_nonzero(w)),
            "m_S": mS,
            "m_F": mF,
        }
        for key, val in m.items():
            if isinstance(val, float):
                entry[key] = _nan_to_none(val)
            else:
                entry[key] = val
        per[name] = entry
    out["estimators"] = per
    return out


def nested_group_geometry(
    K: Any,
    rewards: Any,
    lengths: Any,
    *,
    R_values: Sequence[int],
    **kw: Any,
) -> dict[int, dict[str, Any]]:
    """:func:`group_geometry` of the leading ``R' x R'`` block for each ``R'`` in ``R_values``.

    See the module docstring (nested groups). ``kw`` is passed to :func:`group_geometry`.
    """
    k = np.asarray(K, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    L = np.asarray(lengths).reshape(-1)
    out = {}
    for Rp in R_values:
        if not 2 <= Rp <= r.size:
            raise ValueError(
                f"each R must satisfy 2 <= R <= {r.size} (the sampled group), got {Rp}"
            )
        out[int(Rp)] = group_geometry(k[:Rp, :Rp], r[:Rp], L[:Rp], **kw)
    return out
