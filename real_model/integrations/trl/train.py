"""``grpo-audit real trl-train``: GRPO training of a real model with TRL, geometry logged per step.

The same task as ``real train`` (seeded generated word problems of :mod:`real_model.data`, few-shot
prompts, the binary reward of :func:`real_model.data.binary_reward`), but the update loop is TRL's
``GRPOTrainer`` (here :class:`real_model.integrations.trl.GeometryGRPOTrainer`), with TRL's own
advantages (``scale_rewards``), loss (``loss_type``), AdamW, gradient clipping
(``max_grad_norm=1``, a common factor that leaves every spectrum unchanged) and sampling. Step
``s`` uses prompts ``s P .. s P + P - 1`` (``shuffle_dataset=False``), ``R = num_generations``
completions each.

Outputs in ``--out`` (the layout of ``real train``):

* ``steps.jsonl``: one line per step with ``accuracy`` (TRL's mean reward), ``reward_std``,
  ``reward_std_within`` (mean within-group std, from the measured groups), ``zero_adv_fraction``
  (the share of groups with no gradient: on a measured step the exact dead-group share from the
  rows, else the share of groups whose advantages are all zero), ``trl_frac_reward_zero_std``
  (TRL's own ``frac_reward_zero_std``, a batch flag under ``scale_rewards="batch"``),
  ``grad_norm`` and ``loss`` (TRL's), ``geometry_grad_norm`` (the geometry's, equal to TRL's
  with one process and ``geometry_memory_budget_mb`` 0), ``spectra[str(R)]``: means over the
  step's mixed groups of effective rank / top-1 fraction / numerical rank of the rows' actual
  gradients ``g_i`` (from TRL's own per-token loss gradient, :mod:`real_model.integrations.trl`),
  and on measured steps ``diagnostics`` (norms, dead groups, noise scale and SNR:
  :mod:`grpo_theory.diagnostics`);
* ``geometry.jsonl``: the full per-step geometry records (every metric's mean/sd/min/max/count,
  every group's weights, norms and singular values);
* ``results.json`` (``experiment: "real_trl_train"``, with a ``summary`` over all measured mixed
  groups in the format of ``real rank``, so ``grpo-audit compare --real`` accepts it),
  ``table.md``, ``train.png``, ``diagnostics.png`` (noise scale and SNR per measured step).

Options beyond ``real train``: ``beta`` (KL to the initial model: a second copy of the model, built
from the policy's own weights by :func:`reference_model_source`, or the adapters disabled with
LoRA; TRL's ``kl`` is recorded in ``steps.jsonl``), ``num_iterations`` (TRL's inner steps per
generation), ``lora_r`` (> 0: TRL's PEFT path with LoRA adapters of rank ``lora_r`` on the
attention and MLP projections; only the adapters train and are measured),
``gradient_checkpointing`` and ``geometry_every`` (0: geometry off, for comparisons). The defaults
(``R = 8`` completions of 48 tokens for 2 one-step addition / subtraction problems per step, T =
0.7, 3 shots) give groups with mixed rewards from the first steps on the offline SmolLM2 (two-step
problems, the default of ``real rank``, gave 0 of 8 correct on both first prompts).

TRL's transformers generation has no stop strings (``generate`` is called without a tokenizer), so
completions run to ``max_new_tokens`` or EOS; the reward scores the text before the first stop
string (default ``"\\n\\n"``, ``"Question:"``), as ``real train`` does. A rerun into a folder that
holds results needs ``--overwrite`` (no resume: TRL's own checkpoints are ~1.6 GB for SmolLM2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import atomic_write_text, check_path, locks_out_dir

from ...config import TRLTrainConfig
from ...data import ProblemSet, binary_reward, checked_reward, load_problems
from ...outputs import (
    diagnostics_figure,
    has_diagnostics,
    rank_table_markdown,
    run_header,
    summarize_rank,
    train_figure,
    train_table_markdown,
)
from ...run_io import append_jsonl, read_jsonl, write_json
from . import private

__all__ = [
    "TRLTrainConfig", "run_trl_train", "cut_at_stop", "StopCutReward", "prompt_dataset",
    "write_trl_train_results", "lora_config", "reference_model_source",
]


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
            if "grad_norm" in g:
                max_rank = int(g["max_rank"])
            elif not g.get("has_gradient", True):
                max_rank = 0  # no row has a gradient: G = 0 (counted, no spectrum)
            else:
                continue
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


def _grpo_args(cfg: TRLTrainConfig, out: Path, loaded: Any, *, progress: bool) -> Any:
    """The run's :class:`~real_model.integrations.trl.GeometryGRPOConfig` (a ``trl.GRPOConfig``)."""
    from . import GeometryGRPOConfig

    on_gpu = str(loaded.device).startswith("cuda")
    bf16 = on_gpu and "bfloat16" in str(loaded.dtype)
    R, P = cfg.num_generations, cfg.prompts_per_step
    # transformers 5.24 renamed gradient_checkpointing (the old name warns); older ones lack it
    names = {f.name for f in dataclasses.fields(GeometryGRPOConfig)}
    checkpointing = ("activation_checkpointing" if "activation_checkpointing" in names
                     else "gradient_checkpointing")
    return GeometryGRPOConfig(
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
        beta=cfg.beta,
        num_iterations=cfg.num_iterations,
        # beta > 0 without LoRA: TRL builds the reference model from the policy's
        # _name_or_path (reference_model_source), offline
        model_init_kwargs={"local_files_only": True} if _by_name(loaded) and cfg.beta > 0
        and cfg.lora_r == 0 else None,
        disable_tqdm=not progress,
        **{checkpointing: cfg.gradient_checkpointing},
        geometry_every=cfg.geometry_every,
        geometry_jsonl_path=str(out / "geometry.jsonl"),
        geometry_gram_method=cfg.gram_method,
        geometry_memory_budget_mb=cfg.geometry_memory_budget_mb or None,
        geometry_grad_norm=not cfg.geometry_memory_budget_mb,  # a budget splits the pass
    )


