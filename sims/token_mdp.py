"""A token-level autoregressive MDP solved exactly by enumerating every sequence.

Vocabulary of ``V`` tokens, sequences of exactly ``T`` tokens, deterministic transitions
(append the token; seed paper Sec. 2.1), terminal (outcome-only) reward ``r | seq ~
Bernoulli(mu_seq)``. The policy is tabular softmax: every prefix ``s_t`` (the states,
``t = 0..T-1``) has its own logits ``theta[s_t] in R^V``, so ``d = V (V^T - 1) / (V - 1)``
parameters.

Exact quantities (all by enumeration of the ``V^T`` sequences):

* ``P(seq) = prod_t pi(a_t | s_t)``, ``J = sum_seq P(seq) mu_seq``;
* ``v(s_t) = E[r | s_t]``, ``q(s_t, a) = v(s_t a)`` (the terminal case ``q = mu_seq``) and
  ``A(s_t, a) = q - v`` (Eqs. 1-3, ``gamma = 1``);
* trajectory score ``psi(seq) = sum_t grad log pi(a_t | s_t)`` (Eq. 18); in block ``s_t`` it is
  ``e_{a_t} - pi(. | s_t)``;
* ``grad J = sum_seq P(seq) mu_seq psi(seq)``.

A prefix of length ``t`` with tokens ``a_0..a_{t-1}`` has state index
``(V^t - 1)/(V - 1) + sum_i a_i V^(t-1-i)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["TokenMDP"]


def _n_states(V: int, T: int) -> int:
    return (V**T - 1) // (V - 1)


@dataclass(frozen=True)
class TokenMDP:
    """Tabular softmax policy over sequences of ``T`` tokens from a vocabulary of ``V``.

    Attributes:
        logits: ``[n_states, V]`` per-prefix logits, ``n_states = (V^T - 1)/(V - 1)``.
        seq_means: ``[V^T]`` success probability ``mu_seq`` of each full sequence (sequence index
            = the base-``V`` number ``a_0 a_1 ... a_{T-1}``).
        vocab: ``V >= 2``.
        length: ``T >= 1``.
    """

    logits: np.ndarray
    seq_means: np.ndarray
    vocab: int
    length: int

    def __post_init__(self) -> None:
        V, T = int(self.vocab), int(self.length)
        if V < 2 or T < 1:
            raise ValueError(f"need vocab >= 2 and length >= 1, got V={V}, T={T}")
        if V**T > 200_000:
            raise ValueError(f"V^T = {V**T} sequences is too many to enumerate")
        th = np.asarray(self.logits, dtype=np.float64)
        mu = np.asarray(self.seq_means, dtype=np.float64)
        if th.shape != (_n_states(V, T), V):
            raise ValueError(f"logits must be shaped [{_n_states(V, T)}, {V}], got {th.shape}")
        if mu.shape != (V**T,):
            raise ValueError(f"seq_means must be shaped [{V**T}], got {mu.shape}")
        if not (np.all(np.isfinite(th)) and np.all(np.isfinite(mu))):
            raise ValueError("logits and seq_means must be finite")
        if np.any(mu < 0) or np.any(mu > 1):
            raise ValueError("seq_means must be success probabilities in [0, 1]")
        object.__setattr__(self, "logits", th)
        object.__setattr__(self, "seq_means", mu)

    @classmethod
    def random(
        cls,
        rng: np.random.Generator,
        *,
        vocab: int = 3,
        length: int = 3,
        logit_scale: float = 1.0,
        success_fraction: float = 0.3,
        binary_rewards: bool = True,
    ) -> TokenMDP:
        """A random instance: Gaussian logits (std ``logit_scale``); a random ``success_fraction``
        of sequences are correct (``mu = 1``, others 0) if ``binary_rewards`` else ``mu ~ U(0,1)``.
        """
        n = vocab**length
        logits = logit_scale * rng.standard_normal((_n_states(vocab, length), vocab))
        if binary_rewards:
            mu = (rng.random(n) < success_fraction).astype(np.float64)
            if mu.sum() == 0:
                mu[rng.integers(n)] = 1.0
        else:
            mu = rng.random(n)
        return cls(logits=logits, seq_means=mu, vocab=vocab, length=length)

    def with_logits(self, logits: np.ndarray) -> TokenMDP:
        """Same MDP with new policy logits."""
        return TokenMDP(
            logits=logits, seq_means=self.seq_means, vocab=self.vocab, length=self.length
        )

    # --- structure -----------------------------------------------------------------------------
    @property
    def n_states(self) -> int:
        """Number of non-terminal states (prefixes of length 0..T-1)."""
        return _n_states(self.vocab, self.length)

    @property
    def dim(self) -> int:
        """Number of policy parameters ``d = n_states * V``."""
        return self.n_states * self.vocab

    @cached_property
    def sequences(self) -> np.ndarray:
        """``[V^T, T]`` every sequence, row ``i`` = base-V digits of ``i``."""
        V, T = self.vocab, self.length
        idx = np.arange(V**T)
        return np.stack([(idx // V ** (T - 1 - t)) % V for t in range(T)], axis=1)

    @cached_property
    def state_index(self) -> np.ndarray:
        """``[V^T, T]`` index of the state ``s_t`` visited at step ``t`` by each sequence."""
        V, T = self.vocab, self.length
        seqs = self.sequences
        out = np.zeros_like(seqs)
        code = np.zeros(seqs.shape[0], dtype=np.int64)
        for t in range(T):
            out[:, t] = (V**t - 1) // (V - 1) + code
            code = code * V + seqs[:, t]
        return out

    @property
    def policy(self) -> np.ndarray:
        """``[n_states, V]`` ``pi(a | s)``."""
        z = np.exp(self.logits - self.logits.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    # --- exact quantities ----------------------------------------------------------------------
    def seq_probs(self) -> np.ndarray:
        """``[V^T]`` ``P(seq) = prod_t pi(a_t | s_t)``."""
        pol = self.policy
        return np.prod(pol[self.state_index, self.sequences], axis=1)

    def J(self) -> float:
        """``J = E[r] = sum_seq P(seq) mu_seq``."""
        return float(self.seq_probs() @ self.seq_means)

    def reward_variance(self) -> float:
        """``sigma_r^2 = J (1 - J)`` (binary terminal reward)."""
        J = self.J()
        return J * (1.0 - J)

    def values_enumeration(self) -> tuple[np.ndarray, np.ndarray]:
        """``(v [n_states], q [n_states, V])`` by brute force: conditional expectations of the
        terminal reward over all sequences through each prefix (reference path)."""
        P, mu = self.seq_probs(), self.seq_means
        V = self.vocab
        v = np.zeros(self.n_states)
        q = np.zeros((self.n_states, V))
        for t in range(self.length):
            s = self.state_index[:, t]
            mass = np.bincount(s, weights=P, minlength=self.n_states)
            rew = np.bincount(s, weights=P * mu, minlength=self.n_states)
            for a in range(V):
                sel = self.sequences[:, t] == a
                m_a = np.bincount(s[sel], weights=P[sel], minlength=self.n_states)
                r_a = np.bincount(s[sel], weights=(P * mu)[sel], minlength=self.n_states)
                ok = m_a > 0
                q[ok, a] = r_a[ok] / m_a[ok]
            ok = mass > 0
            v[ok] = rew[ok] / mass[ok]
        return v, q

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(v [n_states], q [n_states, V])`` by backward recursion over prefixes (DP):
        ``q(s_{T-1}, a) = mu_seq``, ``q(s_t, a) = v(s_t a)``, ``v(s) = sum_a pi(a|s) q(s, a)``."""
        V, T = self.vocab, self.length
        pol = self.policy
        v = np.zeros(self.n_states)
        q = np.zeros((self.n_states, V))
        child_v = self.seq_means.reshape(-1, V)  # level T-1: q = mu of the completed sequence
        for t in range(T - 1, -1, -1):
            off = (V**t - 1) // (V - 1)
            q[off : off + V**t] = child_v
            v[off : off + V**t] = np.sum(pol[off : off + V**t] * child_v, axis=1)
            child_v = v[off : off + V**t].reshape(-1, V) if t > 0 else None
        return v, q

    def advantages(self) -> np.ndarray:
        """``[n_states, V]`` true advantages ``A(s, a) = q(s, a) - v(s)``."""
        v, q = self.values()
        return q - v[:, None]

    def psi(self) -> np.ndarray:
        """``[V^T, d]`` exact trajectory score of every sequence (Eq. 18)."""
        V, T = self.vocab, self.length
        pol = self.policy
        n = V**T
        out = np.zeros((n, self.n_states, V))
        rows = np.arange(n)
        for t in range(T):
            s = self.state_index[:, t]
            out[rows, s, :] -= pol[s]
            out[rows, s, self.sequences[:, t]] += 1.0
        return out.reshape(n, -1)

    def grad_J(self) -> np.ndarray:
        """``[d]`` exact ``grad J = sum_seq P(seq) mu_seq psi(seq)``."""
        return (self.seq_probs() * self.seq_means) @ self.psi()

    def outcome_model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(probs [V^T], means [V^T], psi [V^T, d])`` for :mod:`sims.exact`."""
        return self.seq_probs(), self.seq_means.copy(), self.psi()

    # --- sampling ------------------------------------------------------------------------------
    def sample(
        self, n_groups: int, R: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(seq_idx [n, R] int, rewards [n, R] float)``: i.i.d. sequences and Bernoulli rewards.

        Sequences are drawn from the exact sequence distribution by inverse CDF (equivalent in law
        to sampling token by token).
        """
        if n_groups < 1 or R < 1:
            raise ValueError(f"need n_groups >= 1 and R >= 1, got {n_groups}, {R}")
        cdf = np.cumsum(self.seq_probs())
        cdf[-1] = 1.0
        idx = np.searchsorted(cdf, rng.random((n_groups, R)), side="right")
        rewards = (rng.random(idx.shape) < self.seq_means[idx]).astype(np.float64)
        return idx, rewards
