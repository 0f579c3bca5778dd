"""KL-regularised updates in exact toy worlds: the gradient each KL placement delivers, by
enumeration, by finite differences and by seeded Monte Carlo; and where the updates take the
policy (toward or away from the reference).

Worlds (:class:`KLWorld`): a tabular softmax policy over every sequence of ``T`` tokens from a
vocabulary of ``V`` (``T = 1``: a softmax bandit), with reference logits and a task reward per
sequence; built from :class:`sims.bandit.SoftmaxBandit` or :class:`sims.token_mdp.TokenMDP`
(:meth:`KLWorld.from_bandit`, :meth:`KLWorld.from_token_mdp`). The mathematics is
:mod:`grpo_theory.kl`; here are the worlds, the independent routes and the dynamics:

* :func:`finite_difference_targets`: central differences of ``KL(pi || pi_ref)``,
  ``KL(pi_ref || pi)`` and of the per-state KL sums with the state law frozen (a route that does
  not use the score identity);
* :func:`monte_carlo_gradient`: the sampled estimate ``mean_n sum_t c_t S_t`` with its standard
  error per coordinate (the statistical tier: ``|estimate - exact| <= 4 SE``);
* :func:`expected_flow`: exact expected-gradient ascent of ``J - beta KL`` with a placement's
  gradient in place of ``grad KL`` (where each option converges);
* :func:`sampled_kl_exact` / :func:`sampled_kl_monte_carlo`: ``E[KL(pi_n || pi_ref)]`` after
  ``n`` sampled steps, exact by enumerating every batch, and by seeded Monte Carlo (drift away
  from the reference by noise alone).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from grpo_theory import kl

__all__ = [
    "KLOption",
    "KLWorld",
    "option_gradient",
    "finite_difference_targets",
    "monte_carlo_gradient",
    "gibbs_tilt",
    "expected_flow",
    "sampled_kl_exact",
    "sampled_kl_monte_carlo",
]


@dataclass(frozen=True)
class KLOption:
    """One KL implementation: estimator, placement and level (see :func:`grpo_theory.kl.
    kl_coefficients`), plus its off-policy options (``importance``, ``ratio_level``,
    ``weight_clip``)."""

    estimator: str
    placement: str
    level: str = "token"
    importance: str = "none"
    ratio_level: str = "token"
    weight_clip: float | None = None

    @property
    def name(self) -> str:
        extra = "" if self.importance == "none" else f", IS {self.importance}"
        return f"{self.estimator} {self.placement} ({self.level}{extra})"

    def coefficients(self, log_ratio: np.ndarray, log_ratio_old: np.ndarray | None = None
                     ) -> np.ndarray:
        return kl.kl_coefficients(log_ratio, estimator=self.estimator,  # type: ignore[arg-type]
                                  placement=self.placement, level=self.level,  # type: ignore[arg-type]
                                  log_ratio_old=log_ratio_old, importance=self.importance,  # type: ignore[arg-type]
                                  ratio_level=self.ratio_level,  # type: ignore[arg-type]
                                  weight_clip=self.weight_clip)


@dataclass(frozen=True)
class KLWorld:
    """A tabular softmax policy, its reference and a task reward, every sequence enumerated.

    Attributes:
        logits: ``[n_states, V]`` policy logits (``n_states = (V^T - 1)/(V - 1)``; 1 for T = 1).
        ref_logits: ``[n_states, V]`` reference logits.
        seq_rewards: ``[V^T]`` expected task reward of each sequence.
        vocab, length: ``V`` and ``T``.
    """

    logits: np.ndarray
    ref_logits: np.ndarray
    seq_rewards: np.ndarray
    vocab: int
    length: int
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("logits", "ref_logits", "seq_rewards"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        n = (self.vocab**self.length - 1) // (self.vocab - 1)
        if self.logits.shape != (n, self.vocab) or self.ref_logits.shape != self.logits.shape:
            raise ValueError(f"logits and ref_logits must be [{n}, {self.vocab}], got "
                             f"{self.logits.shape}, {self.ref_logits.shape}")
        if self.seq_rewards.shape != (self.vocab**self.length,):
            raise ValueError(f"seq_rewards must be [{self.vocab**self.length}]")

    @classmethod
    def from_bandit(cls, bandit: Any, ref_logits: Any) -> KLWorld:
        """A :class:`sims.bandit.SoftmaxBandit` (one token from ``K`` arms) and reference logits."""
        K = bandit.K
        return cls(bandit.logits.reshape(1, K), np.asarray(ref_logits, float).reshape(1, K),
                   bandit.arm_means.copy(), K, 1)

    @classmethod
    def from_token_mdp(cls, mdp: Any, ref_logits: Any) -> KLWorld:
        """A :class:`sims.token_mdp.TokenMDP` and reference logits of its shape."""
        return cls(mdp.logits, ref_logits, mdp.seq_means.copy(), mdp.vocab, mdp.length)

    def with_logits(self, logits: Any) -> KLWorld:
        keep = {k: v for k, v in self._cache.items() if k == "ref_logp"}
        return replace(self, logits=np.asarray(logits, float), _cache=keep)

    # --- enumeration (grpo_theory.kl's tabular world) ---------------------------------------------
    def _get(self, key: str) -> np.ndarray:
        if key not in self._cache:
            V, T = self.vocab, self.length
            if key == "logp":
                val = kl.tabular_token_log_probs(self.logits, vocab=V, length=T)
            elif key == "ref_logp":
                val = kl.tabular_token_log_probs(self.ref_logits, vocab=V, length=T)
            else:
                val = kl.tabular_token_scores(self.logits, vocab=V, length=T)
            self._cache[key] = val
        return self._cache[key]

    @property
    def logp(self) -> np.ndarray:
        """``[N, T]`` token log-probs under ``pi``."""
        return self._get("logp")

    @property
    def ref_logp(self) -> np.ndarray:
        """``[N, T]`` token log-probs under ``pi_ref``."""
        return self._get("ref_logp")

    @property
    def scores(self) -> np.ndarray:
        """``[N, T, d]`` token scores at ``pi``."""
        return self._get("scores")

    @property
    def probs(self) -> np.ndarray:
        """``[N]`` sequence law under ``pi``."""
        return np.exp(self.logp.sum(axis=1))

    @property
    def log_ratio(self) -> np.ndarray:
        return self.logp - self.ref_logp

    def kl_values(self) -> tuple[float, float]:
        """``(KL(pi || pi_ref), KL(pi_ref || pi))`` over sequences."""
        return kl.sequence_kl_values(self.logp, self.ref_logp)

    def targets(self) -> dict[str, np.ndarray]:
        """:func:`grpo_theory.kl.kl_gradient_targets` of this world."""
        return kl.kl_gradient_targets(self.logp, self.ref_logp, self.scores)

    def J(self) -> float:
        return float(self.probs @ self.seq_rewards)

    def grad_J(self) -> np.ndarray:
        """``sum_y pi(y) r(y) psi(y)``."""
        return (self.probs * self.seq_rewards) @ self.scores.sum(axis=1)


def option_gradient(world: KLWorld, option: KLOption, *, old_logits: Any = None) -> np.ndarray:
    """The exact expected gradient of ``option``'s KL term: on-policy, or with samples from
    ``pi_old`` (``old_logits``; log-ratio to ``pi_old`` passed to the coefficients)."""
    if old_logits is None:
        c = option.coefficients(world.log_ratio)
        return kl.expected_kl_gradient(c, probs=world.probs, scores=world.scores)
    old = kl.tabular_token_log_probs(old_logits, vocab=world.vocab, length=world.length)
    c = option.coefficients(world.log_ratio, world.logp - old)
    return kl.expected_kl_gradient(c, probs=np.exp(old.sum(axis=1)), scores=world.scores)


def finite_difference_targets(world: KLWorld, *, h: float = 1e-6) -> dict[str, np.ndarray]:
    """Central differences (step ``h``) of ``KL(pi || pi_ref)``, ``KL(pi_ref || pi)`` and of
    ``sum_s d(s) KL(pi_s || ref_s)`` / ``sum_s d(s) KL(ref_s || pi_s)`` with ``d`` (the state law
    of ``pi``) frozen, over every logit."""
    V, T = world.vocab, world.length
    base = world.logits
    seqs, states = kl.tabular_sequences(V, T)
    P0 = world.probs
    d = np.zeros(base.shape[0])
    for t in range(T):
        d += np.bincount(states[:, t], weights=P0, minlength=base.shape[0])
    ref = np.exp(world.ref_logits - world.ref_logits.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)

    def values(th: np.ndarray) -> np.ndarray:
        w = world.with_logits(th)
        rev, fwd = w.kl_values()
        pol = np.exp(th - th.max(1, keepdims=True))
        pol /= pol.sum(1, keepdims=True)
        rs = float(d @ (pol * np.log(pol / ref)).sum(1))
        fs = float(d @ (ref * np.log(ref / pol)).sum(1))
        return np.array([rev, fwd, rs, fs])

    out = np.zeros((4, base.size))
    for i in range(base.size):
        e = np.zeros(base.size)
        e[i] = h
        e = e.reshape(base.shape)
        out[:, i] = (values(base + e) - values(base - e)) / (2 * h)
    return dict(zip(kl.KL_TARGETS, out, strict=True))


def monte_carlo_gradient(world: KLWorld, option: KLOption, *, n: int, rng: np.random.Generator,
                         old_logits: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Seeded Monte Carlo of :func:`option_gradient`: ``n`` sequences drawn from ``pi`` (or
    ``pi_old``), the per-sample gradient ``sum_t c_t S_t``; returns ``(mean [d], se [d])``."""
    if old_logits is None:
        q, lo = world.probs, None
    else:
        old = kl.tabular_token_log_probs(old_logits, vocab=world.vocab, length=world.length)
        q, lo = np.exp(old.sum(axis=1)), world.logp - old
    cdf = np.cumsum(q)
    cdf[-1] = 1.0
    idx = np.searchsorted(cdf, rng.random(n), side="right")
    c = option.coefficients(world.log_ratio, lo)
    per = np.einsum("nt,ntd->nd", c, world.scores)[idx]
    return per.mean(axis=0), per.std(axis=0, ddof=1) / np.sqrt(n)


