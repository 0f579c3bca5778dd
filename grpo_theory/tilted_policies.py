"""KL-regularised GRPO updates over every policy on a finite output space (one prompt).

Mroueh (arXiv 2503.06639 v4) replaces the parametric GRPO step by its maximiser over the whole
simplex. For a prompt with outputs ``o = 0..K-1``, a binary reward (``success[o]``), an advantage
``A(o) = +a_plus`` on successes and ``-a_minus`` on failures, and a KL anchor ``pi_o``:

    ``argmax_pi  E_pi A - beta KL(pi || pi_o)  =  pi_o exp(A / beta) / Z``          (Thm 1, 4, 8)

(the Gibbs variational principle; the gap is ``J(pi*) - J(pi) = beta KL(pi || pi*)``). The PoS of
the tilt is ``sigmoid(logit(p_o) + (a_plus + a_minus) / beta)``. Two KL terms
``alpha KL(pi || pi_ref) + (1 - alpha) KL(pi || pi_prev)`` equal one KL to the normalised geometric
mean ``pi_ref^alpha pi_prev^(1-alpha)`` plus a constant (Lemma 2), whose PoS involves the Renyi
divergences between the success- and failure-conditionals (Lemma 3, Thm 9).

Also the clipped per-prompt surrogate of GRPO-Clip, ``E_{pi_old} min(x A, clip(x, 1-c, 1+c) A)``
with ``x = pi / pi_old`` (Sec. 2), and the importance-sampled surrogate of a sampled group, whose
maximiser over the simplex is a tilt too (:func:`sampled_group_update`).

Arrays: policies are ``[K]`` probability vectors, ``success`` a ``[K]`` bool mask. NumPy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .success_dynamics import Normalisation, success_weights
from .surrogate import ppo_clip_objective

__all__ = [
    "as_policy",
    "as_success_mask",
    "tilt",
    "success_probability",
    "kl_divergence",
    "total_variation",
    "regularised_objective",
    "geometric_mean",
    "conditional",
    "renyi_divergence",
    "renyi_correction",
    "grpo_policy_step",
    "grpo_policy_iterates",
    "expected_clipped_surrogate",
    "sampled_group_update",
]


def as_policy(pi: Any, name: str = "pi") -> np.ndarray:
    """``pi`` as a float64 ``[K]`` probability vector (non-negative, sums to 1 within 1e-12)."""
    a = np.asarray(pi, dtype=np.float64)
    if a.ndim != 1 or a.size < 1:
        raise ValueError(f"{name} must be a 1-D probability vector, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be finite and >= 0, got {a.tolist()}")
    if abs(a.sum() - 1.0) > 1e-12 * a.size:
        raise ValueError(f"{name} must sum to 1, sums to {a.sum()!r}")
    return a


def as_success_mask(success: Any, K: int) -> np.ndarray:
    """``success`` as a ``[K]`` bool mask (0/1 or bool entries)."""
    s = np.asarray(success)
    if s.shape != (K,):
        raise ValueError(f"success must have shape ({K},), got {s.shape}")
    if not np.all((s == 0) | (s == 1)):
        raise ValueError(f"success must hold 0/1 (binary reward), got {s.tolist()}")
    return s.astype(bool)


def _beta(beta: float) -> float:
    b = float(beta)
    if not b > 0 or not np.isfinite(b):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    return b


def tilt(anchor: Any, success: Any, *, a_plus: float, a_minus: float, beta: float) -> np.ndarray:
    """``pi* = anchor exp(A / beta) / Z`` with ``A = +a_plus`` on successes, ``-a_minus`` on
    failures: the maximiser of ``E_pi A - beta KL(pi || anchor)`` (arXiv 2503.06639, Thm 1, Thm 4,
    and Thm 8 with the ``1 / beta`` it omits). Computed with the exponent shifted by its max.

    Args:
        anchor: ``[K]`` KL anchor.
        success: ``[K]`` binary reward mask.
        a_plus, a_minus: the two advantage values (any reals).
        beta: KL weight ``> 0``.

    Returns:
        ``[K]`` policy (zero wherever the anchor is zero).

    >>> tilt([0.5, 0.5], [1, 0], a_plus=1.0, a_minus=0.0, beta=1.0).round(6).tolist()
    [0.731059, 0.268941]
    """
    an = as_policy(anchor, "anchor")
    s = as_success_mask(success, an.size)
    b = _beta(beta)
    expo = np.where(s, float(a_plus), -float(a_minus)) / b
    expo = expo - expo[an > 0].max()
    w = an * np.exp(expo)
    return w / w.sum()


def success_probability(pi: Any, success: Any) -> float:
    """``P_pi(r = 1) = sum_{o in S} pi(o)``, kept inside ``[0, 1]`` (the float sum of a
    normalised vector can exceed 1 by an ulp)."""
    p = as_policy(pi)
    return min(1.0, max(0.0, float(p[as_success_mask(success, p.size)].sum())))


def kl_divergence(p: Any, q: Any) -> float:
    """``KL(p || q) = sum p log(p / q)`` (``0 log 0 = 0``; ``inf`` when ``p`` puts mass where
    ``q`` has none)."""
    a, b = as_policy(p, "p"), as_policy(q, "q")
    if a.size != b.size:
        raise ValueError(f"p and q differ in size: {a.size} vs {b.size}")
    on = a > 0
    if np.any(b[on] == 0):
        return float("inf")
    return float(np.sum(a[on] * (np.log(a[on]) - np.log(b[on]))))


def total_variation(p: Any, q: Any) -> float:
    """``TV(p, q) = (1/2) sum |p - q| = sup_A |p(A) - q(A)|``."""
    a, b = as_policy(p, "p"), as_policy(q, "q")
    return 0.5 * float(np.abs(a - b).sum())


def regularised_objective(pi: Any, success: Any, *, a_plus: float, a_minus: float, beta: float,
                          anchor: Any) -> float:
    """``J(pi) = a_plus P_pi(S) - a_minus P_pi(F) - beta KL(pi || anchor)`` (the per-prompt
    objective of (GRPO Iterations), Eq. 9, Thm 8)."""
    p = as_policy(pi)
    s = as_success_mask(success, p.size)
    ps = float(p[s].sum())
    return float(a_plus) * ps - float(a_minus) * (1.0 - ps) - _beta(beta) * kl_divergence(p, anchor)


def geometric_mean(pi_ref: Any, pi_prev: Any, *, alpha: float) -> np.ndarray:
    """``pibar proportional to pi_ref^alpha pi_prev^(1 - alpha)``, normalised (Lemma 2's anchor;
    ``0^0 = 1`` so ``alpha = 0`` gives ``pi_prev`` and ``alpha = 1`` gives ``pi_ref``)."""
    a, b = as_policy(pi_ref, "pi_ref"), as_policy(pi_prev, "pi_prev")
    al = float(alpha)
    if not 0.0 <= al <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    with np.errstate(divide="ignore"):
        la = np.where(a > 0, np.log(np.where(a > 0, a, 1.0)), -np.inf)
        lb = np.where(b > 0, np.log(np.where(b > 0, b, 1.0)), -np.inf)
    lg = (al * la if al > 0 else 0.0) + ((1.0 - al) * lb if al < 1 else 0.0)
    if not np.any(np.isfinite(lg)):
        raise ValueError("pi_ref and pi_prev have disjoint supports: the geometric mean is 0")
    w = np.exp(lg - np.max(lg[np.isfinite(lg)]))
    return w / w.sum()


def conditional(pi: Any, mask: Any) -> np.ndarray:
    """``pi(. | mask) = pi 1_mask / pi(mask)`` (needs ``pi(mask) > 0``)."""
    p = as_policy(pi)
    m = as_success_mask(mask, p.size)
    z = float(p[m].sum())
    if z <= 0:
        raise ValueError("conditional: the set has probability 0")
    return np.where(m, p, 0.0) / z


def renyi_divergence(p: Any, q: Any, *, alpha: float) -> float:
    """``D_alpha(p || q) = log(sum p^alpha q^(1 - alpha)) / (alpha - 1)``, ``0 < alpha < 1``
    (arXiv 2503.06639, App. E); ``inf`` when the supports are disjoint."""
    a, b = as_policy(p, "p"), as_policy(q, "q")
    al = float(alpha)
    if not 0.0 < al < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    both = (a > 0) & (b > 0)
    s = float(np.sum(a[both] ** al * b[both] ** (1.0 - al)))
    return float("inf") if s == 0 else float(np.log(s) / (al - 1.0))


def renyi_correction(pi_ref: Any, pi_prev: Any, success: Any, *, alpha: float) -> float:
    """``Delta_R = (1 - alpha) [D_alpha(ref_F || prev_F) - D_alpha(ref_S || prev_S)]`` with
    ``ref_S = pi_ref(. | S)``, ``prev_S = pi_prev(. | S)`` and likewise on ``F`` (Thm 9).

    It is 0 whenever ``pi_prev`` has the success- and failure-conditionals of ``pi_ref``, which is
    the case along every iteration started at ``pi_0 = pi_ref``: each step tilts by a function of
    the reward alone.
    """
    a = as_policy(pi_ref, "pi_ref")
    s = as_success_mask(success, a.size)
    dS = renyi_divergence(conditional(a, s), conditional(pi_prev, s), alpha=alpha)
    dF = renyi_divergence(conditional(a, ~s), conditional(pi_prev, ~s), alpha=alpha)
    return (1.0 - float(alpha)) * (dF - dS)


def grpo_policy_step(pi_prev: Any, pi_ref: Any, success: Any, *, beta: float, eps: float,
                     alpha: float = 1.0, normalisation: Normalisation = "mean_std") -> np.ndarray:
    """``pi_n = argmax_pi E_pi A_{n-1} - beta [alpha KL(pi || pi_ref)
    + (1-alpha) KL(pi || pi_prev)]`` with the population advantage of ``pi_prev``
    (:func:`grpo_theory.success_dynamics.success_weights`): the tilt of the geometric-mean
    anchor (Lemma 2, Thm 1/4/9)."""
    p_prev = success_probability(pi_prev, success)
    wp, wm = success_weights(p_prev, eps=eps, normalisation=normalisation)
    anchor = geometric_mean(pi_ref, pi_prev, alpha=alpha)
    return tilt(anchor, success, a_plus=float(wp), a_minus=float(wm), beta=beta)


def grpo_policy_iterates(pi_ref: Any, success: Any, *, beta: float, eps: float, n_steps: int,
                         alpha: float = 1.0, normalisation: Normalisation = "mean_std",
                         pi_start: Any = None) -> list[np.ndarray]:
    """``[pi_0, ..., pi_n]`` of :func:`grpo_policy_step`, ``pi_0 = pi_start`` (default
    ``pi_ref``, the paper's assumption)."""
    pi = as_policy(pi_ref if pi_start is None else pi_start, "pi_start")
    out = [pi]
    for _ in range(int(n_steps)):
        pi = grpo_policy_step(pi, pi_ref, success, beta=beta, eps=eps, alpha=alpha,
                              normalisation=normalisation)
        out.append(pi)
    return out


def expected_clipped_surrogate(pi: Any, pi_old: Any, advantage: Any, *, clip: float
                               ) -> float:
    """``E_{o ~ pi_old} f_c(pi(o) / pi_old(o), A(o))`` for one prompt (outputs where
    ``pi_old = 0`` are never sampled and do not enter)."""
    p, q = as_policy(pi), as_policy(pi_old, "pi_old")
    A = np.asarray(advantage, dtype=np.float64)
    on = q > 0
    return float(np.sum(q[on] * ppo_clip_objective(p[on] / q[on], A[on], clip=clip)))


def sampled_group_update(counts: Any, pi_old: Any, anchor: Any, success: Any, *,
                         adv_success: float, adv_failure: float, beta: float) -> np.ndarray:
    """Maximiser over the simplex of the importance-sampled surrogate of one sampled group,
    ``(1/G) sum_i pi(o_i) / pi_old(o_i) A_i - beta KL(pi || anchor)``: the tilt
    ``anchor exp(a_hat / beta) / Z`` with ``a_hat(o) = c_o A(o) / (G pi_old(o))`` (``c_o`` =
    draws of output ``o``; ``A(o)`` = the group's advantage of a success or a failure). Outputs
    never drawn are not tilted (arXiv 2503.06639 Algorithm 1 with the argmax over every policy).

    Args:
        counts: ``[K]`` draws per output (sum ``G``).
        pi_old: ``[K]`` sampling policy (positive where ``counts > 0``).
        anchor: ``[K]`` KL anchor.
        success: ``[K]`` binary reward mask.
        adv_success, adv_failure: the group's advantage values (from the estimator registry).
        beta: KL weight.
    """
    c = np.asarray(counts, dtype=np.float64)
    q = as_policy(pi_old, "pi_old")
    an = as_policy(anchor, "anchor")
    s = as_success_mask(success, q.size)
    if c.shape != q.shape or np.any(c < 0):
        raise ValueError(f"counts must be [K] non-negative, got {c.tolist()}")
    if np.any((c > 0) & (q == 0)):
        raise ValueError("counts > 0 where pi_old = 0")
    G = float(c.sum())
    A = np.where(s, float(adv_success), float(adv_failure))
    a_hat = np.where(c > 0, c * A / (G * np.where(q > 0, q, 1.0)), 0.0)
    expo = a_hat / _beta(beta)
    expo = expo - expo[an > 0].max()
    w = an * np.exp(expo)
    return w / w.sum()
