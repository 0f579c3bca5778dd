"""The paper's printed formulas, transcribed once as functions (a support module: it registers
no claim), and our side: the registry's advantages on enumerated groups.

Printed (population std, Sec. 2-6): ``sigma(k) = sqrt(k (G - k)) / G`` (Eq. 2); Eq. (6)
``E[g] = (1/G) sum_{k=1}^{G-1} C(G, k) p^k (1-p)^(G-k) sqrt(k (G - k))``; Eq. (7)'s expansion
``sqrt(p(1-p)) (1 - 1/(8 G p (1-p)))``; fidelity ``phi = E[g] / sqrt(p(1-p))`` (Eq. 8); Eq. (9)
``G* = 1/(8 eps p (1-p))``; Eq. (10) ``p^G + (1-p)^G``; Eq. (11) ``w(p) = 1/sqrt(p(1-p))``.

Ours: the scalar prompt's ``E[g] = E[A_1 (y_1 - p)] = p (1 - p) c(p)`` with ``c(p) = E[A | r = 1]
- E[A | r = 0]`` from :func:`grpo_theory.question_weights.question_weight` (the registry's
``grpo_std`` at any ``ddof``), cross-checked by enumerating every reward vector for small G.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np


def sigma_printed(k: Any, G: int) -> np.ndarray:
    """Eq. (2) for binary rewards: ``sqrt(k (G - k)) / G``."""
    k = np.asarray(k, dtype=float)
    return np.sqrt(k * (G - k)) / G


def expected_update_printed(G: int, p: float) -> float:
    """Eq. (6)."""
    from grpo_theory import binom_pmf

    k = np.arange(1, G)
    return float((binom_pmf(k, G, p) * np.sqrt(k * (G - k))).sum() / G)


def expansion_printed(G: int, p: float) -> float:
    """Eq. (7) without the O(G^-2): ``sqrt(p(1-p)) (1 - 1/(8 G p (1-p)))``."""
    return math.sqrt(p * (1 - p)) * (1 - 1 / (8 * G * p * (1 - p)))


def fidelity_printed(G: int, p: float) -> float:
    """Eq. (8) with Eq. (6)."""
    return expected_update_printed(G, p) / math.sqrt(p * (1 - p))


def g_star_printed(eps: float, p: float) -> float:
    """Eq. (9): ``1 / (8 eps p (1 - p))``."""
    return 1.0 / (8 * eps * p * (1 - p))


def silent_printed(G: int, p: float) -> float:
    """Eq. (10)."""
    return p**G + (1 - p) ** G


def weight_printed(p: Any) -> np.ndarray:
    """Eq. (11): ``1 / sqrt(p (1 - p))``."""
    p = np.asarray(p, dtype=float)
    return 1.0 / np.sqrt(p * (1 - p))


# --- ours -----------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def fidelity(G: int, p: float, ddof: int = 0) -> float:
    """``phi(G, p) = sqrt(p(1-p)) c(p)`` from the registry's ``grpo_std`` (``ddof``, eps 0)."""
    from grpo_theory.question_weights import question_weight

    c = float(question_weight("grpo_std", G=G, p=p, ddof=ddof, eps=0.0))
    return math.sqrt(p * (1 - p)) * c


def smallest_group(target: float, p: float, ddof: int = 0, G_max: int = 2000) -> int:
    """The smallest ``G`` with ``phi(G, p) >= target`` (bisection after a doubling search;
    :func:`fidelity` is increasing in G, checked by the claims)."""
    lo, hi = 2, 2
    while fidelity(hi, p, ddof) < target:
        lo, hi = hi, hi * 2
        if hi > G_max:
            raise ValueError(f"phi < {target} up to G = {G_max} at p = {p}")
    while lo < hi:
        mid = (lo + hi) // 2
        if fidelity(mid, p, ddof) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def enumerate_scalar(G: int, p: float, estimator: str = "grpo_std", **opts: Any
                     ) -> tuple[float, np.ndarray, np.ndarray]:
    """Every reward vector y in {0,1}^G of the scalar prompt (score s = y - p): ``(E[g], g per
    vector, probability per vector)`` with the registry's advantages."""
    from grpo_theory import compute_advantages

    Y = ((np.arange(2**G)[:, None] >> np.arange(G)) & 1).astype(float)
    A = np.asarray(compute_advantages(estimator, Y, **opts))
    g = (A * (Y - p)).mean(1)
    k = Y.sum(1)
    pr = p**k * (1 - p) ** (G - k)
    return float(pr @ g), g, pr
