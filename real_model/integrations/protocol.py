"""The group record and the step's aggregate: the measurement both hosts share, as pure functions.

Given one group's Gram of trajectory scores ``K [R, R]`` (``K_ij = <psi_i, psi_j>``, seed paper
Eq. 18), the host's rewards, advantages ``A_i`` and row weights ``c_i`` (the row's gradient is
``c_i A_i psi_i``), :func:`group_records` gives every per-group metric (spectra of
``G = diag(w) Psi`` with ``w = c A``: :func:`grpo_theory.spectral.spectral_metrics`; FADE masses
:func:`grpo_theory.mass.gradient_mass`; score geometry :func:`real_model.geometry.score_geometry`;
``cos(S, F)``); :func:`gradient_row_metrics` the same spectra from the Gram of a host's actual
gradient rows ``K_ij = <g_i, g_j>`` (captured in-run; for many groups at once
:func:`gradient_row_metrics_batch`, one :func:`grpo_theory.spectral.spectral_metrics_batch` per
group size); :func:`aggregate_groups` the step's mean / sd / min / max / count over the mixed
groups; :func:`diagnostic_sums` and :func:`step_diagnostics_fields` the step's exact training
diagnostics (:mod:`grpo_theory.diagnostics`: norms, dead groups, noise scale, SNR) from the
groups' Grams and the host's own gradient norm, sums merged across processes as scalars. The TRL
and verl integrations build their records from these; no host is imported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_theory.diagnostics import diagnostics_from_sums, group_sums, merge_group_sums
from grpo_theory.mass import gradient_mass
from grpo_theory.spectral import DEFAULT_RTOL, spectral_metrics, spectral_metrics_batch

from ..geometry import score_geometry

__all__ = [
    "SPECTRAL_KEYS",
    "SCORE_KEYS",
    "cos_success_failure",
    "group_records",
    "gradient_row_metrics",
    "gradient_row_metrics_batch",
    "metric_stats",
    "aggregate_groups",
    "DIAGNOSTICS_UNLOGGED",
    "padded_gram",
    "diagnostic_sums",
    "step_diagnostics_fields",
    "diagnostics_metrics",
]

# Scalar per-group metrics aggregated per step (over mixed groups unless stated).
SPECTRAL_KEYS = ("rank", "effective_rank", "entropy_effective_rank", "stable_rank",
                 "top1_fraction", "m_S", "m_F", "grad_norm")
SCORE_KEYS = ("common_share", "top_eig_share", "cos_within_success", "cos_within_failure",
              "cos_between", "cos_SF", "score_norm_mean", "score_norm_success",
              "score_norm_failure")


def cos_success_failure(K: Any, success: Any) -> float | None:
    """``cos(g_S, g_F)`` of the mean success and mean failure scores, from ``K [R, R]``.

    ``<g_S, g_F> = mean K[S, F]``, ``||g_S||^2 = mean K[S, S]`` (means over index pairs).
    ``None`` when the group has no success or no failure.

    >>> cos_success_failure(np.eye(2), [True, False])
    0.0
    """
    k = np.asarray(K, dtype=np.float64)
    s = np.asarray(success, dtype=bool)
    if s.all() or not s.any():
        return None
    ss, ff, sf = k[np.ix_(s, s)].mean(), k[np.ix_(~s, ~s)].mean(), k[np.ix_(s, ~s)].mean()
    den = math.sqrt(max(ss, 0.0) * max(ff, 0.0))
    return float(sf / den) if den > 0 else None


def _none_if_nan(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def group_records(
    K: Any,
    rewards: Any,
    advantages: Any,
    c: Any,
    lengths: Any,
    *,
    rtol: float = DEFAULT_RTOL,
    success_threshold: float = 0.5,
    exact_structure: bool = True,
    row_gram: Any = None,
) -> dict[str, Any]:
    """All metrics of one group (JSON-ready; NaN -> None).

    Two routes to the gradient-matrix metrics (spectra of the rows' gradients, ``grad_norm``):
    from the score Gram and row weights (``G = diag(w) Psi``, ``w = c A``: ``G G^T =
    diag(w) K diag(w)``), or, when ``row_gram`` is given, from the Gram of the host's actual
    per-row gradients ``g_i`` (``row_gram_ij = <g_i, g_j>``, e.g. ``g_i = sum_t u_it grad log
    pi_it`` with ``u`` the host's per-token loss gradient), which holds for any loss.

    Args:
        K: ``[R, R]`` Gram of the trajectory scores.
        rewards: ``[R]`` the host's (weighted-sum) rewards.
        advantages: ``[R]`` the host's advantages ``A_i``.
        c: ``[R]`` row weights ``c_i`` of the host's loss aggregation (the row's gradient is
            ``c_i A_i psi_i``; e.g. ``integrations.trl.weights.trl_row_weights``), or
            ``None`` (only with ``row_gram``).
        lengths: ``[R]`` loss tokens per row.
        rtol: numerical-rank tolerance.
        success_threshold: success when ``reward > success_threshold``.
        exact_structure: False when the host's gradient is not ``sum_i c_i A_i psi_i`` (e.g.
            ``integrations.trl.weights.structure_issues`` found a problem): the
            weight-dependent metrics are then left out (ignored when ``row_gram`` is given).
        row_gram: ``[R, R]`` Gram of the rows' actual gradients ``g_i`` (optional; see above).
    """
    k = np.asarray(K, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    A = np.asarray(advantages, dtype=np.float64).reshape(-1)
    succ = r > success_threshold
    rec: dict[str, Any] = {
        "R": int(r.size),
        "num_success": int(succ.sum()),
        "mixed": bool(succ.any() and not succ.all()),
        "rewards": r.tolist(),
        "lengths": [int(x) for x in np.asarray(lengths).reshape(-1)],
        "advantages": A.tolist(),
    }
    # score geometry uses r > 0.5; pass the thresholded labels as 0/1
    sg = score_geometry(k, succ.astype(np.float64))
    norms = np.asarray(sg.pop("norms"))
    rec["norms"] = norms.tolist()
    rec.update(sg)
    rec["cos_SF"] = cos_success_failure(k, succ)
    rec["score_norm_mean"] = float(norms.mean())
    rec["score_norm_success"] = float(norms[succ].mean()) if succ.any() else None
    rec["score_norm_failure"] = float(norms[~succ].mean()) if (~succ).any() else None
    mS, mF = gradient_mass(A[None, :], succ[None, :].astype(np.float64))
    rec["m_S"], rec["m_F"] = float(mS[0]), float(mF[0])
    if c is not None and (exact_structure or row_gram is not None):
        w = A * np.asarray(c, dtype=np.float64).reshape(-1)
        rec["row_weights"] = np.asarray(c, dtype=np.float64).reshape(-1).tolist()
        rec["weights"] = w.tolist()
    if row_gram is not None:
        rec.update(gradient_row_metrics(row_gram, rtol=rtol))
        return rec
    if not exact_structure:
        return rec
    if c is None:
        raise ValueError("group_records needs the row weights c or the row Gram row_gram")
    m = spectral_metrics(k, w, rtol=rtol).as_dict()
    rec["grad_norm"] = float(math.sqrt(max(float(w @ k @ w), 0.0)))
    for key, val in m.items():
        rec[key] = _none_if_nan(val) if isinstance(val, float) else val
    return rec


def gradient_row_metrics(K: Any, *, rtol: float = DEFAULT_RTOL) -> dict[str, Any]:
    """Metrics of a group's gradient matrix ``G`` (rows ``g_i``) from its Gram ``K = G G^T``.

    Every field of :func:`grpo_theory.spectral.spectral_metrics` with unit weights (``G`` is the
    matrix of the actual rows; non-finite values -> ``None``) and
    ``grad_norm = ||sum_i g_i|| = sqrt(1^T K 1)``.

    >>> m = gradient_row_metrics(np.eye(2))
    >>> (m["rank"], m["effective_rank"], m["grad_norm"])
    (2, 2.0, 1.4142135623730951)
    """
    return gradient_row_metrics_batch([K], rtol=rtol)[0]


def gradient_row_metrics_batch(
    Ks: Sequence[Any], *, rtol: float = DEFAULT_RTOL
) -> list[dict[str, Any]]:
    """:func:`gradient_row_metrics` of each Gram ``Ks[i] [R_i, R_i]``, in input order.

    The Grams are stacked by size ``R`` (``[G_R, R, R]``) and each stack's metrics are one call
    of :func:`grpo_theory.spectral.spectral_metrics_batch` (unit weights ``[G_R, R]``), its
    ``grad_norm = sqrt(1^T K 1)`` one sum; the results equal the per-Gram function's. A Gram
    that fails (not square, not symmetric, not PSD, not finite) is a ``ValueError`` with the
    message of :func:`spectral_metrics` for it, prefixed ``Ks[i]: `` when there are several.

    >>> ms = gradient_row_metrics_batch([np.eye(2), np.ones((3, 3)), np.eye(2)])
    >>> [(m["rank"], m["grad_norm"]) for m in ms]
    [(2, 1.4142135623730951), (1, 3.0), (2, 1.4142135623730951)]
    """
    ks = [np.asarray(K, dtype=np.float64) for K in Ks]
    prefix = [f"Ks[{i}]: " if len(ks) > 1 else "" for i in range(len(ks))]
    by_size: dict[int, list[int]] = {}
    for i, k in enumerate(ks):
        if k.ndim != 2 or k.shape[0] != k.shape[1]:
            raise ValueError(f"{prefix[i]}K must be a square R x R matrix, got shape {k.shape}")
        by_size.setdefault(k.shape[0], []).append(i)
    out: list[dict[str, Any]] = [{} for _ in ks]
    for R, idx in by_size.items():
        stack = np.stack([ks[i] for i in idx])  # [G_R, R, R]
        try:
            ms = spectral_metrics_batch(stack, np.ones((len(idx), R)), rtol=rtol)
        except ValueError as exc:  # error path: name the first failing Gram by its input index
            for i in idx:
                try:
                    spectral_metrics(ks[i], np.ones(R), rtol=rtol)
                except ValueError as one:
                    if str(one) == str(exc) or not prefix[i]:  # not about one Gram (rtol)
                        raise one from None
                    raise ValueError(f"{prefix[i]}{one}") from exc
            raise
        norms = np.sqrt(np.maximum(stack.reshape(len(idx), -1).sum(axis=1), 0.0)).tolist()
        for i, m, norm in zip(idx, ms, norms, strict=True):
            d = m.as_dict()
            out[i] = {key: _none_if_nan(val) if isinstance(val, float) else val
                      for key, val in d.items()}
            out[i]["grad_norm"] = norm
    return out


def metric_stats(vals: Sequence[float | None]) -> dict[str, Any]:
    """Mean, sd (ddof 1; ``None`` below 2 values), min, max and count of the finite values.

    >>> metric_stats([1.0, 3.0, None, float("nan")])["sd"]
    1.4142135623730951
    """
    x = np.asarray([v for v in vals if v is not None and math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return {"mean": None, "sd": None, "min": None, "max": None, "count": 0}
    return {
        "mean": float(x.mean()),
        "sd": float(x.std(ddof=1)) if x.size > 1 else None,
        "min": float(x.min()),
        "max": float(x.max()),
        "count": int(x.size),
    }


def aggregate_groups(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-step aggregates over the MIXED groups: mean, sd (ddof 1), min, max, count per metric.

    Returns ``{"groups": n, "mixed_groups": m, "metrics": {name: stats}}``.
    """
    mixed = [g for g in groups if g["mixed"]]
    keys = [k for k in (*SPECTRAL_KEYS, *SCORE_KEYS) if any(k in g for g in mixed)]
    return {
        "groups": len(groups),
        "mixed_groups": len(mixed),
        "metrics": {k: metric_stats([g.get(k) for g in mixed]) for k in keys},
    }


