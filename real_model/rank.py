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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import locks_out_dir

from ._io import (
    append_jsonl,
    check_config,
    check_record_configs,
    read_jsonl,
    rewrite_jsonl,
)
from .config import RankConfig
from .data import binary_reward, load_problems
from .outputs import rank_table_markdown, summarize_rank, write_rank_results
from .rollouts import sample_problem_groups

# RankConfig, load_problems, summarize_rank and rank_table_markdown: trl_train.py imports them from
# here (kept for it; their homes are real_model.config, .data and .outputs)
__all__ = ["run_rank", "RankConfig", "load_problems", "summarize_rank", "rank_table_markdown"]


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
    return write_rank_results(out, cfg, loaded, records, wall_s=time.perf_counter() - t_start,
                              results_jsonl=jsonl)
