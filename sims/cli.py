"""``grpo-audit sims``: run one toy-world experiment, or list them.

``grpo-audit sims <experiment> --out DIR [--seed N] [--quick]`` writes ``results.json``,
``table.md`` and ``figure.png`` into ``DIR`` and exits 1 when any check fails (0 when all pass);
``grpo-audit sims list`` prints the experiments.
Cheap to import: numpy, scipy and matplotlib are imported inside the handler.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register", "EXPERIMENT_NAMES"]

#: Names of :data:`sims.experiments.EXPERIMENTS` (kept here so the parser needs no heavy import).
EXPERIMENT_NAMES = ("moments", "unbiasedness", "multiturn", "spectra", "training", "tails")


def _run(args: argparse.Namespace) -> int:
    if args.experiment == "list":
        from .experiments import EXPERIMENTS

        for name, fn in EXPERIMENTS.items():
            doc = (fn.__doc__ or "").strip().splitlines()[0]
            print(f"{name:14s} {doc}")
        return 0
    if args.out is None:
        raise ValueError("grpo-audit sims: --out DIR is required to run an experiment")
    from grpo_io.paths import prepare_out_dir

    args.out = str(prepare_out_dir(args.out))
    import matplotlib

    matplotlib.use("Agg")
    from ._stats import Z_THRESHOLD
    from .experiments import run_experiment

    res = run_experiment(args.experiment, args.out, seed=args.seed, quick=args.quick)
    n, ok = res.get("n_checks", 0), res.get("n_passed", 0)
    print(
        f"sims {args.experiment}: {ok}/{n} checks passed (k={Z_THRESHOLD:g}); wrote results.json, "
        f"table.md, figure.png to {args.out} in {res['wall_time_s']:.1f} s"
    )
    if ok < n:
        failed = [c["name"] for c in res.get("checks", []) if not c.get("passed", True)]
        print(f"sims {args.experiment}: FAILED: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def register(sub: Any) -> None:  # argparse subparsers action
    """Add ``grpo-audit sims`` to the ``grpo-audit`` parser."""
    p = sub.add_parser(
        "sims",
        help="toy-world Monte Carlo experiments with exact ground truth",
        usage="grpo-audit sims EXPERIMENT --out DIR [--seed N] [--quick]\n"
        "       grpo-audit sims list",
    )
    p.add_argument(
        "experiment", choices=(*EXPERIMENT_NAMES, "list"), help="experiment to run, or 'list'"
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output folder, created if missing (required unless EXPERIMENT is 'list')",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--quick", action="store_true", help="small version (a few seconds)")
    p.set_defaults(func=_run)
