"""Exact expected dynamics for the FADE abstract (arXiv 2607.01490): the sign axis (an imbalance of
the gradient masses m_S and m_F, AsymGRPO(delta)) and the difficulty axis (Power-alpha focus on
hard prompts), in the toy worlds of :mod:`sims.bandit` and :mod:`sims.token_mdp`.

Three levels of exactness:

* **one step, exact**: every joint group of ``R`` rollouts is enumerated (outcome and binary
  reward of each rollout), so ``E[f(theta + lr g_hat)]`` is exact for any ``f`` (entropy of the
  policy over outcomes, solve rate ``J``, logit spread) - the noise of the sampled gradient
  included (:func:`one_step_exact`);
* **mean field**: ``theta_{t+1} = theta_t + lr E[g_hat]`` with the exact ``E[g_hat]``
  (:func:`mean_field_trajectory`);
* **seeded Monte Carlo** of the sampled dynamics, vectorised over independent runs of the bandit
  (:func:`stochastic_bandit_runs`), for the multi-step effect of the noise.

For one prompt and binary rewards every group estimator has ``E[g_hat] = c(J) grad J`` (the score
has mean 0 under the policy, so ``E[psi | failure] = -p/(1-p) E[psi | success]``): the masses only
set the scalar ``c``. The difficulty axis has closed forms over ``k ~ Binomial(R, p)``:
:func:`power_alpha_prompt_mass`, :func:`kish_ess`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
from scipy.stats import binom

from grpo_theory import compute_advantages
from grpo_theory.limits import ARRAY_R_MAX, check_R_limit

from .bandit import SoftmaxBandit
from .exact import expected_gradient_bernoulli
from .token_mdp import TokenMDP

__all__ = [
    "FadeWorld",
    "entropy",
    "one_step_exact",
    "mean_field_trajectory",
    "stochastic_bandit_runs",
    "power_alpha_prompt_mass",
    "kish_ess",
]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) over the last axis: ``-sum p log p`` (``0 log 0 = 0``)."""
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -t.sum(axis=-1)


