"""``grpo-audit frameworks``: run TRL's, verl's and OpenRLHF's own code against ``grpo_theory``.

Where a framework is importable (or its source is given with ``--source``: a wheel, a directory
or one of its files) the command runs its own advantage and loss code in its training dtype on
a fixed battery (:func:`framework_checks.battery.battery`) and prints a Markdown table of
agreements and discrepancies (max abs diff, the smallest input that shows each), with the version
it ran, under a one-paragraph conclusion; ``--out DIR`` also writes ``frameworks.md`` and
``frameworks.json``. A framework that is not installed is read from its pinned wheel, fetched
once into the user cache after one line says so (:mod:`framework_checks.fetch`;
``--no-download``: name the fix instead). The audit itself is :mod:`framework_checks.audit`;
this module stays cheap to import (no numpy at import time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    """Entry point of ``grpo-audit frameworks`` (``--out DIR`` is locked for the whole run).
    The options are checked before anything is written."""
    from grpo_io.options import check_path

    if args.source and not args.framework:
        raise ValueError("--source needs --framework (which framework the source belongs to)")
    _require_torch()
    if args.source:
        from .source import FrameworkCodeError, find_source

        check_path(args.source, "file_or_folder", option="--source")
        try:  # the source read (archive, UTF-8 text) before anything is written
            find_source(args.framework, args.source)
        except FrameworkCodeError as exc:
            raise ValueError(str(exc)) from None
    if args.out:
        check_path(args.out, "out_folder", option="--out")
    if args.out:
        from grpo_io import lock_out_dir, prepare_out_dir

        prepare_out_dir(args.out)
        with lock_out_dir(args.out, purpose="frameworks"):
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from grpo_io import atomic_write_text, environment, write_json

    from .audit import audit_framework
    from .report import render_markdown
    from .source import FRAMEWORKS, FrameworkCodeError

    chosen = [args.framework] if args.framework else list(FRAMEWORKS)
    reports, skipped = [], []
    for fw in chosen:
        try:
            reports.append(audit_framework(fw, args.source, dtype=args.dtype,
                                           download=not args.no_download,
                                           say=_say))
        except FrameworkCodeError as exc:
            if args.framework:
                raise ValueError(str(exc)) from exc
            skipped.append(f"{fw}: {exc}")
    text = "\n".join(render_markdown(r) for r in reports)
    if skipped:
        text += "\nskipped: " + "; ".join(skipped) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "frameworks.md", text)
        env = environment(libraries=("numpy", "torch", *FRAMEWORKS))
        write_json(
            out / "frameworks.json",
            {"reports": reports, "skipped": skipped, "environment": env},
            indent=1,
        )
    return 0 if reports else 2


def _say(line: str) -> None:
    """A status line (a download): on stderr, so stdout stays the report."""
    print(line, file=sys.stderr, flush=True)


def _require_torch() -> None:
    """The frameworks' code runs on torch tensors: without torch, one line says what to do."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ValueError(
            "frameworks runs each framework's own torch code, and torch is not installed here; "
            "install it first (CPU-only build: pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu; the README's table lists the others)"
        )


def register(subparsers: Any) -> None:
    """Add ``frameworks`` to the ``grpo-audit`` command line."""
    from .source import FRAMEWORKS  # stdlib only
    p = subparsers.add_parser(
        "frameworks",
        help="run TRL/verl/OpenRLHF's own advantage and loss code against grpo_theory",
        description="Run each framework's own advantage and loss code (its installed package, "
        "or --source) against grpo_theory on a fixed battery; print a table.",
    )
    p.add_argument("--framework", choices=list(FRAMEWORKS), default=None)
    p.add_argument(
        "--source",
        default=None,
        help="the framework's source: a .whl, a directory, or one of its files "
        "(default: the installed package)",
    )
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument(
        "--no-download",
        action="store_true",
        help="never fetch a framework that is not installed (default: its pinned wheel is "
        "downloaded once into the user cache, source only, after saying so)",
    )
    p.add_argument("--out", default=None, help="directory for frameworks.md and frameworks.json")
    p.set_defaults(func=run)
