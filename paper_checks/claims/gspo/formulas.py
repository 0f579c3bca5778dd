"""GSPO's printed objectives and gradients, transcribed once as functions, and the worlds they
are evaluated in (a support module: it registers no claim).

A sampled group: ``G`` responses of a tabular token MDP (``V = 2``, ``T = 4``), response ``i``
being the first ``L_i`` tokens of sequence ``idx_i``; per-token log-probs ``[G, T]`` under the
current logits ``theta`` and the old ones, a mask ``[G, T]``. The objectives (to be maximised):

* Eq. (2): ``J_GRPO = (1/G) sum_i (1/|y_i|) sum_t min(w_it A_i, clip(w_it) A_i)``;
* Eq. (5): ``J_GSPO = (1/G) sum_i min(s_i A_i, clip(s_i) A_i)``, ``s_i = exp(mean_t log w_it)``
  (Eq. 7);
* Eq. (13): ``J_GSPO-token = (1/G) sum_i (1/|y_i|) sum_t min(s_it A_it, clip(s_it) A_it)``,
  ``s_it = sg[s_i] pi(y_it) / sg[pi(y_it)]`` (Eq. 14; the stop-gradients frozen at ``frozen``);

and the printed gradients (no clipping) of Eqs. (10), (12), (17). ``clip(x) = clip(x, 1 -
eps_low, 1 + eps_high)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

V, T = 2, 4
N_STATES = (V**T - 1) // (V - 1)


def clip_term(x: np.ndarray, A: np.ndarray, eps_low: float, eps_high: float) -> np.ndarray:
    """``min(x A, clip(x, 1 - eps_low, 1 + eps_high) A)``."""
    return np.minimum(x * A, np.clip(x, 1.0 - eps_low, 1.0 + eps_high) * A)


@dataclass(frozen=True)
class Group:
    """A sampled group: sequences, lengths, advantages, old logits."""

    idx: np.ndarray
    lengths: np.ndarray
    advantages: np.ndarray
    old_logits: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        return (np.arange(T)[None, :] < self.lengths[:, None]).astype(float)

    def logp(self, logits: np.ndarray) -> np.ndarray:
        """``[G, T]`` token log-probs of the group's sequences under ``logits``."""
        from grpo_theory.kl import tabular_token_log_probs

        return tabular_token_log_probs(logits.reshape(N_STATES, V), vocab=V, length=T)[self.idx]

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """``[G, T, d]`` token scores at ``logits``, masked."""
        from grpo_theory.kl import tabular_token_scores

        S = tabular_token_scores(logits.reshape(N_STATES, V), vocab=V, length=T)[self.idx]
        return S * self.mask[..., None]


def group(seed: int = 5) -> tuple[Group, np.ndarray]:
    """A seeded group of ``G = 4`` responses of lengths 4, 2, 3, 1 with std-normalised
    advantages of rewards (1, 0, 1, 0), and the current logits ``theta`` (old + 0.15 noise)."""
    from grpo_theory import compute_advantages

    rng = np.random.default_rng(seed)
    old = 0.7 * rng.standard_normal(N_STATES * V)
    theta = old + 0.15 * rng.standard_normal(old.size)
    A = np.asarray(compute_advantages("grpo_std", np.array([[1.0, 0.0, 1.0, 0.0]])))[0]
    g = Group(np.array([5, 9, 12, 3]), np.array([4, 2, 3, 1]), A, old)
    return g, theta


def j_grpo(g: Group, logits: np.ndarray, *, eps_low: float = 0.2, eps_high: float = 0.2
           ) -> float:
    """Eq. (2) for one group."""
    m = g.mask
    w = np.exp((g.logp(logits) - g.logp(g.old_logits)) * m)
    per = (clip_term(w, g.advantages[:, None], eps_low, eps_high) * m).sum(1) / m.sum(1)
    return float(per.mean())


def sequence_ratio(g: Group, logits: np.ndarray) -> np.ndarray:
    """Eq. (7), first form: ``(pi(y)/pi_old(y))^(1/|y|)``."""
    m = g.mask
    rho = np.exp(((g.logp(logits) - g.logp(g.old_logits)) * m).sum(1))
    return rho ** (1.0 / m.sum(1))


def sequence_ratio_mean_form(g: Group, logits: np.ndarray) -> np.ndarray:
    """Eq. (7), second form: ``exp((1/|y|) sum_t log w_t)``."""
    m = g.mask
    return np.exp(((g.logp(logits) - g.logp(g.old_logits)) * m).sum(1) / m.sum(1))


def j_gspo(g: Group, logits: np.ndarray, *, eps_low: float = 0.2, eps_high: float = 0.2
           ) -> float:
    """Eq. (5) for one group."""
    return float(clip_term(sequence_ratio(g, logits), g.advantages, eps_low, eps_high).mean())


def j_gspo_token(g: Group, logits: np.ndarray, frozen: np.ndarray, *,
                 token_advantages: np.ndarray | None = None, eps_low: float = 0.2,
                 eps_high: float = 0.2) -> float:
    """Eq. (13) with Eq. (14)'s stop-gradients frozen at ``frozen``."""
    m = g.mask
    s0 = sequence_ratio(g, frozen)
    sit = s0[:, None] * np.exp((g.logp(logits) - g.logp(frozen)) * m)
    A = (np.broadcast_to(g.advantages[:, None], m.shape) if token_advantages is None
         else token_advantages)
    return float(((clip_term(sit, A, eps_low, eps_high) * m).sum(1) / m.sum(1)).mean())


def grad_gspo_printed(g: Group, logits: np.ndarray) -> np.ndarray:
    """Eq. (10): ``(1/G) sum_i s_i A_i (1/|y_i|) sum_t grad log pi(y_it)``."""
    s = sequence_ratio(g, logits)
    S = g.scores(logits).sum(1) / g.mask.sum(1)[:, None]
    return (s * g.advantages) @ S / len(s)


def grad_grpo_printed(g: Group, logits: np.ndarray) -> np.ndarray:
    """Eq. (12): ``(1/G) sum_i A_i (1/|y_i|) sum_t w_it grad log pi(y_it)``."""
    m = g.mask
    w = np.exp((g.logp(logits) - g.logp(g.old_logits)) * m)
    S = np.einsum("it,itd->id", w * m, g.scores(logits)) / m.sum(1)[:, None]
    return g.advantages @ S / m.shape[0]


def grad_gspo_token_printed(g: Group, logits: np.ndarray, token_advantages: np.ndarray
                            ) -> np.ndarray:
    """Eq. (17): ``(1/G) sum_i s_i (1/|y_i|) sum_t A_it grad log pi(y_it)``."""
    m = g.mask
    s = sequence_ratio(g, logits)
    S = np.einsum("it,itd->id", token_advantages * m, g.scores(logits)) / m.sum(1)[:, None]
    return s @ S / m.shape[0]


def fd_gradient(f: Callable[[np.ndarray], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central finite differences of ``f`` at ``x``."""
    out = np.zeros(x.size)
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = h
        out[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out


def rel(a: Any, b: Any) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def token_world() -> tuple[Any, np.ndarray]:
    """A token MDP (V = 2, T = 3) with binary rewards, and theta_old = theta moved by noise."""
    from sims.kl_dynamics import KLWorld
    from sims.token_mdp import TokenMDP

    rng = np.random.default_rng(2702)
    m = TokenMDP.random(rng, vocab=2, length=3, logit_scale=0.8, success_fraction=0.5)
    w = KLWorld.from_token_mdp(m, m.logits)
    return w, m.logits + 0.5 * rng.standard_normal(m.logits.shape)
