"""Exact computations the checks share (enumeration, no sampling), on top of grpo_theory and sims.

* Binary-reward groups: advantage values of a success and of a failure in a group of ``R`` with
  ``k`` successes (:func:`grpo_theory.bernoulli.advantage_values`, every registered estimator,
  the std-normalised one included); :func:`group_moments` and :func:`advantage_tail` re-derive the
  moments and tails by enumerating the WHOLE group's ``k ~ Binomial(R, p)`` (a different route
  from :mod:`grpo_theory.bernoulli`, which conditions on rollout 1), used as a cross-check.
* "Outcome worlds": outcomes ``tau`` (bandit arms of :class:`sims.bandit.SoftmaxBandit`, token
  sequences of :class:`sims.token_mdp.TokenMDP`) with probabilities, trajectory scores ``psi``
  (Eq. 18) and success probabilities; :func:`brute_force_expected_gradient` enumerates every joint
  group, independently of the conditioning argument of :mod:`sims.exact`;
  :func:`group_estimator_moments` gives the exact mean, variance and MSE of per-group gradient
  estimators the same way.
* :class:`TokenMDPView`: prefix-level access (``v``, ``q``, ``grad log pi``) to a sims TokenMDP
  and finite differences of ``J(theta)`` as an independent ``grad J``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Any

import numpy as np
from scipy.stats import binom

from grpo_theory import bernoulli as _bern
from grpo_theory import compute_advantages
from grpo_theory.bounds import exact_baseline_tail_bernoulli

__all__ = [
    "advantage_values",
    "group_moments",
    "advantage_tail",
    "baseline_tail",
    "sup_baseline_tail",
    "OutcomeWorld",
    "bandit_world",
    "expected_gradient",
    "brute_force_expected_gradient",
    "group_estimator_moments",
    "TokenMDPView",
]


def _key(opts: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(opts.items()))


@lru_cache(maxsize=4096)
def _adv_values(estimator: str, R: int, k: int, opts: tuple[tuple[str, Any], ...]):
    return _bern.advantage_values(estimator, R=R, k=k, exact=False, **dict(opts))


def advantage_values(estimator: str, *, R: int, k: int, **opts: Any) -> tuple[Any, Any]:
    """(advantage of a success, of a failure) in a binary group of ``R`` with ``k`` successes.

    ``None`` where that kind of rollout does not exist (``k = 0`` or ``k = R``).
    """
    if not 0 <= k <= R:
        raise ValueError(f"need 0 <= k <= R, got k={k}, R={R}")
    return _adv_values(estimator, R, k, _key(opts))


def group_moments(estimator: str, *, R: int, p: float, **opts: Any) -> dict[str, float]:
    """Exact ``E[A_i]``, ``Var(A_i)``, ``Cov(A_i, A_j)`` (i != j) for i.i.d. Bernoulli(p) rewards.

    Enumerates ``k ~ Binomial(R, p)``; within a group of ``k`` successes, rollout ``i`` is a success
    with probability ``k/R`` and the pair ``(i, j)`` is (S,S), (S,F), (F,F) with probabilities
    ``k(k-1)``, ``2k(R-k)``, ``(R-k)(R-k-1)`` over ``R(R-1)`` (exchangeability).
    """
    m1 = m2 = mij = 0.0
    for k in range(R + 1):
        pk = float(binom.pmf(k, R, p))
        s, f = advantage_values(estimator, R=R, k=k, **opts)
        s = 0.0 if s is None else s
        f = 0.0 if f is None else f
        m1 += pk * (k * s + (R - k) * f) / R
        m2 += pk * (k * s * s + (R - k) * f * f) / R
        mij += pk * (k * (k - 1) * s * s + 2 * k * (R - k) * s * f + (R - k) * (R - k - 1) * f * f)
    mij /= R * (R - 1)
    return {"mean": m1, "var": m2 - m1 * m1, "cov": mij - m1 * m1, "second_moment": m2}


def advantage_tail(estimator: str, *, R: int, p: float, threshold: float, **opts: Any) -> float:
    """Exact ``P(|A_i| > threshold)`` for i.i.d. Bernoulli(p) rewards (strict ``>``); ``opts`` are
    the estimator's options (grpo_std's own ``eps`` included)."""
    eps = threshold
    out = 0.0
    for k in range(R + 1):
        s, f = advantage_values(estimator, R=R, k=k, **opts)
        pk = float(binom.pmf(k, R, p))
        if s is not None and abs(s) > eps:
            out += pk * k / R
        if f is not None and abs(f) > eps:
            out += pk * (R - k) / R
    return out


def baseline_tail(*, R: int, p: float, eps: float) -> float:
    """Exact ``P(|v_hat_R - p| > eps)``: :func:`grpo_theory.bounds.exact_baseline_tail_bernoulli`
    (the one implementation; strict ``>`` decided exactly, floats read as their decimal repr)."""
    return float(exact_baseline_tail_bernoulli(R=R, eps=eps, p=p))


def sup_baseline_tail(*, R: int, eps: float, grid: int = 4001) -> tuple[float, float]:
    """``sup_p P(|v_hat_R - p| > eps)`` and a maximising ``p`` (grid plus every breakpoint).

    The tail is a polynomial in ``p`` between the breakpoints ``k/R +- eps``, where the set of
    counted ``k`` changes; the sup is taken over a grid and points just inside each breakpoint.
    An independent cross-check for small ``R`` (``O(R (grid + R))`` work): ``R > 2000`` raises
    and names :func:`grpo_theory.sup_baseline_tail_bernoulli`, the exact route for large ``R``.
    """
    if R > 2000:
        raise ValueError(
            f"sup_baseline_tail (grid cross-check) is limited to R <= 2000, got R={R}; use "
            "grpo_theory.sup_baseline_tail_bernoulli (exact, vectorised, R <= 100000)"
        )
    pts = [np.linspace(0.0, 1.0, grid)]
    for k in range(R + 1):
        for b in (k / R - eps, k / R + eps):
            pts.append(np.array([b - 1e-9, b + 1e-9]))
    ps = np.clip(np.concatenate(pts), 0.0, 1.0)
    vals = np.array([baseline_tail(R=R, p=float(p), eps=eps) for p in ps])
    i = int(np.argmax(vals))
    return float(vals[i]), float(ps[i])


# --- outcome worlds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class OutcomeWorld:
    """Finite outcomes with probabilities ``prob [N]``, scores ``psi [N, d]``, success ``q [N]``."""

    prob: np.ndarray
    psi: np.ndarray
    q: np.ndarray

    @property
    def J(self) -> float:
        """``J = sum_tau P(tau) q(tau)``: the success probability."""
        return float(self.prob @ self.q)

    @property
    def grad_J(self) -> np.ndarray:
        """``grad J = E[q(tau) psi(tau)]`` (score-function identity; ``psi`` = grad log P)."""
        return (self.prob * self.q) @ self.psi


def bandit_world(logits: Any, success: Any) -> OutcomeWorld:
    """:class:`sims.bandit.SoftmaxBandit` with Bernoulli(success[a]) arms, as an outcome world."""
    from sims.bandit import SoftmaxBandit

    probs, means, psi = SoftmaxBandit(np.asarray(logits, float), np.asarray(success, float)
                                      ).outcome_model()
    return OutcomeWorld(np.asarray(probs), np.asarray(psi), np.asarray(means))


def expected_gradient(world: OutcomeWorld, estimator: str, *, R: int, **opts: Any) -> np.ndarray:
    """Exact ``E[g_hat] = E[(1/R) sum_i A_i psi_i]`` for binary rewards
    (:func:`sims.exact.expected_gradient_bernoulli`: conditions on rollout 1's outcome)."""
    from sims.exact import expected_gradient_bernoulli

    return expected_gradient_bernoulli(estimator, probs=world.prob, means=world.q, psi=world.psi,
                                       R=R, opts=dict(opts))


def brute_force_expected_gradient(
    world: OutcomeWorld, estimator: str, *, R: int, **opts: Any
) -> np.ndarray:
    """``E[g_hat]`` by enumerating every joint (outcome, reward) of the ``R`` rollouts.

    Independent of the conditioning argument of :func:`expected_gradient`; cost ``(2N)^R``.
    """
    N = world.prob.size
    cells = [(t, r) for t in range(N) for r in (0, 1)]
    pcell = np.array([world.prob[t] * (world.q[t] if r else 1 - world.q[t]) for t, r in cells])
    total = np.zeros(world.psi.shape[1])
    for combo in product(range(len(cells)), repeat=R):
        pr = float(np.prod(pcell[list(combo)]))
        if pr == 0.0:
            continue
        rew = np.array([[cells[c][1] for c in combo]], dtype=np.float64)
        A = np.asarray(compute_advantages(estimator, rew, **opts))[0]
        g = sum(A[i] * world.psi[cells[c][0]] for i, c in enumerate(combo)) / R
        total += pr * g
    return total


# --- token MDP (a view of sims.token_mdp.TokenMDP by prefixes) ------------------------------------
class TokenMDPView:
    """Prefix-level view of :class:`sims.token_mdp.TokenMDP` (binary ``seq_means``).

    States are prefixes (tuples of tokens, the prompt is ``()``), transitions append the token;
    output-only reward ``mu_seq`` (0 or 1) at the last step, gamma = 1 (Sec. 2.1, 2.5).
    """

    def __init__(self, mdp: Any) -> None:
        self.mdp = mdp
        self.V, self.T = int(mdp.vocab), int(mdp.length)
        self.theta = np.asarray(mdp.logits)
        self._v, self._q = mdp.values()
        self._pol = mdp.policy
        probs = mdp.seq_probs()
        self.seqs = [tuple(int(x) for x in row) for row in mdp.sequences]
        self._prob = {s: float(p) for s, p in zip(self.seqs, probs, strict=True)}
        self.reward = {s: float(m) for s, m in zip(self.seqs, mdp.seq_means, strict=True)}
        self.prefixes = [p for t in range(self.T) for p in product(range(self.V), repeat=t)]

    def sid(self, prefix: tuple[int, ...]) -> int:
        code = 0
        for a in prefix:
            code = code * self.V + a
        return (self.V ** len(prefix) - 1) // (self.V - 1) + code

    def J(self) -> float:
        return float(self.mdp.J())

    def seq_prob(self, seq: tuple[int, ...]) -> float:
        return self._prob[seq]

    def pi(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._pol[self.sid(prefix)]

    def v(self, prefix: tuple[int, ...]) -> float:
        """``v(prefix)``; a full sequence is terminal with value ``mu_seq``."""
        if len(prefix) == self.T:
            return self.reward[prefix]
        return float(self._v[self.sid(prefix)])

    def q(self, prefix: tuple[int, ...], a: int) -> float:
        return float(self._q[self.sid(prefix), a])

    def grad_log_pi(self, prefix: tuple[int, ...], a: int) -> np.ndarray:
        g = np.zeros_like(self.theta)
        i = self.sid(prefix)
        g[i] = -self._pol[i]
        g[i, a] += 1.0
        return g.ravel()

    def outcome_world(self) -> OutcomeWorld:
        probs, means, psi = self.mdp.outcome_model()
        return OutcomeWorld(np.asarray(probs), np.asarray(psi), np.asarray(means))

    def finite_difference_grad(self, h: float = 1e-6) -> np.ndarray:
        """Central differences of ``J(theta)``: a reference for ``grad J`` independent of any
        score-function identity."""
        base = self.theta.ravel()
        g = np.zeros(base.size)
        for i in range(base.size):
            tp, tm = base.copy(), base.copy()
            tp[i] += h
            tm[i] -= h
            jp = self.mdp.with_logits(tp.reshape(self.theta.shape)).J()
            jm = self.mdp.with_logits(tm.reshape(self.theta.shape)).J()
            g[i] = (jp - jm) / (2 * h)
        return g


def group_estimator_moments(
    world: OutcomeWorld, R: int, baselines: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Exact mean, variance and MSE of per-group gradient estimators, by enumerating every joint
    (outcome, reward) of the ``R`` rollouts.

    ``g_hat = (1/R) sum_i w_i psi_i`` with ``w_i`` from ``baselines[name]``: an estimator name of
    :func:`grpo_theory.compute_advantages` (``"grpo"``, ``"rloo"``) or a float ``b`` (the oracle
    constant baseline, ``w_i = r_i - b``).

    Returns:
        ``{name: {"scale": <E g, grad J>/|grad J|^2, "cosine", "trace_var", "mse"}}``.
    """
    N = world.prob.size
    cell_t = np.repeat(np.arange(N), 2)
    cell_r = np.tile([0.0, 1.0], N)
    pcell = world.prob[cell_t] * np.where(cell_r == 1.0, world.q[cell_t], 1 - world.q[cell_t])
    combos = np.array(list(product(range(2 * N), repeat=R)), dtype=np.int64)
    pr = np.prod(pcell[combos], axis=1)
    rew = cell_r[combos]
    psi = world.psi[cell_t[combos]]  # [n, R, d]
    gJ = world.grad_J
    out: dict[str, dict[str, float]] = {}
    for name, b in baselines.items():
        A = (np.asarray(compute_advantages(b, rew)) if isinstance(b, str) else rew - float(b))
        g = np.einsum("nr,nrd->nd", A, psi) / R
        m = pr @ g
        second = float(pr @ np.einsum("nd,nd->n", g, g))
        out[name] = {
            "scale": float(m @ gJ / (gJ @ gJ)),
            "cosine": float(m @ gJ / (np.linalg.norm(m) * np.linalg.norm(gJ))),
            "trace_var": second - float(m @ m),
            "mse": float(pr @ np.einsum("nd,nd->n", g - gJ, g - gJ)),
        }
    return out
