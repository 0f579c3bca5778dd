"""Exact expected gradients of length-aggregated group losses: the length bias of GRPO.

Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, Sec. 3.1 and Fig. 5) points out that GRPO's loss
(Eq. 3) averages each response's token terms, so at ``rho = 1`` response ``i`` contributes
``A_i / |o_i|`` times its trajectory score, and that common PPO implementations divide by a random
token count too (Listing 1). This module computes, exactly, what such a loss does in expectation.

Setting (an *outcome world with lengths*). One question; a rollout draws an outcome ``o`` (a whole
response) with probability ``pi_o``; the outcome has a length ``L_o >= 1`` (tokens), a success
probability ``mu_o`` (reward ``r ~ Bernoulli(mu_o)``) and a trajectory score ``psi_o`` (the sum of
its token scores, seed paper Eq. 18). A group is ``G`` i.i.d. rollouts. A loss aggregation
(:func:`grpo_theory.aggregation.aggregation_weights`) gives rollout ``i`` the weight ``w_i``, so
the on-policy (``rho = 1``) gradient of the loss is

    ``g = sum_i w_i A_i psi_i``   (``A_i`` from any registered per-group estimator).

For every aggregation mode of :mod:`grpo_theory.aggregation` (``empty_completions="count"``),
``w_1`` depends only on the own length ``L_1`` and on the total length ``S`` of the other
``G - 1`` rollouts; for binary rewards ``A_1`` depends only on the own reward ``r_1`` and the
number ``k`` of successes among the others. By exchangeability

    ``E[g] = G sum_o pi_o psi_o sum_r P(r | o) T[r, L_o]``,
    ``T[r, L] = E[w_1 A_1 | r_1 = r, L_1 = L] = sum_{k, S} P_{G-1}(k, S) w(L, S) A(r, k)``,

where ``P_{G-1}(k, S)`` is the joint law of (successes, total length) of ``G - 1`` rollouts (a
convolution, :func:`others_reward_length_law`). Advantages come from
:func:`grpo_theory.question_weights.success_failure_values` (the registered estimator itself)
and weights from :func:`grpo_theory.aggregation.aggregation_weights` (the one implementation of
each mode), so nothing is re-implemented. :func:`brute_force_aggregated_gradient` enumerates
every joint group instead, an independent route for small worlds.

The true policy gradient of ``J = E[r]`` is ``grad J = sum_o pi_o mu_o psi_o``; Dr. GRPO's
aggregation (a constant normaliser) gives ``E[g] = (G - 1) / (G max_tokens) grad J``; GRPO's
per-response mean (``sequence_mean``) weighs ``psi_o`` by ``1 / L_o`` (its response-level length
bias, Dr. GRPO Sec. 3.1).
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import product
from typing import Any

import numpy as np

from ._validate import check_R
from .aggregation import AGGREGATION_MODES, aggregation_weights
from .limits import ARRAY_R_MAX, LAW_CELLS_MAX, check_R_limit
from .question_weights import success_failure_values
from .registry import estimator_spec, validate_options

__all__ = [
    "reward_length_law",
    "others_reward_length_law",
    "rollout_weight",
    "own_advantage_table",
    "conditional_weighted_advantage",
    "expected_aggregated_gradient",
    "brute_force_aggregated_gradient",
    "mean_length_given_reward",
    "BRUTE_FORCE_MAX_GROUPS",
]

#: Largest number of joint (outcome, reward) groups :func:`brute_force_aggregated_gradient` sums.
BRUTE_FORCE_MAX_GROUPS = 300_000


def _outcomes(probs: Any, means: Any, lengths: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate ``probs [N]`` (a distribution), ``means [N]`` in [0, 1], ``lengths [N]`` >= 1."""
    pr = np.asarray(probs, dtype=np.float64)
    mu = np.asarray(means, dtype=np.float64)
    L = np.asarray(lengths, dtype=np.float64)
    if pr.ndim != 1 or mu.shape != pr.shape or L.shape != pr.shape or pr.size == 0:
        raise ValueError(f"need probs, means, lengths shaped [N]; got {pr.shape}, {mu.shape}, "
                         f"{L.shape}")
    if not np.isfinite(pr.sum() + mu.sum() + L.sum()):
        raise ValueError("probs, means and lengths must be finite")
    if pr.min() < 0 or abs(pr.sum() - 1.0) > 1e-9:
        raise ValueError(f"probs must be a distribution (>= 0, sum 1), sum is {pr.sum()}")
    if mu.min() < 0 or mu.max() > 1:
        raise ValueError("means must be success probabilities in [0, 1]")
    Li = L.astype(np.int64)
    if Li.min() < 1 or not np.array_equal(Li, L):
        raise ValueError("lengths must be integers >= 1 (every response has at least one token)")
    return pr, mu, Li