def lora_config(cfg: TRLTrainConfig) -> Any:
    """LoRA adapters of rank ``lora_r`` on the attention and MLP projections (None: off)."""
    if cfg.lora_r == 0:
        return None
    try:
        import peft
    except ImportError as exc:
        raise ValueError(
            "--lora-r needs the optional peft extra: pip install -e '.[peft]'"
        ) from exc
    return peft.LoraConfig(
        r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"],
    )


def _step_recorder(steps_path: Path, R: int) -> Any:
    """A callback writing one ``real train``-style line per optimizer step (main process)."""
    from transformers import TrainerCallback

    class StepRecorder(TrainerCallback):
        trainer: Any = None
        t0: float = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any):
            if not logs or "reward" not in logs or not state.is_world_process_zero:
                return
            s = int(state.global_step) - 1
            rec = next((r for r in self.trainer.geometry_records if r["step"] == s), None)
            within = None
            if rec is not None and rec.get("group_records"):
                within = float(np.mean([np.std([x for x in g["rewards"] if x is not None])
                                        for g in rec["group_records"]]))
            append_jsonl(steps_path, {
                "step": s,
                "accuracy": logs.get("reward"),
                "reward_std_within": within,
                "reward_std": logs.get("reward_std"),
                "zero_adv_fraction": _dead_share(self.trainer, rec, R),
                "trl_frac_reward_zero_std": logs.get("frac_reward_zero_std"),
                "grad_norm": logs.get("grad_norm"),
                "geometry_grad_norm": None if rec is None else rec.get("grad_norm"),
                "loss": logs.get("loss"),
                "kl": logs.get("kl"),
                "spectra": _spectra(rec, R),
                "geometry_skipped_reason": None if rec is None else rec.get("skipped_reason"),
                "geometry_time_s": None if rec is None else rec.get("geometry_time_s"),
                "time_s": time.perf_counter() - self.t0,
                **({} if rec is None or not rec.get("diagnostics") else
                   {"diagnostics": rec["diagnostics"]}),
            })

    return StepRecorder()


def _dead_share(trainer: Any, rec: dict[str, Any] | None, R: int) -> float | None:
    """The step's share of groups with no gradient: on a measured step the exact dead-group
    share from the rows (``diagnostics``); otherwise the share of the latest generation
    batch's groups whose advantages are all exactly zero (TRL's logged advantages)."""
    if rec is not None and rec.get("diagnostics"):
        return float(rec["diagnostics"]["dead_groups/group_share"])
    adv = private.logged_advantages(trainer)
    if not adv or len(adv) % R:
        return None
    return float(np.mean(np.all(np.asarray(adv).reshape(-1, R) == 0.0, axis=1)))


