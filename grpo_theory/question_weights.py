"""Per-question weight of a group estimator: the difficulty bias of std normalisation.

Binary rewards, one question with success probability ``p`` under the current policy, groups of
``G`` i.i.d. rollouts. For any per-group estimator rollout ``i``'s advantage depends on its
response only through its reward, so (seed paper Eq. 19, expectation taken exactly)

    ``E[(1/G) sum_i A_i psi_i] = c(p) grad p``,
    ``c(p) = E[A_1 | r_1 = 1] - E[A_1 | r_1 = 0]
          = sum_{j=0}^{G-1} Bin(j; G-1, p) (a_S(j+1) - a_F(j))``

(``a_S(k)``, ``a_F(k)``: the advantage of a success / failure in a group with ``k`` successes).
``c(p)`` is the weight the estimator gives the question's true gradient ``grad p``: with several
questions ``E[g] = sum_q P(q) c(p_q) grad p_q`` while ``grad J = sum_q P(q) grad p_q``.

* Mean-centred GRPO / Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): ``c = (G - 1) / G`` for every
  ``p`` (the linear weight ``alpha`` of :data:`grpo_theory.LINEAR_ESTIMATORS`): no difficulty bias.
* Std-normalised GRPO (``grpo_std``): ``c(p)`` depends on ``p``: Dr. GRPO's "question-level
  difficulty bias" (Sec. 3.1). For ``G -> inf`` it tends to ``1 / (sqrt(p (1 - p)) + eps)``
  (:func:`population_std_question_weight`), the inverse population std.

:func:`question_weight` evaluates ``c(p)`` from the registered estimator's float values
(:func:`success_failure_values`; no sympy), vectorised over ``p``;
:func:`grpo_theory.bernoulli.exact_advantage_moments` is the exact (sympy-valued) route
(``cond_mean_success - cond_mean_failure``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ._validate import check_R, real_option
from .advantages import compute_advantages
from .bernoulli import binom_pmf
from .limits import SQUARE_R_MAX, check_R_limit
from .registry import estimator_spec

__all__ = ["success_failure_values", "conditional_advantages", "question_weight",
           "population_std_question_weight", "group_mean_factor"]


def conditional_advantages(estimator: str, *, G: int, p: Any, **opts: Any
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(E[A_1 | r_1 = 1], E[A_1 | r_1 = 0])`` for i.i.d. Bernoulli(p) rewards, groups of ``G``.

    ``E[A_1 | r_1 = 1] = sum_j Bin(j; G-1, p) a_S(j+1)`` and ``E[A_1 | r_1 = 0] = sum_j Bin(j;
    G-1, p) a_F(j)``, with the registered estimator's float values
    (:func:`success_failure_values`; no sympy), vectorised over ``p``.
    (:func:`grpo_theory.bernoulli.exact_advantage_moments` is the exact route.)

    >>> s, f = conditional_advantages("grpo", G=2, p=0.5)
    >>> float(s), float(f)
    (0.25, -0.25)
    """
    G = check_R(G, minimum=2)
    q = np.asarray(p, dtype=np.float64)
    if not np.all((q >= 0) & (q <= 1)):
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    a_s, a_f = success_failure_values(estimator, G=G, **opts)
    pmf = binom_pmf(np.arange(G)[(...,) + (None,) * q.ndim], G - 1, q)  # [G, *p.shape]
    return np.tensordot(a_s, pmf, axes=(0, 0)), np.tensordot(a_f, pmf, axes=(0, 0))


def success_failure_values(estimator: str, *, G: int, **opts: Any
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(a_S(j + 1), a_F(j))`` for ``j = 0..G-1``: the advantage of a success and of a failure in
    a binary group of ``G`` with ``j`` successes among the others, from one call of the
    registered estimator on the rows ``[1]*k + [0]*(G-k)``, ``k = 0..G`` (the values of
    :func:`grpo_theory.bernoulli.advantage_values` with ``exact=False``).

    >>> s, f = success_failure_values("grpo", G=2)
    >>> s.tolist(), f.tolist()
    ([0.5, 0.0], [0.0, -0.5])
    """
    G = check_R(G, minimum=2)
    check_R_limit(G, limit=SQUARE_R_MAX, name="SQUARE_R_MAX", routine="success_failure_values",
                  cost="the (G + 1) x G rows of every binary group", alternative="the estimator's "
                  "exact form, estimator_spec(estimator).exact(G, k), gives (a_S(k), a_F(k)) for "
                  "any G; population_std_question_weight is the G -> infinity closed form")
    rows = (np.arange(G)[None, :] < np.arange(G + 1)[:, None]).astype(np.float64)
    A = np.asarray(compute_advantages(estimator, rows, **opts), dtype=np.float64)
    return A[1:, 0].copy(), A[:G, G - 1].copy()


def question_weight(estimator: str, *, G: int, p: Any, **opts: Any) -> np.ndarray:
    """``c(p) = E[A_1 | r_1 = 1] - E[A_1 | r_1 = 0]``: the question's weight (module docstring).

    Args:
        estimator: registry name (per-group estimator).
        G: group size, ``>= 2``.
        p: success probability(ies) in ``[0, 1]`` (scalar or array).
        **opts: the estimator's options (e.g. ``ddof``, ``eps`` of ``grpo_std``).

    Returns:
        float64 array of ``p``'s shape.

    >>> round(float(question_weight("grpo", G=4, p=0.3)), 12)
    0.75
    >>> round(float(question_weight("grpo_std", G=2, p=0.3, ddof=1)), 6)
    0.707107
    """
    s, f = conditional_advantages(estimator, G=G, p=p, **opts)
    return s - f


def population_std_question_weight(p: Any, *, eps: float = 0.0) -> np.ndarray:
    """The ``G -> inf`` limit of ``grpo_std``'s weight: ``1 / (sqrt(p (1 - p)) + eps)``.

    The advantages become ``(r - p) / (sigma + eps)`` with the population std
    ``sigma = sqrt(p (1 - p))`` (any ``ddof``), so ``c = ((1 - p) + p) / (sigma + eps)``.
    Infinite at ``p in {0, 1}`` when ``eps = 0`` (returned as ``inf``).

    >>> float(population_std_question_weight(0.5))
    2.0
    """
    e = real_option(eps, "eps", minimum=0.0)
    q = np.asarray(p, dtype=np.float64)
    if not np.all((q >= 0) & (q <= 1)):
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    den = np.sqrt(q * (1.0 - q)) + e
    with np.errstate(divide="ignore"):
        return np.where(den > 0, 1.0 / np.where(den > 0, den, 1.0), np.inf)


def group_mean_factor(G: int) -> float:
    """``(G - 1) / G``: the scale of the mean-centred estimator's expected gradient.

    The group mean includes the own reward, so ``E[(1/G) sum_i (r_i - mean) psi_i]
    = ((G - 1)/G) grad J``. Read from the registered linear weights of ``dr_grpo``
    (``A_1 = alpha r_1 + beta sum_{j != 1} r_j``, the factor is ``alpha``), not typed in.

    >>> group_mean_factor(4)
    0.75
    """
    G = check_R(G, minimum=2)
    alpha, _beta, _c = estimator_spec("dr_grpo").linear(Fraction(G))  # type: ignore[misc]
    return float(alpha)