@dataclass(frozen=True)
class FadeWorld:
    """A softmax bandit or a token MDP seen as outcomes with a flat parameter vector.

    ``outcome_probs(thetas [n, d]) -> [n, O]`` is vectorised over parameter vectors; ``means`` are
    the outcomes' success probabilities; entropy is over outcomes (arms, or whole sequences).
    """

    world: SoftmaxBandit | TokenMDP

    @property
    def theta(self) -> np.ndarray:
        """Flat parameters ``[d]``."""
        return np.asarray(self.world.logits, dtype=np.float64).ravel().copy()

    @property
    def means(self) -> np.ndarray:
        """``[O]`` success probability of each outcome."""
        w = self.world
        return np.asarray(w.arm_means if isinstance(w, SoftmaxBandit) else w.seq_means, float)

    def with_theta(self, theta: np.ndarray) -> FadeWorld:
        """The same world at parameters ``theta`` ``[d]``."""
        w = self.world
        if isinstance(w, SoftmaxBandit):
            return FadeWorld(SoftmaxBandit(np.asarray(theta, float), w.arm_means))
        return FadeWorld(w.with_logits(np.asarray(theta, float).reshape(w.logits.shape)))

    def outcome_probs(self, thetas: np.ndarray) -> np.ndarray:
        """``[n, O]`` outcome probabilities at each row of ``thetas`` ``[n, d]``."""
        th = np.atleast_2d(np.asarray(thetas, dtype=np.float64))
        w = self.world
        if isinstance(w, SoftmaxBandit):
            return np.exp(_log_softmax(th))
        lp = _log_softmax(th.reshape(th.shape[0], *w.logits.shape))  # [n, states, V]
        seq_lp = lp[:, w.state_index, w.sequences].sum(-1)  # [n, V^T]
        return np.exp(seq_lp)

    def model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(probs [O], means [O], psi [O, d])`` at the current parameters."""
        pr, mu, psi = self.world.outcome_model()
        return np.asarray(pr, float), np.asarray(mu, float), np.asarray(psi, float)

    def stats(self, thetas: np.ndarray) -> dict[str, np.ndarray]:
        """``J``, entropy ``H`` and logit spread (norm of the centred logits) at each row."""
        th = np.atleast_2d(thetas)
        p = self.outcome_probs(th)
        w = self.world
        shaped = th.reshape(th.shape[0], -1, np.shape(w.logits)[-1])
        centred = shaped - shaped.mean(axis=-1, keepdims=True)
        return {"J": p @ self.means, "H": entropy(p),
                "logit_norm": np.sqrt((centred**2).sum(axis=(1, 2)))}


#: Most joint groups :func:`one_step_exact` enumerates (``(2 O)^R`` cells of outcome and reward).
GROUPS_MAX = 2_000_000


def _groups(probs: np.ndarray, means: np.ndarray, R: int) -> tuple[np.ndarray, ...]:
    """Every joint group: outcome indices ``[n, R]``, rewards ``[n, R]``, probabilities ``[n]``
    (cells of zero probability dropped)."""
    O = probs.size
    cell_o = np.repeat(np.arange(O), 2)
    cell_r = np.tile([0.0, 1.0], O)
    pc = probs[cell_o] * np.where(cell_r == 1.0, means[cell_o], 1.0 - means[cell_o])
    keep = np.flatnonzero(pc > 0)
    if R * math.log(max(int(keep.size), 1)) > math.log(GROUPS_MAX):  # not size ** R: huge R
        raise ValueError(
            f"{keep.size}^{R} joint groups is too many to enumerate (more than GROUPS_MAX="
            f"{GROUPS_MAX}); use the mean-field step (mean_field_trajectory) or "
            "stochastic_bandit_runs (Monte Carlo) for this R"
        )
    combos = np.array(list(product(keep, repeat=R)), dtype=np.int64)
    return cell_o[combos], cell_r[combos], np.prod(pc[combos], axis=1)


def one_step_exact(
    fw: FadeWorld, estimator: str, *, R: int, lr: float, opts: dict[str, Any] | None = None
) -> dict[str, float]:
    """One update ``theta + lr g_hat`` with ``g_hat = (1/R) sum_i A_i psi_i``, exactly in
    expectation over the sampled group (every joint group enumerated).

    Returns:
        ``dJ``, ``dH``, ``dlogit_norm``: exact ``E[f(theta')] - f(theta)``; the same for the
        mean-field step ``theta + lr E[g_hat]`` (``*_mean_field``); ``m_S``, ``m_F``: expected
        per-group masses; ``scale``: ``c`` in ``E[g_hat] = c grad J``.
    """
    if R < 2 or lr <= 0:
        raise ValueError(f"need R >= 2 and lr > 0, got R={R}, lr={lr}")
    probs, means, psi = fw.model()
    o, r, pg = _groups(probs, means, R)
    A = np.asarray(compute_advantages(estimator, r, **(opts or {})))
    g = np.einsum("nr,nrd->nd", A, psi[o]) / R
    th = fw.theta
    after = fw.stats(th[None, :] + lr * g)
    now = fw.stats(th[None, :])
    Eg = pg @ g
    mf = fw.stats(th[None, :] + lr * Eg)
    gJ = (probs * means) @ psi
    succ = r == 1.0
    out = {f"d{k}": float(pg @ after[k] - now[k][0]) for k in now}
    out.update({f"d{k}_mean_field": float(mf[k][0] - now[k][0]) for k in now})
    out["m_S"] = float(pg @ np.where(succ, A, 0.0).sum(1))
    out["m_F"] = float(pg @ np.where(~succ, np.abs(A), 0.0).sum(1))
    out["scale"] = float(Eg @ gJ / (gJ @ gJ))
    out["J"], out["H"] = float(now["J"][0]), float(now["H"][0])
    return out


def mean_field_trajectory(
    fw: FadeWorld, estimator: str, *, R: int, lr: float, steps: int,
    opts: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """``theta_{t+1} = theta_t + lr E[g_hat]`` (exact expectation, :mod:`sims.exact`).

    Returns:
        ``J``, ``H``, ``logit_norm``: ``[steps + 1]`` arrays (the start included).
    """
    if steps < 1 or lr <= 0:
        raise ValueError(f"need steps >= 1 and lr > 0, got steps={steps}, lr={lr}")
    hist: dict[str, list[float]] = {"J": [], "H": [], "logit_norm": []}
    cur = fw
    for t in range(steps + 1):
        st = cur.stats(cur.theta[None, :])
        for k in hist:
            hist[k].append(float(st[k][0]))
        if t == steps:
            break
        pr, mu, psi = cur.model()
        g = expected_gradient_bernoulli(estimator, probs=pr, means=mu, psi=psi, R=R,
                                        opts=dict(opts or {}))
        cur = cur.with_theta(cur.theta + lr * g)
    return {k: np.asarray(v) for k, v in hist.items()}


def stochastic_bandit_runs(
    bandit: SoftmaxBandit, estimator: str, *, R: int, lr: float, steps: int, n_runs: int,
    rng: np.random.Generator, opts: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """``n_runs`` independent sampled-gradient runs of a Bernoulli softmax bandit (vectorised).

    Returns:
        ``J``, ``H``, ``logit_norm``: ``[steps + 1, n_runs]`` per-run trajectories.
    """
    if n_runs < 1 or steps < 1 or R < 2 or lr <= 0:
        raise ValueError("need n_runs >= 1, steps >= 1, R >= 2, lr > 0")
    mu = np.asarray(bandit.arm_means, dtype=np.float64)
    K = mu.size
    th = np.tile(np.asarray(bandit.logits, dtype=np.float64), (n_runs, 1))
    fw = FadeWorld(bandit)
    out: dict[str, list[np.ndarray]] = {"J": [], "H": [], "logit_norm": []}
    for t in range(steps + 1):
        st = fw.stats(th)
        for k in out:
            out[k].append(st[k])
        if t == steps:
            break
        p = np.exp(_log_softmax(th))
        cdf = np.cumsum(p, axis=1)
        cdf[:, -1] = 1.0
        arms = (rng.random((n_runs, R, 1)) > cdf[:, None, :]).sum(-1)
        rew = (rng.random((n_runs, R)) < mu[arms]).astype(np.float64)
        A = np.asarray(compute_advantages(estimator, rew, **(opts or {})))
        onehot = np.zeros((n_runs, R, K))
        np.put_along_axis(onehot, arms[..., None], 1.0, axis=2)
        psi = onehot - p[:, None, :]
        th = th + lr * np.einsum("nr,nrk->nk", A, psi) / R
    return {k: np.asarray(v) for k, v in out.items()}


def power_alpha_prompt_mass(p: np.ndarray, *, R: int, alpha: float) -> np.ndarray:
    """Closed form of the expected per-group mass ``E[m_S + m_F]`` of Power-alpha at solve rate
    ``p``: ``sum_k Binom(k; R, p) * 2 k (R - k) / R * (1 - k/R)^(alpha - 1)``.

    (Given ``k`` successes the advantages are ``f (1 - k/R)`` and ``-f k/R``,
    ``f = (1 - k/R)^(alpha - 1)``; ``k m_S = (R - k) m_F = f k (R - k)/R``.)
    """
    if R < 2:
        raise ValueError(f"R must be >= 2, got {R}")
    check_R_limit(int(R), limit=ARRAY_R_MAX, name="ARRAY_R_MAX",
                  routine="power_alpha_prompt_mass", cost="the Binomial law of R + 1 counts",
                  alternative="estimate the mass by Monte Carlo (sample k ~ Binomial(R, p))")
    p = np.asarray(p, dtype=np.float64)
    k = np.arange(R + 1)
    base = 1.0 - k / R
    f = np.where(base > 0, np.where(base > 0, base, 1.0) ** (alpha - 1.0), 0.0)
    per_k = 2.0 * k * (R - k) / R * f
    return binom.pmf(k[:, None], R, p.reshape(1, -1)).T @ per_k if p.ndim else float(
        binom.pmf(k, R, float(p)) @ per_k)


def kish_ess(weights: np.ndarray) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` of nonnegative weights."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights must be a non-empty 1-D array of finite values >= 0")
    s2 = float(w @ w)
    if s2 == 0:
        raise ValueError("all weights are zero")
    return float(w.sum() ** 2 / s2)
