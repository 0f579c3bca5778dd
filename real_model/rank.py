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
(:meth:`RankConfig.validate`), and the model is found (:func:`~real_model.loading.resolve_model`),
before the model is loaded or anything is written.

An ``R`` without a mixed-reward group has no spectrum: ``table.md`` (which the command prints)
and ``results.json`` (``notes``) say why, in one line per such ``R``, and which options give
mixed groups (:func:`~real_model.outputs.no_mixed_group_notes`).

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

from .config import RankConfig
from .data import Problem, ProblemSet, binary_reward, checked_reward, load_problems
from .outputs import write_rank_results
from .rollouts import RolloutBatch, sample_problem_groups
from .run_io import (
    append_jsonl,
    check_config,
    check_record_configs,
    read_jsonl,
    read_rank_records,
    rewrite_jsonl,
)

# RankConfig is real_model.config's, importable from here too (real rank's configuration)
__all__ = ["run_rank", "RankConfig", "pending_prompts", "BlockSampler", "rank_record"]


@locks_out_dir("real rank", check=lambda a: a["cfg"].validate(model=a.get("loaded") is None))
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

    from .loading import load_model

    cfg.validate()  # before any file is written or the model is loaded
    if loaded is None:  # a model that is not there fails here, before config.json is written
        from .loading import resolve_device, resolve_model

        resolve_model(cfg.model, device=resolve_device(cfg.device))
    problem_set = load_problems(cfg, cfg.prompts)
    out = Path(out_dir)
    jsonl = out / "results.jsonl"
    todo = pending_prompts(out, cfg, overwrite=overwrite)
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, progress=progress)
    reward = binary_reward if reward_fn is None else reward_fn
    t_start = time.perf_counter()
    blocks = BlockSampler(loaded, cfg, problem_set)
    for i in tqdm(todo, desc="real rank", disable=not progress):
        batch, sample_s = blocks.group(i)
        append_jsonl(jsonl, rank_record(loaded.model, cfg, problem_set.problems[i], i, batch,
                                        reward=reward, sample_s=sample_s))
    records = sorted(read_jsonl(jsonl), key=lambda r: r["prompt_index"])
    records = [r for r in records if r["prompt_index"] < cfg.prompts]
    return write_rank_results(out, cfg, loaded, records, wall_s=time.perf_counter() - t_start,
                              results_jsonl=jsonl)


def pending_prompts(out: Path, cfg: RankConfig, *, overwrite: bool) -> list[int]:
    """The prompt indices ``< cfg.prompts`` that ``out/results.jsonl`` does not hold yet.

    Creates ``out``; with ``overwrite``, first deletes the earlier run's files. The records there,
    and ``config.json``, must have been written under ``cfg``'s resume key (else a
    ``ValueError`` names the differing options); a truncated last line is dropped.
    """
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "results.jsonl"
    if overwrite:
        for name in ("results.jsonl", "config.json", "results.json", "table.md", "rank.png"):
            (out / name).unlink(missing_ok=True)
    key = cfg.resume_key()
    done = read_rank_records(jsonl)  # schema-checked; a prompt index seen twice is an error
    check_record_configs(done, key, jsonl, have_config=(out / "config.json").is_file())
    check_config(out / "config.json", key)
    rewrite_jsonl(jsonl, done)  # drops a truncated last line, if any
    have = {int(r["prompt_index"]) for r in done}
    return [i for i in range(cfg.prompts) if i not in have]


class BlockSampler:
    """The group of prompt ``i``, sampled with the other prompts of its block.

    Blocks are the prompt indices ``[kB, (k+1)B)`` (``B = cfg.rollout_batch``) cut at
    ``cfg.prompts``: a resumed run resamples a partly written block in full, so every group sees
    the same batch as in the uninterrupted run. A block is sampled when one of its prompts is
    first asked for and kept until each of its groups has been taken.
    """

    def __init__(self, loaded: Any, cfg: RankConfig, problem_set: ProblemSet) -> None:
        self.loaded, self.cfg, self.problem_set = loaded, cfg, problem_set
        self.sampled: dict[int, RolloutBatch] = {}
        self.sample_s = 0.0

    def group(self, i: int) -> tuple[RolloutBatch, float]:
        """Prompt ``i``'s group of ``max(R_values)`` completions, and the sampling time per group
        of its block (seconds, the block's average)."""
        if i not in self.sampled:
            B, cfg = self.cfg.rollout_batch, self.cfg
            block = range((i // B) * B, min((i // B + 1) * B, cfg.prompts))
            t0 = time.perf_counter()
            groups = sample_problem_groups(self.loaded.model, self.loaded.tokenizer, cfg,
                                           self.problem_set, list(block), R=max(cfg.R_values),
                                           batch_prompts=B)
            self.sample_s = (time.perf_counter() - t0) / len(block)
            self.sampled = dict(zip(block, groups, strict=True))
        return self.sampled.pop(i), self.sample_s


def rank_record(
    model: Any,
    cfg: RankConfig,
    problem: Problem,
    index: int,
    batch: RolloutBatch,
    *,
    reward: Callable[[str, Any], float],
    sample_s: float,
) -> dict[str, Any]:
    """One line of ``results.jsonl``: prompt ``index``'s group ``batch``, its rewards, its Gram
    ``K`` (:func:`~real_model.geometry.group_gram`) and the nested geometry of every ``R`` in
    ``cfg.R_values`` (:func:`~real_model.geometry.nested_group_geometry`), with the timings and
    the run's resume key (``config``)."""
    from .geometry import group_gram, nested_group_geometry

    t1 = time.perf_counter()
    rewards = np.array([checked_reward(reward(t, problem.answer)) for t in batch.texts])
    K = group_gram(model, batch, method=cfg.gram_method)
    t2 = time.perf_counter()
    geo = nested_group_geometry(K, rewards, batch.lengths, R_values=sorted(cfg.R_values),
                                estimators=cfg.estimators, aggregation=cfg.aggregation,
                                max_tokens=cfg.max_new_tokens)
    return {
        "prompt_index": index,
        "question": problem.question,
        "gold": str(problem.answer),
        "texts": batch.texts,
        "rewards": rewards,
        "lengths": batch.lengths,
        "stop_reasons": batch.stop_reasons,
        "prompt_tokens": batch.prompt_length,
        "K": K,
        "by_R": {str(k): v for k, v in geo.items()},
        "time_s": {"sample": sample_s, "gram": t2 - t1},
        "config": cfg.resume_key(),
    }
