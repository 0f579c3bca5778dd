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

Input rules (errors name the problem, nothing is clamped silently):

* ``K`` must be real, finite and symmetric to within ``PSD_RTOL * max|K|``; its eigenvalues
  may be negative only by round-off, ``lambda_min >= -PSD_RTOL * max|lambda|`` (default
  ``PSD_RTOL = 1e-5``, which covers Grams accumulated in float32, ``R * eps_32`` for ``R <= 64``);
  such round-off eigenvalues are set to 0, anything more negative is an error naming it.
* All metrics are scale-free: ``K`` and the weights are normalised by their largest magnitude
  before any product or square, so weights of order ``1e-200`` or singular values of order
  ``1e200`` give the same ranks as order 1 (the reported singular values are scaled back).
* Singular values passed to the metric functions must be real, finite and ``>= 0``.

Groups of one size go together: :func:`spectral_metrics_batch` takes ``K [G, R, R]`` and
``weights [G, R]`` and returns, float for float, the ``G`` results of :func:`spectral_metrics`
(each step is one vectorised operation over the leading group axis, the eigenvalues one batched
``eigvalsh``; :func:`spectral_metrics` is the batch of one). Errors name the group, ``K[g]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ._validate import check_R, real_option
from .limits import SQUARE_R_MAX, check_R_limit

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
    "spectral_metrics_batch",
    "spectral_metrics_from_matrix",
    "gram_isotropic",
    "gram_clustered",
    "gram_common_component",
    "isotropic_effective_rank_binary",
]

DEFAULT_RTOL = 1e-6
PSD_RTOL = 1e-5

_LOG_FLOAT_MAX = math.log(np.finfo(np.float64).max)
_EPS = float(np.finfo(np.float64).eps)


def _real_float64(x: Any, name: str) -> np.ndarray:
    """``x`` (array-like or torch tensor) as a real float64 array; complex input is an error."""
    if hasattr(x, "detach"):
        if x.is_complex():
            raise TypeError(f"{name} must be real, got a complex tensor ({x.dtype})")
        if x.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (no data); materialise it first")
        x = x.detach().cpu().double()
    arr = np.asarray(x)
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, got complex values (dtype {arr.dtype})")
    try:
        return np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real numeric array, got {type(x).__name__}") from exc


def _check_rtol(rtol: Any, name: str = "rtol") -> float:
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {type(rtol).__name__}")
    r = float(rtol)
    if not 0.0 <= r < 1.0:  # NaN fails too
        raise ValueError(f"{name} must satisfy 0 <= {name} < 1, got {rtol!r}")
    return r


def _as_spectrum(s: Any) -> np.ndarray:
    """Singular values as a 1-D float64 array, checked real, finite and nonnegative."""
    v = _real_float64(s, "singular values").reshape(-1)
    if not np.all(np.isfinite(v)):
        raise ValueError("singular values contain NaN or inf")
    if v.size and v.min() < 0:
        raise ValueError(f"singular values must be >= 0, got {float(v.min())!r}")
    return v


def _unit(s: np.ndarray) -> np.ndarray | None:
    """``s / max(s)`` (scale-free form), or None for an all-zero or empty spectrum."""
    m = float(s.max()) if s.size else 0.0
    return s / m if m > 0 else None


def _label(name: str, g: tuple[int, ...]) -> str:
    """``name`` of the group at leading index ``g``: ``K`` for ``()``, ``K[3]`` for ``(3,)``."""
    return name + "".join(f"[{i}]" for i in g)


