"""A multi-turn MDP with stochastic transitions and per-stage random rewards, solved by DP.

Stages ``h = 0..H-1`` (the paper's ``1..H``), states ``s in {0..S-1}``, actions ``a in {0..A-1}``,
fixed initial state ``s_0`` (the prompt). At stage ``h`` the policy ``pi_h(a | s) =
softmax(theta[h, s])`` picks ``a``; the stage reward is ``r_h = c * Bernoulli(m[h, s, a])``
(``c = reward_value``) and the next state is drawn from ``P[h, s, a, :]``. Exact quantities
(seed paper Def. 2.1 with ``gamma = 1`` and per-stage rewards, App. A.3):

* ``q_h(s, a) = c m[h, s, a] + sum_s' P[h, s, a, s'] v_{h+1}(s')``, ``v_h(s) = sum_a pi_h(a|s)
  q_h(s, a)``, ``v_H = 0``; ``A_h(s, a) = q_h(s, a) - v_h(s)`` (Eq. 21 / App. A.3);
* every trajectory (states, actions, rewards) is enumerable, which gives the brute-force reference
  for the DP, ``grad J`` and the score ``psi(tau) = sum_h grad log pi_h(a_h | s_h)``;
* the law of the future reward count from ``(h, s_h, a_h)`` (a pmf over ``0..H-h``), which makes
  ``E[A_hat(h) | prefix]`` exact for any estimator applied to the total returns (Eq. 22).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from scipy.special import gammaln

from grpo_theory import compute_advantages

from .exact import estimator_options

__all__ = ["MultiTurnMDP", "MULTISET_CELLS_MAX"]

#: Most cells (multisets x (R - 1)) the exact conditional advantage enumerates: the multisets of
#: the other ``R - 1`` rollouts' reward counts grow as ``C(R - 1 + H, H)`` (16 MB, about a
#: second at the cap).
MULTISET_CELLS_MAX = 2_000_000


@dataclass(frozen=True)
class MultiTurnMDP:
    """Finite-horizon tabular MDP with a tabular softmax policy.

    Attributes:
        transitions: ``[H-1, S, A, S]`` next-state probabilities after stages ``0..H-2``.
        reward_means: ``[H, S, A]`` success probability of each stage reward.
        logits: ``[H, S, A]`` policy logits.
        init_state: initial state ``s_0`` (default 0).
        reward_value: value ``c`` of a successful stage reward (default 1.0).
    """

    transitions: np.ndarray
    reward_means: np.ndarray
    logits: np.ndarray
    init_state: int = 0
    reward_value: float = 1.0

    def __post_init__(self) -> None:
        P = np.asarray(self.transitions, dtype=np.float64)
        m = np.asarray(self.reward_means, dtype=np.float64)
        th = np.asarray(self.logits, dtype=np.float64)
        if m.ndim != 3:
            raise ValueError(f"reward_means must be [H, S, A], got shape {m.shape}")
        H, S, A = m.shape
        if H < 1 or S < 1 or A < 2:
            raise ValueError(f"need H >= 1, S >= 1, A >= 2; got {m.shape}")
        if th.shape != m.shape:
            raise ValueError(f"logits must be shaped {m.shape}, got {th.shape}")
        if P.shape != (H - 1, S, A, S):
            raise ValueError(f"transitions must be shaped {(H - 1, S, A, S)}, got {P.shape}")
        if np.any(P < 0) or np.any(np.abs(P.sum(-1) - 1.0) > 1e-9):
            raise ValueError("each transitions[h, s, a, :] must be a probability distribution")
        if np.any(m < 0) or np.any(m > 1):
            raise ValueError("reward_means must be in [0, 1]")
        if not (0 <= self.init_state < S):
            raise ValueError(f"init_state must be in [0, {S}), got {self.init_state}")
        if not np.all(np.isfinite(th)) or not np.isfinite(self.reward_value):
            raise ValueError("logits and reward_value must be finite")
        object.__setattr__(self, "transitions", P)
        object.__setattr__(self, "reward_means", m)
        object.__setattr__(self, "logits", th)

    @classmethod
    def random(
        cls,
        rng: np.random.Generator,
        *,
        H: int = 3,
        S: int = 3,
        A: int = 2,
        logit_scale: float = 1.0,
        dirichlet: float = 1.0,
    ) -> MultiTurnMDP:
        """Random instance: Dirichlet(``dirichlet``) transitions, U(0, 1) reward means, Gaussian
        logits of std ``logit_scale``."""
        P = rng.dirichlet(np.full(S, dirichlet), size=(H - 1, S, A))
        return cls(
            transitions=P,
            reward_means=rng.random((H, S, A)),
            logits=logit_scale * rng.standard_normal((H, S, A)),
        )

    # --- structure -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """``(H, S, A)``."""
        H, S, A = self.reward_means.shape
        return H, S, A

    @property
    def dim(self) -> int:
        """Number of policy parameters ``H * S * A``."""
        H, S, A = self.shape
        return H * S * A

    @property
    def policy(self) -> np.ndarray:
        """``[H, S, A]`` ``pi_h(a | s)``."""
        z = np.exp(self.logits - self.logits.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)

    # --- dynamic programming -------------------------------------------------------------------
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(v [H+1, S], q [H, S, A])`` by backward induction (``v[H] = 0``)."""
        H, S, A = self.shape
        pol = self.policy
        v = np.zeros((H + 1, S))
        q = np.zeros((H, S, A))
        for h in range(H - 1, -1, -1):
            q[h] = self.reward_value * self.reward_means[h]
            if h < H - 1:
                q[h] += self.transitions[h] @ v[h + 1]
            v[h] = np.sum(pol[h] * q[h], axis=-1)
        return v, q

    def advantages(self) -> np.ndarray:
        """``[H, S, A]`` true advantages ``A_h(s, a) = q_h(s, a) - v_h(s)``."""
        v, q = self.values()
        return q - v[:-1, :, None]

    def J(self) -> float:
        """``J = v_0(s_0)``."""
        return float(self.values()[0][0, self.init_state])

    def future_count_pmf(self) -> np.ndarray:
        """``F[h, s, a, c] = P(number of successful stage rewards at stages h..H-1 = c | s_h=s,
        a_h=a)``, ``c = 0..H``; by backward recursion (convolution with each stage's Bernoulli)."""
        H, S, A = self.shape
        pol = self.policy
        F = np.zeros((H, S, A, H + 1))
        nxt = None  # [S, H+1]: pmf of the count from stage h+1 given s_{h+1}
        for h in range(H - 1, -1, -1):
            if nxt is None:
                base = np.zeros((S, A, H + 1))
                base[..., 0] = 1.0
            else:
                base = np.einsum("sat,tc->sac", self.transitions[h], nxt)
            m = self.reward_means[h][..., None]
            shifted = np.concatenate([np.zeros((S, A, 1)), base[..., :-1]], axis=-1)
            F[h] = (1.0 - m) * base + m * shifted
            nxt = np.einsum("sa,sac->sc", pol[h], F[h])
        return F

    def total_count_pmf(self) -> np.ndarray:
        """``[H+1]`` pmf of the total number of successful stage rewards of a full rollout."""
        F = self.future_count_pmf()
        s0 = self.init_state
        return self.policy[0, s0] @ F[0, s0]

    # --- enumeration ---------------------------------------------------------------------------
    @cached_property
    def trajectories(self) -> dict[str, np.ndarray]:
        """Every trajectory: ``states``, ``actions``, ``rewards`` (0/1 counts) ``[N, H]`` and
        ``prob [N]`` (brute force, no DP)."""
        H, S, A = self.shape
        pol = self.policy
        per_stage = [(s, a, r) for s in range(S) for a in range(A) for r in (0, 1)]
        states, actions, rewards, probs = [], [], [], []
        for combo in itertools.product(per_stage, repeat=H):
            if combo[0][0] != self.init_state:
                continue
            p = 1.0
            for h, (s, a, r) in enumerate(combo):
                m = self.reward_means[h, s, a]
                p *= pol[h, s, a] * (m if r else 1.0 - m)
                if h + 1 < H:
                    p *= self.transitions[h, s, a, combo[h + 1][0]]
            states.append([c[0] for c in combo])
            actions.append([c[1] for c in combo])
            rewards.append([c[2] for c in combo])
            probs.append(p)
        return {
            "states": np.array(states, dtype=np.int64),
            "actions": np.array(actions, dtype=np.int64),
            "rewards": np.array(rewards, dtype=np.float64),
            "prob": np.array(probs),
        }

    def values_enumeration(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(v [H, S], q [H, S, A], reach [H, S])`` as conditional expectations of the reward to
        go over all enumerated trajectories; entries with zero reach probability are 0."""
        H, S, A = self.shape
        tr = self.trajectories
        p = tr["prob"]
        togo = self.reward_value * np.cumsum(tr["rewards"][:, ::-1], axis=1)[:, ::-1]
        v = np.zeros((H, S))
        q = np.zeros((H, S, A))
        reach = np.zeros((H, S))
        for h in range(H):
            s, a = tr["states"][:, h], tr["actions"][:, h]
            ps = np.bincount(s, weights=p, minlength=S)
            reach[h] = ps
            ok = ps > 0
            v[h, ok] = np.bincount(s, weights=p * togo[:, h], minlength=S)[ok] / ps[ok]
            sa = s * A + a
            psa = np.bincount(sa, weights=p, minlength=S * A)
            qa = np.bincount(sa, weights=p * togo[:, h], minlength=S * A)
            okk = psa > 0
            qq = np.zeros(S * A)
            qq[okk] = qa[okk] / psa[okk]
            q[h] = qq.reshape(S, A)
        return v, q, reach

    def psi(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``[..., d]`` trajectory scores ``sum_h (e_{a_h} - pi_h(.|s_h))`` in block ``(h, s_h)``.

        Args:
            states: ``[..., H]`` int.
            actions: ``[..., H]`` int.
        """
        H, S, A = self.shape
        pol = self.policy
        lead = states.shape[:-1]
        out = np.zeros((*lead, H, S, A))
        for h in range(H):
            s, a = states[..., h], actions[..., h]
            blk = -pol[h][s]  # [..., A]
            np.put_along_axis(
                blk, a[..., None], np.take_along_axis(blk, a[..., None], -1) + 1.0, -1
            )
            idx = np.indices(lead)
            out[(*idx, np.full(lead, h), s)] = blk
        return out.reshape(*lead, H * S * A)

    def grad_J(self) -> np.ndarray:
        """``[d]`` exact ``grad J = sum_tau P(tau) G(tau) psi(tau)`` by enumeration."""
        tr = self.trajectories
        G = self.reward_value * tr["rewards"].sum(1)
        return (tr["prob"] * G) @ self.psi(tr["states"], tr["actions"])

    # --- sampling ------------------------------------------------------------------------------
    def _rollout(
        self,
        states0: np.ndarray,
        h0: int,
        first_actions: np.ndarray | None,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        H, S, A = self.shape
        pol = self.policy
        shape = states0.shape
        st = np.zeros((*shape, H - h0), dtype=np.int64)
        ac = np.zeros((*shape, H - h0), dtype=np.int64)
        rw = np.zeros((*shape, H - h0))
        s = states0.copy()
        for j, h in enumerate(range(h0, H)):
            if j == 0 and first_actions is not None:
                a = first_actions.copy()
            else:
                cdf = np.cumsum(pol[h][s], axis=-1)
                a = np.minimum((rng.random(shape)[..., None] >= cdf).sum(-1), A - 1)
            st[..., j], ac[..., j] = s, a
            rw[..., j] = rng.random(shape) < self.reward_means[h, s, a]
            if h + 1 < H:
                cdf = np.cumsum(self.transitions[h, s, a], axis=-1)
                s = np.minimum((rng.random(shape)[..., None] >= cdf).sum(-1), S - 1)
        return st, ac, rw

    def sample(self, n_groups: int, R: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Sample ``n_groups`` groups of ``R`` rollouts from ``s_0``.

        Returns:
            dict of ``states``, ``actions`` (int) and ``stage_rewards`` (float, values ``0`` or
            ``c``), each ``[n_groups, R, H]``.
        """
        if n_groups < 1 or R < 1:
            raise ValueError(f"need n_groups >= 1 and R >= 1, got {n_groups}, {R}")
        s0 = np.full((n_groups, R), self.init_state, dtype=np.int64)
        st, ac, rw = self._rollout(s0, 0, None, rng)
        return {"states": st, "actions": ac, "stage_rewards": self.reward_value * rw}

    def sample_continuation(
        self, h: int, s: int, a: int, n: int, rng: np.random.Generator
    ) -> np.ndarray:
        """``[n]`` reward to go (stages ``h..H-1``) of rollouts continued from ``(s_h, a_h)``."""
        H, S, A = self.shape
        if not (0 <= h < H and 0 <= s < S and 0 <= a < A):
            raise ValueError(f"(h, s, a) = {(h, s, a)} out of range for shape {self.shape}")
        _, _, rw = self._rollout(
            np.full(n, s, dtype=np.int64), h, np.full(n, a, dtype=np.int64), rng
        )
        return self.reward_value * rw.sum(-1)

    # --- exact conditional advantages ----------------------------------------------------------
    def _others_multisets(self, R: int) -> tuple[np.ndarray, np.ndarray]:
        """All multisets of the other ``R-1`` rollouts' reward counts, with probabilities."""
        H = self.shape[0]
        n_sets = math.comb(R - 1 + H, H)  # multisets of R - 1 counts in 0..H
        if n_sets * (R - 1) > MULTISET_CELLS_MAX:
            raise ValueError(
                f"R={R}, H={H}: {n_sets} multisets of the other R - 1 reward counts "
                f"({n_sets * (R - 1)} cells) exceed MULTISET_CELLS_MAX={MULTISET_CELLS_MAX}; "
                "estimate E[A_1 | own count] by Monte Carlo (check_multiturn samples it)"
            )
        p0 = self.total_count_pmf()
        combos = np.array(
            list(itertools.combinations_with_replacement(range(H + 1), R - 1)), dtype=np.int64
        ).reshape(-1, R - 1)
        counts = np.stack([(combos == c).sum(1) for c in range(H + 1)], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = gammaln(R) - gammaln(counts + 1).sum(1) + (counts * np.log(p0)).sum(1)
        prob = np.where(np.all((counts == 0) | (p0 > 0), axis=1), np.exp(logp), 0.0)
        return combos.astype(np.float64), np.nan_to_num(prob)

    def expected_own_advantage_given_total(
        self, estimator: str, *, R: int, opts: dict[str, Any] | None = None, power: int = 1
    ) -> np.ndarray:
        """``[H+1]`` exact ``E[A_1^power | own reward count = c]``, the others ``R-1`` i.i.d.
        rollouts (``power=2``: the second moment, for exact standard errors).

        The estimator is applied to the total returns (Eq. 22: every stage of a rollout gets the
        same advantage).
        """
        if R < 2:
            raise ValueError(f"R must be >= 2, got {R}")
        H = self.shape[0]
        others, prob = self._others_multisets(R)
        out = np.zeros(H + 1)
        opts_ = estimator_options(estimator, opts)
        for c in range(H + 1):
            rows = np.concatenate([np.full((others.shape[0], 1), float(c)), others], axis=1)
            A1 = np.asarray(compute_advantages(estimator, self.reward_value * rows, **opts_))[:, 0]
            out[c] = prob @ A1**power
        return out

    def conditional_advantage(
        self,
        estimator: str,
        *,
        R: int,
        h: int,
        s: int,
        a: int,
        past_count: int,
        opts: dict[str, Any] | None = None,
        power: int = 1,
    ) -> float:
        """Exact ``E[A_hat(h)^power | prefix]`` for a prefix ending in ``(s_h, a_h)`` with
        ``past_count`` successful rewards at stages ``< h``: enumerate the own continuation and
        the others."""
        F = self.future_count_pmf()[h, s, a]
        g = self.expected_own_advantage_given_total(estimator, R=R, opts=opts, power=power)
        H = self.shape[0]
        tot = 0.0
        for c in range(H - h + 1):
            if F[c] > 0:
                tot += F[c] * g[past_count + c]
        return float(tot)

    def prefix_table(self) -> list[dict[str, Any]]:
        """Every reachable ``(h, s_h, a_h, past_count)`` with its probability (by enumeration)."""
        H, S, A = self.shape
        tr = self.trajectories
        out = []
        for h in range(H):
            past = tr["rewards"][:, :h].sum(1).astype(np.int64)
            key = (tr["states"][:, h] * A + tr["actions"][:, h]) * (H + 1) + past
            mass = np.bincount(key, weights=tr["prob"], minlength=S * A * (H + 1))
            for kk in np.flatnonzero(mass > 0):
                sa, pc = divmod(int(kk), H + 1)
                s, a = divmod(sa, A)
                out.append({"h": h, "s": s, "a": a, "past_count": pc, "prob": float(mass[kk])})
        return out

    def expected_gradient(
        self, estimator: str, *, R: int, opts: dict[str, Any] | None = None
    ) -> np.ndarray:
        """Exact ``E[g_hat] = E[A_1 psi_1]`` with Eq. 22 advantages (by enumeration)."""
        tr = self.trajectories
        g = self.expected_own_advantage_given_total(estimator, R=R, opts=opts)
        cnt = tr["rewards"].sum(1).astype(np.int64)
        return (tr["prob"] * g[cnt]) @ self.psi(tr["states"], tr["actions"])

    def stage_cross_moments(self) -> np.ndarray:
        """``M[h, h'] = E[r_{h'} grad log pi_h(a_h | s_h)]`` (``[H, H, d]``, block ``h`` nonzero),
        by enumeration; ``r`` in reward units (``c`` times the 0/1 outcome)."""
        H, S, A = self.shape
        tr = self.trajectories
        blocks = self.psi(tr["states"], tr["actions"]).reshape(-1, H, S * A)
        r = self.reward_value * tr["rewards"]
        M = np.zeros((H, H, H, S * A))
        for h in range(H):
            M[h, :, h] = np.einsum("n,nk,nd->kd", tr["prob"], r, blocks[:, h])
        return M.reshape(H, H, -1)

    def expected_gradient_stagewise(self, coef: np.ndarray) -> np.ndarray:
        """Exact ``E[g_hat]`` for per-stage advantages linear in the own stage rewards,
        ``A_1(h) = sum_h' coef[h, h'] r_{1,h'} + (terms in the other, independent rollouts)``:
        ``E[g_hat] = sum_{h,h'} coef[h, h'] M[h, h']`` (:meth:`stage_cross_moments`); the
        other rollouts' terms multiply the own score, whose mean is 0."""
        H = self.shape[0]
        coef = np.asarray(coef, dtype=np.float64)
        if coef.shape != (H, H):
            raise ValueError(f"coef must be shaped [H, H]=[{H}, {H}], got {coef.shape}")
        return np.einsum("ab,abd->d", coef, self.stage_cross_moments())

    def expected_gradient_true_advantage(self) -> np.ndarray:
        """``E[sum_h A_h(s_h, a_h) grad log pi_h(a_h|s_h)]`` by enumeration (= grad J, Eq. 10)."""
        H, S, A = self.shape
        tr = self.trajectories
        adv = self.advantages()
        pol = self.policy
        out = np.zeros((H, S, A))
        for h in range(H):
            s, a = tr["states"][:, h], tr["actions"][:, h]
            w = tr["prob"] * adv[h, s, a]
            blk = -pol[h][s]
            blk[np.arange(s.size), a] += 1.0
            np.add.at(out[h], s, w[:, None] * blk)
        return out.reshape(-1)
