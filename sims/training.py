"""GRPO training dynamics on a batch of toy prompts (token MDPs) with any estimator.

Each prompt ``p`` is a :class:`sims.token_mdp.TokenMDP` with its own tabular policy and its own set
of correct sequences (binary outcome reward, difficulty spread over prompts). One step samples
``R`` rollouts per prompt, computes advantages with :func:`grpo_theory.compute_advantages` on the
``[P, R]`` reward matrix, forms ``g_p = (1/R) sum_i A_{p,i} psi_{p,i}`` (Eq. 19) and takes
``theta_p += lr * g_p`` (plain gradient ascent; no clipping or KL, as in the paper's Sec. 2.5). With
``gradient="exact"`` the update is the exact expectation ``E[g_p]`` (deterministic dynamics) while
the tracked statistics still come from a sampled group.

Tracked per step: exact mean reward ``J`` and reward std ``sigma_r = mean_p sqrt(J_p (1 - J_p))``,
the sampled and exact fraction of zero-variance groups (all rewards equal, so every centred
estimator gives zero advantage; ``P(k in {0, R}) = J^R + (1-J)^R``), the
mean per-prompt gradient norm ``|g_p|`` and exact ``|grad J_p|``, the effective rank and top-1
fraction of ``G_p = diag(A_p) Psi_p`` (mean over non-degenerate groups), and the FADE masses
``m_S`` (sum of advantages of successes) and ``m_F`` (sum of |advantages| of failures).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from grpo_theory import compute_advantages, spectral_metrics, zero_variance_groups
from grpo_theory.mass import gradient_mass

from ._stats import Z_THRESHOLD
from .exact import estimator_options, expected_gradient_bernoulli
from .token_mdp import TokenMDP

__all__ = [
    "make_prompts", "gradient_masses", "run_training", "summarize_training", "HISTORY_KEYS",
]


def make_prompts(
    rng: np.random.Generator,
    *,
    n_prompts: int = 16,
    vocab: int = 3,
    length: int = 3,
    success_fractions: tuple[float, float] = (0.05, 0.5),
    logit_scale: float = 0.5,
) -> list[TokenMDP]:
    """``n_prompts`` token MDPs whose fraction of correct sequences is spread evenly over
    ``success_fractions`` (at least one correct sequence each), with random initial logits."""
    if n_prompts < 1:
        raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
    fr = np.linspace(*success_fractions, n_prompts)
    return [
        TokenMDP.random(
            rng, vocab=vocab, length=length, success_fraction=float(f), logit_scale=logit_scale
        )
        for f in fr
    ]


def gradient_masses(advantages: np.ndarray, rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FADE masses per group: ``m_S = sum_{r_i = 1} A_i``, ``m_F = sum_{r_i = 0} |A_i|``.

    Thin wrapper of :func:`grpo_theory.mass.gradient_mass` (binary rewards).
    """
    mS, mF = gradient_mass(advantages, rewards)
    return np.asarray(mS, dtype=np.float64), np.asarray(mF, dtype=np.float64)


