"""Spectral metrics of the GRPO gradient matrix ``G = diag(w) Psi`` (rows ``w_i psi_i``).

The seed paper (Sec. 7.1) stacks the per-rollout contributions ``A_i psi_i^T`` into
``G in R^{R x d}`` and reports its effective rank and top-1 fraction. ``d`` is huge, so we never
form ``G``: its nonzero singular values are the square roots of the eigenvalues of the ``R x R``
matrix ``G G^T = diag(w) K diag(w)``, with ``K_ij = <psi_i, psi_j>`` the Gram matrix of the
trajectory scores (Eq. 18) and ``w_i`` the effective per-rollout weight (the advantage ``A_i``
times the aggregation weight of :mod:`grpo_theory.aggregation`).

Metrics of singular values ``s_1 >= ... >= s_R >= 0``:

* rank: ``#{s_i > rtol * s_1}`` (``rtol`` stated; default ``1e-6``, suitable for float64 Grams).
* effective rank (paper, Sec. 7.1): ``(sum s)^2 / sum s^2``; always ``<= rank``.
* entropy effective rank (Roy & Vetterli 2007): ``exp(H(p))``, ``p_i = s_i / sum s``.
* stable rank: ``sum s^2 / s_1^2``.
* top-1 fraction (paper, Sec. 7.1): ``s_1^2 / sum s^2``.

A group whose weights are all zero has ``G = 0``: rank 0 and the ratio metrics undefined; they
are reported as NaN in :class:`SpectralMetrics` with ``degenerate=True`` (documented, not silent:
the flag says why), since a zero-advantage group contributes no gradient at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "SpectralMetrics",
    "gradient_gram",
    "singular_values_from_gram",
    "numerical_rank",
    "effective_rank",
    "entropy_effective_rank",
    "stable_rank",
    "top1_fraction",
    "spectral_metrics",
    "spectral_metrics_from_matrix",
    "gram_isotropic",
    "gram_clustered",
    "gram_common_component",
    "isotropic_effective_rank_binary",
]

DEFAULT_RTOL = 1e-6


def _as_square(K: Any, name: str = "K") -> np.ndarray:
    k = np.asarray(K.detach().cpu().double() if hasattr(K, "detach") else K, dtype=np.float64)
    if k.ndim != 2 or k.shape[0] != k.shape[1]:
        raise ValueError(f"{name} must be a square R x R matrix, got shape {k.shape}")
    if not np.all(np.isfinite(k)):
        raise ValueError(f"{name} contains NaN or inf")
    return k


def _as_vector(w: Any, R: int, name: str = "weights") -> np.ndarray:
    v = np.asarray(w.detach().cpu().double() if hasattr(w, "detach") else w, dtype=np.float64)
    if v.shape != (R,):
        raise ValueError(f"{name} must be shaped [R]=[{R}], got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} contains NaN or inf")
    return v


def gradient_gram(K: Any, weights: Any) -> np.ndarray:
    """``G G^T = diag(w) K diag(w)`` for ``G = diag(w) Psi`` and ``K = Psi Psi^T``.

    Args:
        K: ``[R, R]`` Gram matrix of trajectory scores, ``K_ij = <psi_i, psi_j>``.
        weights: ``[R]`` per-rollout weights (advantages times aggregation weights).

    Returns:
        ``[R, R]`` float64 matrix.
    """
    k = _as_square(K)
    w = _as_vector(weights, k.shape[0])
    return w[:, None] * k * w[None, :]


def singular_values_from_gram(M: Any) -> np.ndarray:
    """Singular values of ``G`` from ``M = G G^T``: ``sqrt(max(eig(M), 0))``, descending.

    Args:
        M: ``[R, R]`` symmetric positive semi-definite matrix.

    Returns:
        ``[R]`` nonnegative singular values, descending; eigenvalues below the round-off floor
        ``R * eps_machine * max|eig|`` are set to 0 (so singular values below about
        ``1e-7 s_1`` read as 0).
    """
    m = _as_square(M, "M")
    m = 0.5 * (m + m.T)
    ev = np.linalg.eigvalsh(m)[::-1]
    # Eigenvalues below the round-off floor R * eps_machine * max|eig| are numerically zero; the
    # square root would turn that noise (~1e-16 relative) into spurious singular values
    # (~1e-8 relative) that inflate the effective ranks. Singular values below
    # sqrt(R * eps_machine) * s_1 (~1e-7 s_1) cannot be resolved from a Gram matrix.
    floor = ev.size * np.finfo(np.float64).eps * (np.abs(ev).max() if ev.size else 0.0)
    ev = np.where(ev > floor, ev, 0.0)
    return np.sqrt(ev)


def numerical_rank(s: Any, *, rtol: float = DEFAULT_RTOL) -> int:
    """Number of singular values ``> rtol * s_max`` (0 for an all-zero spectrum)."""
    s = np.asarray(s, dtype=np.float64)
    if s.size == 0 or s.max() <= 0:
        return 0
    return int(np.sum(s > rtol * s.max()))


def effective_rank(s: Any) -> float:
    """Paper's effective rank (Sec. 7.1): ``(sum_i s_i)^2 / sum_i s_i^2``; NaN if ``s = 0``.

    >>> effective_rank([1.0, 1.0, 0.0])
    2.0
    """
    s = np.asarray(s, dtype=np.float64)
    q = float(np.sum(s**2))
    return float(np.sum(s) ** 2 / q) if q > 0 else float("nan")


def entropy_effective_rank(s: Any) -> float:
    """Roy & Vetterli (2007) effective rank ``exp(-sum p_i log p_i)``, ``p_i = s_i / sum s``."""
    s = np.asarray(s, dtype=np.float64)
    tot = float(np.sum(s))
    if tot <= 0:
        return float("nan")
    p = s[s > 0] / tot
    return float(np.exp(-np.sum(p * np.log(p))))


def stable_rank(s: Any) -> float:
    """Stable rank ``sum s^2 / s_max^2``; NaN if ``s = 0``."""
    s = np.asarray(s, dtype=np.float64)
    m = float(np.max(s)) if s.size else 0.0
    return float(np.sum(s**2) / m**2) if m > 0 else float("nan")


def top1_fraction(s: Any) -> float:
    """Paper's top-1 fraction (Sec. 7.1): ``s_1^2 / sum s^2``; NaN if ``s = 0``."""
    s = np.asarray(s, dtype=np.float64)
    q = float(np.sum(s**2))
    return float(np.max(s) ** 2 / q) if q > 0 else float("nan")


