"""What several section modules of the arXiv 2503.06639 audit share: the parameter grid, random
finite worlds, the cached fixed-point and orbit scans, an SLSQP maximiser over the simplex, exact
log-odds of a policy, and an exact-identity helper (60-digit evaluation at rational points)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from grpo_theory.success_dynamics import fixed_points, orbit_kinds

#: The parameter grid every fixed-point scan uses (p_ref, beta, eps).
P_REFS: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99)
BETAS: tuple[float, ...] = (0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0)
EPSS: tuple[float, ...] = (1e-5, 1e-2, 0.25)


def grid() -> list[tuple[float, float, float]]:
    """Every ``(p_ref, beta, eps)`` of the grid."""
    return [(p, b, e) for e in EPSS for b in BETAS for p in P_REFS]


@lru_cache(maxsize=1)
def fixed_point_scan() -> tuple[tuple[tuple[float, float, float], Any], ...]:
    """Certified fixed points of ``h_{eps, p_ref}`` (beta) at every grid point (cached)."""
    return tuple((g, fixed_points(g[0], beta=g[1], eps=g[2], cells=1024)) for g in grid())


@lru_cache(maxsize=1)
def orbit_scan() -> tuple[tuple[tuple[float, float, float], str, tuple[float, float]], ...]:
    """Long-run kind of the iterates from ``p_ref`` at every grid point (cached)."""
    g = np.array(grid())
    kinds, last = orbit_kinds(g[:, 0], beta=g[:, 1], eps=g[:, 2], n_steps=3000)
    return tuple((tuple(map(float, gi)), str(k), (float(a), float(b)))
                 for gi, k, (a, b) in zip(g, kinds, last, strict=True))


def random_world(rng: np.random.Generator, K: int = 6, n_success: int = 2
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A reference policy with full support on ``K`` outputs and a success mask with
    ``n_success`` successes."""
    pi = rng.dirichlet(np.ones(K))
    success = np.zeros(K, dtype=bool)
    success[rng.choice(K, size=n_success, replace=False)] = True
    return pi, success


def simplex_maximiser(pi_ref: np.ndarray, s: np.ndarray, wp: float, wm: float, beta: float
                      ) -> np.ndarray:
    """argmax of ``wp P(S) - wm P(F) - beta KL(pi || pi_ref)`` over the probability simplex by
    scipy's SLSQP with the analytic gradient: a numerical optimiser that knows nothing of the
    Gibbs form it is compared with."""
    from scipy.optimize import minimize

    A = np.where(s, wp, -wm)

    def neg(x: np.ndarray) -> tuple[float, np.ndarray]:
        x = np.clip(x, 1e-300, None)
        lr = np.log(x / pi_ref)
        return -(float(A @ x) - beta * float(x @ lr)), -(A - beta * (lr + 1.0))

    res = minimize(neg, pi_ref.copy(), jac=True, method="SLSQP",
                   bounds=[(0.0, 1.0)] * pi_ref.size,
                   constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0,
                                 "jac": lambda x: np.ones_like(x)}],
                   options={"ftol": 1e-15, "maxiter": 500})
    x = np.clip(res.x, 0.0, None)
    return x / x.sum()


def policy_log_odds(pi: np.ndarray, success: np.ndarray) -> float:
    """``log P(S) - log P(F)`` of a policy, from the two masses (accurate when ``P(S)`` is within
    ``1e-16`` of 1, where ``logit(P(S))`` of the rounded PoS is not)."""
    with np.errstate(divide="ignore"):
        return float(np.log(pi[success].sum()) - np.log(pi[~success].sum()))


def exact_zero(expr: Any, symbols: dict[Any, tuple[float, float]], *, n_points: int = 5,
               seed: int = 0, digits: int = 60) -> float:
    """Largest ``|expr|`` at ``n_points`` random rational points inside the symbols' ranges,
    evaluated in ``digits``-digit arithmetic (sympy expression compiled for mpmath): an identity
    ``expr == 0`` gives ~``10^-digits`` (a non-identity of algebraic/exponential functions
    vanishes at random rationals with probability 0). Cheaper and more predictable than
    ``sympy.simplify``."""
    import mpmath as mp
    import sympy as sp

    syms = list(symbols)
    f = sp.lambdify(syms, expr, "mpmath")
    rng = np.random.default_rng(seed)
    worst = 0.0
    with mp.workdps(digits):
        for _ in range(n_points):
            args = [mp.mpf(lo) + mp.mpf(int(rng.integers(1, 10**6))) / 10**6 * (mp.mpf(hi)
                                                                            - mp.mpf(lo))
                    for lo, hi in (symbols[x] for x in syms)]
            worst = max(worst, abs(float(f(*args))))
    return worst


#: An identity holds when :func:`exact_zero` is below this (60-digit evaluation).
IDENTITY_TOL = 1e-40
