"""TRL's ``frac_reward_zero_std`` and ``reward_std``, run from TRL's own code, against the exact
dead-group share and the within-group std.

TRL 1.16 logs, in ``GRPOTrainer._generate_and_score_completions``, after computing the
advantages:

* ``reward_std = nanstd(rewards)``: the std (ddof 1) of the summed rewards over the *whole*
  batch, whatever ``scale_rewards`` is;
* ``frac_reward_zero_std = is_std_zero.float().mean()`` with ``is_std_zero =
  torch.isclose(std_rewards, 0)`` (``|std| <= 1e-8``), where ``std_rewards`` is the per-group std
  under ``scale_rewards="group"`` / ``"none"``, the batch std under ``"batch"``, and the batch
  std of the summed normalised rewards under ``multi_objective_aggregation="normalize_then_sum"``.

Both blocks are executed as TRL wrote them (the advantage block of :mod:`framework_checks.trl`,
then the block from ``rewards = (rewards_per_func * ...)`` to the ``frac_reward_zero_std`` line) in
float32, TRL's reward dtype, on a fixed set of reward batches (:data:`CASES`). The exact side:

* dead groups: the groups whose TRL advantages are all exactly 0, so that every gradient row
  ``A_i psi_i`` is zero (:func:`grpo_theory.diagnostics.dead_groups` on the rows' Grams with
  orthonormal scores), as a share of the groups;
* constant groups: the groups whose (summed) rewards have std exactly 0;
* the within-group std: the mean over groups of each group's std (ddof 1), and the batch std.
"""

from __future__ import annotations

import types
from collections import defaultdict
from typing import Any

import numpy as np

from grpo_theory.diagnostics import dead_groups

from .extract import source_block
from .source import SourceTree
from .trl import TrlCode

__all__ = ["METRIC_BLOCK", "SETTINGS", "CASES", "audit_zero_std"]

#: TRL's lines that log the reward metrics (first and last).
METRIC_BLOCK = ("rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)",
                '["frac_reward_zero_std"].append(is_std_zero.float().mean().item())')

#: ``torch.isclose(std, 0)``'s reach: ``|std| <= atol`` (its default ``atol``).
ISCLOSE_ATOL = 1e-8

#: Setting -> (scale_rewards, multi_objective_aggregation).
SETTINGS: dict[str, tuple[str, str]] = {
    'GRPOConfig(scale_rewards="group")': ("group", "sum_then_normalize"),
    'GRPOConfig(scale_rewards="batch")': ("batch", "sum_then_normalize"),
    'GRPOConfig(scale_rewards="none")': ("none", "sum_then_normalize"),
    'GRPOConfig(multi_objective_aggregation="normalize_then_sum")': (
        "group", "normalize_then_sum"),
}


def _cases() -> dict[str, np.ndarray]:
    """Reward batches ``[P, R]`` (or ``[P, R, K]`` per reward function), fixed."""
    rng = np.random.default_rng(0)
    solved = np.array([4, 0, 1, 2, 3, 1, 2, 4])
    mixed = rng.permuted((np.arange(4)[None, :] < solved[:, None]).astype(float), axis=1)
    two = np.stack([mixed, rng.integers(0, 2, size=mixed.shape).astype(float)], axis=-1)
    two[1, :, 1] = 0.0  # group 1: both functions constant
    return {
        "binary, 3 of 8 groups all-or-nothing": mixed,
        "binary, every group all-or-nothing": np.array([[1.0] * 4, [0.0] * 4] * 4),
        "binary, every group mixed": np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]] * 4),
        "every reward equal": np.ones((8, 4)),
        "continuous, one constant group [0.7]*8": np.vstack(
            [rng.normal(size=(3, 8)), np.full((1, 8), 0.7)]),
        "continuous, scale 1e-9": 1e-9 * rng.normal(size=(8, 4)),
        "two reward functions, binary": two,
    }


CASES = _cases()


def _run(code: TrlCode, metric_block: Any, rewards: np.ndarray, scale_rewards: str,
         aggregation: str) -> tuple[np.ndarray, float, float]:
    """TRL's advantages ``[P, R]``, ``frac_reward_zero_std`` and ``reward_std``."""
    import torch

    per_func = rewards[..., None] if rewards.ndim == 2 else rewards
    P, R, K = per_func.shape
    trainer = types.SimpleNamespace(
        multi_objective_aggregation=aggregation, scale_rewards=scale_rewards,
        reward_weights=torch.ones(K, dtype=torch.float32), reward_funcs=[None] * K,
        _metrics=defaultdict(lambda: defaultdict(list)))
    env = dict(code.ns, self=trainer, num_generations=R, device="cpu", mode="train")
    env["rewards_per_func"] = torch.as_tensor(per_func.reshape(P * R, K), dtype=code.dtype)
    exec(code.grpo_block, env)  # noqa: S102
    exec(metric_block, env)  # noqa: S102
    m = trainer._metrics["train"]
    return (env["advantages"].double().numpy().reshape(P, R),
            float(m["frac_reward_zero_std"][0]), float(m["reward_std"][0]))