def _prepare_out(out: Path, cfg: TRLTrainConfig, overwrite: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / n for n in (*_RESULTS, "table.md", "train.png", "config.json")]
    if any(f.exists() for f in files[:3]) and not overwrite:
        raise FileExistsError(
            f"{out} already holds trl-train results (no resume: pass --overwrite to replace them)"
        )
    for f in files:
        f.unlink(missing_ok=True)
    write_json(out / "config.json", asdict(cfg))


def _by_name(loaded: Any) -> bool:
    """TRL can build a reference model from the policy's name: a local Hugging Face folder or
    a hub id (not a GGUF file, not a model built in memory)."""
    spec = getattr(loaded, "spec", None)
    return (spec is not None and spec.gguf_file is None
            and (not spec.is_local or (Path(spec.path) / "config.json").is_file()))


class StopCutReward:
    """TRL reward function: ``reward(text cut at the first stop string, gold)`` per completion.

    TRL's transformers generation has no stop strings, so a completion may run past the answer;
    the text before the first of ``stop_strings`` is scored (:func:`cut_at_stop`), as
    ``real train`` scores its completions. Named ``binary`` in TRL's logs
    (``rewards/binary/mean``).
    """

    def __init__(self, reward: Callable[[str, Any], float], stop_strings: Sequence[str]) -> None:
        self.reward = reward
        self.stops = tuple(stop_strings)
        self.__name__ = "binary"

    def __call__(self, completions: list[str], gold: list[str], **_: Any) -> list[float]:
        return [checked_reward(self.reward(cut_at_stop(c, self.stops), g))
                for c, g in zip(completions, gold, strict=True)]


def prompt_dataset(
    cfg: TRLTrainConfig, tokenizer: Any, problem_set: ProblemSet | None = None
) -> Any:
    """The run's ``datasets.Dataset``: ``prompt`` (:func:`~real_model.rollouts.build_prompt`) and
    ``gold`` (the answer as text) of problems ``0 .. steps P - 1`` (``problem_set``, else
    :func:`~real_model.data.load_problems`); step ``s`` reads rows ``s P .. s P + P - 1`` (TRL
    repeats each prompt ``num_generations`` times)."""
    from datasets import Dataset

    from ...rollouts import build_prompt

    problems, shots = problem_set or load_problems(cfg, cfg.steps * cfg.prompts_per_step)
    prompts = [build_prompt(p.question, style=cfg.prompt_style, shots=shots, tokenizer=tokenizer)
               for p in problems]
    return Dataset.from_dict({"prompt": prompts, "gold": [str(p.answer) for p in problems]})


@contextlib.contextmanager
def reference_model_source(cfg: TRLTrainConfig, loaded: Any, folder: Path) -> Iterator[None]:
    """Let TRL build its reference model (``beta > 0`` without LoRA) as the policy was built.

    TRL 1.16 builds the reference model from the policy's ``config._name_or_path``
    (``create_model_from_path``), which works for a local Hugging Face folder or a cached hub
    id, but not for a GGUF file (no ``config.json`` beside it) or a model built in memory. For
    those, the policy's weights (de-quantised, as loaded) are saved to ``folder`` with
    ``save_pretrained`` for the construction of the trainer, and ``_name_or_path`` points there:
    the reference model equals the policy before the first update, bit for bit. The folder is
    removed and ``_name_or_path`` restored afterwards. Nothing happens with ``beta = 0`` (TRL
    builds no reference model) or with LoRA (the adapters are disabled instead).
    """
    model = getattr(loaded, "model", loaded)
    if cfg.beta == 0 or cfg.lora_r > 0 or _by_name(loaded):
        yield
        return
    config = model.config
    name = config._name_or_path
    shutil.rmtree(folder, ignore_errors=True)
    try:
        model.save_pretrained(folder)
        config._name_or_path = str(folder)
        yield
    finally:
        config._name_or_path = name
        shutil.rmtree(folder, ignore_errors=True)