def run_training(
    *,
    estimator: str,
    rng: np.random.Generator,
    prompts: list[TokenMDP] | None = None,
    n_prompts: int = 16,
    R: int = 8,
    steps: int = 300,
    lr: float = 2.0,
    gradient: Literal["sampled", "exact"] = "sampled",
    opts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run GRPO for ``steps`` steps and return the per-step statistics as lists.

    Args:
        estimator: registry name of :data:`grpo_theory.ESTIMATORS`.
        rng: random generator (prompt construction when ``prompts`` is None, and sampling).
        prompts: the worlds (default :func:`make_prompts` with ``n_prompts``).
        R: group size.
        steps: number of updates.
        lr: learning rate of ``theta += lr * g``. Default 2.0.
        gradient: ``"sampled"`` (default, Eq. 19 from the sampled group) or ``"exact"``.
        opts: estimator options (default :data:`sims.exact.ESTIMATOR_SPECS`).

    Returns:
        dict with ``config`` and ``history`` (dict of per-step lists).
    """
    if gradient not in ("sampled", "exact"):
        raise ValueError(f"gradient must be 'sampled' or 'exact', got {gradient!r}")
    if R < 2 or steps < 1 or lr <= 0:
        raise ValueError(f"need R >= 2, steps >= 1, lr > 0; got R={R}, steps={steps}, lr={lr}")
    worlds = list(prompts) if prompts is not None else make_prompts(rng, n_prompts=n_prompts)
    opts_ = estimator_options(estimator, opts)
    hist: dict[str, list[Any]] = {k: [] for k in HISTORY_KEYS}
    for _ in range(steps):
        tables = [w.outcome_model() for w in worlds]
        Js = np.array([pr @ mu for pr, mu, _ in tables])
        idx, rewards = _sample_one_group_per_prompt(worlds, R=R, rng=rng)
        A = np.asarray(compute_advantages(estimator, rewards, **opts_))
        update = _PromptUpdates()
        for p, (pr, mu, psi) in enumerate(tables):
            g = update.add(A[p], psi[idx[p]])
            if gradient == "exact":
                g = expected_gradient_bernoulli(
                    estimator, probs=pr, means=mu, psi=psi, R=R, opts=opts_
                )
            worlds[p] = worlds[p].with_logits(
                worlds[p].logits + lr * g.reshape(worlds[p].logits.shape)
            )
        for key, value in _step_statistics(Js, A, rewards, update, worlds).items():
            hist[key].append(value)
    return {
        "config": {
            "estimator": estimator,
            "opts": opts_,
            "n_prompts": len(worlds),
            "R": R,
            "steps": steps,
            "lr": lr,
            "gradient": gradient,
        },
        "history": hist,
    }


#: The per-step statistics :func:`run_training` records, in ``history`` order.
HISTORY_KEYS = (
    "J",
    "sigma_r",
    "zero_adv_frac",
    "zero_adv_frac_exact",
    "grad_norm",
    "grad_J_norm",
    "eff_rank",
    "top1",
    "m_S",
    "m_F",
    "n_nondegenerate",
    "zero_adv_var",
    "zero_adv_probs",
)


def _sample_one_group_per_prompt(
    worlds: list[TokenMDP], *, R: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(idx, rewards)``, both ``[P, R]``: one group of ``R`` rollouts per prompt."""
    idx = np.empty((len(worlds), R), dtype=np.int64)
    rewards = np.empty((len(worlds), R))
    for p, w in enumerate(worlds):
        i, r = w.sample(1, R, rng)
        idx[p], rewards[p] = i[0], r[0]
    return idx, rewards


class _PromptUpdates:
    """The sampled gradient ``g_p = (1/R) A_p Psi_p`` (Eq. 19) of each prompt of one step, with
    its norm and the spectral metrics of ``diag(A_p) Psi_p`` (non-degenerate groups only)."""

    def __init__(self) -> None:
        self.grad_norms: list[float] = []
        self.effective_ranks: list[float] = []
        self.top1_fractions: list[float] = []

    def add(self, A: np.ndarray, Psi: np.ndarray) -> np.ndarray:
        """Record one prompt (``A [R]``, ``Psi [R, d]``) and return its sampled ``g [d]``."""
        g = A @ Psi / A.shape[0]
        self.grad_norms.append(np.linalg.norm(g))
        m = spectral_metrics(Psi @ Psi.T, A)
        if not m.degenerate:
            self.effective_ranks.append(m.effective_rank)
            self.top1_fractions.append(m.top1_fraction)
        return g


def _step_statistics(
    Js: np.ndarray, A: np.ndarray, rewards: np.ndarray, update: _PromptUpdates,
    worlds: list[TokenMDP],
) -> dict[str, Any]:
    """One step's entry of each :data:`HISTORY_KEYS` list. ``Js [P]`` are the solve rates before
    the update, ``worlds`` the prompts after it; ``pz = J^R + (1 - J)^R`` is the exact chance
    of a zero-variance group (per prompt: the exact count law)."""
    R = rewards.shape[1]
    mS, mF = gradient_masses(A, rewards)
    pz = Js**R + (1 - Js) ** R
    ers, tops = update.effective_ranks, update.top1_fractions
    return {
        "J": float(Js.mean()),
        "sigma_r": float(np.sqrt(Js * (1 - Js)).mean()),
        "zero_adv_frac": float(zero_variance_groups(rewards).mean()),
        "zero_adv_frac_exact": float(pz.mean()),
        "zero_adv_var": float(np.sum(pz * (1 - pz))),
        "zero_adv_probs": pz.tolist(),
        "grad_norm": float(np.mean(update.grad_norms)),
        "grad_J_norm": float(np.mean([np.linalg.norm(w.grad_J()) for w in worlds])),
        "eff_rank": float(np.mean(ers)) if ers else float("nan"),
        "top1": float(np.mean(tops)) if tops else float("nan"),
        "m_S": float(mS.mean()),
        "m_F": float(mF.mean()),
        "n_nondegenerate": float(len(ers)),
    }


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3:
        return float("nan")
    rx = np.argsort(np.argsort(x[ok])).astype(float)
    ry = np.argsort(np.argsort(y[ok])).astype(float)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def summarize_training(run: dict[str, Any], *, k: float = Z_THRESHOLD) -> dict[str, Any]:
    """Tests of Corollary 4.2 and of the rank-collapse prediction on one run.

    * zero-advantage groups: sampled count over all steps vs the exact expected count
      (``sum_t sum_p P_t(k in {0, R})``), SE ``sqrt(sum p (1 - p))``, verdict ``|z| <= k``; when
      either class (zero-advantage or not) is rare (expected count below
      :data:`sims.results.RARE_COUNT`) the exact count law, a sum of Bernoulli(p_tp), decides;
    * Corollary 4.2: log-log slope and Spearman correlation of the per-step mean ``|g|`` against
      ``sigma_r`` (the corollary predicts a positive association);
    * rank collapse (Sec. 8 "Future directions"): Spearman correlation of the effective rank with
      ``sigma_r`` over steps (the paper predicts positive: rank falls as ``sigma_r -> 0``).
    """
    from .results import RareCount, make_check

    h = {key: np.asarray(v, dtype=np.float64) for key, v in run["history"].items()}
    P = run["config"]["n_prompts"]
    steps = h["J"].size
    exp_count = float(h["zero_adv_frac_exact"].sum() * P)
    se = float(np.sqrt(h["zero_adv_var"].sum()))
    obs = float(h["zero_adv_frac"].sum() * P)
    rare = None
    if "zero_adv_probs" in h:
        pz = h["zero_adv_probs"].ravel()
        n_obs = int(round(obs))
        rare = (RareCount(n_obs, tuple((1, float(q)) for q in pz), "zero-advantage groups")
                if exp_count <= pz.size / 2 else
                RareCount(pz.size - n_obs, tuple((1, float(1 - q)) for q in pz),
                          "groups with a nonzero advantage"))
    chk = make_check(
        f"zero-variance groups over training {run['config']['estimator']} "
        f"({run['config']['gradient']} gradient)",
        estimate=obs / (P * steps),
        exact=exp_count / (P * steps),
        se=se / (P * steps),
        n=P * steps,
        k=k,
        rare=rare,
        details={"se_note": "martingale SE: sqrt(sum_t sum_p p_tp (1 - p_tp))"},
    )
    ok = (h["sigma_r"] > 0) & (h["grad_norm"] > 0)
    slope = (
        float(np.polyfit(np.log(h["sigma_r"][ok]), np.log(h["grad_norm"][ok]), 1)[0])
        if ok.sum() >= 3
        else float("nan")
    )
    return {
        "zero_adv_check": chk.as_dict(),
        "gradnorm_vs_sigma_loglog_slope": slope,
        "spearman_gradnorm_sigma": _spearman(h["sigma_r"], h["grad_norm"]),
        "spearman_effrank_sigma": _spearman(h["sigma_r"], h["eff_rank"]),
        "sigma_r_first_last": [float(h["sigma_r"][0]), float(h["sigma_r"][-1])],
        "eff_rank_first_last": [float(h["eff_rank"][0]), float(h["eff_rank"][-1])],
        "J_first_last": [float(h["J"][0]), float(h["J"][-1])],
        "mean_m_S": float(np.mean(h["m_S"])),
        "mean_m_F": float(np.mean(h["m_F"])),
    }
