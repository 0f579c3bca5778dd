"""Exact expected updates and exact gradient flow of GRPO-type losses in the length worlds.

A loss is named by a :class:`LossSpec`: an advantage estimator of the
:mod:`grpo_theory.registry` (with its options) and a loss aggregation of
:mod:`grpo_theory.aggregation`. :data:`LOSSES` holds the ones Dr. GRPO (Liu et al. 2025, arXiv
2503.20783) discusses:

==================  ============  ===================================  ==========================
name                estimator     aggregation                          what
==================  ============  ===================================  ==========================
``grpo``            ``grpo_std``  ``sequence_mean`` (``1/(G |o_i|)``)  Eq. (3); std as the
                    ddof=1,                                            authors' code (torch
                    eps=1e-8                                           default, + 1e-8)
``grpo_ddof0``      ``grpo_std``  ``sequence_mean``                    the population std
                    ddof=0
``dr_grpo``         ``dr_grpo``   ``dr_grpo`` (``1/(G MAX_TOKENS)``)   Sec. 3.2 as implemented
``dr_grpo_sum``     ``dr_grpo``   ``sequence_sum`` (``1/G``)           Fig. 1's objective
``mean_seq_mean``   ``dr_grpo``   ``sequence_mean``                    Listing 1, per response
``mean_token_mean`` ``dr_grpo``   ``token_mean`` (``1/sum_j |o_j|``)   Listing 1, per batch
``std_const``       ``grpo_std``  ``dr_grpo``                          std kept, length removed
==================  ============  ===================================  ==========================

``MAX_TOKENS`` is the world's ``max_length``. :func:`expected_update` is the exact ``E[g]`` of
:func:`grpo_theory.length_bias.expected_aggregated_gradient` (on-policy, ``rho = 1``);
:func:`flow` iterates ``theta <- theta + lr E[g]`` (the exact expected-step dynamics; small ``lr``
approximates the gradient flow) and records ``J`` and the mean length of correct and incorrect
responses; :func:`sampled_gradients` gives per-group ``g`` for Monte Carlo checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from grpo_theory import aggregation_weights, compute_advantages
from grpo_theory.length_bias import expected_aggregated_gradient, mean_length_given_reward

from .question_mix import QuestionMix

__all__ = ["LossSpec", "LOSSES", "expected_update", "true_gradient", "flow",
           "sampled_gradients", "length_summary"]


@dataclass(frozen=True)
class LossSpec:
    """An estimator (registry name and options) and a loss aggregation mode."""

    estimator: str
    mode: str
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def max_tokens(self, world: Any) -> int | None:
        """``world.max_length`` for the ``dr_grpo`` aggregation, else None."""
        return int(world.max_length) if self.mode == "dr_grpo" else None


AUTHORS_STD = {"ddof": 1, "eps": 1e-8}  # torch.std default (Bessel) + 1e-8, authors' code

LOSSES: Mapping[str, LossSpec] = MappingProxyType({
    "grpo": LossSpec("grpo_std", "sequence_mean", AUTHORS_STD, "GRPO (Eq. 3)"),
    "grpo_ddof0": LossSpec("grpo_std", "sequence_mean", {"ddof": 0, "eps": 0.0},
                           "GRPO, population std"),
    "dr_grpo": LossSpec("dr_grpo", "dr_grpo", {}, "Dr. GRPO (sum / MAX_TOKENS)"),
    "dr_grpo_sum": LossSpec("dr_grpo", "sequence_sum", {}, "Dr. GRPO (Fig. 1 objective)"),
    "mean_seq_mean": LossSpec("dr_grpo", "sequence_mean", {}, "mean-centred, per-response mean"),
    "mean_token_mean": LossSpec("dr_grpo", "token_mean", {}, "mean-centred, batch token mean"),
    "std_const": LossSpec("grpo_std", "dr_grpo", AUTHORS_STD, "std-normalised, constant norm."),
})


def _spec(loss: str | LossSpec) -> LossSpec:
    if isinstance(loss, LossSpec):
        return loss
    try:
        return LOSSES[loss]
    except KeyError:
        raise ValueError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)} or pass a "
                         "LossSpec") from None


def expected_update(world: Any, loss: str | LossSpec, *, G: int) -> np.ndarray:
    """Exact on-policy ``E[g]`` (``[d]``) of ``loss`` with groups of ``G`` in ``world``.

    For a :class:`sims.question_mix.QuestionMix` the groups are drawn within a question:
    ``E[g]`` stacks ``P(q) E[g_q]``, with the population's one ``MAX_TOKENS``.
    """
    spec = _spec(loss)
    if isinstance(world, QuestionMix):
        mt = spec.max_tokens(world)
        return np.concatenate([wq * _one_question(w, spec, G, mt)
                               for wq, w in zip(world.weights, world.worlds, strict=True)])
    return _one_question(world, spec, G, spec.max_tokens(world))


def _one_question(world: Any, spec: LossSpec, G: int, max_tokens: int | None) -> np.ndarray:
    probs, means, psi = world.outcome_model()
    return expected_aggregated_gradient(
        spec.estimator, probs=probs, means=means, lengths=world.lengths, psi=psi, G=G,
        mode=spec.mode, max_tokens=max_tokens, estimator_options=dict(spec.options))


def true_gradient(world: Any, *, G: int | None = None) -> np.ndarray:
    """Exact ``grad J`` (``G`` ignored; the signature matches :func:`expected_update`)."""
    return np.asarray(world.grad_J(), dtype=np.float64)


def length_summary(world: Any) -> dict[str, float]:
    """``J``, ``E[L | incorrect]``, ``E[L | correct]`` and ``E[L]`` of ``world``."""
    probs, means, _ = world.outcome_model()
    return {
        "J": float(probs @ means),
        "mean_length_incorrect": mean_length_given_reward(probs, means, world.lengths, reward=0),
        "mean_length_correct": mean_length_given_reward(probs, means, world.lengths, reward=1),
        "mean_length": float(probs @ world.lengths),
    }


def flow(world: Any, loss: str | LossSpec | None, *, G: int, lr: float, steps: int
         ) -> dict[str, np.ndarray]:
    """Exact expected-step dynamics ``theta <- theta + lr E[g]`` (``loss=None``: ``grad J``).

    Returns:
        dict of ``[steps + 1]`` arrays ``J``, ``mean_length_incorrect``,
        ``mean_length_correct``, ``mean_length``, and ``theta`` ``[steps + 1, d]``.
    """
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    rows = [length_summary(world)]
    thetas = [world.theta]
    for _ in range(steps):
        g = true_gradient(world) if loss is None else expected_update(world, loss, G=G)
        world = world.with_theta(world.theta + lr * g)
        rows.append(length_summary(world))
        thetas.append(world.theta)
    out = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    out["theta"] = np.stack(thetas)
    return out


def sampled_gradients(world: Any, loss: str | LossSpec, *, G: int, n_groups: int,
                      rng: np.random.Generator) -> np.ndarray:
    """``[n_groups, d]`` per-group ``g = sum_i w_i A_i psi_i`` from i.i.d. sampled groups.

    Advantages by :func:`grpo_theory.compute_advantages` on each group's rewards, weights by
    :func:`grpo_theory.aggregation_weights` on each group's lengths (one prompt per group).
    """
    spec = _spec(loss)
    idx, rewards = world.sample(n_groups, G, rng)
    _, _, psi = world.outcome_model()
    A = np.asarray(compute_advantages(spec.estimator, rewards, **dict(spec.options)))
    L = np.asarray(world.lengths)[idx].astype(np.float64)
    kw = {"max_tokens": spec.max_tokens(world)} if spec.mode == "dr_grpo" else {}
    if spec.mode == "token_mean":  # couples a group's rollouts: one call per distinct group
        rows, inv = np.unique(L, axis=0, return_inverse=True)
        w = np.stack([aggregation_weights(row[None, :], mode="token_mean")[0]
                      for row in rows])[inv.ravel()]
    else:  # per-rollout weights; the 1/P of a P-prompt batch is undone (one prompt per group)
        w = aggregation_weights(L, mode=spec.mode, **kw) * (n_groups if spec.mode != "token_sum"
                                                            else 1.0)
    return np.einsum("ng,ngd->nd", w * A, psi[idx])
