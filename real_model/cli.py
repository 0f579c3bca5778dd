"""``grpo-audit real rank|train|trl-train`` and ``grpo-audit compare`` (cheap to import: no numpy,
no torch here).

Each command's options are generated from its config dataclass (:mod:`real_model.config`: names,
defaults, help and checks declared once, :func:`grpo_io.options.add_options`); the command adds
only what is not part of a run's configuration (``--out``, ``--overwrite``, ``--no-progress``,
``--cache-dir``). Every option, path, data file and the model's files are checked before anything
is loaded or written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from grpo_io.options import add_options, check_path, from_args

from .config import CompareConfig, RankConfig, TrainConfig, TRLTrainConfig

__all__ = ["register"]


def _run_args(p: argparse.ArgumentParser, cls: type) -> None:
    """``--out`` and the options of ``cls``, then ``--overwrite`` and ``--no-progress``."""
    p.add_argument("--out", required=True, help="output folder (created; reruns resume)")
    add_options(p, cls)
    p.add_argument("--overwrite", action="store_true", help="discard earlier results in --out")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _use_agg() -> None:
    import matplotlib

    matplotlib.use("Agg")


def _rank(args: argparse.Namespace) -> int:
    cfg = from_args(RankConfig, args)  # every value checked as it is built
    check_path(args.out, "out_folder", option="--out")
    cfg.validate(model=True)  # data, device, estimators, model found: before anything is written
    _use_agg()
    from .rank import run_rank

    res = run_rank(args.out, cfg, progress=not args.no_progress, overwrite=args.overwrite)
    print((Path(args.out) / "table.md").read_text(encoding="utf-8"))
    print(
        f"wrote {args.out}/results.jsonl, results.json, table.md, rank.png "
        f"({res['num_groups']} groups)"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    cfg = from_args(TrainConfig, args)
    _use_agg()
    from .train import run_train

    res = run_train(  # checks --out, --cache-dir, the data and the model before any write
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
        f"wrote {args.out}/steps.jsonl, results.json, table.md, train.png{_diagnostics(args.out)} "
        f"({res['steps_done']} steps)"
    )
    return 0


def _diagnostics(out: str) -> str:
    """``", diagnostics.png"`` when the run drew it (steps with the training diagnostics)."""
    return ", diagnostics.png" if (Path(out) / "diagnostics.png").exists() else ""


def _trl_train(args: argparse.Namespace) -> int:
    cfg = from_args(TRLTrainConfig, args)
    _use_agg()
    from .integrations.trl.train import run_trl_train

    # checks the extras, --out, the data and the model before any write
    res = run_trl_train(args.out, cfg, progress=not args.no_progress, overwrite=args.overwrite)
    print((Path(args.out) / "table.md").read_text(encoding="utf-8"))
    print(
        f"wrote {args.out}/steps.jsonl, geometry.jsonl, results.json, table.md, train.png"
        f"{_diagnostics(args.out)} ({res['steps_done']} steps)"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    cfg = from_args(CompareConfig, args)
    check_path(args.out, "out_folder", option="--out")
    if cfg.real is not None:
        check_path(cfg.real, "file", option="--real")
        from .run_io import read_results

        read_results(Path(cfg.real))  # the whole file checked before anything is written
    _use_agg()
    from grpo_io.paths import prepare_out_dir

    from .compare import run_compare

    prepare_out_dir(args.out)
    res = run_compare(args.out, real=cfg.real, R_values=cfg.R_values, p=cfg.p)
    print(res["table_md"])
    also = ", diagnostics.png" if res.get("diagnostics_figure") else ""
    print(f"wrote {args.out}/compare.json, compare.md, compare.png{also}")
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
    _run_args(rank, RankConfig)
    rank.set_defaults(func=_rank)

    train = rsub.add_parser(
        "train", help="GRPO updates, recording the spectra per step (resumable)"
    )
    _run_args(train, TrainConfig)
    train.add_argument(
        "--cache-dir",
        default=None,
        help="checkpoint folder (~1.6 GB for SmolLM2; default: $GRPO_AUDIT_CACHE/train/<id> or "
        "~/.cache/grpo-audit/train/<id>, outside --out; recorded in OUT/checkpoint.json)",
    )
    train.set_defaults(func=_train)

    trl = rsub.add_parser(
        "trl-train",
        help="GRPO with TRL's GRPOTrainer, exact gradient geometry per step (needs the trl extra)",
    )
    _run_args(trl, TRLTrainConfig)
    trl.set_defaults(func=_trl_train)

    cmp_ = sub.add_parser("compare", help="toy worlds' rank behaviour beside the real model's")
    cmp_.add_argument("--out", required=True, help="output folder")
    add_options(cmp_, CompareConfig)
    cmp_.set_defaults(func=_compare)
