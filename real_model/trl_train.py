"""``grpo-audit real trl-train``: GRPO training of a real model with TRL, geometry logged per step.

The same task as ``real train`` (seeded generated word problems of :mod:`real_model.data`, few-shot
prompts, the binary reward of :func:`real_model.data.binary_reward`), but the update loop is TRL's
``GRPOTrainer`` (here :class:`real_model.trl_geometry.GeometryGRPOTrainer`), with TRL's own
advantages (``scale_rewards``), loss (``loss_type``), AdamW, gradient clipping
(``max_grad_norm=1``, a common factor that leaves every spectrum unchanged) and sampling. Step
``s`` uses prompts ``s P .. s P + P - 1`` (``shuffle_dataset=False``), ``R = num_generations``
completions each.

Outputs in ``--out`` (the layout of ``real train``):

* ``steps.jsonl``: one line per step with ``accuracy`` (TRL's mean reward), ``reward_std``,
  ``reward_std_within`` (mean within-group std, from the measured groups), ``zero_adv_fraction``
  (TRL's ``frac_reward_zero_std``), ``grad_norm`` and ``loss`` (TRL's), and ``spectra[str(R)]``:
  means over the step's mixed groups of effective rank / top-1 fraction / numerical rank of
  ``G = diag(w) Psi`` with TRL's ACTUAL row weights ``w`` (:func:`trl_row_weights`);
* ``geometry.jsonl``: the full per-step geometry records (every metric's mean/sd/min/max/count,
  every group's weights, norms and singular values);
* ``results.json`` (``experiment: "real_trl_train"``, with a ``summary`` over all measured mixed
  groups in the format of ``real rank``, so ``grpo-audit compare --real`` accepts it),
  ``table.md``, ``train.png``.

TRL's transformers generation has no stop strings (``generate`` is called without a tokenizer), so
completions run to ``max_new_tokens`` or EOS; the reward scores the text before the first stop
string (default ``"\\n\\n"``, ``"Question:"``), as ``real train`` does. A rerun into a folder that
holds results needs ``--overwrite`` (no resume: TRL's own checkpoints are ~1.6 GB for SmolLM2).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import locks_out_dir

from ._io import append_jsonl, environment, read_jsonl, write_json
from .rank import RankConfig, load_problems, rank_table_markdown, summarize_rank

__all__ = ["TRLTrainConfig", "run_trl_train", "cut_at_stop"]


@dataclass(frozen=True)
class TRLTrainConfig(RankConfig):
    """A :class:`~real_model.rank.RankConfig` (model, data, sampling) plus TRL's options.

    ``R_values``, ``estimators``, ``aggregation`` and ``prompts`` of the base class are not used:
    the group size is ``num_generations``, the advantages and aggregation are TRL's.
    """

    steps: int = 4
    prompts_per_step: int = 2
    num_generations: int = 4
    lr: float = 1e-5
    weight_decay: float = 0.0
    loss_type: str = "dapo"  # TRL's default
    scale_rewards: str = "group"  # TRL's default
    geometry_every: int = 1
    report_to: tuple[str, ...] = ()


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the first occurrence of any stop string.

    >>> cut_at_stop(" 3 + 4 = 7. The answer is 7.\\n\\nQuestion: x", ("\\n\\n",))
    ' 3 + 4 = 7. The answer is 7.'
    """
    cut = len(text)
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0:
            cut = min(cut, i)
    return text[:cut]


def _validate(cfg: TRLTrainConfig) -> None:
    from .trl_geometry import SUPPORTED_LOSS_TYPES

    RankConfig.validate(cfg)  # model, data and sampling options, before any model is loaded
    if cfg.steps < 1 or cfg.prompts_per_step < 1:
        raise ValueError("steps and prompts_per_step must be >= 1")
    if cfg.num_generations < 2:
        raise ValueError(f"num_generations must be >= 2, got {cfg.num_generations}")
    if not cfg.lr > 0:
        raise ValueError(f"lr must be > 0, got {cfg.lr}")
    if cfg.loss_type not in SUPPORTED_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {SUPPORTED_LOSS_TYPES}, got {cfg.loss_type!r}")
    if cfg.scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be group, batch or none, got {cfg.scale_rewards!r}")
    if cfg.geometry_every < 1:
        raise ValueError(f"geometry_every must be >= 1, got {cfg.geometry_every}")


