"""``grpo-audit real train``: a GRPO update loop that records the gradient spectra at every step.

Step ``s`` (``s = 0 .. steps-1``) with ``P = prompts_per_step`` groups and group size ``R_train``
is :func:`grpo_step`, which reads top to bottom:

1. rollouts: ``R_train`` completions for each of the step's prompts (prompt ``s P + j``, seeded by
   ``(seed, s P + j)``; the step's groups in batches of ``rollout_batch`` prompts, see
   :func:`~real_model.rollouts.sample_prompts`);
2. rewards ``r [P, R_train]`` (binary by default);
3. at the current weights: ``K`` per group and its nested spectra for every ``R`` in ``R_values``
   (``R <= R_train``; :mod:`real_model.geometry`), for the main estimator;
4. advantages ``A`` of the main estimator times the aggregation weights ``c``: ``w = A c``;
5. the GRPO surrogate (the seed paper's Eq. 19 with aggregation weights ``c``)::

       loss = -(1/P) sum_j sum_i A_ji c_ji sum_t m_jit log pi(y_jit | y_ji,<t)

   whose gradient is ``-(1/P) sum_j sum_i w_ji psi_ji``;
6. one AdamW step (``lr``, ``weight_decay``).

The model stays in eval mode (no dropout); sampling is on-policy (the ratio is 1, no clipping,
no KL term, as in the paper's derivation).

:func:`run_train` is the bookkeeping around the steps: the output and checkpoint folders (one
writer each), resuming (:mod:`real_model.checkpoint`), one JSON line per step in ``steps.jsonl``
(accuracy, mean within-group reward std, overall reward std, fraction of zero-advantage groups,
gradient norm ``||grad loss||``, loss, and per ``R`` the mean effective rank / top-1 fraction /
numerical rank over mixed groups, and per-group values), a checkpoint every ``checkpoint_every``
steps, and the outputs (:func:`real_model.outputs.write_train_results`).

Resuming: a rerun with the same configuration loads the checkpoint, drops step records newer
than it, restores from it any step record the JSONL lost (a truncated last line), and continues;
since every step is seeded by its index, the resumed run reproduces the uninterrupted one. A rerun
with fewer ``steps`` than the checkpoint has trained trains nothing and reports exactly the steps
``< steps`` (``results.json``, ``table.md``, ``train.png``); the later steps stay on disk untouched
(``steps.jsonl`` and the checkpoint are not rewritten), and ``results.json["note"]`` (printed by
the CLI, also under the table) says so; ``steps_on_disk`` counts what ``OUT`` holds.
Step records and the checkpoint carry the configuration; a mismatch is refused by name.
Where checkpoints live, and how they are read safely: :mod:`real_model.checkpoint`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import check_path, lock_out_dir

from .checkpoint import (
    CHECKPOINT_KEYS,
    cache_folder,
    default_cache_dir,
    load_checkpoint,
    resume_from_checkpoint,
    save_checkpoint,
)
from .config import TrainConfig
from .data import ProblemSet, binary_reward, checked_reward, load_problems
from .outputs import train_step_record, write_train_results
from .rollouts import sample_problem_groups
from .run_io import (
    append_jsonl,
    check_config,
    check_record_configs,
    jsonable,
    read_jsonl,
    read_train_steps,
    rewrite_jsonl,
    write_json,
)

# CHECKPOINT_KEYS, default_cache_dir and load_checkpoint are real_model.checkpoint's, and
# TrainConfig real_model.config's, importable from here too (real train's API)
__all__ = [
    "TrainConfig", "GRPOStep", "grpo_loss", "grpo_step", "run_train", "CHECKPOINT_KEYS",
    "default_cache_dir", "load_checkpoint",
]

def grpo_loss(model: Any, batch: Any, weights: Any) -> Any:
    """``-sum_i w_i sum_t m_it log pi(y_it | y_i,<t)`` for one group (a scalar with graph).

    Args:
        model: the causal LM.
        batch: :class:`~real_model.rollouts.RolloutBatch` with ``R`` rows.
        weights: ``[R]`` effective weights ``w_i = A_i c_i``.
    """
    import torch

    from .gram import token_logprobs

    lp = token_logprobs(model, batch.input_ids, batch.attention_mask)
    m = batch.completion_mask.to(lp.dtype)
    seq = (lp * m).sum(dim=1)
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=lp.dtype, device=lp.device)
    if w.shape != seq.shape:
        raise ValueError(f"weights must be shaped [R]={tuple(seq.shape)}, got {tuple(w.shape)}")
    return -(w * seq).sum()


@dataclass
class GRPOStep:
    """What one :func:`grpo_step` measured.

    Attributes:
        rewards: ``[P, R_train]`` rewards of the step's groups.
        geometry: per group, ``{R: geometry}`` of
            :func:`~real_model.geometry.nested_group_geometry` at the weights the rollouts were
            sampled with (before the update).
        grad_norm: ``||grad loss||`` (float64 sum over the trainable parameters).
        loss: the surrogate's value (0 when every weight is 0).
        diagnostics: the step's training diagnostics (norms, dead groups, noise scale, SNR:
            :func:`grpo_theory.diagnostics.step_diagnostics`) from the rows' Grams
            ``diag(w/P) K diag(w/P)`` and ``grad_norm``.
    """

    rewards: np.ndarray
    geometry: list[dict[int, dict[str, Any]]]
    grad_norm: float
    loss: float
    diagnostics: dict[str, float] | None = None


def grpo_step(
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    cfg: TrainConfig,
    problem_set: ProblemSet,
    step: int,
    *,
    reward: Callable[[str, Any], float] = binary_reward,
) -> GRPOStep:
    """One GRPO update at step ``step``: rollouts -> rewards -> advantages -> loss -> update.

    The equations are in the module docstring. ``optimizer`` holds the model's trainable
    parameters (one AdamW step is taken); ``reward(completion_text, gold)`` scores a completion.
    """
    from grpo_theory.diagnostics import step_diagnostics

    from .geometry import group_gram, nested_group_geometry, rollout_weights

    P, est = cfg.prompts_per_step, cfg.estimators[0]
    idxs = [step * P + j for j in range(P)]
    # rollouts: the step's groups in blocks of rollout_batch prompts, a fixed function of the step
    batches = sample_problem_groups(model, tokenizer, cfg, problem_set, idxs,
                                    R=cfg.train_R or max(cfg.R_values),
                                    batch_prompts=cfg.rollout_batch)
    # rewards r [P, R_train]
    golds = [problem_set.problems[i].answer for i in idxs]
    rewards = np.stack([np.array([checked_reward(reward(text, gold)) for text in b.texts])
                        for b, gold in zip(batches, golds, strict=True)])
    groups = list(zip(batches, rewards, strict=True))
    # the spectra of diag(w) Psi at the current weights, nested R (measured, not trained on)
    Ks = [group_gram(model, b, method=cfg.gram_method) for b, _ in groups]
    geometry = [nested_group_geometry(K, r, b.lengths, R_values=sorted(cfg.R_values),
                                      estimators=(est,), aggregation=cfg.aggregation,
                                      max_tokens=cfg.max_new_tokens)
                for K, (b, r) in zip(Ks, groups, strict=True)]
    # advantages times aggregation weights: w = A c per group
    weights = [rollout_weights(r, b.lengths, estimator=est, aggregation=cfg.aggregation,
                               max_tokens=cfg.max_new_tokens)[1] for b, r in groups]
    # loss = -(1/P) sum_j sum_i w_ji log pi(y_ji), its gradient accumulated group by group
    optimizer.zero_grad(set_to_none=True)
    loss = 0.0
    for (b, _), w in zip(groups, weights, strict=True):
        if np.any(w != 0):  # a group whose weights are all 0 adds nothing
            part = grpo_loss(model, b, w) / P
            part.backward()
            loss += float(part.detach())
    grad_norm = _grad_norm(optimizer)
    # diagnostics: the rows' Grams (row i's gradient is -(w_i / P) psi_i) and ||grad loss||
    diagnostics = step_diagnostics(
        np.stack([_row_gram(K, w / P) for K, w in zip(Ks, weights, strict=True)]),
        tokens=np.stack([b.lengths for b, _ in groups]), rewards=rewards,
        total_grad_norm=grad_norm)
    # update: one AdamW step
    optimizer.step()
    return GRPOStep(rewards, geometry, grad_norm, loss, diagnostics)


def _row_gram(K: Any, w: Any) -> np.ndarray:
    """``diag(w) K diag(w)``: the Gram of the rows ``w_i psi_i`` from the score Gram ``K``."""
    w = np.asarray(w, dtype=np.float64)
    return w[:, None] * np.asarray(K, dtype=np.float64) * w[None, :]


def _grad_norm(optimizer: Any) -> float:
    """``||grad||`` over the optimizer's parameters (float64 squares, summed in order)."""
    sq = sum(float((p.grad.double() ** 2).sum()) for group in optimizer.param_groups
             for p in group["params"] if p.grad is not None)
    return float(np.sqrt(sq))