def reward_length_law(probs: Any, means: Any, lengths: Any) -> np.ndarray:
    """Joint law of one rollout's (reward, length): ``P[r, L]``, ``r in {0, 1}``, ``L = 0..max``.

    ``P[r, L] = sum_{o: L_o = L} pi_o mu_o^r (1 - mu_o)^(1 - r)``.

    >>> reward_length_law([0.5, 0.5], [1.0, 0.0], [1, 2]).tolist()
    [[0.0, 0.0, 0.5], [0.0, 0.5, 0.0]]
    """
    return _reward_length_law(*_outcomes(probs, means, lengths))


def _reward_length_law(pr: np.ndarray, mu: np.ndarray, L: np.ndarray) -> np.ndarray:
    n = int(L.max()) + 1
    return np.stack([np.bincount(L, weights=pr * (1.0 - mu), minlength=n),
                     np.bincount(L, weights=pr * mu, minlength=n)])


def others_reward_length_law(cell: np.ndarray, n: int) -> np.ndarray:
    """Joint law ``P[k, S]`` of (successes, total length) of ``n`` i.i.d. rollouts.

    Args:
        cell: ``[2, L_max + 1]`` one rollout's law (:func:`reward_length_law`).
        n: number of rollouts, ``>= 0``.

    Returns:
        ``[n + 1, n L_max + 1]`` probabilities (``k = 0..n``, ``S = 0..n L_max``), by ``n``
        convolutions.

    >>> others_reward_length_law(np.array([[0.0, 0.5], [0.0, 0.5]]), 2).tolist()
    [[0.0, 0.0, 0.25], [0.0, 0.0, 0.5], [0.0, 0.0, 0.25]]
    """
    cell = np.asarray(cell, dtype=np.float64)
    if cell.ndim != 2 or cell.shape[0] != 2:
        raise ValueError(f"cell must be shaped [2, L_max + 1], got {cell.shape}")
    n = check_R(n, minimum=0)
    lmax = cell.shape[1] - 1
    check_R_limit((n + 1) * (n * lmax + 1), limit=LAW_CELLS_MAX, name="LAW_CELLS_MAX",
                  routine=f"others_reward_length_law (n={n} rollouts, L_max={lmax}: cells)",
                  cost="the joint law by n convolutions, time ~ cells^2", alternative="sample "
                  "the groups (Monte Carlo, e.g. sims.length_worlds) for larger groups")
    # (k, S) -> k W + S with W > n lmax: 1-D polynomial products never carry S into k.
    W = max(n, 1) * lmax + 1
    flat = np.zeros(2 * W)
    flat[: lmax + 1], flat[W : W + lmax + 1] = cell[0], cell[1]
    P = np.ones(1)
    for _ in range(n):
        P = np.convolve(P, flat)[: (n + 1) * W]
    out = np.zeros((n + 1) * W)
    out[: P.size] = P
    return out.reshape(n + 1, W)[:, : n * lmax + 1]


def _split(total: int, parts: int) -> list[int]:
    """``parts`` non-negative integers, as equal as possible, summing to ``total``."""
    q, rem = divmod(total, parts)
    return [q + (1 if j < rem else 0) for j in range(parts)]


def rollout_weight(
    own_length: int, others_total: int, *, G: int, mode: str, max_tokens: int | None = None
) -> float:
    """Weight ``w_1`` of rollout 1 in a group of ``G`` (one prompt) under aggregation ``mode``.

    Evaluated by :func:`grpo_theory.aggregation.aggregation_weights` itself on a length row whose
    first entry is ``own_length`` and whose other ``G - 1`` entries sum to ``others_total`` (as
    equal as possible): every mode's ``w_1`` depends on the others only through that sum.
    """
    G = check_R(G, minimum=2)
    check_R_limit(G, limit=ARRAY_R_MAX, name="ARRAY_R_MAX", routine="rollout_weight",
                  cost="a length row of G entries", alternative="the aggregation's closed form "
                  "(grpo_theory.aggregation.aggregation_weights on the lengths you have)")
    return _rollout_weight(int(own_length), int(others_total), G, mode, max_tokens)