def _check_run(a: dict[str, Any]) -> None:
    """Everything ``run_trl_train`` can check before it writes or loads anything: the output
    folder, the options, the data, (without ``loaded``) the model, then the optional extras."""
    cfg = a["cfg"]
    if not isinstance(cfg, TRLTrainConfig):
        raise TypeError(f"cfg must be a TRLTrainConfig, got {type(cfg).__name__}")
    check_path(a["out_dir"], "out_folder", option="--out")
    cfg.validate(model=a.get("loaded") is None)
    try:
        import trl  # noqa: F401
    except ImportError:
        raise ValueError(
            "real trl-train needs the optional trl extra: pip install -e '.[real,trl]'"
        ) from None
    lora_config(cfg)  # the peft extra, with --lora-r
    out = Path(a["out_dir"]).expanduser()
    if not a.get("overwrite") and any((out / n).exists() for n in _RESULTS):
        raise FileExistsError(
            f"{out} already holds trl-train results (no resume: pass --overwrite to replace them)"
        )


#: Files of a run that a rerun without --overwrite refuses to replace.
_RESULTS = ("steps.jsonl", "geometry.jsonl", "results.json")


@locks_out_dir("real trl-train", check=_check_run)
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
    :func:`real_model.data.binary_reward`. Every option, the data and the model's files are
    checked before anything is written or loaded.
    """
    import trl

    from ...loading import load_model, quiet_loading
    from . import GeometryGRPOTrainer

    problem_set = load_problems(cfg, cfg.steps * cfg.prompts_per_step)
    out = Path(out_dir)
    _prepare_out(out, cfg, overwrite)
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, progress=progress)
    recorder = _step_recorder(out / "steps.jsonl", cfg.num_generations)
    with quiet_loading(not progress), \
            reference_model_source(cfg, loaded, out / "cache" / "reference"):
        trainer = GeometryGRPOTrainer(
            model=loaded.model,
            reward_funcs=StopCutReward(reward_fn or binary_reward, cfg.stop_strings),
            args=_grpo_args(cfg, out, loaded, progress=progress),
            train_dataset=prompt_dataset(cfg, loaded.tokenizer, problem_set),
            processing_class=loaded.tokenizer,
            callbacks=[recorder],
            peft_config=lora_config(cfg),
        )
    recorder.trainer = trainer
    with warnings.catch_warnings():
        # TRL 1.16's own generation asks the model under transformers 5.24's deprecated name
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated",
                                category=FutureWarning)
        trainer.train()
    return write_trl_train_results(out, cfg, loaded, trl_version=trl.__version__)


def write_trl_train_results(
    out: Path, cfg: TRLTrainConfig, loaded: Any, *, trl_version: str
) -> dict[str, Any]:
    """``results.json``, ``table.md``, ``train.png`` and (measured steps with diagnostics)
    ``diagnostics.png`` of a finished run, from its ``steps.jsonl`` and ``geometry.jsonl`` in
    ``out``; returns the ``results.json`` content."""
    from .weights import TRL_LOSS_AGGREGATION

    R = cfg.num_generations
    records = read_jsonl(out / "steps.jsonl")
    geo_path = out / "geometry.jsonl"
    geo_records = read_jsonl(geo_path) if geo_path.is_file() else []
    summary = summarize_rank(_rank_like(geo_records, R), estimator="trl", R_values=(R,))
    accs = [r["accuracy"] for r in records if r.get("accuracy") is not None]
    result = {
        **run_header("real_trl_train", cfg, loaded),
        "trl_version": trl_version,
        "loss_type": cfg.loss_type,
        "aggregation": TRL_LOSS_AGGREGATION.get(cfg.loss_type, (None, None))[0],
        "estimator": "trl",
        "accuracy": float(np.mean(accs)) if accs else None,
        "steps_done": len(records),
        "steps": records,
        "summary": summary,
        "issues": sorted({i for r in geo_records for i in r.get("issues", [])}),
        "skipped_steps": [r["step"] for r in geo_records if r.get("skipped")],
    }
    write_json(out / "results.json", result)
    title = (f"TRL GRPO ({cfg.loss_type}, scale_rewards={cfg.scale_rewards}), "
             f"R={R}: all measured mixed groups")
    atomic_write_text(
        out / "table.md",
        train_table_markdown(records, (R,)) + "\n" + rank_table_markdown(summary, title=title),
    )
    train_figure(out / "train.png", records, (R,))
    if has_diagnostics(records):
        diagnostics_figure(out / "diagnostics.png", records,
                           title=f"TRL GRPO ({cfg.loss_type}), R={R}")
    return result
