"""The worlds the KL claims share (a support module: it registers no claim).

A 3-arm softmax bandit (one token: the single-step setting of [LIU]) and a tabular token MDP
(``V = 2``, ``T = 3``, prefix-dependent conditionals: where token-level and sequence-level KLs
differ), each with a reference policy and a stale sampling policy ``pi_old``; the options of
:class:`sims.kl_dynamics.KLOption` used throughout; and the classification of an option's exact
expected gradient (:func:`grpo_theory.kl.classify_gradient`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

TOL = 1e-9

#: The named implementations (estimator, placement, level).
OPTIONS: dict[str, dict[str, str]] = {
    "k1_loss": {"estimator": "k1", "placement": "loss"},
    "k2_loss": {"estimator": "k2", "placement": "loss"},
    "k3_loss": {"estimator": "k3", "placement": "loss"},
    "k1_reward": {"estimator": "k1", "placement": "reward"},
    "k1_reward_to_go": {"estimator": "k1", "placement": "reward_to_go"},
    "k1_reward_sum": {"estimator": "k1", "placement": "reward_sum"},
    "k3_reward_sum": {"estimator": "k3", "placement": "reward_sum"},
    "k3_reward": {"estimator": "k3", "placement": "reward"},
    "seq_k1_loss": {"estimator": "k1", "placement": "loss", "level": "sequence"},
    "seq_k2_loss": {"estimator": "k2", "placement": "loss", "level": "sequence"},
    "seq_k3_loss": {"estimator": "k3", "placement": "loss", "level": "sequence"},
    "seq_k1_reward": {"estimator": "k1", "placement": "reward", "level": "sequence"},
}


def option(name: str, **over: Any) -> Any:
    """The :class:`sims.kl_dynamics.KLOption` named ``name`` (fields overridden by ``over``)."""
    from sims.kl_dynamics import KLOption

    return KLOption(**{**OPTIONS[name], **over})


@lru_cache(maxsize=1)
def bandit() -> Any:
    """3-arm softmax bandit, reference logits (0, 0.3, 0.2)."""
    from sims.bandit import SoftmaxBandit
    from sims.kl_dynamics import KLWorld

    return KLWorld.from_bandit(SoftmaxBandit(np.array([0.6, 0.0, -0.4]),
                                             np.array([0.8, 0.4, 0.1])),
                               np.array([0.0, 0.3, 0.2]))


@lru_cache(maxsize=1)
def token_mdp() -> Any:
    """Tabular token MDP (``V = 2``, ``T = 3``, seeded), random reference logits."""
    from sims.kl_dynamics import KLWorld
    from sims.token_mdp import TokenMDP

    rng = np.random.default_rng(2506)
    mdp = TokenMDP.random(rng, vocab=2, length=3, logit_scale=0.8, success_fraction=0.5)
    return KLWorld.from_token_mdp(mdp, 0.8 * rng.standard_normal(mdp.logits.shape))


def stale_logits(world: Any, seed: int = 7) -> np.ndarray:
    """``pi_old``'s logits: ``pi``'s moved by a seeded perturbation (std 0.4)."""
    rng = np.random.default_rng(seed)
    return world.logits + 0.4 * rng.standard_normal(world.logits.shape)


def worlds() -> dict[str, Any]:
    return {"bandit": bandit(), "token_mdp": token_mdp()}


def classify(world: Any, opt: Any, *, old_logits: Any = None) -> Any:
    """:func:`grpo_theory.kl.classify_gradient` of ``opt``'s exact expected gradient."""
    from grpo_theory import kl
    from sims.kl_dynamics import option_gradient

    return kl.classify_gradient(option_gradient(world, opt, old_logits=old_logits),
                                world.targets())


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """``||a - b|| / ||b||``."""
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


def mc_projection(ctx: Any, world: Any, opt: Any, salt: int, name: str
                  ) -> tuple[dict[str, Any], bool]:
    """Seeded Monte Carlo of ``opt``'s gradient projected on a fixed direction against the
    exact enumeration of the same option (a cross-check of the exact route), k = 4 SE."""
    from paper_checks.claim_support import K_SE, mc_evidence
    from sims.kl_dynamics import monte_carlo_gradient, option_gradient
    from sims.results import make_check

    exact = option_gradient(world, opt)
    n = 4000 if ctx.quick else 40_000
    u = np.random.default_rng(salt).standard_normal(exact.size)
    mean, _ = monte_carlo_gradient(world, opt, n=n, rng=ctx.rng(salt))
    # the projection's exact SE (the per-response projections' law), not the coordinates'
    c = opt.coefficients(world.log_ratio)
    per = np.einsum("nt,ntd->nd", c, world.scores) @ u
    q = world.probs
    m = float(q @ per)
    se = float(np.sqrt(max(q @ (per - m) ** 2, 0.0) / n))
    chk = make_check(name, estimate=float(mean @ u), exact=float(exact @ u), se=se, n=n, k=K_SE)
    return mc_evidence([chk], "mc_")
