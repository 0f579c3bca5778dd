"""The spectral metrics of Sec. 7.1 as the rank claims and the Table 1 toy use them.

* :func:`effective_rank_range` and its inverse :func:`top1_range`: the effective ranks (the paper's
  ``(sum s)^2 / sum s^2``) that a spectrum with a given top-1 fraction and number of nonzero
  singular values can have, in closed form, and back (Sec. 7.1, Table 1).
* :func:`expected_metric`: a metric of ``G = diag(A) Psi`` averaged over the binary groups of one
  prompt, for the limit Grams of :mod:`sims.psi_models` named in :data:`PSI_MODELS`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from grpo_theory import compute_advantages, spectral_metrics

__all__ = ["PSI_MODELS", "effective_rank_range", "top1_range", "expected_metric"]

PSI_MODELS: dict[str, dict[str, float]] = {
    "isotropic": {},
    "clustered (noise 0.1)": {"within": 1.0, "between": 0.0, "noise": 0.1},
    "clustered (noise 0.01)": {"within": 1.0, "between": 0.0, "noise": 0.01},
    "clustered (noise 0)": {"within": 1.0, "between": 0.0, "noise": 0.0},
    "common (strength 4)": {"strength": 4.0},
}


def effective_rank_range(top1: float, rank: int) -> tuple[float, float]:
    """Range of the paper's effective rank ``(sum s)^2 / sum s^2`` given the top-1 fraction
    ``f = s_1^2 / sum s^2`` and the number of nonzero singular values ``rank``.

    With ``sum s^2 = 1``: the maximum spreads ``1 - f`` evenly over the other ``rank - 1`` values,
    ``(sqrt f + sqrt((rank - 1)(1 - f)))^2``; the minimum packs it into as few values as possible,
    each at most ``s_1``: ``m = floor((1 - f)/f)`` copies of ``sqrt f`` and a remainder.

    Raises:
        ValueError: if no spectrum has that ``f`` and ``rank`` (``f < 1/rank`` or ``f > 1``, or
            ``f < 1`` with ``rank = 1``).
    """
    if rank < 1 or not (0 < top1 <= 1):
        raise ValueError(f"need rank >= 1 and 0 < top1 <= 1, got rank={rank}, top1={top1}")
    if rank == 1 and top1 < 1:
        raise ValueError(f"rank 1 forces top1 = 1, got {top1}")
    if top1 < 1.0 / rank - 1e-12:
        raise ValueError(f"top1={top1} < 1/rank={1 / rank}: infeasible (s_1 is the largest)")
    f = top1
    hi = (math.sqrt(f) + math.sqrt((rank - 1) * (1 - f))) ** 2
    m = math.floor((1 - f) / f + 1e-12)
    rem = max(0.0, 1 - f - m * f)
    lo = (math.sqrt(f) * (1 + m) + math.sqrt(rem)) ** 2
    return lo, hi


def top1_range(eff_rank: float, rank: int, *, tol: float = 1e-12) -> tuple[float, float]:
    """Range of the top-1 fraction ``f = s_1^2 / sum s^2`` over spectra with ``rank`` nonzero
    singular values and effective rank ``(sum s)^2 / sum s^2 = eff_rank``.

    Inverts :func:`effective_rank_range`: both of its bounds fall as
    ``f`` rises on ``[1/rank, 1]``, so ``f`` ranges from ``lo^{-1}`` to ``hi^{-1}`` (bisection).

    Raises:
        ValueError: if ``eff_rank`` is not in ``[1, rank]``.
    """
    if rank < 1 or not (1 - 1e-12 <= eff_rank <= rank + 1e-12):
        raise ValueError(f"need 1 <= eff_rank <= rank, got eff_rank={eff_rank}, rank={rank}")
    if rank == 1:
        return 1.0, 1.0

    def solve(which: int) -> float:
        a, b = 1.0 / rank, 1.0  # bound(a) = rank >= eff_rank >= bound(b) = 1
        for _ in range(200):
            mid = 0.5 * (a + b)
            if effective_rank_range(mid, rank)[which] >= eff_rank:
                a = mid
            else:
                b = mid
            if b - a < tol:
                break
        return 0.5 * (a + b)

    return solve(0), solve(1)


def _limit_gram(model: str, labels: np.ndarray) -> np.ndarray:
    from sims.psi_models import limit_gram

    name = model.split(" ")[0]
    return limit_gram(name, labels, **PSI_MODELS[model])


def expected_metric(model: str, estimator: str, *, R: int, p: float, key: str,
                    **opts: float) -> float:
    """``E[metric | group not degenerate]`` over ``k ~ Binomial(R, p)`` for a limit-Gram model."""
    ks = np.arange(R + 1)
    rows = (np.arange(R)[None, :] < ks[:, None]).astype(np.float64)
    A = np.asarray(compute_advantages(estimator, rows, **opts))
    vals, w = [], []
    for k in ks:
        m = spectral_metrics(_limit_gram(model, rows[k]), A[k])
        if not m.degenerate:
            vals.append(getattr(m, key))
            w.append(binom.pmf(k, R, p))
    w = np.array(w) / np.sum(w)
    return float(np.dot(w, vals))
