"""GRPO's PoS dynamics with sampled groups: the population recursion of arXiv 2503.06639 with
its population assumption relaxed.

The paper's iteration (:mod:`grpo_theory.success_dynamics`) uses the exact PoS ``p_{n-1}`` and the
exact expectation over ``pi``. Algorithm 1 instead draws ``G`` outputs from ``pi_{n-1}``, computes
group advantages (the estimator registry: ``grpo_std`` with ``ddof=0, eps_mode="add_var"`` is the
paper's Eq. 4 with ``p_hat = k/G``; ``dr_grpo`` its mean-only Eq. 13) and maximises the
importance-sampled surrogate. Over every policy on a finite output space that maximiser is a tilt
(:func:`grpo_theory.tilted_policies.sampled_group_update`): this module iterates it.

* :class:`FiniteWorld`: one prompt, ``K`` outputs, binary reward, reference policy.
* :func:`group_advantage_table`: the registry's advantage of a success / failure per number of
  successes ``k`` in the group (the one implementation of the estimators).
* :func:`exact_sampled_expectation`: ``E[p_n]`` and ``E[TV(pi~_n, pi_n)]`` after ``n`` sampled
  steps, exactly, by enumerating every multinomial draw of every step (small ``K``, ``G``, ``n``).
* :func:`simulate_sampled_iterates`: seeded Monte Carlo of many independent runs (vectorised),
  with the population iterates beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from grpo_theory.limits import ARRAY_R_MAX
from grpo_theory.tilted_policies import (
    as_policy,
    as_success_mask,
    grpo_policy_iterates,
)

from .exact import own_reward_table

__all__ = [
    "FiniteWorld",
    "PAPER_ESTIMATOR_OPTIONS",
    "group_advantage_table",
    "compositions",
    "exact_sampled_expectation",
    "simulate_sampled_iterates",
]

#: The paper's Eq. 4 with the plug-in ``p_hat`` (Algorithm 1) as a registry estimator and options.
PAPER_ESTIMATOR_OPTIONS: dict[str, Any] = {"ddof": 0, "eps_mode": "add_var"}


@dataclass(frozen=True)
class FiniteWorld:
    """One prompt with ``K`` outputs.

    Attributes:
        pi_ref: ``[K]`` reference policy (``pi_0``).
        success: ``[K]`` binary reward of each output.
    """

    pi_ref: np.ndarray
    success: np.ndarray

    def __post_init__(self) -> None:
        p = as_policy(self.pi_ref, "pi_ref")
        object.__setattr__(self, "pi_ref", p)
        object.__setattr__(self, "success", as_success_mask(self.success, p.size))

    @property
    def K(self) -> int:
        """Number of outputs."""
        return int(self.pi_ref.size)

    @property
    def p_ref(self) -> float:
        """PoS of the reference."""
        return float(self.pi_ref[self.success].sum())


def group_advantage_table(G: int, *, estimator: str, opts: dict[str, Any]
                          ) -> tuple[np.ndarray, np.ndarray]:
    """``(a_S[k], a_F[k])``, ``k = 0..G``: the advantage of a success and of a failure in a group
    of ``G`` with ``k`` successes, from :func:`grpo_theory.compute_advantages` (through
    :func:`sims.exact.own_reward_table`); 0 where no such rollout exists (``a_S[0]``, ``a_F[G]``).
    """
    T = own_reward_table(estimator, R=G, opts=opts)  # T[r1, j], j successes among the others
    a_S = np.zeros(G + 1)
    a_F = np.zeros(G + 1)
    a_S[1:] = T[1, :]
    a_F[:G] = T[0, :]
    return a_S, a_F


#: Most branches ``C(G+K-1, K-1)^n_steps`` that :func:`exact_sampled_expectation` enumerates
#: (and most rows of :func:`compositions`, ``ARRAY_R_MAX``).
BRANCHES_MAX = 1_000_000


def compositions(G: int, K: int) -> np.ndarray:
    """Every ``[K]`` vector of non-negative integers summing to ``G`` (stars and bars), as rows."""
    n_rows = math.comb(int(G) + int(K) - 1, int(K) - 1)
    if n_rows > ARRAY_R_MAX:
        raise ValueError(f"compositions: {n_rows} compositions of G={G} into K={K} parts exceed "
                         f"ARRAY_R_MAX={ARRAY_R_MAX}; sample the counts (Monte Carlo: "
                         "numpy's multinomial) instead")
    rows = []
    for bars in combinations(range(G + K - 1), K - 1):
        edges = (-1, *bars, G + K - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(K)])
    return np.array(rows, dtype=np.int64)


def _multinomial_log_pmf(counts: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """``log P(counts)`` under Multinomial(G, pi) for each row of ``counts`` (``[m, K]``)."""
    G = int(counts[0].sum())
    logc = math.lgamma(G + 1) - np.sum([[math.lgamma(c + 1) for c in row] for row in counts], 1)
    with np.errstate(divide="ignore"):
        lp = np.where(counts > 0, counts * np.log(np.where(pi > 0, pi, 1.0)), 0.0)
    bad = np.any((counts > 0) & (pi == 0), axis=1)
    return np.where(bad, -np.inf, logc + lp.sum(1))


class _Stepper:
    """The sampled update of many policies at once (rows), for one world and estimator."""

    def __init__(self, world: FiniteWorld, *, G: int, beta: float, alpha: float,
                 estimator: str, opts: dict[str, Any]):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta!r}")
        if int(G) != G or G < 2:
            raise ValueError(f"group size G must be an integer >= 2, got {G!r}")
        self.w, self.G, self.beta, self.alpha = world, int(G), float(beta), float(alpha)
        self.a_S, self.a_F = group_advantage_table(self.G, estimator=estimator, opts=opts)
        with np.errstate(divide="ignore"):
            self.log_ref = np.log(world.pi_ref)

    def step(self, pi: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """``pi [m, K]`` (the sampling policies), ``counts [m, K]`` -> updated ``[m, K]``."""
        s = self.w.success
        k = counts[:, s].sum(1)
        A = np.where(s[None, :], self.a_S[k][:, None], self.a_F[k][:, None])
        a_hat = np.where(counts > 0, counts * A / (self.G * np.where(pi > 0, pi, 1.0)), 0.0)
        with np.errstate(divide="ignore"):
            log_prev = np.log(pi)
        log_anchor = (self.alpha * self.log_ref if self.alpha > 0 else 0.0) + (
            (1.0 - self.alpha) * log_prev if self.alpha < 1 else 0.0)
        z = log_anchor + a_hat / self.beta
        z = z - np.max(z, axis=1, keepdims=True)
        w = np.exp(z)
        return w / w.sum(1, keepdims=True)


def exact_sampled_expectation(world: FiniteWorld, *, G: int, beta: float, eps: float,
                              n_steps: int, alpha: float = 1.0, estimator: str = "grpo_std",
                              opts: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Exact ``E[p~_n]``, ``E[p~_n^2]`` and ``E[TV(pi~_n, pi_n)]`` for ``n = 0..n_steps`` of the
    sampled iteration, by enumerating every draw of every step (``C(G+K-1, K-1)^n`` branches).

    ``pi_n`` is the population iterate (:func:`grpo_theory.tilted_policies.grpo_policy_iterates`,
    ``normalisation="mean_std"`` with ``eps``; pass the matching estimator and options).
    """
    opts = dict(PAPER_ESTIMATOR_OPTIONS | {"eps": eps} if opts is None else opts)
    per_step = math.comb(int(G) + int(world.K) - 1, int(world.K) - 1)
    if int(n_steps) * math.log(per_step) > math.log(BRANCHES_MAX):  # never per_step ** n_steps
        raise ValueError(
            f"exact_sampled_expectation: {per_step}^{n_steps} branches (G={G}, K={world.K}) "
            f"exceed BRANCHES_MAX={BRANCHES_MAX}; use simulate_sampled_iterates (Monte Carlo)")
    st = _Stepper(world, G=G, beta=beta, alpha=alpha, estimator=estimator, opts=opts)
    comp = compositions(st.G, world.K)
    pop = grpo_policy_iterates(world.pi_ref, world.success, beta=beta, eps=eps,
                               n_steps=n_steps, alpha=alpha)
    pis, logw = world.pi_ref[None, :], np.zeros(1)
    out = {"mean_p": [], "mean_p2": [], "mean_tv": [], "branches": []}
    for n in range(int(n_steps) + 1):
        w = np.exp(logw)
        p = pis[:, world.success].sum(1)
        tv = 0.5 * np.abs(pis - pop[n][None, :]).sum(1)
        out["mean_p"].append(float(w @ p))
        out["mean_p2"].append(float(w @ p**2))
        out["mean_tv"].append(float(w @ tv))
        out["branches"].append(pis.shape[0])
        if n == n_steps:
            break
        lp = np.stack([_multinomial_log_pmf(comp, pi) for pi in pis])  # [m, C]
        keep = np.isfinite(lp)
        rows = np.nonzero(keep)
        counts = comp[rows[1]]
        pis = st.step(pis[rows[0]], counts)
        logw = logw[rows[0]] + lp[rows]
    return {k: np.array(v) for k, v in out.items()}


