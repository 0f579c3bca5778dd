"""Small statistics helpers shared by the checks (z threshold, sample mean/SE, jackknife cosine)."""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_theory import compute_advantages

from .exact import estimator_options

__all__ = ["Z_THRESHOLD", "mean_se", "discrete_mean_sd", "adv", "var_cov_stats", "jackknife_cosine"]

#: The one pass threshold of every statistical check and test: ``|estimate - exact| <= k SE``
#: with ``k = Z_THRESHOLD`` (for a normal estimate, a false failure once in about 16 000 checks).
Z_THRESHOLD: float = 4.0


def mean_se(x: np.ndarray) -> tuple[float, float]:
    """Sample mean and its standard error ``std(ddof=1) / sqrt(n)`` (SE 0 for one sample)."""
    x = np.asarray(x, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0


def discrete_mean_sd(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Exact mean and standard deviation of a discrete distribution.

    ``mu = sum_j w_j x_j`` and ``sd = sqrt(sum_j w_j (x_j - mu)^2)`` for values ``x [m]`` with
    probabilities ``w [m]`` (``w >= 0``, normalised here). The SE of the mean of ``n`` i.i.d. draws
    is ``sd / sqrt(n)``: the yardstick of a Monte Carlo mean of a metric that is a known function
    of a discrete variable with a known law.

    >>> discrete_mean_sd(np.array([0.0, 1.0]), np.array([0.75, 0.25]))
    (0.25, 0.4330127018922193)
    """
    x = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if x.shape != w.shape or x.ndim != 1:
        raise ValueError(f"values and weights must be 1-D of one shape, got {x.shape}, {w.shape}")
    if np.any(w < 0) or not w.sum() > 0:
        raise ValueError("weights must be >= 0 with a positive sum")
    w = w / w.sum()
    mu = float(w @ x)
    return mu, float(np.sqrt(w @ (x - mu) ** 2))


def adv(estimator: str, rewards: np.ndarray, opts: dict[str, Any] | None) -> np.ndarray:
    """Advantages ``[P, R]`` via :func:`grpo_theory.compute_advantages` (default options of
    :data:`sims.exact.ESTIMATOR_SPECS` when ``opts`` is None)."""
    return np.asarray(compute_advantages(estimator, rewards, **estimator_options(estimator, opts)))


def var_cov_stats(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group unbiased-in-expectation statistics of Var(A_i) and Cov(A_i, A_j)."""
    R = A.shape[1]
    c = A - A.mean()
    s1 = c.sum(1)
    s2 = (c**2).sum(1)
    return s2 / R, (s1**2 - s2) / (R * (R - 1))


def jackknife_cosine(g: np.ndarray, ref: np.ndarray, n_batches: int = 20) -> tuple[float, float]:
    """Cosine of the mean of ``g [n, d]`` with ``ref``, and its jackknife SE over batches."""

    def cos(v: np.ndarray) -> float:
        return float(v @ ref / (np.linalg.norm(v) * np.linalg.norm(ref)))

    n = g.shape[0]
    nb = min(n_batches, n)
    sums = np.stack([b.sum(0) for b in np.array_split(g, nb)])
    counts = np.array([b.shape[0] for b in np.array_split(g, nb)], dtype=np.float64)
    full = cos(sums.sum(0) / n)
    loo = np.array([cos((sums.sum(0) - sums[i]) / (n - counts[i])) for i in range(nb)])
    se = float(np.sqrt((nb - 1) / nb * np.sum((loo - loo.mean()) ** 2)))
    return full, se