@lru_cache(maxsize=65536)
def _rollout_weight(own: int, total: int, G: int, mode: str, max_tokens: int | None) -> float:
    row = np.array([[own, *_split(total, G - 1)]], dtype=np.float64)
    kw = {"max_tokens": max_tokens} if mode == "dr_grpo" else {}
    return float(aggregation_weights(row, mode=mode, **kw)[0, 0])  # type: ignore[arg-type]


def own_advantage_table(estimator: str, *, G: int, **opts: Any) -> np.ndarray:
    """``A[r, k]``: rollout 1's advantage with own reward ``r`` and ``k`` successes among the
    other ``G - 1`` (binary rewards), from the registered estimator
    (:func:`grpo_theory.question_weights.success_failure_values`).

    >>> own_advantage_table("grpo", G=2).tolist()
    [[0.0, -0.5], [0.5, 0.0]]
    """
    G = check_R(G, minimum=2)
    validate_options(estimator, opts)
    if estimator_spec(estimator).batch_coupled:
        raise ValueError(f"estimator {estimator!r} couples the groups of a batch; the per-group "
                         "expectation does not apply")
    try:
        frozen = tuple(sorted(opts.items()))
        hash(frozen)
    except TypeError:
        raise TypeError(f"{estimator}: options must be scalars, got {opts!r}") from None
    return _advantage_table(estimator, G, frozen).copy()


@lru_cache(maxsize=512)
def _advantage_table(estimator: str, G: int, frozen: tuple[tuple[str, Any], ...]) -> np.ndarray:
    s, f = success_failure_values(estimator, G=G, **dict(frozen))
    return np.stack([f, s])


def conditional_weighted_advantage(
    estimator: str,
    *,
    probs: Any,
    means: Any,
    lengths: Any,
    G: int,
    mode: str,
    max_tokens: int | None = None,
    estimator_options: dict[str, Any] | None = None,
) -> np.ndarray:
    """``T[r, L] = E[w_1 A_1 | r_1 = r, L_1 = L]`` for ``L = 0..max L_o`` (rows ``r = 0, 1``).

    ``T[r, L] = sum_{k, S} P_{G-1}(k, S) w(L, S) A(r, k)`` (module docstring): the value a
    response of length ``L`` and reward ``r`` gets, for every ``L = 1..max L_o`` (also lengths no
    outcome has); ``T[:, 0] = 0``.
    """
    pr, mu, L = _outcomes(probs, means, lengths)
    return _conditional_weighted_advantage(estimator, pr, mu, L, G, mode, max_tokens,
                                           estimator_options)


def _conditional_weighted_advantage(estimator: str, pr: np.ndarray, mu: np.ndarray,
                                    L: np.ndarray, G: int, mode: str, max_tokens: int | None,
                                    estimator_options: dict[str, Any] | None) -> np.ndarray:
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
    G = check_R(G, minimum=2)
    if mode == "dr_grpo" and (max_tokens is None or max_tokens < L.max()):
        raise ValueError(f"mode='dr_grpo' needs max_tokens >= the longest response ({L.max()}), "
                         f"got {max_tokens}")
    A = own_advantage_table(estimator, G=G, **(estimator_options or {}))
    lmax = int(L.max())
    Pks = others_reward_length_law(_reward_length_law(pr, mu, L), G - 1)  # [G, (G-1)lmax + 1]
    W = _weight_matrix(G, mode, max_tokens, lmax)  # [lmax + 1, (G-1) lmax + 1]: w(L, S)
    return A @ (Pks @ W.T)  # T[r, L] = sum_k A[r, k] sum_S P(k, S) w(L, S)


@lru_cache(maxsize=256)
def _weight_matrix(G: int, mode: str, max_tokens: int | None, lmax: int) -> np.ndarray:
    """``W[L, S] = w_1`` for own length ``L = 1..lmax`` and others' total ``S = G-1..(G-1) lmax``
    (0 elsewhere: lengths are >= 1), by :func:`rollout_weight`."""
    W = np.zeros((lmax + 1, (G - 1) * lmax + 1))
    for ell in range(1, lmax + 1):
        for S in range(G - 1, (G - 1) * lmax + 1):
            W[ell, S] = _rollout_weight(ell, S, G, mode, max_tokens)
    W.flags.writeable = False
    return W


