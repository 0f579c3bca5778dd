"""Exact expectations of group advantages by enumeration, for any registered estimator.

The worlds of :mod:`sims` all reduce, for the questions of Theorem 4.1 and of unbiasedness, to a
*categorical outcome model*: each rollout independently draws an outcome ``o`` (an arm, a whole
token sequence) with probability ``pi_o``, has trajectory score ``psi_o`` and a reward whose law
depends only on ``o``. With binary rewards (``r | o ~ Bernoulli(mu_o)``) every rollout's reward
is marginally ``Bernoulli(p)``, ``p = sum_o pi_o mu_o``, independent of the others, so every
group statistic is a finite sum over (own reward, number of successes among the others). The
advantage values of each configuration are computed with :func:`grpo_theory.compute_advantages`
itself (nothing is re-implemented), which makes these expectations exact up to float rounding
for every estimator, linear or not (``grpo_std``, ``asym_grpo``, ``power_alpha``, ``fade``).
Tails are the exception: whether ``|A_1| > eps`` holds at a tie cannot be read off a float, so
:func:`bernoulli_tail` is :func:`grpo_theory.bounds.exact_advantage_tail_bernoulli` (the event
decided on the exact advantage values).

Because rollouts are exchangeable, ``E[g_hat] = E[(1/R) sum_i A_i psi_i] = E[A_1 psi_1]`` and
``E[A_1 psi_1] = sum_o pi_o psi_o E[A_1 | o]`` (seed paper Eq. 19 with the expectation taken
exactly).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from grpo_theory import binom_pmf, compute_advantages
from grpo_theory.bounds import exact_advantage_tail_bernoulli
from grpo_theory.limits import ARRAY_R_MAX, check_R_limit
from grpo_theory.registry import RegistryView, estimator_names, estimator_spec

__all__ = [
    "TABLE_R_MAX",
    "ESTIMATOR_SPECS",
    "estimator_options",
    "own_reward_table",
    "pair_table",
    "bernoulli_advantage_moments",
    "bernoulli_tail",
    "cond_advantage_given_reward",
    "expected_gradient_bernoulli",
    "linear_coefficients",
    "expected_gradient_linear",
    "projection_moments",
    "outcome_advantage_se",
]

#: Estimators checked by default, with the options used: a read-only live view of the registry
#: (``name -> EstimatorSpec.check_options``, see :mod:`grpo_theory.registry`).
ESTIMATOR_SPECS: Mapping[str, Mapping[str, Any]] = RegistryView(
    "check_options", where=lambda spec: not spec.batch_coupled
)


def estimator_options(name: str, opts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Options for ``name``: ``opts`` if given, else its registered ``check_options``."""
    if opts is not None:
        return dict(opts)
    return dict(ESTIMATOR_SPECS.get(name, {}))


#: Largest group the enumeration tables accept (:func:`own_reward_table`, :func:`pair_table` and
#: everything built on them): they evaluate the estimator on ``O(R)`` reward rows of ``R``
#: entries, ``O(R^2)`` memory (32 MiB for the pair table at the cap, about a second).
TABLE_R_MAX = 1024

_TABLE_ALTERNATIVE = (
    "for larger groups use grpo_theory.exact_advantage_moments (exact values per (R, k), "
    "R <= EXACT_R_MAX), the closed forms of grpo_theory.symbolic.linear_estimator_moments "
    "(linear estimators, any R), the Hoeffding/Bernstein bounds, or a Monte Carlo estimate"
)