@dataclass(frozen=True)
class SpectralMetrics:
    """Spectrum of one group's gradient matrix and the metrics derived from it."""

    singular_values: tuple[float, ...]
    rank: int
    effective_rank: float
    entropy_effective_rank: float
    stable_rank: float
    top1_fraction: float
    rtol: float
    degenerate: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["singular_values"] = list(self.singular_values)
        return d


def _metrics_from_s(s: np.ndarray, rtol: float) -> SpectralMetrics:
    return SpectralMetrics(
        singular_values=tuple(float(x) for x in s),
        rank=numerical_rank(s, rtol=rtol),
        effective_rank=effective_rank(s),
        entropy_effective_rank=entropy_effective_rank(s),
        stable_rank=stable_rank(s),
        top1_fraction=top1_fraction(s),
        rtol=rtol,
        degenerate=bool(s.size == 0 or s.max() <= 0),
    )


def spectral_metrics(K: Any, weights: Any, *, rtol: float = DEFAULT_RTOL) -> SpectralMetrics:
    """All metrics of ``G = diag(weights) Psi`` from the trajectory-score Gram ``K``.

    Args:
        K: ``[R, R]`` Gram of the trajectory scores ``psi_i`` (Eq. 18).
        weights: ``[R]`` effective weights (advantages ``A_i`` times aggregation weights).
        rtol: relative tolerance of the numerical rank (default ``1e-6``).

    Returns:
        :class:`SpectralMetrics`.

    >>> m = spectral_metrics(np.eye(4), [0.5, 0.5, -0.5, -0.5])
    >>> (m.rank, m.effective_rank, m.top1_fraction)
    (4, 4.0, 0.25)
    """
    s = singular_values_from_gram(gradient_gram(K, weights))
    return _metrics_from_s(s, rtol)


