"""Helpers shared by the claim modules: estimator conventions, the statistical-tier threshold,
the sims Monte Carlo and training runs (cached per seed), the token MDP of Sec. 2 and the
multi-turn world of Sec. 6 and App. A.3."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from sims._stats import Z_THRESHOLD

from .enumeration import TokenMDPView, advantage_values
from .registry import CheckContext

__all__ = ["K_SE", "STD", "P_GRID", "mc_evidence", "mc_theorem41", "training_run", "token_mdp",
           "multiturn_mdp", "multiturn_bias_rows", "scale_factor", "ratio"]

K_SE = Z_THRESHOLD  # statistical tier: |estimate - exact| <= K_SE * SE (the one k)
STD = {"ddof": 1, "eps": 0.0}  # std-normalised GRPO as TRL/verl/OpenRLHF run it (eps set to 0)
P_GRID = tuple(np.round(np.linspace(0.05, 0.95, 19), 4))


def mc_evidence(results: list[Any], prefix: str) -> tuple[dict[str, float], bool]:
    """Flatten :class:`sims.results.CheckResult` objects into named numbers; all passed?"""
    ev: dict[str, float] = {}
    ok = True
    for r in results:
        slug = re.sub(r"[^0-9a-zA-Z.]+", "_", r.name).strip("_")
        key = f"{prefix}{slug}"
        ev[f"{key}_estimate"] = r.estimate
        ev[f"{key}_exact"] = r.exact
        ev[f"{key}_se"] = r.se
        ev[f"{key}_z"] = r.z  # +-inf (failed deterministic check) is written as "inf"/"-inf"
        ev[f"{key}_n"] = r.n
        if r.paper_value is not None:
            ev[f"{key}_paper_formula"] = r.paper_value
        ok = ok and r.passed
    return ev, ok


@lru_cache(maxsize=8)
def _mc_theorem41_cached(seed: int, quick: bool, estimator: str, R: int) -> tuple[Any, ...]:
    opts = STD if estimator == "grpo_std" else None
    from sims.bandit import SoftmaxBandit
    from sims.checks import check_theorem41

    world = SoftmaxBandit(np.array([0.5, 0.0, -0.5]), np.array([0.8, 0.4, 0.1]))
    n = 20_000 if quick else 400_000
    ctx = CheckContext(seed=seed, quick=quick)
    return tuple(check_theorem41(world, estimator, R=R, n_groups=n, rng=ctx.rng(41),
                                 eps_values=(0.3,), k=K_SE, opts=opts))


def mc_theorem41(ctx: CheckContext, estimator: str, R: int = 4) -> list[Any]:
    """sims Monte Carlo of Thm 4.1 in a 3-arm softmax bandit (20k groups quick, 400k full)."""
    return list(_mc_theorem41_cached(ctx.seed, ctx.quick, estimator, R))


@lru_cache(maxsize=4)
def _training_cached(seed: int, quick: bool) -> dict[str, Any]:
    from sims.training import run_training

    ctx = CheckContext(seed=seed, quick=quick)
    return run_training(estimator="grpo", rng=ctx.rng(77), n_prompts=8, R=8,
                        steps=60 if quick else 300)


def training_run(ctx: CheckContext) -> dict[str, Any]:
    """One sims GRPO training run (8 token-MDP prompts, R=8, mean-centred), shared by checks."""
    return _training_cached(ctx.seed, ctx.quick)


def token_mdp(ctx: CheckContext) -> TokenMDPView:
    """A :class:`sims.token_mdp.TokenMDP` (V=2, T=3, binary terminal reward), 0.2 < J < 0.8."""
    from sims.token_mdp import TokenMDP

    rng = ctx.rng(11)
    while True:
        m = TokenMDP.random(rng, vocab=2, length=3, success_fraction=0.5, binary_rewards=True)
        if 0.2 < m.J() < 0.8:
            return TokenMDPView(m)


def multiturn_mdp(ctx: CheckContext) -> Any:
    """The multi-turn world of Sec. 6 and App. A.3: a :class:`sims.multiturn.MultiTurnMDP` with
    H = 3 stages, 3 states and 2 actions (stochastic transitions, Bernoulli stage rewards)."""
    from sims.multiturn import MultiTurnMDP

    return MultiTurnMDP.random(ctx.rng(60), H=3, S=3, A=2)


def multiturn_bias_rows(ctx: CheckContext, R: int) -> list[dict]:
    """Exact ``E[A_hat(h) | prefix]`` of mean-centred GRPO per stage and prefix in
    :func:`multiturn_mdp` (:func:`sims.checks.multiturn_bias_table`)."""
    from sims.checks import multiturn_bias_table

    return multiturn_bias_table(multiturn_mdp(ctx), "grpo", R=R)


def scale_factor(estimator: str, R: int, J: float, **opts: Any) -> float:
    """``c`` with ``E[g_hat] = c grad J`` (binary rewards, one prompt):
    ``c = E_k[A(success | k+1) - A(failure | k)]``, ``k ~ Binomial(R-1, J)``."""
    from grpo_theory import binom_pmf

    ks = np.arange(R)
    pk = binom_pmf(ks, R - 1, J)
    return float(sum(
        pk[k] * (advantage_values(estimator, R=R, k=k + 1, **opts)[0]
                 - advantage_values(estimator, R=R, k=k, **opts)[1])
        for k in ks
    ))


def ratio(g: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Least-squares scale of ``g`` on ``ref`` and the cosine between them."""
    c = float(g @ ref / (ref @ ref))
    cos = float(g @ ref / (np.linalg.norm(g) * np.linalg.norm(ref)))
    return c, cos