def _check_R_p(R: int, p: float, *, routine: str | None) -> None:
    """``R >= 2`` and ``p`` in ``[0, 1]``; with ``routine``, also ``R <= TABLE_R_MAX``."""
    if int(R) != R or R < 2:
        raise ValueError(f"group size R must be an integer >= 2, got {R}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"success probability p must be in [0, 1], got {p}")
    if routine is not None:
        check_R_limit(int(R), limit=TABLE_R_MAX, name="TABLE_R_MAX", routine=routine,
                      cost="O(R) reward rows of R entries", alternative=_TABLE_ALTERNATIVE)


def own_reward_table(estimator: str, *, R: int, opts: dict[str, Any] | None = None) -> np.ndarray:
    """``T[r1, k] = A_1`` for the group ``[r1, 1 (k times), 0 (R-1-k times)]``.

    Args:
        estimator: registry name of :data:`grpo_theory.ESTIMATORS`.
        R: group size.
        opts: estimator options (default :data:`ESTIMATOR_SPECS`).

    Returns:
        ``[2, R]`` float64 array, ``k = 0..R-1`` successes among the other ``R-1`` rollouts.
    """
    _check_R_p(R, 0.5, routine="own_reward_table")
    rows = np.zeros((2 * R, R))
    for r1 in (0, 1):
        for k in range(R):
            rows[r1 * R + k, 0] = r1
            rows[r1 * R + k, 1 : 1 + k] = 1.0
    A = np.asarray(compute_advantages(estimator, rows, **estimator_options(estimator, opts)))
    return A[:, 0].reshape(2, R)


def pair_table(estimator: str, *, R: int, opts: dict[str, Any] | None = None) -> np.ndarray:
    """``T[r1, r2, k] = (A_1, A_2)`` for ``[r1, r2, 1 (k times), 0 (R-2-k times)]``.

    Returns:
        ``[2, 2, R-1, 2]`` float64 array.
    """
    _check_R_p(R, 0.5, routine="pair_table")
    rows = np.zeros((4 * (R - 1), R))
    i = 0
    for r1 in (0, 1):
        for r2 in (0, 1):
            for k in range(R - 1):
                rows[i, 0], rows[i, 1] = r1, r2
                rows[i, 2 : 2 + k] = 1.0
                i += 1
    A = np.asarray(compute_advantages(estimator, rows, **estimator_options(estimator, opts)))
    return A[:, :2].reshape(2, 2, R - 1, 2)


def cond_advantage_given_reward(
    estimator: str, *, R: int, p: float, opts: dict[str, Any] | None = None
) -> np.ndarray:
    """``[E[A_1 | r_1 = 0], E[A_1 | r_1 = 1]]`` for i.i.d. Bernoulli(p) rewards (exact)."""
    _check_R_p(R, p, routine="cond_advantage_given_reward")
    T = own_reward_table(estimator, R=R, opts=opts)
    w = binom_pmf(np.arange(R), R - 1, p)
    return T @ w


def bernoulli_advantage_moments(
    estimator: str, *, R: int, p: float, opts: dict[str, Any] | None = None
) -> dict[str, float]:
    """Exact moments of the advantages of a group of ``R`` i.i.d. Bernoulli(p) rewards.

    Returns:
        dict with ``mean`` (E A_i), ``var`` (Var A_i), ``cov`` (Cov(A_i, A_j), i != j),
        ``mean_sum`` (E sum_i A_i), ``max_abs_sum`` (max over all groups of |sum_i A_i|),
        ``cond_mean_failure``, ``cond_mean_success``, ``sigma2`` (= p (1 - p)).
    """
    _check_R_p(R, p, routine="bernoulli_advantage_moments")
    T = own_reward_table(estimator, R=R, opts=opts)
    wk = binom_pmf(np.arange(R), R - 1, p)
    pr = np.array([1.0 - p, p])
    m1 = float(pr @ T @ wk)
    m2 = float(pr @ (T**2) @ wk)
    P2 = pair_table(estimator, R=R, opts=opts)
    wk2 = binom_pmf(np.arange(R - 1), R - 2, p)
    prod = P2[..., 0] * P2[..., 1]
    e12 = float(np.einsum("a,b,abk,k->", pr, pr, prod, wk2))
    # full-group sums, k = 0..R successes
    rows = (np.arange(R)[None, :] < np.arange(R + 1)[:, None]).astype(np.float64)
    opts_ = estimator_options(estimator, opts)
    sums = np.asarray(compute_advantages(estimator, rows, **opts_)).sum(axis=1)
    return {
        "mean": m1,
        "var": m2 - m1**2,
        "cov": e12 - m1**2,
        "mean_sum": float(binom_pmf(np.arange(R + 1), R, p) @ sums),
        "max_abs_sum": float(np.max(np.abs(sums))),
        "cond_mean_failure": float(T[0] @ wk),
        "cond_mean_success": float(T[1] @ wk),
        "sigma2": p * (1.0 - p),
    }


def bernoulli_tail(
    estimator: str, *, R: int, p: float, eps: float, opts: dict[str, Any] | None = None
) -> float:
    """Exact ``P(|A_1| > eps)`` (strict) for i.i.d. Bernoulli(p) rewards (Thm 4.1 (iv)).

    :func:`grpo_theory.bounds.exact_advantage_tail_bernoulli` (the one implementation) with this
    module's options: the event ``|A_1| > eps`` is decided exactly by
    :func:`grpo_theory.bounds.advantage_tail_event` (exact advantage values; ``eps`` read as its
    decimal repr, so ``eps = 1/3`` is ``0.3333333333333333 < 1/3``), the same event the Monte
    Carlo side (:func:`sims.checks.sampled_advantage_tail_event`) counts. There is no float
    fallback: every per-group estimator of the registry has an exact form (batch-coupled ones are
    not per-group); an estimator without one raises ``ValueError``.

    Args:
        estimator: registry name with an exact form.
        R: group size, ``>= 2``.
        p: success probability in ``[0, 1]``.
        eps: threshold, ``>= 0``.
        opts: estimator options (default :data:`ESTIMATOR_SPECS`).

    Returns:
        The probability (float).
    """
    _check_R_p(R, p, routine=None)  # capped at EXACT_R_MAX by the exact tail itself
    _require_exact(estimator)
    return float(
        exact_advantage_tail_bernoulli(
            R=R, eps=eps, p=p, estimator=estimator,
            estimator_options=estimator_options(estimator, opts),
        )
    )


def _require_exact(estimator: str) -> None:
    if not estimator_spec(estimator).has_exact:
        raise ValueError(
            f"estimator {estimator!r} has no exact form, so the event |A_1| > eps cannot be "
            "decided exactly (ties); the advantage tail is defined here for estimators with an "
            f"exact form only: {list(estimator_names(exact=True))}"
        )


def expected_gradient_bernoulli(
    estimator: str,
    *,
    probs: np.ndarray,
    means: np.ndarray,
    psi: np.ndarray,
    R: int,
    opts: dict[str, Any] | None = None,
) -> np.ndarray:
    """Exact ``E[g_hat]``, ``g_hat = (1/R) sum_i A_i psi_i`` (Eq. 19), binary rewards.

    ``E[g_hat] = sum_o pi_o psi_o (mu_o E[A_1 | r_1=1] + (1 - mu_o) E[A_1 | r_1=0])``.

    Args:
        estimator: registry name.
        probs: ``[O]`` outcome probabilities (sum to 1).
        means: ``[O]`` success probabilities ``mu_o``.
        psi: ``[O, d]`` trajectory scores.
        R: group size.
        opts: estimator options.

    Returns:
        ``[d]`` exact expected gradient.
    """
    probs, means, psi = _outcome_arrays(probs, means, psi)
    p = float(np.clip(probs @ means, 0.0, 1.0))
    c0, c1 = cond_advantage_given_reward(estimator, R=R, p=p, opts=opts)
    w = probs * (means * c1 + (1.0 - means) * c0)
    return w @ psi


def linear_coefficients(
    estimator: str, *, R: int, opts: dict[str, Any] | None = None, check_rng_seed: int = 0
) -> tuple[float, float, float]:
    """``(a, b, c)`` with ``A_1 = a r_1 + b sum_{j != 1} r_j + c`` for a linear estimator.

    Raises:
        ValueError: when the estimator is not linear (checked on random reward rows).
    """
    if int(R) != R or R < 1:
        raise ValueError(f"group size R must be a positive integer, got {R}")
    check_R_limit(int(R), limit=ARRAY_R_MAX // 11, name="ARRAY_R_MAX // 11",
                  routine="linear_coefficients",
                  cost="11 reward rows of R entries", alternative="the closed form "
                  "grpo_theory.symbolic.linear_weights(name) holds for any R")
    opts_ = estimator_options(estimator, opts)
    basis = np.zeros((3, R))
    basis[1, 0] = 1.0
    basis[2, 1] = 1.0
    A = np.asarray(compute_advantages(estimator, basis, **opts_))[:, 0]
    c, a, b = A[0], A[1] - A[0], A[2] - A[0]
    x = np.random.default_rng(check_rng_seed).random((8, R))
    pred = a * x[:, 0] + b * (x[:, 1:].sum(1)) + c
    got = np.asarray(compute_advantages(estimator, x, **opts_))[:, 0]
    if not np.allclose(pred, got, atol=1e-12, rtol=1e-10):
        raise ValueError(f"estimator {estimator!r} is not linear in the rewards")
    return float(a), float(b), float(c)


def expected_gradient_linear(
    estimator: str,
    *,
    probs: np.ndarray,
    means: np.ndarray,
    psi: np.ndarray,
    R: int,
    opts: dict[str, Any] | None = None,
) -> np.ndarray:
    """Exact ``E[g_hat]`` for a linear estimator and ANY reward law with conditional means ``mu_o``.

    ``E[A_1 | o] = a mu_o + b (R-1) J + c`` with :func:`linear_coefficients`, ``J = pi . mu``.
    """
    probs, means, psi = _outcome_arrays(probs, means, psi, binary=False)
    a, b, c = linear_coefficients(estimator, R=R, opts=opts)
    J = float(probs @ means)
    return (probs * (a * means + b * (R - 1) * J + c)) @ psi


def _conditional_tables(
    estimator: str, R: int, p: float, opts: dict[str, Any] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(T, w1, P2, w2)``: :func:`own_reward_table` with its weights ``Bin(j; R-1, p)`` and
    :func:`pair_table` with ``Bin(j; R-2, p)``."""
    T = own_reward_table(estimator, R=R, opts=opts)
    P2 = pair_table(estimator, R=R, opts=opts)
    return T, binom_pmf(np.arange(R), R - 1, p), P2, binom_pmf(np.arange(R - 1), R - 2, p)


def projection_moments(
    estimator: str,
    *,
    probs: np.ndarray,
    means: np.ndarray,
    x: np.ndarray,
    R: int,
    opts: dict[str, Any] | None = None,
) -> tuple[float, float]:
    """Exact ``E[X]`` and ``E[X^2]`` of ``X = (1/R) sum_i A_i x_{o_i}`` for one group, binary
    rewards (``x_o``: a scalar per outcome, e.g. ``<psi_o, grad J> / |grad J|^2``).

    With ``m_r = sum_o pi_o P(r | o) x_o`` and ``m2_r = sum_o pi_o P(r | o) x_o^2`` (``P(1 | o) =
    mu_o``), and the others' rewards independent of a rollout's outcome given its reward:
    ``E[X] = sum_r m_r E[A_1 | r_1 = r]`` and
    ``E[X^2] = (1/R) sum_r m2_r E[A_1^2 | r] + ((R-1)/R) sum_{r, r'} m_r m_r' E[A_1 A_2 | r, r']``
    (the conditional moments from :func:`own_reward_table` / :func:`pair_table`).
    """
    probs, means, _ = _outcome_arrays(probs, means, np.zeros((np.size(probs), 1)))
    x = np.asarray(x, dtype=np.float64)
    if x.shape != probs.shape:
        raise ValueError(f"x must be shaped like probs {probs.shape}, got {x.shape}")
    p = float(np.clip(probs @ means, 0.0, 1.0))
    _check_R_p(R, p, routine="projection_moments")
    T, w1, P2, w2 = _conditional_tables(estimator, R, p, opts)
    pr = np.stack([probs * (1.0 - means), probs * means])  # [r, o]: pi_o P(r | o)
    m, m2 = pr @ x, pr @ x**2
    mean = float(m @ (T @ w1))
    e11 = float(m2 @ ((T**2) @ w1))
    e12 = float(np.einsum("a,b,abj,j->", m, m, P2[..., 0] * P2[..., 1], w2))
    return mean, e11 / R + (R - 1) / R * e12


def outcome_advantage_se(
    estimator: str,
    *,
    probs: np.ndarray,
    means: np.ndarray,
    outcome: int,
    theta: float,
    R: int,
    n_groups: int,
    opts: dict[str, Any] | None = None,
) -> float:
    """Exact (delta-method) SE of ``sum_g S_g / sum_g N_g``, the Monte Carlo ``E[A_i | o]``.

    ``S = sum_i 1[o_i = o] A_i``, ``N = sum_i 1[o_i = o]`` per group; at the exact ``theta =
    E[A_i | o]`` the ratio's SE is ``sqrt(E[(S - theta N)^2] / n) / E[N]``, ``E[N] = R pi_o``,
    with ``E[(S - theta N)^2] = R E[Z_1^2] + R (R-1) E[Z_1 Z_2]``, ``Z_i = 1[o_i = o] (A_i -
    theta)``: ``E[Z_1^2] = pi_o sum_r P(r | o) E[(A_1 - theta)^2 | r]`` and
    ``E[Z_1 Z_2] = pi_o^2 sum_{r, r'} P(r | o) P(r' | o) E[(A_1 - theta)(A_2 - theta) | r, r']``.
    """
    probs, means, _ = _outcome_arrays(probs, means, np.zeros((np.size(probs), 1)))
    p = float(np.clip(probs @ means, 0.0, 1.0))
    _check_R_p(R, p, routine="outcome_advantage_se")
    T, w1, P2, w2 = _conditional_tables(estimator, R, p, opts)
    pi, mu = float(probs[outcome]), float(means[outcome])
    pr = np.array([1.0 - mu, mu])
    ez2 = pi * float(pr @ (((T - theta) ** 2) @ w1))
    cross = (P2[..., 0] - theta) * (P2[..., 1] - theta)
    ez12 = pi**2 * float(np.einsum("a,b,abj,j->", pr, pr, cross, w2))
    v = max(R * ez2 + R * (R - 1) * ez12, 0.0)
    return float(np.sqrt(v / n_groups) / (R * pi))


def _outcome_arrays(
    probs: Any, means: Any, psi: Any, *, binary: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    means = np.asarray(means, dtype=np.float64)
    psi = np.asarray(psi, dtype=np.float64)
    if probs.ndim != 1 or means.shape != probs.shape or psi.ndim != 2 or psi.shape[0] != probs.size:
        raise ValueError(
            f"need probs [O], means [O], psi [O, d]; got {probs.shape}, {means.shape}, {psi.shape}"
        )
    if abs(probs.sum() - 1.0) > 1e-9 or (probs < 0).any():
        raise ValueError(f"probs must be a distribution (sum {probs.sum()})")
    if binary and ((means < 0).any() or (means > 1).any()):
        raise ValueError("means must be success probabilities in [0, 1]")
    return probs, means, psi