def run_train(
    out_dir: str | Path,
    cfg: TrainConfig,
    *,
    loaded: Any = None,
    progress: bool = True,
    overwrite: bool = False,
    reward_fn: Callable[[str, Any], float] | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run or resume GRPO training; returns the ``results.json`` content (see module docstring).

    ``reward_fn(completion_text, gold) -> reward`` defaults to
    :func:`~real_model.data.binary_reward`.
    ``loaded`` is an already loaded :class:`~real_model.loading.LoadedModel` (else loaded from cfg).
    ``cache_dir`` is the checkpoint folder (default: see
    :func:`~real_model.checkpoint.cache_folder`).
    """
    # every option and path, the data and the model (found, not loaded) before anything is written
    check_path(out_dir, "out_folder", option="--out")
    if cache_dir is not None:
        check_path(cache_dir, "out_folder", option="--cache-dir")
    cfg.validate(model=loaded is None)
    problem_set = load_problems(cfg, cfg.steps * cfg.prompts_per_step)
    out = Path(out_dir)
    with contextlib.ExitStack() as held:
        cache = _lock_folders(held, out, cache_dir, overwrite=overwrite)
        return _train_locked(out, cfg, cache, problem_set, loaded=loaded, progress=progress,
                             reward_fn=reward_fn)


def _lock_folders(
    held: contextlib.ExitStack, out: Path, cache_dir: str | Path | None, *, overwrite: bool
) -> Path:
    """Lock ``out`` and the checkpoint folder (one writer each; a ``--cache-dir`` may be shared)
    for as long as ``held`` is open; with ``overwrite``, delete the earlier run's files first.
    Returns the checkpoint folder."""
    held.enter_context(lock_out_dir(out, purpose="real train"))
    cache = cache_folder(out, cache_dir)
    held.enter_context(
        lock_out_dir(cache, purpose="real train checkpoints", option="--cache-dir")
    )
    if overwrite:
        for p in (out / "steps.jsonl", out / "config.json", out / "results.json",
                  out / "checkpoint.json", cache / "checkpoint.pt"):
            p.unlink(missing_ok=True)
        new_cache = cache_folder(out, cache_dir)
        if new_cache != cache:  # the pointer named another folder: use the default one
            cache = held.enter_context(
                lock_out_dir(new_cache, purpose="real train checkpoints", option="--cache-dir")
            )
    return cache


def _check_run_folder(out: Path, cache: Path, key: dict[str, Any]) -> list[dict[str, Any]]:
    """The step records in ``out/steps.jsonl``, after checking that they, and ``config.json``,
    were written under the configuration ``key``; records where the checkpoints go."""
    jsonl = out / "steps.jsonl"
    done = read_train_steps(jsonl)  # schema-checked; a step seen twice is an error
    check_record_configs(done, key, jsonl, have_config=(out / "config.json").is_file())
    check_config(out / "config.json", key)
    cache.mkdir(parents=True, exist_ok=True)
    write_json(out / "checkpoint.json", {"cache_dir": str(cache.resolve())})
    return done


def _train_locked(
    out: Path,
    cfg: TrainConfig,
    cache: Path,
    problem_set: ProblemSet,
    *,
    loaded: Any,
    progress: bool,
    reward_fn: Callable[[str, Any], float] | None,
) -> dict[str, Any]:
    """:func:`run_train` once ``out`` and ``cache`` are locked (and cleared for --overwrite):
    resume, then one :func:`grpo_step` per step with its record and checkpoint, then outputs."""
    import torch
    from tqdm.auto import tqdm

    from .loading import load_model

    jsonl, ckpt, key = out / "steps.jsonl", cache / "checkpoint.pt", cfg.resume_key()
    done = _check_run_folder(out, cache, key)
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, progress=progress)
    model = loaded.model
    model.eval()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    start, kept = resume_from_checkpoint(ckpt, model, opt, key=key, records=done, jsonl=jsonl)
    if start > cfg.steps:  # an earlier, longer run: report the requested steps, touch nothing
        return _report_fewer_steps(out, cfg, loaded, ckpt, kept, done, start)
    rewrite_jsonl(jsonl, kept)
    records = list(kept)
    reward = binary_reward if reward_fn is None else reward_fn
    for s in tqdm(range(start, cfg.steps), desc="real train", disable=not progress,
                  initial=start, total=cfg.steps):
        t0 = time.perf_counter()
        step = grpo_step(model, loaded.tokenizer, opt, cfg, problem_set, s, reward=reward)
        rec = {**train_step_record(s, step.rewards, step.geometry, cfg.estimators[0],
                                   grad_norm=step.grad_norm, loss=step.loss,
                                   diagnostics=step.diagnostics),
               "time_s": time.perf_counter() - t0, "config": key}
        append_jsonl(jsonl, rec)
        records.append(jsonable(rec))
        if (s + 1) % cfg.checkpoint_every == 0 or s + 1 == cfg.steps:
            save_checkpoint(ckpt, model, opt, steps_done=s + 1, records=records, config=key)
    records = read_jsonl(jsonl)
    return write_train_results(out, cfg, loaded, records, checkpoint=ckpt,
                               steps_on_disk=len(records), checkpoint_steps=cfg.steps)


def _report_fewer_steps(
    out: Path,
    cfg: TrainConfig,
    loaded: Any,
    ckpt: Path,
    kept: list[dict[str, Any]],
    done: list[dict[str, Any]],
    start: int,
) -> dict[str, Any]:
    """A rerun with ``--steps`` below the ``start`` steps its checkpoint has trained: summarise
    exactly the steps ``< cfg.steps`` (from the JSONL, else the checkpoint's copy) and leave
    ``steps.jsonl`` and the checkpoint as they are (nothing trained, nothing truncated)."""
    on_disk = len({int(r["step"]) for r in done} | set(range(start)))
    note = (
        f"{out} already holds a run of {start} trained steps (checkpoint {ckpt}); this run "
        f"reports steps 0..{cfg.steps - 1} (--steps {cfg.steps}) and trains nothing; steps "
        f"{cfg.steps}..{on_disk - 1} are left untouched on disk (steps.jsonl, checkpoint): rerun "
        f"with --steps {on_disk} or more to report them"
    )
    return write_train_results(out, cfg, loaded, kept[: cfg.steps], checkpoint=ckpt,
                               steps_on_disk=on_disk, checkpoint_steps=start, note=note)
