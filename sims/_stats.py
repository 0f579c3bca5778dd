"""Small statistics helpers shared by the checks (z threshold, exact finite laws, sample
mean/SE, jackknife cosine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_theory import binom_pmf, compute_advantages

from .exact import estimator_options

__all__ = [
    "Z_THRESHOLD", "FiniteLaw", "group_count_law", "mean_se", "discrete_mean_sd", "adv",
    "var_cov_stats", "jackknife_cosine",
]

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


@dataclass(frozen=True)
class FiniteLaw:
    """The exact law of a per-group statistic with finitely many values.

    ``values [m]`` (sorted; values within ``tol`` of each other merged) with probabilities
    ``weights [m]`` (summing to 1). The law of every per-group statistic of a group of ``R``
    i.i.d. Bernoulli(p) rewards that depends only on the success count ``k`` (an estimator's
    advantages are exchangeable) is a law over ``k ~ Binomial(R, p)``: :func:`group_count_law`.

    >>> law = FiniteLaw.of([0.0, 1.0, 0.0], [0.5, 0.25, 0.25])
    >>> law.values.tolist(), law.weights.tolist(), law.mean, law.mode, law.off_mode
    ([0.0, 1.0], [0.75, 0.25], 0.25, 0.0, 0.25)
    """

    values: np.ndarray
    weights: np.ndarray
    tol: float

    @classmethod
    def of(cls, values: Any, weights: Any, *, rtol: float = 1e-9) -> FiniteLaw:
        """The law with ``P(X = values[j]) = weights[j]`` (normalised; close values merged)."""
        x = np.asarray(values, dtype=np.float64).ravel()
        w = np.asarray(weights, dtype=np.float64).ravel()
        if x.shape != w.shape or x.size == 0:
            raise ValueError(
                f"values and weights must be 1-D of one shape, got {x.shape}, {w.shape}")
        if not (np.all(np.isfinite(x)) and np.all(w >= 0) and w.sum() > 0):
            raise ValueError(
                "a finite law needs finite values and weights >= 0 with a positive sum")
        tol = rtol * max(1.0, float(np.abs(x).max()))
        order = np.argsort(x, kind="stable")
        x, w = x[order], w[order] / w.sum()
        start = np.concatenate([[True], np.diff(x) > tol])
        groups = np.cumsum(start) - 1
        return cls(x[start], np.bincount(groups, weights=w), tol)

    @property
    def mean(self) -> float:
        """``sum_j w_j x_j``."""
        return float(self.weights @ self.values)

    @property
    def sd(self) -> float:
        """``sqrt(sum_j w_j (x_j - mean)^2)``."""
        return float(np.sqrt(self.weights @ (self.values - self.mean) ** 2))

    @property
    def mode(self) -> float:
        """The most probable value."""
        return float(self.values[int(np.argmax(self.weights))])

    @property
    def off_mode(self) -> float:
        """``P(X != mode)``."""
        return float(1.0 - self.weights.max())

    def count_off_mode(self, samples: np.ndarray) -> int:
        """How many ``samples`` differ from the mode (by more than ``tol``)."""
        return int(np.count_nonzero(np.abs(np.asarray(samples, float) - self.mode) > self.tol))

    def count_off_support(self, samples: np.ndarray) -> int:
        """How many ``samples`` lie farther than ``tol`` from every value of the law."""
        s = np.asarray(samples, dtype=np.float64).ravel()
        i = np.clip(np.searchsorted(self.values, s), 1, self.values.size - 1)
        if self.values.size == 1:
            near = np.abs(s - self.values[0])
        else:
            near = np.minimum(np.abs(s - self.values[i - 1]), np.abs(s - self.values[i]))
        return int(np.count_nonzero(near > self.tol))


def group_count_law(
    estimator: str,
    *,
    R: int,
    p: float,
    opts: dict[str, Any] | None,
    statistic: Any,
) -> FiniteLaw:
    """The exact law of ``statistic(A, rewards) -> [m]`` over ``k ~ Binomial(R, p)`` successes.

    The statistic is evaluated on the ``R + 1`` canonical groups ``[1]*k + [0]*(R-k)`` with the
    estimator's advantages ``A`` (:func:`adv`); it must be a symmetric function of the group
    (the checks verify that every sampled value lies in the law's support).
    """
    ks = np.arange(R + 1)
    rows = (np.arange(R)[None, :] < ks[:, None]).astype(np.float64)
    A = adv(estimator, rows, opts)
    return FiniteLaw.of(np.asarray(statistic(A, rows), dtype=np.float64), binom_pmf(ks, R, p))


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