def _first(bad: np.ndarray) -> tuple[int, ...]:
    """Leading index of the first True entry of ``bad`` (``()`` for a 0-d ``bad``)."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))


def _check_finite(x: np.ndarray, name: str, lead: int) -> None:
    """NaN or inf in ``x`` is an error naming the first group (``lead`` leading group axes)."""
    if not np.all(np.isfinite(x)):
        bad = ~np.isfinite(x).reshape(*x.shape[:lead], -1).all(axis=-1)
        raise ValueError(f"{_label(name, _first(bad))} contains NaN or inf")


def _as_square(K: Any, name: str = "K", *, stack: bool = False) -> np.ndarray:
    """``K`` as a real finite float64 ``[R, R]`` matrix, or ``[G, R, R]`` stack if ``stack``."""
    k = _real_float64(K, name)
    if stack:
        if k.ndim != 3 or k.shape[1] != k.shape[2]:
            raise ValueError(
                f"{name} must be a stack of G square R x R matrices [G, R, R], got shape {k.shape}"
            )
    elif k.ndim != 2 or k.shape[0] != k.shape[1]:
        raise ValueError(f"{name} must be a square R x R matrix, got shape {k.shape}")
    _check_finite(k, name, k.ndim - 2)
    return k


def _as_vector(w: Any, R: int, name: str = "weights", *, G: int | None = None) -> np.ndarray:
    """``w`` as a real finite float64 ``[R]`` vector, or ``[G, R]`` rows if ``G`` is given."""
    v = _real_float64(w, name)
    shape, dims = ((R,), "[R]") if G is None else ((G, R), "[G, R]")
    if v.shape != shape:
        raise ValueError(
            f"{name} must be shaped {dims}=[{', '.join(map(str, shape))}], got shape {v.shape}"
        )
    _check_finite(v, name, v.ndim - 1)
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


def _check_psd(m: np.ndarray, name: str, psd_rtol: float) -> np.ndarray:
    """Symmetrised ``m [..., R, R]`` after checking symmetry and eigenvalue signs up to
    ``psd_rtol``, each matrix on its own scale ``max|m|`` (errors name the first bad one:
    ``K`` for one matrix, ``K[g]`` in a stack; an all-zero matrix passes unchanged)."""
    if m.size == 0:
        return m
    scale = np.abs(m).max(axis=(-2, -1))  # [...]
    live = scale > 0.0
    if not live.any():
        return m
    c = np.where(live, scale, 1.0)[..., None, None]
    u = m / c  # scale-free: no under/overflow in the checks below
    ut = np.swapaxes(u, -1, -2)
    diff = np.abs(u - ut)
    asym = diff.max(axis=(-2, -1))
    if np.any(asym > psd_rtol):
        g = _first(asym > psd_rtol)
        lab = _label(name, g)
        i, j = np.unravel_index(int(np.argmax(diff[g])), m.shape[-2:])
        raise ValueError(
            f"{lab} must be symmetric: |{lab}[{i},{j}] - {lab}[{j},{i}]| = "
            f"{float(asym[g]) * float(scale[g]):.3g} exceeds {psd_rtol:g} * max|{lab}| "
            "(a Gram matrix <psi_i, psi_j> is symmetric)"
        )
    u = 0.5 * (u + ut)
    ev = np.linalg.eigvalsh(u)  # [..., R] ascending
    top = np.abs(ev).max(axis=-1)
    low = ev[..., 0] < -psd_rtol * top
    if np.any(low):
        g = _first(low)
        sc, tp = float(scale[g]), float(top[g])
        raise ValueError(
            f"{_label(name, g)} is not positive semi-definite: eigenvalue "
            f"{float(ev[g][0]) * sc:.6g} is below -{psd_rtol:g} * max|eigenvalue| = "
            f"{-psd_rtol * tp * sc:.3g} (a Gram matrix has eigenvalues >= 0; only round-off "
            "within psd_rtol is set to 0)"
        )
    return u * c if live.all() else np.where(live[..., None, None], u * c, m)


def _sv_unit(m: np.ndarray) -> np.ndarray:
    """Singular values ``[..., R]`` (descending) of ``G`` from symmetric ``M = G G^T [..., R, R]``
    normalised to ``max|M| = 1`` (each matrix of the leading axes on its own).

    Eigenvalues below the round-off floor ``R * eps_machine * max|eig|`` (including the
    negative round-off admitted by :func:`_check_psd`) are set to 0: the square root would turn
    that noise (~1e-16 relative) into spurious singular values (~1e-8 relative) that inflate the
    effective ranks. Singular values below ``sqrt(R * eps_machine) * s_1`` (~1e-7 ``s_1``)
    cannot be resolved from a Gram matrix.
    """
    ev = np.linalg.eigvalsh(0.5 * (m + np.swapaxes(m, -1, -2)))[..., ::-1]
    R = ev.shape[-1]
    floor = R * _EPS * (np.abs(ev).max(axis=-1, keepdims=True) if R else 0.0)
    ev = np.where(ev > floor, ev, 0.0)
    return np.sqrt(ev)


def singular_values_from_gram(M: Any, *, psd_rtol: float = PSD_RTOL) -> np.ndarray:
    """Singular values of ``G`` from ``M = G G^T``: ``sqrt(eig(M))``, descending.

    Args:
        M: ``[R, R]`` symmetric positive semi-definite matrix.
        psd_rtol: admitted relative round-off: asymmetry up to ``psd_rtol * max|M|`` and
            eigenvalues down to ``-psd_rtol * max|eig|`` (set to 0); more is a ``ValueError``.

    Returns:
        ``[R]`` nonnegative singular values, descending; eigenvalues below the round-off floor
        ``R * eps_machine * max|eig|`` are set to 0 (so singular values below about
        ``1e-7 s_1`` read as 0). Computed on ``M / max|M|`` and scaled back, so no under- or
        overflow for any finite scale.

    >>> singular_values_from_gram(np.diag([4.0, 1.0, 0.0])).tolist()
    [2.0, 1.0, 0.0]
    """
    tol = _check_rtol(psd_rtol, "psd_rtol")
    m = _check_psd(_as_square(M, "M"), "M", tol)
    scale = float(np.abs(m).max()) if m.size else 0.0
    if scale == 0.0:
        return np.zeros(m.shape[0])
    return _sv_unit(m / scale) * np.sqrt(scale)


def numerical_rank(s: Any, *, rtol: float = DEFAULT_RTOL) -> int:
    """Number of singular values ``> rtol * s_max`` (0 for an all-zero spectrum).

    >>> numerical_rank([2.0, 1e-9, 0.0])
    1
    """
    r = _check_rtol(rtol)
    u = _unit(_as_spectrum(s))
    return 0 if u is None else int(_rank_of_unit(u, r))


def effective_rank(s: Any) -> float:
    """Paper's effective rank (Sec. 7.1): ``(sum_i s_i)^2 / sum_i s_i^2``; NaN if ``s = 0``.

    Computed on ``s / max(s)`` (scale-free: no under/overflow for any finite scale).

    >>> effective_rank([1.0, 1.0, 0.0])
    2.0
    """
    u = _unit(_as_spectrum(s))
    return float("nan") if u is None else float(_effective_rank_of_unit(u))


def entropy_effective_rank(s: Any) -> float:
    """Roy & Vetterli (2007) effective rank ``exp(-sum p_i log p_i)``, ``p_i = s_i / sum s``.

    >>> entropy_effective_rank([1.0, 1.0, 0.0])
    2.0
    """
    u = _unit(_as_spectrum(s))
    return float("nan") if u is None else float(_entropy_effective_rank_of_unit(u))


def stable_rank(s: Any) -> float:
    """Stable rank ``sum s^2 / s_max^2``; NaN if ``s = 0``.

    >>> stable_rank([2.0, 1.0])
    1.25
    """
    u = _unit(_as_spectrum(s))
    return float("nan") if u is None else float(_stable_rank_of_unit(u))


def top1_fraction(s: Any) -> float:
    """Paper's top-1 fraction (Sec. 7.1): ``s_1^2 / sum s^2``; NaN if ``s = 0``.

    >>> top1_fraction([1.0, 1.0])
    0.5
    """
    u = _unit(_as_spectrum(s))
    return float("nan") if u is None else 1.0 / float(_stable_rank_of_unit(u))


# the metrics of unit spectra u [..., R] = s / max(s) along the last axis (checked, none all
# zero), one value per spectrum [...]: one formula each
def _rank_of_unit(u: np.ndarray, rtol: float) -> np.ndarray:
    return np.count_nonzero(u > rtol, axis=-1)


def _effective_rank_of_unit(u: np.ndarray) -> np.ndarray:
    return np.sum(u, axis=-1) ** 2 / np.sum(u**2, axis=-1)


def _stable_rank_of_unit(u: np.ndarray) -> np.ndarray:  # sum u^2; the top-1 fraction is 1 / it
    return np.sum(u**2, axis=-1)


def _entropy_effective_rank_of_unit(u: np.ndarray) -> np.ndarray:
    p = u / np.sum(u, axis=-1, keepdims=True)
    # p_i log p_i with 0 log 0 = 0: log(1) = 0 stands in for log(0), so no warning and no NaN
    return np.exp(-np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=-1))


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
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # flat: no deep copy
        d["singular_values"] = list(self.singular_values)
        return d


def _metrics_from_spectra(
    s: np.ndarray, rtol: float, scales: np.ndarray, log_scales: np.ndarray | None = None
) -> list[SpectralMetrics]:
    """Metrics of ``scales[g] * s[g]`` for spectra ``s [G, R]`` (checked: finite, ``>= 0``,
    descending) and ``scales [G]``. Every metric but the values is scale-free, so they are
    computed on the unit spectra ``u = s / max(s)`` and only the reported values are scaled;
    an all-zero spectrum is degenerate (rank 0, NaN ratios). ``log_scales [G]``: where not NaN,
    the group's values are ``exp(log s + log_scales[g])`` instead (a scale outside the float
    range)."""
    G, R = s.shape
    top = s.max(axis=-1, initial=0.0)
    live = top > 0.0
    # the spectra share one unit form; a degenerate one has none (ones stand in, unread)
    u = (np.where(live[:, None], s / np.where(live, top, 1.0)[:, None], 1.0) if R
         else np.ones((G, 1)))
    square_sum = _stable_rank_of_unit(u)
    rank = _rank_of_unit(u, rtol).tolist()
    eff = _effective_rank_of_unit(u).tolist()
    ent = _entropy_effective_rank_of_unit(u).tolist()
    top1 = (1.0 / square_sum).tolist()
    values = s * scales[:, None]
    if log_scales is not None:
        by_log = ~np.isnan(log_scales)
        with np.errstate(divide="ignore"):  # log 0 = -inf: exp gives the zero back
            values[by_log] = np.exp(np.log(s[by_log]) + log_scales[by_log, None])
    values = values.tolist()
    nan = float("nan")
    return [
        SpectralMetrics(
            singular_values=tuple(values[g]),
            rank=rank[g] if ok else 0,
            effective_rank=eff[g] if ok else nan,
            entropy_effective_rank=ent[g] if ok else nan,
            stable_rank=sq if ok else nan,  # sum s^2 / s_max^2 (stable_rank)
            top1_fraction=top1[g] if ok else nan,  # s_1^2 / sum s^2 (top1_fraction)
            rtol=rtol,
            degenerate=not ok,
        )
        for g, (ok, sq) in enumerate(zip(live.tolist(), square_sum.tolist(), strict=True))
    ]


def _metrics_from_s(s: np.ndarray, rtol: float, scale: float = 1.0) -> SpectralMetrics:
    """Metrics of ``scale * s`` for one spectrum ``s [R]`` (:func:`_metrics_from_spectra`)."""
    return _metrics_from_spectra(s[None], rtol, np.array([scale]))[0]


def _spectral_metrics_stack(
    k: np.ndarray, w: np.ndarray, rtol: float, *, name_groups: bool
) -> list[SpectralMetrics]:
    """Metrics of ``G_g = diag(w_g) Psi_g`` for validated ``k [G, R, R]`` (symmetrised, PSD up to
    round-off) and ``w [G, R]``, each group on its own scale (``name_groups``: errors say
    ``K[g]``, else they read as for one group)."""
    G, R = w.shape
    ck = np.abs(k).max(axis=(-2, -1), initial=0.0)  # [G]
    cw = np.abs(w).max(axis=-1, initial=0.0)  # [G]
    live = (ck > 0.0) & (cw > 0.0)
    if not live.any():  # every group degenerate (also G = 0 or R = 0)
        return _metrics_from_spectra(np.zeros((G, R)), rtol, np.ones(G))
    ck, cw = np.where(live, ck, 1.0), np.where(live, cw, 1.0)
    # scale-free: normalise K and w before the products (weights ~1e-200 must not underflow);
    # s(G) = cw * sqrt(ck) * s(diag(w/cw) (K/ck) diag(w/cw)).
    u = w / cw[:, None]
    m = u[:, :, None] * (k / ck[:, None, None]) * u[:, None, :]
    mx = np.abs(m).max(axis=(-2, -1))
    live &= mx > 0.0
    mx = np.where(live, mx, 1.0)
    s = _sv_unit(m / mx[:, None, None])  # [G, R]
    if not live.all():
        s = np.where(live[:, None], s, 0.0)
    # the reported singular values are scale * s: refuse (before multiplying) when they leave
    # the float range; every other metric is scale-free
    log_scale = np.log(cw) + 0.5 * (np.log(ck) + np.log(mx))  # [G]
    log_top = log_scale + np.log(np.maximum(s.max(axis=-1), 1e-300))
    near = live & (log_top > _LOG_FLOAT_MAX - 1e-9)  # np.log within an ulp of math.log
    for g in np.flatnonzero(near).tolist():  # decided in math.log, as for one group
        cwg, ckg, mxg = float(cw[g]), float(ck[g]), float(mx[g])
        lt = (math.log(cwg) + 0.5 * (math.log(ckg) + math.log(mxg))
              + math.log(max(float(s[g].max()), 1e-300)))
        if lt > _LOG_FLOAT_MAX:
            at = f"[{g}]" if name_groups else ""
            raise ValueError(
                f"the singular values of diag(weights{at}) Psi{at} exceed the float range (max "
                f"|{'weights' + at if name_groups else 'weight'}| {cwg:.3g}, max |K{at}| "
                f"{ckg:.3g}): rescale the weights or the scores"
            )
    with np.errstate(over="ignore", under="ignore"):
        scales = np.where(live, cw * np.sqrt(ck) * np.sqrt(mx), 1.0)
    # the product of the three factors can leave the float range where the values do not
    # (weights 1e300 on scores of norm 1 and 1e-50: values 1e300, cw sqrt(ck) = inf): there the
    # values are formed from the logarithms (relative error ~|log scale| ulp, 1e-13 at most)
    off = live & ~(np.isfinite(scales) & (scales >= np.finfo(np.float64).tiny))
    log_scales = np.where(off, log_scale, np.nan) if off.any() else None
    return _metrics_from_spectra(s, rtol, scales, log_scales)


def spectral_metrics(
    K: Any, weights: Any, *, rtol: float = DEFAULT_RTOL, psd_rtol: float = PSD_RTOL
) -> SpectralMetrics:
    """All metrics of ``G = diag(weights) Psi`` from the trajectory-score Gram ``K``.

    Args:
        K: ``[R, R]`` Gram of the trajectory scores ``psi_i`` (Eq. 18): real, symmetric and
            positive semi-definite up to ``psd_rtol`` (else ``ValueError`` naming the eigenvalue).
        weights: ``[R]`` effective weights (advantages ``A_i`` times aggregation weights).
        rtol: relative tolerance of the numerical rank, ``0 <= rtol < 1`` (default ``1e-6``).
        psd_rtol: admitted relative round-off in ``K`` (default ``PSD_RTOL = 1e-5``).

    Returns:
        :class:`SpectralMetrics`.

    >>> m = spectral_metrics(np.eye(4), [0.5, 0.5, -0.5, -0.5])
    >>> (m.rank, m.effective_rank, m.top1_fraction)
    (4, 4.0, 0.25)
    """
    r = _check_rtol(rtol)
    tol = _check_rtol(psd_rtol, "psd_rtol")
    k = _check_psd(_as_square(K), "K", tol)
    w = _as_vector(weights, k.shape[0])
    return _spectral_metrics_stack(k[None], w[None], r, name_groups=False)[0]


def spectral_metrics_batch(
    K: Any, weights: Any, *, rtol: float = DEFAULT_RTOL, psd_rtol: float = PSD_RTOL
) -> list[SpectralMetrics]:
    """:func:`spectral_metrics` of ``G`` groups of one size ``R`` at once.

    ``[spectral_metrics(K[g], weights[g]) for g in range(G)]``, float for float (the same
    operations per group, each one call over the group axis), for a fraction of the cost when
    the groups are small.

    Args:
        K: ``[G, R, R]`` Grams of the trajectory scores, each real, symmetric and positive
            semi-definite up to ``psd_rtol`` (else ``ValueError`` naming the group ``K[g]``).
        weights: ``[G, R]`` effective weights, one row per group.
        rtol: relative tolerance of the numerical rank, ``0 <= rtol < 1`` (default ``1e-6``).
        psd_rtol: admitted relative round-off in ``K`` (default ``PSD_RTOL = 1e-5``).

    Returns:
        ``G`` :class:`SpectralMetrics`, in group order (``[]`` for ``G = 0``).

    >>> ms = spectral_metrics_batch(np.stack([np.eye(2), np.ones((2, 2))]), np.ones((2, 2)))
    >>> [(m.rank, m.effective_rank) for m in ms]
    [(2, 2.0), (1, 1.0)]
    """
    r = _check_rtol(rtol)
    tol = _check_rtol(psd_rtol, "psd_rtol")
    k = _check_psd(_as_square(K, stack=True), "K", tol)
    w = _as_vector(weights, k.shape[2], G=k.shape[0])
    return _spectral_metrics_stack(k, w, r, name_groups=True)


def spectral_metrics_from_matrix(G: Any, *, rtol: float = DEFAULT_RTOL) -> SpectralMetrics:
    """Metrics from an explicit ``[R, d]`` matrix ``G`` (reference path: an SVD, no Gram).

    For ``d > R`` the SVD is taken of the ``R x R`` triangular factor of ``G^T = Q T``
    (same singular values).
    """
    r = _check_rtol(rtol)
    g = _real_float64(G, "G")
    if g.ndim != 2:
        raise ValueError(f"G must be 2-D [R, d], got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("G contains NaN or inf")
    c = float(np.abs(g).max()) if g.size else 0.0
    if c == 0.0:
        return _metrics_from_s(np.zeros(min(g.shape)), r)
    g = g / c  # normalised first: scale-free, no under/overflow in QR or SVD
    if g.shape[1] > g.shape[0]:
        # wide G (d > R): G^T = Q T with T an R x R triangle holding the same singular values;
        # no squaring (unlike the Gram route) and much faster than an SVD of R x d.
        g = np.linalg.qr(g.T, mode="r")
    s = np.linalg.svd(g, compute_uv=False)
    return _metrics_from_s(np.sort(s)[::-1], r, c)


# --- closed-form reference Grams (limit d -> infinity, normalised by d) ------------------------
def gram_isotropic(R: int) -> np.ndarray:
    """``E[K]/d`` for ``psi_i ~ N(0, I_d)`` i.i.d.: the identity (off-diagonals vanish as d grows).

    With ``K = I`` the singular values of ``G`` are ``|w_i|``, so the effective rank is
    ``(sum |w_i|)^2 / sum w_i^2``: for binary rewards see :func:`isotropic_effective_rank_binary`.
    """
    R = check_R(R)
    check_R_limit(R, limit=SQUARE_R_MAX, name="SQUARE_R_MAX", routine="gram_isotropic",
                  cost="an R x R matrix", alternative="it is the identity: with binary rewards "
                  "the effective rank is isotropic_effective_rank_binary(R, k) = 4k(R-k)/R")
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
    within, between, noise = (
        real_option(v, n) for v, n in ((within, "within"), (between, "between"), (noise, "noise"))
    )
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    check_R_limit(lab.size, limit=SQUARE_R_MAX, name="SQUARE_R_MAX", routine="gram_clustered",
                  cost="an R x R matrix", alternative="its spectrum has closed form: per cluster "
                  "of size m the block within J_m + noise I_m, coupled by between across clusters")
    same = lab[:, None] == lab[None, :]
    K = np.where(same, within, between).astype(np.float64)
    return K + noise * np.eye(lab.size)


def gram_common_component(R: int, *, strength: float) -> np.ndarray:
    """Gram of ``psi_i = sqrt(strength) c + xi_i`` (``|c| = 1``, ``xi`` isotropic unit energy).

    ``K = strength * 1 1^T + I`` in the d -> infinity limit.
    """
    R = check_R(R)
    strength = real_option(strength, "strength")
    if strength < 0:
        raise ValueError(f"need strength >= 0, got strength={strength}")
    check_R_limit(R, limit=SQUARE_R_MAX, name="SQUARE_R_MAX", routine="gram_common_component",
                  cost="an R x R matrix", alternative="its eigenvalues are R strength + 1 (once, "
                  "along the all-ones vector) and 1 (R - 1 times)")
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
    R = check_R(R)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an integer, got {k!r}")
    if not 0 <= k <= R:
        raise ValueError(f"need 0 <= k <= R, got k={k}, R={R}")
    if k in (0, R):
        return float("nan")
    return 4.0 * k * (R - k) / R