def simulate_sampled_iterates(world: FiniteWorld, *, G: int, beta: float, eps: float,
                              n_steps: int, n_runs: int, rng: np.random.Generator,
                              alpha: float = 1.0, estimator: str = "grpo_std",
                              opts: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Seeded Monte Carlo of ``n_runs`` independent sampled iterations (vectorised over runs).

    Returns:
        ``p`` ``[n_steps+1, n_runs]`` (PoS of each run), ``tv`` ``[n_steps+1, n_runs]``
        (``TV(pi~_n, pi_n)`` to the population iterate), ``p_population`` ``[n_steps+1]``.
    """
    if int(n_runs) != n_runs or n_runs < 1:
        raise ValueError(f"n_runs must be an integer >= 1, got {n_runs!r}")
    opts = dict(PAPER_ESTIMATOR_OPTIONS | {"eps": eps} if opts is None else opts)
    st = _Stepper(world, G=G, beta=beta, alpha=alpha, estimator=estimator, opts=opts)
    pop = grpo_policy_iterates(world.pi_ref, world.success, beta=beta, eps=eps,
                               n_steps=n_steps, alpha=alpha)
    pis = np.repeat(world.pi_ref[None, :], int(n_runs), axis=0)
    p = np.empty((int(n_steps) + 1, int(n_runs)))
    tv = np.empty_like(p)
    for n in range(int(n_steps) + 1):
        p[n] = pis[:, world.success].sum(1)
        tv[n] = 0.5 * np.abs(pis - pop[n][None, :]).sum(1)
        if n < n_steps:
            pis = st.step(pis, rng.multinomial(st.G, pis))
    p_pop = np.array([float(x[world.success].sum()) for x in pop])
    return {"p": p, "tv": tv, "p_population": p_pop}