def gibbs_tilt(world: KLWorld, beta: float) -> np.ndarray:
    """The maximiser of ``E_pi[r] - beta KL(pi || pi_ref)`` over every law on sequences:
    ``pi_ref(y) exp(r(y) / beta) / Z`` (``[N]``)."""
    a = world.ref_logp.sum(axis=1) + world.seq_rewards / beta
    w = np.exp(a - a.max())
    return w / w.sum()


def expected_flow(world: KLWorld, option: KLOption | None, *, beta: float, lr: float, steps: int
                  ) -> dict[str, np.ndarray]:
    """``theta <- theta + lr (grad J - beta g_option(theta))``, ``g_option`` exact
    (``option=None``: no KL term). Returns per step ``J``, ``reverse_kl``, ``forward_kl`` and
    the final sequence law ``probs``."""
    w = world
    J, rev, fwd = [], [], []
    for _ in range(steps + 1):
        r, f = w.kl_values()
        J.append(w.J())
        rev.append(r)
        fwd.append(f)
        g = w.grad_J()
        if option is not None:
            g = g - beta * option_gradient(w, option)
        w = w.with_logits(w.logits + lr * g.reshape(w.logits.shape))
    return {"J": np.array(J), "reverse_kl": np.array(rev), "forward_kl": np.array(fwd),
            "probs": w.probs}