def expected_aggregated_gradient(
    estimator: str,
    *,
    probs: Any,
    means: Any,
    lengths: Any,
    psi: Any,
    G: int,
    mode: str,
    max_tokens: int | None = None,
    estimator_options: dict[str, Any] | None = None,
) -> np.ndarray:
    """Exact ``E[g]``, ``g = sum_i w_i A_i psi_i`` (the on-policy gradient of the aggregated loss).

    ``E[g] = G sum_o pi_o psi_o (mu_o T[1, L_o] + (1 - mu_o) T[0, L_o])`` with
    :func:`conditional_weighted_advantage`. ``estimator="grpo_std"`` with ``mode="sequence_mean"``
    is GRPO's Eq. (3) at ``rho = 1`` (Dr. GRPO paper); ``"dr_grpo"`` with ``mode="dr_grpo"`` is
    Dr. GRPO's loss as implemented (masked sum / ``max_tokens``).

    Args:
        estimator: registry name (per-group).
        probs, means, lengths: ``[N]`` outcome probabilities, success probabilities, lengths >= 1.
        psi: ``[N, d]`` trajectory scores.
        G: group size, ``>= 2``.
        mode: aggregation mode of :data:`grpo_theory.aggregation.AGGREGATION_MODES`.
        max_tokens: the constant of ``mode="dr_grpo"``.
        estimator_options: the estimator's options.

    Returns:
        ``[d]`` float64.
    """
    pr, mu, L = _outcomes(probs, means, lengths)
    ps = np.asarray(psi, dtype=np.float64)
    if ps.ndim != 2 or ps.shape[0] != pr.size:
        raise ValueError(f"psi must be shaped [N={pr.size}, d], got {ps.shape}")
    T = _conditional_weighted_advantage(estimator, pr, mu, L, G, mode, max_tokens,
                                        estimator_options)
    coef = G * pr * (mu * T[1, L] + (1.0 - mu) * T[0, L])
    return coef @ ps


def brute_force_aggregated_gradient(
    estimator: str,
    *,
    probs: Any,
    means: Any,
    lengths: Any,
    psi: Any,
    G: int,
    mode: str,
    max_tokens: int | None = None,
    estimator_options: dict[str, Any] | None = None,
) -> np.ndarray:
    """``E[g]`` by enumerating every joint (outcome, reward) group of ``G`` rollouts.

    Independent of the conditioning argument of :func:`expected_aggregated_gradient` (advantages
    by :func:`grpo_theory.compute_advantages` on each group's rewards, weights by
    :func:`grpo_theory.aggregation.aggregation_weights` on its lengths). Cost ``(2N)^G`` groups,
    at most :data:`BRUTE_FORCE_MAX_GROUPS`.
    """
    from .advantages import compute_advantages

    pr, mu, L = _outcomes(probs, means, lengths)
    ps = np.asarray(psi, dtype=np.float64)
    G = check_R(G, minimum=2)
    cells = [(o, r) for o in range(pr.size) for r in (0, 1)
             if pr[o] * (mu[o] if r else 1.0 - mu[o]) > 0]
    if G * math.log(max(len(cells), 1)) > math.log(BRUTE_FORCE_MAX_GROUPS):  # no int ** G
        raise ValueError(f"{len(cells)}^{G} joint groups exceed BRUTE_FORCE_MAX_GROUPS="
                         f"{BRUTE_FORCE_MAX_GROUPS}; use expected_aggregated_gradient")
    pc = np.array([pr[o] * (mu[o] if r else 1.0 - mu[o]) for o, r in cells])
    combos = np.array(list(product(range(len(cells)), repeat=G)))
    outc = np.array([c[0] for c in cells])[combos]
    rew = np.array([c[1] for c in cells], dtype=np.float64)[combos]
    A = np.asarray(compute_advantages(estimator, rew, **(estimator_options or {})))
    kw = {"max_tokens": max_tokens} if mode == "dr_grpo" else {}
    w = np.stack([aggregation_weights(L[row][None, :].astype(np.float64), mode=mode, **kw)[0]
                  for row in outc])  # type: ignore[arg-type]
    prob = np.prod(pc[combos], axis=1)
    coef = np.zeros(pr.size)
    np.add.at(coef, outc.ravel(), (prob[:, None] * w * A).ravel())
    return coef @ ps


def mean_length_given_reward(probs: Any, means: Any, lengths: Any, *, reward: int) -> float:
    """``E[L | r = reward]`` of one rollout (``reward`` 0: incorrect, 1: correct).

    >>> mean_length_given_reward([0.5, 0.5], [1.0, 0.0], [1, 3], reward=0)
    3.0
    """
    pr, mu, L = _outcomes(probs, means, lengths)
    if reward not in (0, 1):
        raise ValueError(f"reward must be 0 or 1, got {reward!r}")
    m = pr * (mu if reward else 1.0 - mu)
    if m.sum() <= 0:
        raise ValueError(f"no outcome has reward {reward} with positive probability")
    return float(m @ L / m.sum())
