"""Worlds where a policy can couple response length with correctness (exact by enumeration).

Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, Sec. 3.1) says GRPO's ``1/|o_i|`` favours short
correct and long incorrect responses. That mechanism can only act if the policy can make length
depend on correctness: if the length parameters were independent of the reward, ``sum_i A_i = 0``
would give them zero expected gradient. Two worlds where it can:

* :class:`ResponseBandit`: a softmax over whole responses, each with a length and a success
  probability (e.g. {short, long} x {correct, incorrect}).
* :class:`AnswerLengthMDP`: a token MDP. The first token is an *answer* ``a`` (success probability
  ``mu_a``); then, at filler position ``j = 0..N-1``, the policy emits ``eos`` with probability
  ``sigmoid(z[a, j])`` or a filler token; after ``N`` fillers ``eos`` is forced (the budget). The
  stop probability depends on the earlier answer token, so length can couple with correctness.
  ``shared_stop=True`` (one row of stop logits for every answer) is the negative control where it
  cannot. A response with ``n`` fillers has ``L = n + 2`` tokens (answer, fillers, eos), so
  ``max_length = N + 2``.

Both expose the outcome model of :mod:`sims.exact` (``outcome_model() -> (probs, means, psi)``),
the lengths, a flat parameter vector (``theta``, ``with_theta``), exact ``J`` and ``grad J`` and
i.i.d. sampling of groups. :class:`AnswerLengthMDP` also gives token-level scores, states and
state values (for per-token advantages, Dr. GRPO Eq. 2 and App. A).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .bandit import SoftmaxBandit

__all__ = ["ResponseBandit", "AnswerLengthMDP"]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _sample_outcomes(probs: np.ndarray, means: np.ndarray, n_groups: int, G: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if int(n_groups) != n_groups or n_groups < 1 or int(G) != G or G < 1:
        raise ValueError(f"need n_groups >= 1 and G >= 1 (integers), got {n_groups}, {G}")
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    idx = np.searchsorted(cdf, rng.random((n_groups, G)), side="right")
    rewards = (rng.random(idx.shape) < means[idx]).astype(np.float64)
    return idx, rewards


@dataclass(frozen=True)
class ResponseBandit:
    """Softmax policy over ``N`` whole responses with lengths and success probabilities.

    Attributes:
        logits: ``[N]`` policy logits (the parameters).
        lengths: ``[N]`` token lengths, integers ``>= 1``.
        means: ``[N]`` success probabilities (1/0 for a correct/incorrect response).
    """

    logits: np.ndarray
    lengths: np.ndarray
    means: np.ndarray

    def __post_init__(self) -> None:
        L = np.asarray(self.lengths, dtype=np.float64)
        bandit = SoftmaxBandit(np.asarray(self.logits, float), np.asarray(self.means, float))
        if L.shape != bandit.logits.shape or np.any(L < 1) or np.any(L != np.round(L)):
            raise ValueError(f"lengths must be [N] integers >= 1, got {self.lengths!r}")
        object.__setattr__(self, "logits", bandit.logits)
        object.__setattr__(self, "means", bandit.arm_means)
        object.__setattr__(self, "lengths", L.astype(np.int64))

    @cached_property
    def bandit(self) -> SoftmaxBandit:
        """The underlying :class:`sims.bandit.SoftmaxBandit` (Bernoulli rewards)."""
        return SoftmaxBandit(self.logits, self.means)

    @property
    def theta(self) -> np.ndarray:
        """Flat parameter vector (the logits)."""
        return self.logits.copy()

    def with_theta(self, theta: np.ndarray) -> ResponseBandit:
        """Same world with new parameters."""
        return ResponseBandit(np.asarray(theta, float), self.lengths, self.means)

    @property
    def max_length(self) -> int:
        """The longest response (Dr. GRPO's MAX_TOKENS for this world)."""
        return int(self.lengths.max())

    def outcome_model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(probs [N], means [N], psi [N, N])`` (psi = ``e_o - pi``)."""
        return self.bandit.outcome_model()

    def J(self) -> float:
        """``J = sum_o pi_o mu_o``."""
        return self.bandit.J()

    def grad_J(self) -> np.ndarray:
        """Exact ``grad J = pi * (mu - J)``."""
        return self.bandit.grad_J()

    def sample(self, n_groups: int, G: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(outcome index [n, G], rewards [n, G])``, i.i.d. responses and Bernoulli rewards."""
        return _sample_outcomes(self.bandit.probs, self.means, n_groups, G, rng)


@dataclass(frozen=True)
class AnswerLengthMDP:
    """Answer token, then fillers until ``eos`` with an answer-dependent stop probability.

    Attributes:
        answer_logits: ``[K]`` logits of the first (answer) token.
        stop_logits: ``[K, N]`` (or ``[1, N]`` with ``shared_stop``) logits ``z`` of
            ``P(eos | answer a, j fillers so far) = sigmoid(z[a, j])``.
        answer_means: ``[K]`` success probability of each answer.
        shared_stop: one row of stop logits for every answer (length cannot depend on the
            answer); default False.
    """

    answer_logits: np.ndarray
    stop_logits: np.ndarray
    answer_means: np.ndarray
    shared_stop: bool = False

    def __post_init__(self) -> None:
        a = np.asarray(self.answer_logits, dtype=np.float64)
        z = np.asarray(self.stop_logits, dtype=np.float64)
        mu = np.asarray(self.answer_means, dtype=np.float64)
        if a.ndim != 1 or a.size < 2 or mu.shape != a.shape:
            raise ValueError(f"answer_logits and answer_means must be [K], K >= 2; got {a.shape}, "
                             f"{mu.shape}")
        rows = 1 if self.shared_stop else a.size
        if z.ndim != 2 or z.shape[0] != rows or z.shape[1] < 1:
            raise ValueError(f"stop_logits must be [{rows}, N] with N >= 1, got {z.shape}")
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(z)) and np.all(np.isfinite(mu))):
            raise ValueError("logits and means must be finite")
        if np.any(mu < 0) or np.any(mu > 1):
            raise ValueError("answer_means must be in [0, 1]")
        object.__setattr__(self, "answer_logits", a)
        object.__setattr__(self, "stop_logits", z)
        object.__setattr__(self, "answer_means", mu)

    # --- structure -----------------------------------------------------------------------------
    @property
    def K(self) -> int:
        """Number of answers."""
        return int(self.answer_logits.size)

    @property
    def N(self) -> int:
        """Filler budget (at most ``N`` fillers)."""
        return int(self.stop_logits.shape[1])

    @property
    def max_length(self) -> int:
        """``N + 2`` tokens (Dr. GRPO's MAX_TOKENS for this world)."""
        return self.N + 2

    @property
    def theta(self) -> np.ndarray:
        """Flat parameters ``[answer_logits, stop_logits.ravel()]``."""
        return np.concatenate([self.answer_logits, self.stop_logits.ravel()])

    def with_theta(self, theta: np.ndarray) -> AnswerLengthMDP:
        """Same world with new parameters (layout of :attr:`theta`)."""
        th = np.asarray(theta, dtype=np.float64)
        if th.shape != (self.theta.size,):
            raise ValueError(f"theta must be shaped [{self.theta.size}], got {th.shape}")
        return AnswerLengthMDP(th[: self.K], th[self.K :].reshape(self.stop_logits.shape),
                               self.answer_means, self.shared_stop)

    def _row(self, a: int) -> int:
        return 0 if self.shared_stop else a

    @cached_property
    def outcomes(self) -> np.ndarray:
        """``[K (N+1), 2]`` (answer, number of fillers) of every response."""
        return np.array([(a, n) for a in range(self.K) for n in range(self.N + 1)])

    @cached_property
    def lengths(self) -> np.ndarray:
        """``[K (N+1)]`` token lengths ``n + 2``."""
        return self.outcomes[:, 1] + 2

    @cached_property
    def means(self) -> np.ndarray:
        """``[K (N+1)]`` success probability of each response (its answer's)."""
        return self.answer_means[self.outcomes[:, 0]]

    # --- exact quantities ----------------------------------------------------------------------
    @cached_property
    def answer_probs(self) -> np.ndarray:
        """``[K]`` ``pi(a)``."""
        z = np.exp(self.answer_logits - self.answer_logits.max())
        return z / z.sum()

    @cached_property
    def stop_probs(self) -> np.ndarray:
        """``[rows, N]`` ``sigmoid(z)``."""
        return _sigmoid(self.stop_logits)

    @cached_property
    def _stop_rows(self) -> np.ndarray:
        """``[K, N]`` the stop probabilities each answer uses."""
        return self.stop_probs[[self._row(a) for a in range(self.K)]]

    def probs(self) -> np.ndarray:
        """``[K (N+1)]`` probability of each response:
        ``pi(a) prod_{j<n} (1 - s_{a,j}) (s_{a,n} if n < N else 1)``."""
        s = self._stop_rows
        survive = np.concatenate([np.ones((self.K, 1)), np.cumprod(1.0 - s, axis=1)], axis=1)
        stop = np.concatenate([s, np.ones((self.K, 1))], axis=1)
        return (self.answer_probs[:, None] * survive * stop).ravel()

    @cached_property
    def token_structure(self) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [n_out, N+2, d], states [n_out, N+2])``: per-token score vectors and state
        ids (``-1`` past the end). State ids: 0 the prompt, ``1 + a N + j`` the decision after
        answer ``a`` and ``j`` fillers, ``1 + K N + a`` the forced ``eos`` (no parameter, score 0).
        """
        K, N, T = self.K, self.N, self.N + 2
        d = self.theta.size
        scores = np.zeros((len(self.outcomes), T, d))
        states = -np.ones((len(self.outcomes), T), dtype=np.int64)
        for o, (a, n) in enumerate(self.outcomes):
            r, s = self._row(a), self.stop_probs[self._row(a)]
            states[o, 0] = 0
            scores[o, 0, :K] = -self.answer_probs
            scores[o, 0, a] += 1.0
            for j in range(n):  # filler: d/dz log(1 - sigmoid z) = -sigmoid z
                states[o, 1 + j] = 1 + a * N + j
                scores[o, 1 + j, K + r * N + j] = -s[j]
            if n < N:  # eos chosen: d/dz log sigmoid z = 1 - sigmoid z
                states[o, n + 1] = 1 + a * N + n
                scores[o, n + 1, K + r * N + n] = 1.0 - s[n]
            else:
                states[o, n + 1] = 1 + K * N + a
        return scores, states

    def token_probs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(probs [n_out, N+2], mask [n_out, N+2])``: the probability of each token of each
        response under the current policy (1 for the forced ``eos`` and past the end) and the
        0/1 mask of the response's tokens (``mask.sum(1) = lengths``)."""
        T = self.N + 2
        probs = np.ones((len(self.outcomes), T))
        mask = (np.arange(T)[None, :] < self.lengths[:, None]).astype(np.float64)
        for o, (a, n) in enumerate(self.outcomes):
            s = self.stop_probs[self._row(a)]
            probs[o, 0] = self.answer_probs[a]
            probs[o, 1 : n + 1] = 1.0 - s[:n]
            if n < self.N:
                probs[o, n + 1] = s[n]
        return probs, mask

    @property
    def n_states(self) -> int:
        """Prompt, ``K N`` decisions, ``K`` forced ends."""
        return 1 + self.K * self.N + self.K

    def state_values(self) -> np.ndarray:
        """``[n_states]`` exact ``V(s) = E[r | s]``: ``J`` at the prompt, ``mu_a`` after answer
        ``a`` (the reward depends on the answer only)."""
        v = np.empty(self.n_states)
        v[0] = self.J()
        v[1 : 1 + self.K * self.N] = np.repeat(self.answer_means, self.N)
        v[1 + self.K * self.N :] = self.answer_means
        return v

    def psi(self) -> np.ndarray:
        """``[n_out, d]`` trajectory scores (the sum of :attr:`token_structure`'s token scores):
        ``e_a - pi`` on the answer logits; on answer ``a``'s stop row ``-s_j`` for each filler
        ``j < n`` and ``1 - s_n`` for the chosen ``eos`` (``n < N``)."""
        K, N = self.K, self.N
        a, n = self.outcomes[:, 0], self.outcomes[:, 1]
        out = np.zeros((len(a), self.theta.size))
        out[:, :K] = np.eye(K)[a] - self.answer_probs[None, :]
        j = np.arange(N)[None, :]
        s = self._stop_rows[a]  # [n_out, N]
        block = np.where(j < n[:, None], -s, 0.0) + np.where(j == n[:, None], 1.0 - s, 0.0)
        rows = np.array([self._row(x) for x in a])
        cols = K + rows[:, None] * N + j
        out[np.arange(len(a))[:, None], cols] = block
        return out

    def outcome_model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(probs, means, psi [n_out, d])``, ``psi`` the sum of the token scores."""
        return self.probs(), self.means.copy(), self.psi()

    def J(self) -> float:
        """``J = sum_a pi(a) mu_a``."""
        return float(self.answer_probs @ self.answer_means)

    def mean_length_given_answer(self) -> np.ndarray:
        """``[K]`` ``E[L | a]``: depends on the stop logits of answer ``a`` only."""
        p = self.probs().reshape(self.K, self.N + 1)
        return (p @ (np.arange(self.N + 1) + 2.0)) / p.sum(axis=1)

    def grad_J(self) -> np.ndarray:
        """Exact ``grad J = sum_o P(o) mu_o psi_o`` (zero on the stop logits)."""
        p, mu, psi = self.outcome_model()
        return (p * mu) @ psi

    def sample(self, n_groups: int, G: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(outcome index [n, G], rewards [n, G])``: i.i.d. responses (by inverse CDF on the exact
        response law, equal in law to token-by-token sampling) and Bernoulli rewards."""
        return _sample_outcomes(self.probs(), self.means, n_groups, G, rng)
