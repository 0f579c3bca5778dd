"""A toy GRPO world where the gradient noise scale is known exactly, and its seeded checks.

**World.** ``P`` prompts, each with ``A`` answers; a log-linear policy with parameters shared by
every prompt, ``pi_p(a) = softmax_a(phi(p, a) . theta)`` (``phi [P, A, d]``, ``theta [d]``), so
the score of an answer is ``psi(p, a) = phi(p, a) - E_{pi_p} phi(p, .)`` and different prompts'
gradients are *not* orthogonal. Answer ``a`` of prompt ``p`` has the reward ``r(p, a)`` and the
token count ``L(p, a)``. A group draws a prompt uniformly and ``R`` answers i.i.d. from ``pi_p``;
its advantages are those of a :mod:`grpo_theory` estimator (default ``grpo``); a rollout's
gradient row is ``g_i = A_i psi_i / (n R)`` (sequence-mean over the step's ``n R`` rollouts), so
that group ``g``'s estimate of the step's gradient is ``x_g = n G_g = (1/R) sum_i A_i psi_i``.

**Exact.** ``mu = E[x_g]`` and ``Sigma = Cov(x_g)`` by enumeration over the prompts and the
``A^R`` ordered answer tuples (:meth:`NoiseScaleWorld.exact`): ``|mu|^2``, ``tr(Sigma)``,
``B_simple = tr(Sigma) / |mu|^2`` (McCandlish et al. 2018, arXiv 1812.06162) and the exact
variances of the two estimators of :func:`grpo_theory.diagnostics.noise_scale_parts` at ``n``
groups, which are U-statistics of order 2 (Hoeffding 1948)::

    Var(|mu|^2_hat)    = 4 (n-2) / (n (n-1)) mu^T Sigma mu + 2 / (n (n-1)) (tr(M^2) - |mu|^4)
    Var(tr(Sigma)_hat) = Var(|y|^2) / n + 2 tr(Sigma^2) / (n (n-1))
    Cov(., .)          = 4 (n-2) / (n (n-1)) zeta_1 + 2 / (n (n-1)) zeta_2

with ``M = E[x x^T]``, ``y = x - mu``, ``zeta_1 = mu^T E[|y|^2 y] / 2`` and
``zeta_2 = mu^T E[|x|^2 x] - tr(M^2) - |mu|^2 tr(Sigma)``.

**Checks** (:func:`check_noise_scale`, the decision rule of :mod:`sims.results`, ``k = 4``): over
``steps`` independent steps of ``n`` groups, the means of ``|mu|^2_hat`` and ``tr(Sigma)_hat``
against the exact values with their exact standard errors (unbiasedness of each part), and the
pooled ratio ``mean tr(Sigma)_hat / mean |mu|^2_hat`` against the exact ``B_simple`` with the
delta-method SE from the exact moments (the ratio is consistent, not unbiased; the per-step ratio's
mean is reported beside it, unchecked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import product
from typing import Any

import numpy as np

from grpo_theory import compute_advantages
from grpo_theory.diagnostics import noise_scale_parts

from .results import DEFAULT_K, CheckResult, make_check

__all__ = ["NoiseScaleWorld", "ExactNoise", "default_world", "check_noise_scale"]

#: Largest ``A^R`` the exact enumeration accepts (per prompt).
ENUMERATION_MAX = 50_000


@dataclass(frozen=True)
class ExactNoise:
    """Exact moments of one group's estimate ``x_g`` of the step's gradient.

    Attributes:
        mu: ``[d]`` ``E[x_g]``; sigma: ``[d, d]`` ``Cov(x_g)``.
        fourth: ``E|y|^4`` (``y = x - mu``); skew_mu: ``mu^T E[|y|^2 y]``;
        third_x: ``mu^T E[|x|^2 x]``.
    """

    mu: np.ndarray
    sigma: np.ndarray
    fourth: float
    skew_mu: float
    third_x: float

    @property
    def mu_sq(self) -> float:
        """``|mu|^2``."""
        return float(self.mu @ self.mu)

    @property
    def trace_sigma(self) -> float:
        """``tr(Sigma)``."""
        return float(np.trace(self.sigma))

    @property
    def b_simple(self) -> float:
        """``tr(Sigma) / |mu|^2`` in groups."""
        return self.trace_sigma / self.mu_sq

    def snr(self, n: int) -> float:
        """``|mu|^2 / (tr(Sigma) / n)``: the SNR of a step of ``n`` groups."""
        return self.mu_sq / (self.trace_sigma / n)

    def estimator_moments(self, n: int) -> tuple[float, float, float]:
        """``(Var |mu|^2_hat, Var tr(Sigma)_hat, Cov)`` at ``n >= 2`` groups (module docstring)."""
        if n < 2:
            raise ValueError(f"n must be >= 2 groups, got {n}")
        mu, S = self.mu, self.sigma
        M = S + np.outer(mu, mu)
        c1, c2 = 4.0 * (n - 2) / (n * (n - 1)), 2.0 / (n * (n - 1))
        tr, tr_m2, tr_s2 = self.trace_sigma, float(np.sum(M * M)), float(np.sum(S * S))
        var_mu = c1 * float(mu @ S @ mu) + c2 * (tr_m2 - self.mu_sq**2)
        var_tr = (self.fourth - tr**2) / n + 2.0 * tr_s2 / (n * (n - 1))
        cov = c1 * self.skew_mu / 2.0 + c2 * (self.third_x - tr_m2 - self.mu_sq * tr)
        return var_mu, var_tr, cov


@dataclass(frozen=True)
class NoiseScaleWorld:
    """Prompts with a shared log-linear policy (module docstring).

    Attributes:
        features: ``[P, A, d]`` ``phi(p, a)``.
        theta: ``[d]`` policy parameters.
        rewards: ``[P, A]`` ``r(p, a)``.
        lengths: ``[P, A]`` token counts ``L(p, a)`` (integers ``>= 1``).
        group_size: ``R >= 2``.
        estimator: a :mod:`grpo_theory` registry name (default ``"grpo"``).
        estimator_options: its options.
    """

    features: np.ndarray
    theta: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    group_size: int
    estimator: str = "grpo"
    estimator_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        phi = np.asarray(self.features, dtype=np.float64)
        if phi.ndim != 3 or phi.shape[1] < 2:
            raise ValueError(f"features must be [P, A, d] with A >= 2, got shape {phi.shape}")
        P, A, d = phi.shape
        th = np.asarray(self.theta, dtype=np.float64)
        r = np.asarray(self.rewards, dtype=np.float64)
        L = np.asarray(self.lengths)
        if th.shape != (d,) or r.shape != (P, A) or L.shape != (P, A):
            raise ValueError(f"theta must be [d]={d}, rewards and lengths [P, A]={[P, A]}; got "
                             f"{th.shape}, {r.shape}, {L.shape}")
        if not (np.all(np.isfinite(phi)) and np.all(np.isfinite(th)) and np.all(np.isfinite(r))):
            raise ValueError("features, theta and rewards must be finite")
        if np.any(L < 1) or np.any(L != np.round(L)):
            raise ValueError("lengths must be whole token counts >= 1")
        if int(self.group_size) != self.group_size or self.group_size < 2:
            raise ValueError(f"group_size must be an int >= 2, got {self.group_size!r}")
        if A ** self.group_size > ENUMERATION_MAX:
            raise ValueError(f"A^R = {A}^{self.group_size} exceeds ENUMERATION_MAX = "
                             f"{ENUMERATION_MAX} (the exact enumeration): use fewer answers or R")
        object.__setattr__(self, "features", phi)
        object.__setattr__(self, "theta", th)
        object.__setattr__(self, "rewards", r)
        object.__setattr__(self, "lengths", L.astype(np.int64))

    @property
    def probs(self) -> np.ndarray:
        """``[P, A]`` the policy ``pi_p``."""
        z = self.features @ self.theta
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    @property
    def scores(self) -> np.ndarray:
        """``[P, A, d]`` ``psi(p, a) = phi(p, a) - E_{pi_p} phi(p, .)``."""
        mean = np.einsum("pa,pad->pd", self.probs, self.features)
        return self.features - mean[:, None, :]

    def _advantages(self, r: np.ndarray) -> np.ndarray:
        return np.asarray(compute_advantages(self.estimator, r, **self.estimator_options),
                          dtype=np.float64)

    def _group_estimates(self, p: np.ndarray, a: np.ndarray) -> np.ndarray:
        """``x = (1/R) sum_i A_i psi(p, a_i)`` for groups of prompts ``p [m]``, answers
        ``a [m, R]``: ``[m, d]``."""
        A = self._advantages(self.rewards[p[:, None], a])
        return np.einsum("mi,mid->md", A, self.scores[p[:, None], a]) / self.group_size

    @cached_property
    def exact(self) -> ExactNoise:
        """The exact moments of ``x_g`` by enumeration (prompts uniform, ``A^R`` tuples each)."""
        P, A, _ = self.features.shape
        R = self.group_size
        tuples = np.array(list(product(range(A), repeat=R)))  # [A^R, R]
        xs, ws = [], []
        for p in range(P):
            xs.append(self._group_estimates(np.full(len(tuples), p), tuples))
            ws.append(np.prod(self.probs[p][tuples], axis=1) / P)
        x, w = np.concatenate(xs), np.concatenate(ws)
        mu = w @ x
        y = x - mu
        sigma = (w[:, None] * y).T @ y
        ysq, xsq = (y * y).sum(axis=1), (x * x).sum(axis=1)
        return ExactNoise(
            mu=mu,
            sigma=sigma,
            fourth=float(w @ ysq**2),
            skew_mu=float(mu @ ((w * ysq) @ y)),
            third_x=float(mu @ ((w * xsq) @ x)),
        )

    def sample_rows(self, n_groups: int, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step: gradient rows ``[n, R, d]`` (``g_i = A_i psi_i / (n R)``), token counts
        ``[n, R]`` and rewards ``[n, R]``."""
        p, a = self._draw(n_groups, 1, rng)
        p, a = p[0], a[0]
        A = self._advantages(self.rewards[p[:, None], a])
        rows = A[..., None] * self.scores[p[:, None], a] / (n_groups * self.group_size)
        return rows, self.lengths[p[:, None], a], self.rewards[p[:, None], a]

    def _draw(self, n_groups: int, steps: int, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray]:
        P, A, _ = self.features.shape
        p = rng.integers(0, P, size=(steps, n_groups))
        cdf = np.cumsum(self.probs, axis=1)[p]  # [steps, n, A]
        u = rng.random((steps, n_groups, self.group_size, 1))
        a = np.minimum((u > cdf[:, :, None, :]).sum(axis=-1), A - 1)
        return p, a

    def sample_parts(self, n_groups: int, steps: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
        """``(sum_g |G_g|^2, |G|^2)`` of ``steps`` independent steps of ``n_groups`` groups."""
        p, a = self._draw(n_groups, steps, rng)
        x = self._group_estimates(p.reshape(-1), a.reshape(-1, self.group_size))
        G = x.reshape(steps, n_groups, -1) / n_groups  # per-group gradients G_g = x_g / n
        return (G * G).sum(axis=(1, 2)), (G.sum(axis=1) ** 2).sum(axis=1)


def default_world(*, group_size: int = 4, estimator: str = "grpo") -> NoiseScaleWorld:
    """A fixed world: 3 prompts, 3 answers, ``d = 4``, binary rewards, solve rates between."""
    rng = np.random.default_rng(20181206)  # fixed: the world is part of the check's definition
    phi = rng.normal(size=(3, 3, 4))
    return NoiseScaleWorld(
        features=phi,
        theta=np.array([0.6, -0.3, 0.2, 0.4]),
        rewards=np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]),
        lengths=np.array([[3, 5, 2], [4, 1, 6], [2, 2, 7]]),
        group_size=group_size,
        estimator=estimator,
    )


