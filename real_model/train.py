"""``grpo-audit real train``: a GRPO update loop that records the gradient spectra at every step.

Step ``s`` (``s = 0 .. steps-1``) with ``P = prompts_per_step`` groups and group size ``R_train``:

1. sample ``R_train`` completions for each of the step's prompts (prompt ``s P + j``, seeded by
   ``(seed, s P + j)``; the step's groups in batches of ``rollout_batch`` prompts, see
   :func:`~real_model.rollouts.sample_prompts`), rewards ``r`` (binary);
2. at the current weights: ``K`` per group and its nested spectra for every ``R`` in ``R_values``
   (``R <= R_train``; :mod:`real_model.geometry`), for the main estimator;
3. the GRPO surrogate (the seed paper's Eq. 19 with aggregation weights ``c``)::

       loss = -(1/P) sum_j sum_i A_ji c_ji sum_t m_jit log pi(y_jit | y_ji,<t)

   whose gradient is ``-(1/P) sum_j sum_i w_ji psi_ji``; one AdamW step (``lr``, ``weight_decay``).
   The model stays in eval mode (no dropout); sampling is on-policy (the ratio is 1, no clipping,
   no KL term, as in the paper's derivation).

Per step, one JSON line in ``steps.jsonl``: accuracy, mean within-group reward std, overall reward
std, fraction of zero-advantage groups, gradient norm ``||grad loss||``, loss, and per ``R`` the
mean effective rank / top-1 fraction / numerical rank over mixed groups (and per-group values).

Resuming: every ``checkpoint_every`` steps the model and optimizer states, and the step records
so far, are saved to ``checkpoint.pt`` in the cache folder (float32 SmolLM2 + AdamW is ~1.6 GB):
tensors and plain data only, read back with ``torch.load(weights_only=True)``
(:func:`load_checkpoint`; a file holding anything else, e.g. a pickled callable, is refused by
name and nothing in it runs).
The cache folder is, in order: ``cache_dir`` (``--cache-dir``), the folder recorded in
``OUT/checkpoint.json`` by an earlier run, else ``$GRPO_AUDIT_CACHE/train/<id>`` or
``${XDG_CACHE_HOME:-~/.cache}/grpo-audit/train/<id>`` with ``<id>`` derived from the absolute
``OUT`` path: never inside ``OUT``, so an ``--out`` inside a repository does not collect
checkpoints. A rerun with the same configuration loads the checkpoint, drops step records newer
than it, restores from it any step record the JSONL lost (a truncated last line), and continues;
since every step is seeded by its index, the resumed run reproduces the uninterrupted one. A rerun
with fewer ``steps`` than the checkpoint has trained trains nothing and reports exactly the steps
``< steps`` (``results.json``, ``table.md``, ``train.png``); the later steps stay on disk untouched
(``steps.jsonl`` and the checkpoint are not rewritten), and ``results.json["note"]`` (printed by
the CLI, also under the table) says so; ``steps_on_disk`` counts what ``OUT`` holds.
Step records and the checkpoint carry the configuration; a mismatch is refused by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import lock_out_dir

from ._io import (
    append_jsonl,
    check_config,
    check_record_configs,
    jsonable,
    read_jsonl,
    rewrite_jsonl,
    write_json,
)
from .config import RankConfig
from .data import ProblemSet, load_problems
from .outputs import step_spectra, train_figure, train_table_markdown, write_train_results
from .rollouts import sample_problem_groups

__all__ = [
    "TrainConfig", "default_cache_dir", "grpo_loss", "run_train", "load_checkpoint",
    "CHECKPOINT_KEYS",
]

# trl_train.py imports these two private names from here (kept for it: use
# real_model.outputs.train_table_markdown and train_figure)
_table = train_table_markdown
_figure = train_figure


@dataclass(frozen=True)
class TrainConfig(RankConfig):
    """A :class:`~real_model.rank.RankConfig` plus the optimisation options (defaults stated)."""

    steps: int = 10
    prompts_per_step: int = 4
    train_R: int | None = None  # default: max(R_values)
    lr: float = 1e-5
    weight_decay: float = 0.0
    checkpoint_every: int = 1

    def resume_key(self) -> dict[str, Any]:
        """Everything but ``steps`` and ``checkpoint_every`` must match to resume
        (``rollout_batch=1`` is left out, as in :meth:`RankConfig.resume_key`)."""
        d = super().resume_key()
        for k in ("steps", "checkpoint_every"):
            d.pop(k)
        return d

    def validate(self) -> None:
        """:meth:`RankConfig.validate` plus the optimisation options."""
        super().validate()
        for name in ("steps", "prompts_per_step", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < float("inf")):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < 1e300):
            raise ValueError(
                f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}"
            )
        R_train = self.train_R or max(self.R_values)
        if max(self.R_values) > R_train:
            raise ValueError(f"R values {self.R_values} must lie in [2, train_R={R_train}]")


def default_cache_dir(out_dir: str | Path) -> Path:
    """Checkpoint folder of a training run writing to ``out_dir`` (outside ``out_dir``).

    ``$GRPO_AUDIT_CACHE/train/<id>`` if that variable is set, else
    ``${XDG_CACHE_HOME:-~/.cache}/grpo-audit/train/<id>``; ``<id>`` is the folder name plus 12
    hex digits of the SHA-256 of its absolute path.
    """
    out = Path(out_dir).expanduser().resolve()
    root = os.environ.get("GRPO_AUDIT_CACHE")
    if root:
        base = Path(root).expanduser()
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-audit"
    digest = hashlib.sha256(str(out).encode("utf-8")).hexdigest()[:12]
    return base / "train" / f"{out.name}-{digest}"


def _cache_folder(out: Path, cache_dir: str | Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    pointer = out / "checkpoint.json"
    if pointer.is_file():
        try:
            return Path(json.loads(pointer.read_text(encoding="utf-8"))["cache_dir"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{pointer} is not a valid checkpoint pointer ({exc}); delete it, pass "
                "--cache-dir or --overwrite"
            ) from exc
    return default_cache_dir(out)


#: Keys every checkpoint of :func:`run_train` holds.
CHECKPOINT_KEYS = ("model", "optimizer", "steps_done", "records", "config")


def load_checkpoint(path: str | Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a :func:`run_train` checkpoint with ``torch.load(..., weights_only=True)``.

    A checkpoint holds only tensors and plain data (the model and AdamW state dicts, ints, and
    the step records and configuration as JSON-like dicts), which ``weights_only=True`` accepts;
    anything else (a pickled callable, an object of some class: a file written by another
    program, or altered) is refused by torch's restricted unpickler before it is built, so
    nothing in the file runs.

    Raises:
        ValueError: one line naming the file and saying how to proceed (a new ``--out``, or
            ``--overwrite`` to discard it).
    """
    import pickle

    import torch

    advice = ("run into a new --out (or pass --overwrite to discard this checkpoint and its "
              "steps)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = next((ln.strip() for ln in str(exc).splitlines()
                       if "GLOBAL" in ln or "Unsupported" in ln), "")[:200]
        raise ValueError(
            f"checkpoint {path} holds more than tensors and plain data, so it is not loaded "
            f"(torch.load weights_only=True refused it{': ' + reason if reason else ''}; nothing "
            "in it was run): it was not written by this version of grpo-audit real train, or "
            f"was altered; {advice}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ValueError(
            f"checkpoint {path} is not a readable torch checkpoint ({type(exc).__name__}"
            f"{': ' if str(exc) else ''}{' '.join(str(exc).split())[:200]}); {advice}"
        ) from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(
            f"checkpoint {path} lacks {missing} (an older or foreign checkpoint); {advice}"
        )
    return state


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
    ``cache_dir`` is the checkpoint folder (default: see :func:`default_cache_dir`).
    """
    cfg.validate()  # before any file is written or the model is loaded
    problem_set = load_problems(cfg, cfg.steps * cfg.prompts_per_step)
    out = Path(out_dir)
    with contextlib.ExitStack() as held:
        # one writer per folder: --out, then the checkpoint folder (a --cache-dir may be shared)
        held.enter_context(lock_out_dir(out, purpose="real train"))
        cache = _cache_folder(out, cache_dir)
        held.enter_context(
            lock_out_dir(cache, purpose="real train checkpoints", option="--cache-dir")
        )
        if overwrite:
            for p in (out / "steps.jsonl", out / "config.json", out / "results.json",
                      out / "checkpoint.json", cache / "checkpoint.pt"):
                p.unlink(missing_ok=True)
            new_cache = _cache_folder(out, cache_dir)
            if new_cache != cache:  # the pointer named another folder: use the default one
                cache = held.enter_context(
                    lock_out_dir(new_cache, purpose="real train checkpoints",
                                 option="--cache-dir")
                )
        return _train_locked(out, cfg, cache, problem_set, loaded=loaded, progress=progress,
                             reward_fn=reward_fn)


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
    """:func:`run_train` once ``out`` and ``cache`` are locked (and cleared for --overwrite)."""
    import torch
    from tqdm.auto import tqdm

    from .data import binary_reward
    from .geometry import group_gram, nested_group_geometry, rollout_weights
    from .loading import load_model

    R_train = cfg.train_R or max(cfg.R_values)
    jsonl = out / "steps.jsonl"
    ckpt = cache / "checkpoint.pt"
    key = cfg.resume_key()
    done = read_jsonl(jsonl)
    check_record_configs(done, key, jsonl, have_config=(out / "config.json").is_file())
    check_config(out / "config.json", key)
    cache.mkdir(parents=True, exist_ok=True)
    write_json(out / "checkpoint.json", {"cache_dir": str(cache.resolve())})
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, progress=progress)
    model = loaded.model
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    kept = []
    if ckpt.is_file():
        state = load_checkpoint(ckpt, map_location=next(model.parameters()).device)
        if "config" in state and state["config"] != jsonable(key):
            check_record_configs([{"config": state["config"]}], key, ckpt, have_config=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["steps_done"])
        # records up to the checkpoint: the JSONL's, else the checkpoint's copy (a truncated
        # or lost last line must not shorten the run)
        have = {int(r["step"]): r for r in done if int(r["step"]) < start}
        saved = {int(r["step"]): r for r in state.get("records", [])}
        missing = [s for s in range(start) if s not in have and s not in saved]
        if missing:
            raise ValueError(
                f"{jsonl} lacks the records of steps {missing} that checkpoint {ckpt} has "
                "already trained; pass --overwrite to start again"
            )
        kept = [have.get(s, saved.get(s)) for s in range(start)]
    est = cfg.estimators[0]
    if start > cfg.steps:  # an earlier, longer run: report the requested steps, touch nothing
        return _report_fewer_steps(out, cfg, loaded, est, ckpt, kept, done, start)
    rewrite_jsonl(jsonl, kept)
    records_so_far: list[dict[str, Any]] = list(kept)
    reward = binary_reward if reward_fn is None else reward_fn
    for s in tqdm(
        range(start, cfg.steps),
        desc="real train",
        disable=not progress,
        initial=start,
        total=cfg.steps,
    ):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        rewards_all, geos, loss_total = [], [], 0.0
        idxs = [s * cfg.prompts_per_step + j for j in range(cfg.prompts_per_step)]
        # the step's groups in blocks of rollout_batch prompts: a fixed function of the step
        batches = sample_problem_groups(model, loaded.tokenizer, cfg, problem_set, idxs,
                                        R=R_train, batch_prompts=cfg.rollout_batch)
        for idx, batch in zip(idxs, batches, strict=True):
            prob = problem_set.problems[idx]
            r = np.array([reward(t, prob.answer) for t in batch.texts])
            rewards_all.append(r)
            K = group_gram(model, batch, method=cfg.gram_method)
            geos.append(
                nested_group_geometry(
                    K,
                    r,
                    batch.lengths,
                    R_values=sorted(cfg.R_values),
                    estimators=(est,),
                    aggregation=cfg.aggregation,
                    max_tokens=cfg.max_new_tokens,
                )
            )
            _, w = rollout_weights(
                r,
                batch.lengths,
                estimator=est,
                aggregation=cfg.aggregation,
                max_tokens=cfg.max_new_tokens,
            )
            if np.any(w != 0):
                loss = grpo_loss(model, batch, w) / cfg.prompts_per_step
                loss.backward()
                loss_total += float(loss.detach())
        sq = sum(float((p.grad.double() ** 2).sum()) for p in params if p.grad is not None)
        opt.step()
        rw = np.stack(rewards_all)
        rec = {
            "step": s,
            "accuracy": float(rw.mean()),
            "reward_std_within": float(rw.std(axis=1).mean()),
            "reward_std": float(rw.std()),
            "zero_adv_fraction": float(np.mean(rw.min(axis=1) == rw.max(axis=1))),
            "grad_norm": float(np.sqrt(sq)),
            "loss": loss_total,
            "spectra": step_spectra(geos, est),
            "time_s": time.perf_counter() - t0,
            "config": key,
        }
        append_jsonl(jsonl, rec)
        records_so_far.append(jsonable(rec))
        if (s + 1) % cfg.checkpoint_every == 0 or s + 1 == cfg.steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "steps_done": s + 1,
                    "records": records_so_far,
                    "config": jsonable(key),
                },
                tmp,
            )
            tmp.replace(ckpt)
    records = read_jsonl(jsonl)
    return write_train_results(out, cfg, loaded, records, checkpoint=ckpt,
                               steps_on_disk=len(records), checkpoint_steps=cfg.steps)


def _report_fewer_steps(
    out: Path,
    cfg: TrainConfig,
    loaded: Any,
    est: str,
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