def _exact(rewards: np.ndarray, adv: np.ndarray) -> dict[str, float]:
    per_func = rewards[..., None] if rewards.ndim == 2 else rewards
    r = per_func.sum(axis=-1)
    stds = r.std(axis=1, ddof=1)
    # normalize_then_sum's rewards: each function's group z-score (std ddof 1, + 1e-4), summed
    z = (per_func - per_func.mean(axis=1, keepdims=True)) / (
        per_func.std(axis=1, ddof=1, keepdims=True) + 1e-4)
    grams = np.stack([np.diag(a * a) for a in adv])  # rows A_i e_i: orthonormal scores
    const = stds == 0
    return {
        "constant_max_abs_advantage": float(np.abs(adv[const]).max()) if const.any() else 0.0,
        "dead_share": float(dead_groups(grams).mean()),
        "constant_share": float(np.mean(stds == 0)),
        "small_std_share": float(np.mean(stds <= ISCLOSE_ATOL)),
        "within_std": float(stds.mean()),
        "batch_std": float(r.reshape(-1).std(ddof=1)),
        "normalized_batch_std": float(z.sum(axis=-1).reshape(-1).std(ddof=1)),
    }


def audit_zero_std(tree: SourceTree) -> dict[str, Any]:
    """TRL's two reward metrics against the exact quantities, per setting and case."""
    code = TrlCode(tree, "float32")
    src = tree.text("trl/trainer/grpo_trainer.py")
    block = compile(source_block(src, *METRIC_BLOCK), "<trl reward metrics>", "exec")
    rows = []
    for setting, (sr, agg) in SETTINGS.items():
        for case, rewards in CASES.items():
            adv, frac, rstd = _run(code, block, rewards, sr, agg)
            rows.append({"setting": setting, "case": case, "frac_reward_zero_std": frac,
                         "reward_std": rstd, **_exact(rewards, adv)})
    return {"framework": "trl", "version": tree.version,
            "metrics": ["frac_reward_zero_std", "reward_std"], "rows": rows,
            "findings": findings(rows)}


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _matches(rs: list[dict[str, Any]], wants: list[float], label: str
             ) -> tuple[int, list[str]]:
    """How many rows have ``frac_reward_zero_std == want``, and the others, in words."""
    off = []
    for r, want in zip(rs, wants, strict=True):
        if not _same(r["frac_reward_zero_std"], want):
            off.append(f"{r['case']} (TRL {r['frac_reward_zero_std']:.3g}, {label} {want:.3g})")
    return len(rs) - len(off), off


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """What each metric measures per setting, in words; every number from ``rows``."""
    out = []
    for setting in SETTINGS:
        rs = [r for r in rows if r["setting"] == setting]
        n = len(rs)
        n_group, off_group = _matches(rs, [r["small_std_share"] for r in rs],
                                      "float64 share")
        key = "normalized_batch_std" if SETTINGS[setting][1] == "normalize_then_sum" else \
            "batch_std"
        n_flag, off_flag = _matches(rs, [float(r[key] <= ISCLOSE_ATOL) for r in rs], "flag")
        n_dead, off_dead = _matches(rs, [r["dead_share"] for r in rs], "dead")
        if n_group >= n_flag:
            what, k, off = ("the share of groups whose reward std is within 1e-8 of 0 "
                            "(torch.isclose)", n_group, off_group)
        else:
            of = ("the group-normalised summed rewards" if key == "normalized_batch_std"
                  else "the rewards")
            what, k, off = (f"a batch flag, not a share of groups: 1 when the std of {of} over "
                            "the whole batch is within 1e-8 of 0, else 0", n_flag, off_flag)
        out.append(
            f"`frac_reward_zero_std` under `{setting}` is {what} ({k} of {n} cases"
            + (f"; not in {'; '.join(off)}" if off else "") + "). It equals the exact share of "
            f"dead groups (every advantage exactly 0) in {n_dead} of {n} cases"
            + (f"; it differs in {'; '.join(off_dead)}." if off_dead else ".")
        )
    live = [r for r in rows if r["constant_max_abs_advantage"] > 0]
    if live:
        worst = max(live, key=lambda r: r["constant_max_abs_advantage"])
        out.append(
            "A constant-reward group is not always dead under TRL: in float32 its mean is not "
            f"always the value itself, so it gets advantages up to |A| = "
            f"{worst['constant_max_abs_advantage']:.3g} ({worst['case']}, "
            f"`{worst['setting']}`): a live gradient of pure round-off. The count from the "
            "rows sees it; a count of constant-reward groups does not."
        )
    batch = all(_same(r["reward_std"], r["batch_std"]) for r in rows)
    ratios = [r["reward_std"] / r["within_std"] for r in rows
              if r["within_std"] > 0 and r["setting"] == next(iter(SETTINGS))]
    out.append(
        "`reward_std` is "
        + ("the std of the summed rewards over the whole batch (ddof 1) in every setting"
           if batch else "not always the batch std")
        + ", not the within-group std: between-prompt spread counts in it"
        + (f" (here {min(ratios):.3g}x to {max(ratios):.3g}x the mean within-group std)"
           if ratios else "")
        + "; a batch whose every group is constant still shows a positive reward_std."
    )
    return out