def spectral_metrics_from_matrix(G: Any, *, rtol: float = DEFAULT_RTOL) -> SpectralMetrics:
    """Metrics from an explicit ``[R, d]`` matrix ``G`` (reference path: an SVD, no Gram).

    For ``d > R`` the SVD is taken of the ``R x R`` triangular factor of ``G^T = Q T``
    (same singular values).
    """
    g = np.asarray(G.detach().cpu().double() if hasattr(G, "detach") else G, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"G must be 2-D [R, d], got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("G contains NaN or inf")
    if g.shape[1] > g.shape[0]:
        # wide G (d > R): G^T = Q T with T an R x R triangle holding the same singular values;
        # no squaring (unlike the Gram route) and much faster than an SVD of R x d.
        g = np.linalg.qr(g.T, mode="r")
    s = np.linalg.svd(g, compute_uv=False)
    return _metrics_from_s(np.sort(s)[::-1], rtol)


# --- closed-form reference Grams (limit d -> infinity, normalised by d) ------------------------
def gram_isotropic(R: int) -> np.ndarray:
    """``E[K]/d`` for ``psi_i ~ N(0, I_d)`` i.i.d.: the identity (off-diagonals vanish as d grows).

    With ``K = I`` the singular values of ``G`` are ``|w_i|``, so the effective rank is
    ``(sum |w_i|)^2 / sum w_i^2``: for binary rewards see :func:`isotropic_effective_rank_binary`.
    """
    if R < 1:
        raise ValueError(f"R must be >= 1, got {R}")
    return np.eye(R)


def gram_clustered(
    labels: Any, *, within: float = 1.0, between: float = 0.0, noise: float = 0.0
) -> np.ndarray:
    """Gram of scores clustered by reward label: ``psi_i = mu_{label(i)} + noise_i``.

    ``<mu_a, mu_a> = within``, ``<mu_a, mu_b> = between`` (a != b), and ``noise`` is the
    per-rollout isotropic variance (added on the diagonal, the d -> infinity limit).

    Args:
        labels: ``[R]`` integer labels (e.g. the binary reward).
        within: squared norm of each cluster centre.
        between: inner product of different centres.
        noise: isotropic noise energy per rollout.

    Returns:
        ``[R, R]`` Gram matrix.
    """
    lab = np.asarray(labels)
    if lab.ndim != 1:
        raise ValueError(f"labels must be 1-D [R], got shape {lab.shape}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    same = lab[:, None] == lab[None, :]
    K = np.where(same, within, between).astype(np.float64)
    return K + noise * np.eye(lab.size)


def gram_common_component(R: int, *, strength: float) -> np.ndarray:
    """Gram of ``psi_i = sqrt(strength) c + xi_i`` (``|c| = 1``, ``xi`` isotropic unit energy).

    ``K = strength * 1 1^T + I`` in the d -> infinity limit.
    """
    if R < 1 or strength < 0:
        raise ValueError(f"need R >= 1 and strength >= 0, got R={R}, strength={strength}")
    return strength * np.ones((R, R)) + np.eye(R)


def isotropic_effective_rank_binary(R: int, k: int) -> float:
    """Effective rank of ``diag(A) Psi`` with isotropic ``psi`` and binary rewards, ``k`` successes.

    Mean-centred advantages are ``1 - k/R`` (k times) and ``-k/R`` (R - k times), so
    ``(sum |A|)^2 / sum A^2 = 4 k (R - k) / R`` (NaN for k in {0, R}: A = 0). Equals R at k = R/2:
    with isotropic scores the effective rank grows with R; nothing in the zero-sum constraint
    caps it at 2.

    >>> isotropic_effective_rank_binary(8, 4)
    8.0
    """
    if not 0 <= k <= R:
        raise ValueError(f"need 0 <= k <= R, got k={k}, R={R}")
    if k in (0, R):
        return float("nan")
    return 4.0 * k * (R - k) / R
