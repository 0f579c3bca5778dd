"""Trajectory-score models for the spectra of ``G = diag(A) Psi`` (seed paper Sec. 5, 7).

Each model draws the ``R`` trajectory scores ``psi_i in R^d`` of one group, scaled so that the
expected Gram ``E[K] = E[Psi Psi^T]`` is the closed form of :mod:`grpo_theory.spectral`
(finite ``d`` adds ``O(1/sqrt(d))`` fluctuations; ``d = None`` returns the limit Gram itself):

* ``isotropic``: ``psi_i ~ N(0, I_d / d)``; ``E[K] = I`` (:func:`grpo_theory.gram_isotropic`).
* ``clustered``: ``psi_i = mu_{label(i)} + xi_i``, ``<mu_a, mu_a> = within``,
  ``<mu_a, mu_b> = between``, ``xi_i ~ N(0, noise I_d / d)``; ``E[K] =``
  :func:`grpo_theory.gram_clustered` (label = the binary reward).
* ``common``: ``psi_i = sqrt(strength) c + xi_i``, ``|c| = 1``, ``xi_i ~ N(0, I_d / d)``;
  ``E[K] = strength 1 1^T + I`` (:func:`grpo_theory.gram_common_component`).
* ``token_mdp``: the exact scores of the sampled sequences of a :class:`sims.token_mdp.TokenMDP`
  (no closed form).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_theory import gram_clustered, gram_common_component, gram_isotropic

__all__ = [
    "PSI_MODELS",
    "isotropic_psi",
    "clustered_psi",
    "common_component_psi",
    "token_mdp_psi",
    "limit_gram",
    "sample_gram",
]

PSI_MODELS = ("isotropic", "clustered", "common", "token_mdp")


def _check_d(d: int) -> None:
    if int(d) != d or d < 1:
        raise ValueError(f"dimension d must be a positive integer, got {d}")


def isotropic_psi(R: int, *, d: int, rng: np.random.Generator) -> np.ndarray:
    """``[R, d]`` i.i.d. ``N(0, I_d / d)`` scores."""
    _check_d(d)
    return rng.standard_normal((R, d)) / np.sqrt(d)


def clustered_psi(
    labels: Any,
    *,
    d: int,
    rng: np.random.Generator,
    within: float = 1.0,
    between: float = 0.0,
    noise: float = 0.1,
) -> np.ndarray:
    """``[R, d]`` scores clustered by label: ``psi_i = mu_{label(i)} + xi_i``.

    The centres are built from the Cholesky factor of the label Gram (``within`` on the diagonal,
    ``between`` off it) in a random orthonormal frame, so their Gram is exact.

    Raises:
        ValueError: if the centre Gram is not positive semi-definite or ``d`` is too small.
    """
    _check_d(d)
    lab = np.asarray(labels)
    if lab.ndim != 1:
        raise ValueError(f"labels must be 1-D [R], got shape {lab.shape}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    uniq, inv = np.unique(lab, return_inverse=True)
    L = uniq.size
    if d < L:
        raise ValueError(f"d={d} must be >= the number of labels {L}")
    C = np.full((L, L), float(between)) + (within - between) * np.eye(L)
    ev = np.linalg.eigvalsh(C)
    if ev.min() < -1e-12:
        raise ValueError(f"within={within}, between={between} give a non-PSD centre Gram")
    w, U = np.linalg.eigh(C)
    coords = U * np.sqrt(np.clip(w, 0, None))  # rows: centres in an L-dim frame, Gram = C
    Q, _ = np.linalg.qr(rng.standard_normal((d, L)))
    centres = coords @ Q.T
    return centres[inv] + np.sqrt(noise / d) * rng.standard_normal((lab.size, d))


def common_component_psi(
    R: int, *, d: int, rng: np.random.Generator, strength: float
) -> np.ndarray:
    """``[R, d]`` scores ``sqrt(strength) c + xi_i`` with a random unit ``c``."""
    _check_d(d)
    if strength < 0:
        raise ValueError(f"strength must be >= 0, got {strength}")
    c = rng.standard_normal(d)
    c /= np.linalg.norm(c)
    return np.sqrt(strength) * c[None, :] + rng.standard_normal((R, d)) / np.sqrt(d)


def token_mdp_psi(mdp: Any, seq_idx: Any) -> np.ndarray:
    """``[..., d]`` exact scores of the given sequence indices of a TokenMDP."""
    return mdp.psi()[np.asarray(seq_idx)]


def limit_gram(model: str, labels: Any, **kw: Any) -> np.ndarray:
    """The ``d -> infinity`` Gram of ``model`` for a group with the given reward labels ``[R]``."""
    lab = np.asarray(labels)
    R = lab.size
    if model == "isotropic":
        return gram_isotropic(R)
    if model == "clustered":
        return gram_clustered(
            lab,
            within=kw.get("within", 1.0),
            between=kw.get("between", 0.0),
            noise=kw.get("noise", 0.1),
        )
    if model == "common":
        return gram_common_component(R, strength=kw["strength"])
    raise ValueError(
        f"psi model {model!r} has no closed-form Gram; choose isotropic/clustered/common"
    )


def sample_gram(
    model: str, labels: Any, *, d: int | None, rng: np.random.Generator, **kw: Any
) -> np.ndarray:
    """``[R, R]`` Gram ``K = Psi Psi^T`` of one group (``d=None``: the limit Gram)."""
    if d is None:
        return limit_gram(model, labels, **kw)
    lab = np.asarray(labels)
    if model == "isotropic":
        P = isotropic_psi(lab.size, d=d, rng=rng)
    elif model == "clustered":
        P = clustered_psi(
            lab,
            d=d,
            rng=rng,
            within=kw.get("within", 1.0),
            between=kw.get("between", 0.0),
            noise=kw.get("noise", 0.1),
        )
    elif model == "common":
        P = common_component_psi(lab.size, d=d, rng=rng, strength=kw["strength"])
    else:
        raise ValueError(f"unknown psi model {model!r}; choose one of {PSI_MODELS}")
    return P @ P.T