def _spectra(rec: dict[str, Any] | None, R: int) -> dict[str, Any]:
    """``real train``'s ``spectra`` entry from one geometry record (mixed groups only)."""
    if rec is None:
        return {}
    groups = rec.get("group_records", [])
    mixed = [g for g in groups if g["mixed"]]
    vals = {
        k: [g[k] for g in mixed if g.get(k) is not None]
        for k in ("effective_rank", "top1_fraction", "rank")
    }
    return {
        str(R): {
            "mixed_groups": len(mixed),
            "groups": len(groups),
            **{f"{k}_mean": (float(np.mean(v)) if v else None) for k, v in vals.items()},
            **{f"{k}_values": v for k, v in vals.items()},
            "common_share_mean": float(np.mean([g["common_share"] for g in mixed]))
            if mixed
            else None,
        }
    }


def _rank_like(geo_records: list[dict[str, Any]], R: int) -> list[dict[str, Any]]:
    """Geometry group records reshaped as ``real rank`` records (estimator name ``"trl"``)."""
    out = []
    for rec in geo_records:
        for g in rec.get("group_records", []):
            if "weights" in g:
                max_rank = int(np.count_nonzero(g["weights"]))
            elif not np.any(g["advantages"]):
                max_rank = 0  # all advantages 0: G = 0 (counted, no spectrum)
            else:
                continue  # structure broken (see issues): no gradient-matrix metrics
            est = {k: g.get(k) for k in ("effective_rank", "top1_fraction", "rank",
                                         "entropy_effective_rank")}
            est["max_rank"] = max_rank
            out.append({"by_R": {str(R): {
                "mixed": g["mixed"],
                "estimators": {"trl": est},
                **{k: g.get(k) for k in ("common_share", "cos_between", "cos_within_success",
                                         "cos_within_failure")},
            }}})
    return out


