"""``grpo-audit real rank``: one-shot spectra of the GRPO gradient matrix at the current weights.

For each prompt ``i`` (seeded by ``(seed, i)``, so a resumed run reproduces the same groups, and an
extended run does too when the earlier ``prompts`` was a multiple of ``rollout_batch``): sample
``R_max = max(R_values)`` completions, reward them (binary, exact answer match),
compute the trajectory-score Gram ``K`` once, and evaluate the leading ``R x R`` blocks for every
``R`` in ``R_values`` (nested groups, see :mod:`real_model.geometry`). One JSON line per prompt is
appended to ``results.jsonl`` as soon as it is computed; a rerun with the same configuration skips
the prompts already there (``--prompts`` may grow). The groups of ``rollout_batch`` consecutive
prompts (blocks ``[kB, (k+1)B)`` of prompt indices) are sampled in one batch
(:func:`~real_model.rollouts.sample_groups`); a resumed run resamples a partly written block in
full, so it reproduces the uninterrupted run bit for bit (an extended run equals a fresh one when
the earlier ``prompts`` was a multiple of ``rollout_batch``: the batch shapes the floating point);
``rollout_batch=1`` samples one group at a time as earlier releases did. At the end:
``results.json`` (config, environment, summary), ``table.md`` and ``rank.png``.

Every record carries the configuration it was computed under (``config``: the resume key), and
``config.json`` holds it too: a rerun whose settings differ from either is refused, naming the
differing options, even when ``config.json`` was deleted. All options are checked
(:meth:`RankConfig.validate`) before the model is loaded or anything is written.

Summary rows (per ``R``, for the main estimator, over groups with mixed rewards only, since an
all-equal group has ``A = 0`` and no spectrum): max rank (largest number of nonzero weights, the
rank bound of ``diag(w) Psi``), mean numerical rank, mean +/- sd of the effective rank
``(sum s)^2 / sum s^2``, mean entropy effective rank, mean +/- sd of the top-1 fraction
``s_1^2 / sum s^2``, and the number of mixed groups out of all groups.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import locks_out_dir

from ._io import (
    append_jsonl,
    check_config,
    check_record_configs,
    environment,
    read_jsonl,
    rewrite_jsonl,
    write_json,
)
from .config import RankConfig
from .data import binary_reward, load_problems
from .rollouts import sample_problem_groups

# RankConfig and load_problems are imported from here by trl_train.py (kept for it; their homes
# are real_model.config and real_model.data)
__all__ = [
    "RankConfig",
    "load_problems",
    "run_rank",
    "summarize_rank",
    "rank_table_markdown",
    "plot_rank_metric",
]


@locks_out_dir("real rank", check=lambda a: a["cfg"].validate())
def run_rank(
    out_dir: str | Path,
    cfg: RankConfig,
    *,
    loaded: Any = None,
    progress: bool = True,
    overwrite: bool = False,
    reward_fn: Callable[[str, Any], float] | None = None,
) -> dict[str, Any]:
    """Run (or resume) a rank experiment; returns the ``results.json`` content.

    Args:
        out_dir: output folder (created).
        cfg: :class:`RankConfig`.
        loaded: an already loaded :class:`~real_model.loading.LoadedModel` (else loaded from cfg).
        progress: show a tqdm bar.
        overwrite: discard earlier results in ``out_dir``.
        reward_fn: ``(completion_text, gold) -> reward`` (default
            :func:`~real_model.data.binary_reward`).
    """
    from tqdm.auto import tqdm

    from .geometry import group_gram, nested_group_geometry
    from .loading import load_model
    cfg.validate()  # before any file is written or the model is loaded
    problem_set = load_problems(cfg, cfg.prompts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "results.jsonl"
    if overwrite:
        for name in ("results.jsonl", "config.json", "results.json", "table.md", "rank.png"):
            (out / name).unlink(missing_ok=True)
    key = cfg.resume_key()
    done = read_jsonl(jsonl)
    check_record_configs(done, key, jsonl, have_config=(out / "config.json").is_file())
    check_config(out / "config.json", key)
    rewrite_jsonl(jsonl, done)  # drops a truncated last line, if any
    have = {int(r["prompt_index"]) for r in done}
    todo = [i for i in range(cfg.prompts) if i not in have]
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, progress=progress)
    R_max = max(cfg.R_values)
    reward = binary_reward if reward_fn is None else reward_fn
    t_start = time.perf_counter()
    B = cfg.rollout_batch
    sampled: dict[int, Any] = {}
    for i in tqdm(todo, desc="real rank", disable=not progress):
        prob = problem_set.problems[i]
        if i not in sampled:
            # blocks of prompt indices [kB, (k+1)B) cut at cfg.prompts: a resumed run resamples a
            # partly written block in full, so every group sees the same batch as uninterrupted
            block = range((i // B) * B, min((i // B + 1) * B, cfg.prompts))
            t0 = time.perf_counter()
            groups = sample_problem_groups(loaded.model, loaded.tokenizer, cfg, problem_set,
                                           list(block), R=R_max, batch_prompts=B)
            sample_s = (time.perf_counter() - t0) / len(block)  # per group, block average
            sampled = dict(zip(block, groups, strict=True))
        batch = sampled.pop(i)
        t1 = time.perf_counter()
        rewards = np.array([reward(t, prob.answer) for t in batch.texts])
        K = group_gram(loaded.model, batch, method=cfg.gram_method)
        t2 = time.perf_counter()
        geo = nested_group_geometry(
            K,
            rewards,
            batch.lengths,
            R_values=sorted(cfg.R_values),
            estimators=cfg.estimators,
            aggregation=cfg.aggregation,
            max_tokens=cfg.max_new_tokens,
        )
        append_jsonl(
            jsonl,
            {
                "prompt_index": i,
                "question": prob.question,
                "gold": str(prob.answer),
                "texts": batch.texts,
                "rewards": rewards,
                "lengths": batch.lengths,
                "stop_reasons": batch.stop_reasons,
                "prompt_tokens": batch.prompt_length,
                "K": K,
                "by_R": {str(k): v for k, v in geo.items()},
                "time_s": {"sample": sample_s, "gram": t2 - t1},
                "config": key,
            },
        )
    records = sorted(read_jsonl(jsonl), key=lambda r: r["prompt_index"])
    records = [r for r in records if r["prompt_index"] < cfg.prompts]
    main = cfg.estimators[0]
    rows = summarize_rank(records, estimator=main, R_values=cfg.R_values)
    result = {
        "experiment": "real_rank",
        "config": asdict(cfg),
        "model": loaded.describe() if hasattr(loaded, "describe") else None,
        "environment": environment(getattr(loaded, "device", None)),
        "main_estimator": main,
        "summary": rows,
        "summary_by_estimator": {
            e: summarize_rank(records, estimator=e, R_values=cfg.R_values) for e in cfg.estimators
        },
        "accuracy": float(np.mean([np.mean(r["rewards"]) for r in records])),
        "num_groups": len(records),
        "wall_s_this_call": time.perf_counter() - t_start,
        "results_jsonl": str(jsonl),
    }
    write_json(out / "results.json", result)
    (out / "table.md").write_text(rank_table_markdown(rows, title=_title(result)), encoding="utf-8")
    _figure(out / "rank.png", records, main, cfg.R_values)
    return result


def _title(result: dict[str, Any]) -> str:
    m = result.get("model") or {}
    c = result["config"]
    return (
        f"real rank: model {m.get('name')}, estimator {result['main_estimator']}, aggregation "
        f"{c['aggregation']}, {result['num_groups']} prompts, seed {c['seed']}, "
        f"accuracy {result['accuracy']:.3f}"
    )


def summarize_rank(
    records: Sequence[dict[str, Any]],
    *,
    estimator: str = "grpo",
    R_values: Sequence[int] = (2, 4, 8),
) -> list[dict[str, Any]]:
    """Per-``R`` summary over mixed-reward groups (see the module docstring)."""
    rows = []
    for R in sorted(R_values):
        geos = [r["by_R"][str(R)] for r in records if str(R) in r["by_R"]]
        mixed = [g for g in geos if g["mixed"]]
        ests = [g["estimators"][estimator] for g in mixed]

        def stat(key: str, vals: list[dict[str, Any]] = ests) -> tuple[float | None, float | None]:
            x = np.array([v[key] for v in vals if v.get(key) is not None], dtype=float)
            if x.size == 0:
                return None, None
            return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else None

        er, er_sd = stat("effective_rank")
        t1, t1_sd = stat("top1_fraction")
        rows.append(
            {
                "R": int(R),
                "groups": len(geos),
                "mixed_groups": len(mixed),
                "max_rank": max((v["max_rank"] for v in ests), default=None),
                "numerical_rank_mean": stat("rank")[0],
                "effective_rank_mean": er,
                "effective_rank_sd": er_sd,
                "entropy_effective_rank_mean": stat("entropy_effective_rank")[0],
                "top1_mean": t1,
                "top1_sd": t1_sd,
                "common_share_mean": stat("common_share", mixed)[0],
                "cos_between_mean": stat("cos_between", mixed)[0],
                "cos_within_success_mean": stat("cos_within_success", mixed)[0],
                "cos_within_failure_mean": stat("cos_within_failure", mixed)[0],
            }
        )
    return rows


def _f(x: float | None, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _pm(m: float | None, s: float | None) -> str:
    return _f(m) if s is None else f"{_f(m)} ± {_f(s)}"


def rank_table_markdown(rows: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """Markdown table of :func:`summarize_rank` rows."""
    head = (
        "| R | max rank | numerical rank | effective rank | entropy eff. rank | top-1 fraction "
        "| common share | cos(S,F) | mixed groups |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['R']} | {r['max_rank'] if r['max_rank'] is not None else 'n/a'} "
        f"| {_f(r['numerical_rank_mean'], 2)} "
        f"| {_pm(r['effective_rank_mean'], r['effective_rank_sd'])} "
        f"| {_f(r['entropy_effective_rank_mean'])} | {_pm(r['top1_mean'], r['top1_sd'])} "
        f"| {_f(r['common_share_mean'])} | {_f(r['cos_between_mean'])} "
        f"| {r['mixed_groups']}/{r['groups']} |\n"
        for r in rows
    )
    note = (
        "\nMeans (± sd) over mixed-reward groups. max rank = largest number of nonzero weights "
        "(rank bound of diag(w) Psi); common share = lambda_max(cosine matrix)/R; cos(S,F) = mean "
        "cosine between success and failure scores. Smaller R are nested subsets of the largest "
        "group.\n"
    )
    return (f"{title}\n\n" if title else "") + head + body + note


def plot_rank_metric(
    ax: Any,
    records: Sequence[dict[str, Any]],
    *,
    metric: str = "effective_rank",
    estimator: str = "grpo",
    R_values: Sequence[int] = (2, 4, 8),
    seed: int = 0,
) -> Any:
    """Scatter of ``metric`` per mixed group vs ``R`` (jittered), with the mean; returns ``ax``."""
    rng = np.random.default_rng(seed)
    for R in sorted(R_values):
        vals = [
            r["by_R"][str(R)]["estimators"][estimator][metric]
            for r in records
            if str(R) in r["by_R"] and r["by_R"][str(R)]["mixed"]
        ]
        vals = [v for v in vals if v is not None]
        if not vals:
            continue
        x = R + rng.uniform(-0.15, 0.15, len(vals)) * R / 4
        ax.scatter(x, vals, s=12, alpha=0.5, color="C0")
        ax.scatter([R], [np.mean(vals)], s=60, marker="D", color="C3", zorder=3)
    if metric in ("effective_rank", "rank"):
        Rs = sorted(R_values)
        ax.plot(Rs, Rs, ls="--", color="grey", lw=1, label="R (max possible)")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(R_values), [str(r) for r in sorted(R_values)])
    ax.set_xlabel("group size R")
    ax.set_ylabel(metric.replace("_", " "))
    return ax


def _figure(
    path: Path, records: Sequence[dict[str, Any]], estimator: str, R_values: Sequence[int]
) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    plot_rank_metric(
        axes[0], records, metric="effective_rank", estimator=estimator, R_values=R_values
    )
    plot_rank_metric(
        axes[1], records, metric="top1_fraction", estimator=estimator, R_values=R_values
    )
    axes[1].set_ylim(0, 1.02)
    fig.suptitle(
        f"GRPO gradient spectrum per mixed group ({estimator}; diamonds: mean)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
