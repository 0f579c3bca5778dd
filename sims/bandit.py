"""A K-armed bandit with a softmax policy: the smallest world where GRPO's maths is exact.

Policy ``pi = softmax(theta)``, ``theta in R^K`` (the logits are the parameters). Arm ``a`` has
reward law ``D_a`` with mean ``mu_a`` and variance ``s2_a``. Exact quantities (seed paper,
Def. 2.1 and Eq. 4 with ``T = 1``):

* ``J = v = sum_a pi_a mu_a``; ``q(a) = mu_a``; ``A(a) = mu_a - J`` (Eq. 3);
* score ``psi(a) = grad_theta log pi_a = e_a - pi``; ``grad J = sum_a pi_a mu_a psi(a)
  = pi * (mu - J)`` (elementwise);
* reward variance ``sigma_r^2 = sum_a pi_a (s2_a + mu_a^2) - J^2``.

Reward laws (``reward=``): ``"bernoulli"`` (``r in {0, 1}``, ``P(r=1|a) = mu_a``), ``"beta"``
(continuous on ``[0, 1]``: ``Beta(mu_a c, (1 - mu_a) c)`` with concentration ``c``), and
``"gaussian"`` (``N(mu_a, noise_std^2)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["SoftmaxBandit"]

RewardKind = Literal["bernoulli", "beta", "gaussian"]


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


@dataclass(frozen=True)
class SoftmaxBandit:
    """K-armed bandit with a softmax policy over the logits ``theta``.

    Attributes:
        logits: ``[K]`` policy logits ``theta``.
        arm_means: ``[K]`` mean reward ``mu_a`` (in ``[0, 1]`` for bernoulli/beta).
        reward: reward law, ``"bernoulli"`` (default), ``"beta"`` or ``"gaussian"``.
        concentration: Beta concentration ``c`` (``reward="beta"``), default 4.
        noise_std: Gaussian noise std (``reward="gaussian"``), default 0.5.
    """

    logits: np.ndarray
    arm_means: np.ndarray
    reward: RewardKind = "bernoulli"
    concentration: float = 4.0
    noise_std: float = 0.5

    def __post_init__(self) -> None:
        th = np.asarray(self.logits, dtype=np.float64)
        mu = np.asarray(self.arm_means, dtype=np.float64)
        if th.ndim != 1 or th.size < 2:
            raise ValueError(f"logits must be 1-D with K >= 2 arms, got shape {th.shape}")
        if mu.shape != th.shape:
            raise ValueError(f"arm_means must be shaped [K]={th.shape}, got {mu.shape}")
        if not (np.all(np.isfinite(th)) and np.all(np.isfinite(mu))):
            raise ValueError("logits and arm_means must be finite")
        if self.reward not in ("bernoulli", "beta", "gaussian"):
            raise ValueError(f"reward must be bernoulli, beta or gaussian, got {self.reward!r}")
        if self.reward in ("bernoulli", "beta") and (np.any(mu < 0) or np.any(mu > 1)):
            raise ValueError(f"{self.reward} rewards need arm_means in [0, 1], got {mu}")
        if self.reward == "beta" and (np.any(mu <= 0) or np.any(mu >= 1)):
            raise ValueError("beta rewards need arm_means strictly inside (0, 1)")
        if self.concentration <= 0 or self.noise_std < 0:
            raise ValueError("concentration must be > 0 and noise_std >= 0")
        object.__setattr__(self, "logits", th)
        object.__setattr__(self, "arm_means", mu)

    # --- exact quantities ----------------------------------------------------------------------
    @property
    def K(self) -> int:
        """Number of arms."""
        return int(self.logits.size)

    @property
    def probs(self) -> np.ndarray:
        """``[K]`` policy ``pi = softmax(theta)``."""
        return _softmax(self.logits)

    @property
    def arm_variances(self) -> np.ndarray:
        """``[K]`` reward variance of each arm."""
        mu = self.arm_means
        if self.reward == "bernoulli":
            return mu * (1.0 - mu)
        if self.reward == "beta":
            return mu * (1.0 - mu) / (self.concentration + 1.0)
        return np.full_like(mu, self.noise_std**2)

    def J(self) -> float:
        """``J = v(s_0) = sum_a pi_a mu_a``."""
        return float(self.probs @ self.arm_means)

    def v(self) -> float:
        """State value of the single state (= J)."""
        return self.J()

    def q(self) -> np.ndarray:
        """``[K]`` action values ``q(a) = mu_a``."""
        return self.arm_means.copy()

    def advantage(self) -> np.ndarray:
        """``[K]`` true advantages ``A(a) = mu_a - J`` (Eq. 3)."""
        return self.arm_means - self.J()

    def reward_variance(self) -> float:
        """``sigma_r^2 = Var(r)`` under the policy (law of total variance)."""
        pi, mu = self.probs, self.arm_means
        return float(pi @ (self.arm_variances + mu**2) - (pi @ mu) ** 2)

    def scores(self) -> np.ndarray:
        """``[K, K]`` score of each arm w.r.t. the logits: row ``a`` is ``e_a - pi``."""
        return np.eye(self.K) - self.probs[None, :]

    def grad_J(self) -> np.ndarray:
        """``[K]`` exact ``grad_theta J = pi * (mu - J)``."""
        pi = self.probs
        return pi * (self.arm_means - pi @ self.arm_means)

    # --- sampling ------------------------------------------------------------------------------
    def sample_arms(self, n_groups: int, R: int, rng: np.random.Generator) -> np.ndarray:
        """``[n_groups, R]`` i.i.d. arms from ``pi`` (int64), by inverse CDF."""
        _check_sizes(n_groups, R)
        cdf = np.cumsum(self.probs)
        cdf[-1] = 1.0
        u = rng.random((n_groups, R))
        return np.searchsorted(cdf, u, side="right")

    def sample_rewards(self, arms: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Rewards of the given arms, same shape, float64."""
        mu = self.arm_means[arms]
        if self.reward == "bernoulli":
            return (rng.random(arms.shape) < mu).astype(np.float64)
        if self.reward == "beta":
            c = self.concentration
            return rng.beta(mu * c, (1.0 - mu) * c)
        return mu + self.noise_std * rng.standard_normal(arms.shape)

    def sample(
        self, n_groups: int, R: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sample ``n_groups`` groups of ``R`` rollouts: ``(arms [n, R], rewards [n, R])``."""
        arms = self.sample_arms(n_groups, R, rng)
        return arms, self.sample_rewards(arms, rng)

    def sample_bernoulli_fast(
        self, n_groups: int, R: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bernoulli rewards from float32 uniforms (benchmarked path): arms int64, rewards uint8.

        Same law as :meth:`sample` up to float32 resolution of the uniforms (2^-24).
        """
        if self.reward != "bernoulli":
            raise ValueError("sample_bernoulli_fast needs reward='bernoulli'")
        _check_sizes(n_groups, R)
        cdf = np.cumsum(self.probs).astype(np.float32)
        cdf[-1] = 1.0
        u = rng.random((2, n_groups, R), dtype=np.float32)
        arms = np.searchsorted(cdf, u[0], side="right")
        rewards = (u[1] < self.arm_means.astype(np.float32)[arms]).view(np.uint8)
        return arms, rewards

    def outcome_model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(probs [K], means [K], psi [K, K])`` for :mod:`sims.exact`."""
        return self.probs, self.arm_means.copy(), self.scores()


def _check_sizes(n_groups: int, R: int) -> None:
    if int(n_groups) != n_groups or n_groups < 1:
        raise ValueError(f"n_groups must be a positive integer, got {n_groups}")
    if int(R) != R or R < 1:
        raise ValueError(f"group size R must be a positive integer, got {R}")