# ----------------------------------------------------------------- the step's training diagnostics
DIAGNOSTICS_UNLOGGED = ("groups", "grad_norm")
"""Diagnostics keys kept out of the hosts' logs: the logs already carry them under these names
(``<prefix>groups``: the groups of the step; the host's own ``grad_norm``, which the noise scale
reads). The JSONL record's ``diagnostics`` keep every key."""


def padded_gram(K: Any, positions: Sequence[int], size: int) -> np.ndarray:
    """``[size, size]`` Gram of a group whose rows at ``positions`` have the Gram ``K`` and whose
    other rows have no gradient (zero rows: an empty loss mask, or a group without gradient,
    ``K`` of shape ``[0, 0]``).

    >>> padded_gram([[4.0]], [1], 2).tolist()
    [[0.0, 0.0], [0.0, 4.0]]
    """
    k = np.asarray(K, dtype=np.float64).reshape(len(positions), len(positions))
    out = np.zeros((size, size))
    idx = np.asarray(positions, dtype=np.int64)
    out[np.ix_(idx, idx)] = k
    return out


def diagnostic_sums(groups: Sequence[tuple[Any, Any, Any]], *,
                    success_threshold: float = 0.5) -> dict[str, float]:
    """The additive diagnostic sums of whole groups held here (one process, one micro-batch):
    :func:`grpo_theory.diagnostics.group_sums` per group size, merged
    (:func:`~grpo_theory.diagnostics.merge_group_sums`). Only these scalars cross processes.

    Args:
        groups: per group ``(K [R, R], tokens [R], rewards [R])``: the Gram of the group's
            gradient rows (zero rows for rollouts without gradient: :func:`padded_gram`), the
            rows' loss-token counts and rewards (``None`` / NaN: unscored). Groups may differ in
            ``R``.
        success_threshold: a rollout is solved when its reward exceeds this.

    Returns:
        The merged sums; ``{}`` for no group (merges as nothing).

    >>> s = diagnostic_sums([(np.eye(2), [3, 4], [1.0, 0.0]), (np.zeros((3, 3)), [1, 1, 1],
    ...                      [1.0, 1.0, 1.0])])
    >>> s["groups"], s["dead_groups"], s["group_sq_sum"]
    (2.0, 1.0, 2.0)
    """
    by_size: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for K, tokens, rewards in groups:
        k = np.asarray(K, dtype=np.float64)
        r = np.array([np.nan if x is None else x for x in np.asarray(rewards, dtype=object)
                      .reshape(-1)], dtype=np.float64)
        by_size.setdefault(k.shape[0], []).append((k, np.asarray(tokens, dtype=np.float64), r))
    parts = [group_sums(np.stack([g[0] for g in gs]), tokens=np.stack([g[1] for g in gs]),
                        rewards=np.stack([g[2] for g in gs]),
                        success_threshold=success_threshold)
             for _, gs in sorted(by_size.items())]
    return merge_group_sums(parts) if parts else {}