@locks_out_dir("real trl-train", check=lambda a: _validate(a["cfg"]))
def run_trl_train(
    out_dir: str | Path,
    cfg: TRLTrainConfig,
    *,
    loaded: Any = None,
    progress: bool = True,
    overwrite: bool = False,
    reward_fn: Callable[[str, Any], float] | None = None,
) -> dict[str, Any]:
    """Train with TRL and write the outputs listed in the module docstring; returns results.json.

    ``loaded`` is an already loaded :class:`~real_model.loading.LoadedModel` (else loaded from
    ``cfg``); ``reward_fn(completion_text, gold)`` defaults to
    :func:`real_model.data.binary_reward`.
    """
    try:
        import trl
    except ImportError as exc:
        raise ValueError(
            "real trl-train needs the optional trl extra: pip install -e '.[real,trl]'"
        ) from exc
    from transformers import TrainerCallback

    from .data import binary_reward
    from .loading import load_model
    from .rollouts import build_prompt
    from .train import _figure, _table
    from .trl_geometry import GeometryConfig, GeometryGRPOTrainer

    _validate(cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / n for n in ("steps.jsonl", "geometry.jsonl", "results.json", "table.md",
                               "train.png", "config.json")]
    if any(f.exists() for f in files[:3]) and not overwrite:
        raise FileExistsError(
            f"{out} already holds trl-train results (no resume: pass --overwrite to replace them)"
        )
    for f in files:
        f.unlink(missing_ok=True)
    write_json(out / "config.json", asdict(cfg))
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    tok = loaded.tokenizer
    R, P = cfg.num_generations, cfg.prompts_per_step
    problems, shots = load_problems(cfg, cfg.steps * P)
    prompts = [build_prompt(p.question, style=cfg.prompt_style, shots=shots, tokenizer=tok)
               for p in problems]
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": prompts, "gold": [str(p.answer) for p in problems]})
    score = binary_reward if reward_fn is None else reward_fn
    stops = tuple(cfg.stop_strings)

    def binary(completions: list[str], gold: list[str], **_: Any) -> list[float]:
        return [float(score(cut_at_stop(c, stops), g))
                for c, g in zip(completions, gold, strict=True)]

    on_gpu = str(loaded.device).startswith("cuda")
    bf16 = on_gpu and "bfloat16" in str(loaded.dtype)
    args = trl.GRPOConfig(
        output_dir=str(out / "cache" / "trl"),
        per_device_train_batch_size=P * R,
        gradient_accumulation_steps=1,
        num_generations=R,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="constant",
        max_steps=cfg.steps,
        logging_steps=1,
        report_to=list(cfg.report_to),
        save_strategy="no",
        seed=cfg.seed,
        bf16=bf16,
        use_cpu=not on_gpu,
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        shuffle_dataset=False,
        beta=0.0,
        disable_tqdm=not progress,
        gradient_checkpointing=False,
    )
    geo = GeometryConfig(geometry_every=cfg.geometry_every,
                         jsonl_path=str(out / "geometry.jsonl"), gram_method=cfg.gram_method)
    steps_path = out / "steps.jsonl"
    holder: dict[str, Any] = {}

    class _StepRecorder(TrainerCallback):
        """Writes one ``real train``-style line per optimizer step (main process)."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            holder["t0"] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any):
            if not logs or "reward" not in logs or not state.is_world_process_zero:
                return
            tr = holder["trainer"]
            s = int(state.global_step) - 1
            rec = next((r for r in tr.geometry_records if r["step"] == s), None)
            within = None
            if rec is not None and rec.get("group_records"):
                within = float(np.mean([np.std(g["rewards"]) for g in rec["group_records"]]))
            append_jsonl(steps_path, {
                "step": s,
                "accuracy": logs.get("reward"),
                "reward_std_within": within,
                "reward_std": logs.get("reward_std"),
                "zero_adv_fraction": logs.get("frac_reward_zero_std"),
                "grad_norm": logs.get("grad_norm"),
                "loss": logs.get("loss"),
                "spectra": _spectra(rec, R),
                "geometry_time_s": None if rec is None else rec["geometry_time_s"],
                "time_s": time.perf_counter() - holder.get("t0", time.perf_counter()),
            })

    trainer = GeometryGRPOTrainer(
        model=loaded.model, reward_funcs=binary, args=args, train_dataset=ds,
        processing_class=tok, geometry=geo, callbacks=[_StepRecorder()],
    )
    holder["trainer"] = trainer
    trainer.train()
    records = read_jsonl(steps_path)
    geo_records = read_jsonl(out / "geometry.jsonl")
    summary = summarize_rank(_rank_like(geo_records, R), estimator="trl", R_values=(R,))
    accs = [r["accuracy"] for r in records if r.get("accuracy") is not None]
    result = {
        "experiment": "real_trl_train",
        "config": asdict(cfg),
        "model": loaded.describe() if hasattr(loaded, "describe") else None,
        "environment": environment(getattr(loaded, "device", None)),
        "trl_version": trl.__version__,
        "loss_type": cfg.loss_type,
        "aggregation": geo_records[0]["aggregation"] if geo_records else None,
        "estimator": "trl",
        "accuracy": float(np.mean(accs)) if accs else None,
        "steps_done": len(records),
        "steps": records,
        "summary": summary,
        "issues": sorted({i for r in geo_records for i in r.get("issues", [])}),
    }
    write_json(out / "results.json", result)
    title = (f"TRL GRPO ({cfg.loss_type}, scale_rewards={cfg.scale_rewards}), "
             f"R={R}: all measured mixed groups")
    (out / "table.md").write_text(
        _table(records, (R,)) + "\n" + rank_table_markdown(summary, title=title), encoding="utf-8"
    )
    _figure(out / "train.png", records, (R,))
    return result