def check_noise_scale(world: NoiseScaleWorld, *, n_groups: int, steps: int,
                      rng: np.random.Generator, k: float = DEFAULT_K) -> list[CheckResult]:
    """Seeded checks of the noise-scale estimators against the world's exact values.

    Args:
        world: the toy world.
        n_groups: groups per step, ``n >= 2``.
        steps: independent steps (the Monte Carlo sample).
        rng: the random generator (the seed is the caller's).
        k: threshold of ``|estimate - exact| <= k SE`` (default 4).

    Returns:
        Three :class:`sims.results.CheckResult`: ``|mu|^2``, ``tr(Sigma)`` (exact SEs) and the
        pooled ``B_simple`` (delta-method SE from exact moments).
    """
    if steps < 2:
        raise ValueError(f"steps must be >= 2, got {steps}")
    ex = world.exact
    S, T = world.sample_parts(n_groups, steps, rng)
    mu_hat, tr_hat = noise_scale_parts(S, T, num_groups=n_groups)
    var_mu, var_tr, cov = ex.estimator_moments(n_groups)
    m_mu, m_tr = float(mu_hat.mean()), float(tr_hat.mean())
    label = f"n={n_groups} R={world.group_size} {world.estimator}"
    common = {"n_groups": n_groups, "group_size": world.group_size, "steps": steps}
    # delta method for the ratio of the two means: grad = (-tr/mu^2, 1/mu)
    b = ex.b_simple
    var_b = (b * b * var_mu - 2.0 * b * cov + var_tr) / ex.mu_sq**2
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step = tr_hat / mu_hat
    return [
        make_check(f"noise scale |mu|^2_hat unbiased ({label})", estimate=m_mu,
                   exact=ex.mu_sq, se=float(np.sqrt(var_mu / steps)), n=steps, k=k,
                   details={**common, "sample_se": float(mu_hat.std(ddof=1) / np.sqrt(steps))}),
        make_check(f"noise scale tr(Sigma)_hat unbiased ({label})", estimate=m_tr,
                   exact=ex.trace_sigma, se=float(np.sqrt(var_tr / steps)), n=steps, k=k,
                   details={**common, "sample_se": float(tr_hat.std(ddof=1) / np.sqrt(steps))}),
        make_check(f"noise scale B_simple pooled over steps ({label})", estimate=m_tr / m_mu,
                   exact=b, se=float(np.sqrt(var_b / steps)), n=steps, k=k,
                   se_from="delta method, exact moments",
                   details={**common, "snr_exact": ex.snr(n_groups),
                            "share_of_steps_mu_sq_le_0": float(np.mean(mu_hat <= 0)),
                            "mean_per_step_ratio_where_mu_sq_gt_0": float(
                                np.mean(per_step[mu_hat > 0])) if np.any(mu_hat > 0) else None}),
    ]