def step_diagnostics_fields(parts: Sequence[Mapping[str, float]], *,
                            total_grad_norm: float | None, num_groups: int) -> dict[str, float]:
    """The step's diagnostics from every process's (micro-batch's) :func:`diagnostic_sums` and
    the host's own gradient norm: :func:`grpo_theory.diagnostics.diagnostics_from_sums` of the
    merged sums (keys there; NaN where undefined, ``noise/status`` saying why).

    Args:
        parts: the sums of disjoint sets of whole groups (``{}``: none), together all
            ``num_groups`` groups of the step.
        total_grad_norm: the host's ``|G|`` of the step (before clipping, after the all-reduce:
            the norm of the sum of all the rows), or ``None`` / non-finite (no noise scale).
        num_groups: the step's number of groups (a part missing from the merge is an error).
    """
    merged = merge_group_sums([p for p in parts if p])
    g = None if total_grad_norm is None or not math.isfinite(total_grad_norm) else \
        float(total_grad_norm)
    return diagnostics_from_sums(merged, total_grad_norm=g, num_groups=num_groups)


def diagnostics_metrics(diagnostics: Mapping[str, float], *, prefix: str) -> dict[str, float]:
    """The finite diagnostics as log entries ``{prefix + key: value}`` (not
    :data:`DIAGNOSTICS_UNLOGGED`; an undefined value is left out, ``noise/status`` says why).

    >>> diagnostics_metrics({"groups": 2.0, "noise/snr": 3.0, "noise/b_simple": float("nan")},
    ...                     prefix="geometry/")
    {'geometry/noise/snr': 3.0}
    """
    return {prefix + k: float(v) for k, v in diagnostics.items()
            if k not in DIAGNOSTICS_UNLOGGED and math.isfinite(v)}
