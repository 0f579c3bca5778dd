"""Symbolic (sympy) moments of the linear advantage estimators for i.i.d. rewards.

Every closed-form estimator here is a linear form of the group's rewards:

    ``A_i = alpha r_i + beta sum_{j != i} r_j + c``

with ``(alpha, beta, c)``:

=============  ===============  ==============  ======
estimator      alpha            beta            c
=============  ===============  ==============  ======
grpo/dr_grpo   ``1 - 1/R``      ``-1/R``        0
rloo           ``1``            ``-1/(R-1)``    0
reinforce      ``1``            ``0``           ``-b``
=============  ===============  ==============  ======

For i.i.d. rewards with mean ``mu`` and variance ``sigma2`` bilinearity of the covariance gives,
for symbolic group size ``R`` (our derivation; Theorem 4.1 (ii)-(iii) of arXiv 2606.29238 states
the grpo case):

* ``E[A_i] = (alpha + (R-1) beta) mu + c``
* ``Var(A_i) = (alpha^2 + (R-1) beta^2) sigma2``
* ``Cov(A_i, A_j) = (2 alpha beta + (R-2) beta^2) sigma2``  (``i != j``; the common rewards
  ``r_k, k != i, j`` contribute ``beta^2`` each, ``r_i`` and ``r_j`` ``alpha beta`` each)
* ``E[A_i | r_i] = alpha r_i + (R-1) beta mu + c``: for grpo ``(1 - 1/R)(r_i - mu)``, so a rollout
  that is part of its own baseline sees its own deviation shrunk by ``1/R``;
  rloo's is the unshrunk ``r_i - mu``.
* ``sum_i A_i = (alpha + (R-1) beta) sum_j r_j + R c`` (zero-sum iff both coefficients vanish).

Symbols are plain ``sympy.Symbol("R")``, ``"sigma2"``, ``"mu"``, ``"r_i"``, ``"b"`` (no
assumptions), exported as :data:`R`, :data:`sigma2`, :data:`mu`, :data:`r_i`, :data:`b`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .registry import RegistryView, estimator_names, estimator_spec

if TYPE_CHECKING:  # sympy is imported when a symbol or a moment is first asked for
    import sympy as sp

__all__ = [
    "R",  # noqa: F822 (lazy: module __getattr__)
    "sigma2",  # noqa: F822 (lazy: module __getattr__)
    "mu",  # noqa: F822 (lazy: module __getattr__)
    "r_i",  # noqa: F822 (lazy: module __getattr__)
    "b",  # noqa: F822 (lazy: module __getattr__)
    "LINEAR_ESTIMATORS",
    "linear_weights",
    "linear_estimator_moments",
]

_SYMBOLS = ("R", "sigma2", "mu", "r_i", "b")


def __getattr__(name: str) -> Any:
    """The symbols :data:`R`, :data:`sigma2`, :data:`mu`, :data:`r_i`, :data:`b` (lazy sympy)."""
    if name in _SYMBOLS:
        import sympy as sp

        value = sp.Symbol(name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LINEAR_ESTIMATORS = RegistryView("linear")
"""Read-only live view ``name -> linear weights`` of the registered linear estimators."""


def linear_weights(name: str, *, baseline: sp.Expr | float = 0) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """``(alpha, beta, c)`` of ``A_i = alpha r_i + beta sum_{j != i} r_j + c``.

    Read from the estimator's registry entry (``EstimatorSpec.linear``) with a symbolic ``R``.

    Args:
        name: one of :data:`LINEAR_ESTIMATORS`.
        baseline: reinforce's constant baseline ``b`` (default 0; pass the symbol :data:`b`
            to keep it symbolic). Passed to estimators that have a ``baseline`` option; ignored
            by the others.

    Returns:
        Three sympy expressions in :data:`R`.

    >>> linear_weights("rloo")
    (1, -1/(R - 1), 0)
    """
    import sympy as sp

    spec = estimator_spec(name) if name in estimator_names() else None
    if spec is None or spec.linear is None:
        raise ValueError(
            f"no linear closed form for {name!r}; choose one of {list(LINEAR_ESTIMATORS)}"
        )
    opts = {"baseline": sp.sympify(baseline)} if "baseline" in spec.options else {}
    Rs = sp.Symbol("R")
    return tuple(sp.sympify(w) for w in spec.linear(Rs, **opts))  # type: ignore[return-value]


def linear_estimator_moments(name: str, *, baseline: sp.Expr | float = 0) -> dict[str, sp.Expr]:
    """Mean, variance, covariance and own-reward conditional mean, for symbolic ``R``.

    Rewards are i.i.d. with mean :data:`mu` and variance :data:`sigma2`.

    Args:
        name: ``"grpo"``, ``"dr_grpo"``, ``"rloo"`` or ``"reinforce"``.
        baseline: reinforce's constant ``b`` (default 0).

    Returns:
        dict of sympy expressions (simplified): ``mean`` = E[A_i], ``var`` = Var(A_i),
        ``cov`` = Cov(A_i, A_j) for i != j, ``cond_mean_given_own`` = E[A_i | r_i] (in
        :data:`r_i`), ``sum_coefficient`` = the coefficient of ``sum_j r_j`` in ``sum_i A_i``, and
        ``sum_constant`` = its constant ``R c``.

    >>> m = linear_estimator_moments("grpo")
    >>> m["var"], m["cov"], m["cond_mean_given_own"]
    (sigma2*(R - 1)/R, -sigma2/R, -(R - 1)*(mu - r_i)/R)
    >>> linear_estimator_moments("rloo")["var"]
    R*sigma2/(R - 1)
    """
    import sympy as sp

    R, mu, sigma2, r_i = sp.symbols("R mu sigma2 r_i")
    alpha, beta, c = linear_weights(name, baseline=baseline)
    out = {
        "mean": (alpha + (R - 1) * beta) * mu + c,
        "var": (alpha**2 + (R - 1) * beta**2) * sigma2,
        "cov": (2 * alpha * beta + (R - 2) * beta**2) * sigma2,
        "cond_mean_given_own": alpha * r_i + (R - 1) * beta * mu + c,
        "sum_coefficient": alpha + (R - 1) * beta,
        "sum_constant": R * c,
    }
    return {k: sp.factor(sp.simplify(v)) for k, v in out.items()}
