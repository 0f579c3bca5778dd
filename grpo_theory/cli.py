"""``grpo-audit``: the command-line entry point.

Each package contributes its subcommands through a ``register(subparsers)`` function in its own
``cli.py`` (``sims.cli``, ``paper_checks.cli``, ``real_model.cli``); those modules must stay cheap
to import (no torch/transformers at import time). ``grpo-audit tables KIND`` is shared: the kinds
of :data:`grpo_theory.tables_cli.TABLE_KINDS` are sub-subcommands, and
``paper_checks.cli.register_tables(tables_subparsers)`` adds the audit's own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every package's subcommands."""
    from . import tables_cli

    parser = argparse.ArgumentParser(
        prog="grpo-audit",
        description="Theory-verification library for GRPO: exact tables, toy-world simulations, "
        "real-model gradient geometry and the proof audit of arXiv 2606.29238.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    tables_cli.register(sub)
    from sims import cli as sims_cli

    sims_cli.register(sub)
    from paper_checks import cli as audit_cli

    audit_cli.register(sub)
    from real_model import cli as real_cli

    real_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"grpo-audit: error: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
