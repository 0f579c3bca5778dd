"""A population of questions, each its own world with its own parameters (exact by enumeration).

Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, Sec. 3.1) says std normalisation weighs questions by
their difficulty. In a :class:`QuestionMix` a question ``q`` is drawn with probability ``P(q)``,
then a group of ``G`` responses to it; every question is a length world
(:class:`sims.length_worlds.ResponseBandit`, :class:`sims.length_worlds.AnswerLengthMDP`, or any
object with ``outcome_model``, ``lengths``, ``theta``, ``with_theta``, ``max_length``, ``sample``).

* Parameters: the questions' parameter vectors concatenated (block ``q`` moves only question
  ``q``'s policy).
* ``J = sum_q P(q) J_q`` and ``grad J`` stacks ``P(q) grad J_q``.
* :meth:`QuestionMix.outcome_model` is the marginal law of one response (the question drawn
  first): probabilities ``P(q) pi_{q,o}``, block scores. ``E[L | incorrect]`` of that law is the
  population's, so a difficulty that raises both failure rate and length shows up in it.
* Groups are drawn within one question, so the expected update of a group loss is
  ``sum_q P(q) E[g_q]`` (:func:`sims.length_dynamics.expected_update` handles a mix).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["QuestionMix"]


@dataclass(frozen=True)
class QuestionMix:
    """Questions ``worlds`` drawn with probabilities ``weights``.

    Attributes:
        worlds: tuple of question worlds.
        weights: ``[Q]`` question probabilities (>= 0, sum 1).
    """

    worlds: tuple[Any, ...]
    weights: np.ndarray

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=np.float64)
        if len(self.worlds) < 1 or w.shape != (len(self.worlds),):
            raise ValueError(f"need weights shaped [Q={len(self.worlds)}], got {w.shape}")
        if np.any(w < 0) or abs(w.sum() - 1.0) > 1e-9 or not np.all(np.isfinite(w)):
            raise ValueError(f"weights must be a distribution, got {self.weights!r}")
        object.__setattr__(self, "worlds", tuple(self.worlds))
        object.__setattr__(self, "weights", w)

    @cached_property
    def _param_splits(self) -> np.ndarray:
        return np.cumsum([w.theta.size for w in self.worlds])[:-1]

    @cached_property
    def _outcome_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(w.lengths) for w in self.worlds])])

    @property
    def theta(self) -> np.ndarray:
        """The questions' parameters, concatenated."""
        return np.concatenate([w.theta for w in self.worlds])

    def with_theta(self, theta: np.ndarray) -> QuestionMix:
        """Same population with new parameters (layout of :attr:`theta`)."""
        th = np.asarray(theta, dtype=np.float64)
        if th.shape != self.theta.shape:
            raise ValueError(f"theta must be shaped {self.theta.shape}, got {th.shape}")
        parts = np.split(th, self._param_splits)
        return QuestionMix(tuple(w.with_theta(p) for w, p in zip(self.worlds, parts, strict=True)),
                           self.weights)

    @property
    def max_length(self) -> int:
        """The longest response of any question (one MAX_TOKENS for the run)."""
        return max(int(w.max_length) for w in self.worlds)

    @cached_property
    def lengths(self) -> np.ndarray:
        """Lengths of every (question, response), concatenated."""
        return np.concatenate([np.asarray(w.lengths) for w in self.worlds])

    def success_rates(self) -> np.ndarray:
        """``[Q]`` each question's ``J_q``."""
        return np.array([w.J() for w in self.worlds])

    def outcome_model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Marginal law of one response: ``(P(q) pi_{q,o}, mu_{q,o}, block psi)``."""
        probs, means, blocks = [], [], []
        for wq, world in zip(self.weights, self.worlds, strict=True):
            p, mu, psi = world.outcome_model()
            probs.append(wq * p)
            means.append(mu)
            blocks.append(psi)
        d = sum(b.shape[1] for b in blocks)
        psi = np.zeros((sum(b.shape[0] for b in blocks), d))
        r = c = 0
        for b in blocks:
            psi[r : r + b.shape[0], c : c + b.shape[1]] = b
            r, c = r + b.shape[0], c + b.shape[1]
        return np.concatenate(probs), np.concatenate(means), psi

    def J(self) -> float:
        """``sum_q P(q) J_q``."""
        return float(self.weights @ self.success_rates())

    def grad_J(self) -> np.ndarray:
        """``[P(q) grad J_q]`` stacked."""
        return np.concatenate([wq * w.grad_J() for wq, w in zip(self.weights, self.worlds,
                                                                 strict=True)])

    def sample(self, n_groups: int, G: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(response index [n, G], rewards [n, G])``: a question per group, then ``G``
        responses to it; indices into the concatenated responses of :meth:`outcome_model`."""
        q = rng.choice(len(self.worlds), size=n_groups, p=self.weights)
        idx = np.zeros((n_groups, G), dtype=np.int64)
        rew = np.zeros((n_groups, G))
        for j, world in enumerate(self.worlds):
            sel = np.flatnonzero(q == j)
            if sel.size:
                i, r = world.sample(sel.size, G, rng)
                idx[sel], rew[sel] = i + self._outcome_offsets[j], r
        return idx, rew