def _sampled_step(world: KLWorld, option: KLOption | None, batch: np.ndarray, *, beta: float,
                  lr: float) -> KLWorld:
    """One sampled step on the sequences ``batch``: REINFORCE on the task reward plus ``-beta``
    times the KL term's per-sample gradient, averaged over the batch."""
    S = world.scores[batch]
    g = world.seq_rewards[batch] @ S.sum(axis=1)
    if option is not None:
        c = option.coefficients(world.log_ratio)[batch]
        g = g - beta * np.einsum("nt,ntd->d", c, S)
    return world.with_logits(world.logits + lr * (g / batch.size).reshape(world.logits.shape))


def sampled_kl_exact(world: KLWorld, option: KLOption | None, *, beta: float, lr: float,
                     batch: int, steps: int) -> dict[str, float]:
    """``E[KL(pi_n || pi_ref)]`` and ``E[J_n]`` after ``steps`` sampled steps of ``batch``
    sequences each, exact: every ordered batch of every step enumerated (``N^(batch steps)``
    branches, at most 2^16)."""
    N = world.probs.size
    if N ** (batch * steps) > 2**16:
        raise ValueError(f"{N}^({batch}*{steps}) branches is too many to enumerate")
    branches = [(1.0, world)]
    for _ in range(steps):
        nxt = []
        for p, w in branches:
            q = w.probs
            for b in itertools.product(range(N), repeat=batch):
                pb = p * float(np.prod(q[list(b)]))
                if pb > 0:
                    nxt.append((pb, _sampled_step(w, option, np.array(b), beta=beta, lr=lr)))
        branches = nxt
    pr = np.array([p for p, _ in branches])
    kls = np.array([w.kl_values()[0] for _, w in branches])
    Js = np.array([w.J() for _, w in branches])
    m = float(pr @ kls)
    return {"reverse_kl": m, "reverse_kl_sd": float(np.sqrt(max(pr @ (kls - m) ** 2, 0.0))),
            "J": float(pr @ Js)}


def sampled_kl_monte_carlo(world: KLWorld, option: KLOption | None, *, beta: float, lr: float,
                           batch: int, steps: int, runs: int, rng: np.random.Generator
                           ) -> dict[str, np.ndarray]:
    """Seeded Monte Carlo of the sampled dynamics: ``runs`` independent runs of ``steps`` steps;
    per step the mean ``KL(pi_n || pi_ref)`` and ``J`` over runs with their standard errors."""
    kls = np.zeros((runs, steps + 1))
    Js = np.zeros((runs, steps + 1))
    for i in range(runs):
        w = world
        for s in range(steps + 1):
            kls[i, s] = w.kl_values()[0]
            Js[i, s] = w.J()
            if s < steps:
                cdf = np.cumsum(w.probs)
                cdf[-1] = 1.0
                b = np.searchsorted(cdf, rng.random(batch), side="right")
                w = _sampled_step(w, option, b, beta=beta, lr=lr)
    se = np.sqrt(runs)
    return {"reverse_kl": kls.mean(0), "reverse_kl_se": kls.std(0, ddof=1) / se,
            "J": Js.mean(0), "J_se": Js.std(0, ddof=1) / se}
