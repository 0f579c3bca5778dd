"""``grpo-audit``: the command-line entry point (``python -m grpo_audit`` does the same).

Each package contributes its subcommands through a ``register(subparsers)`` function in its own
``cli.py`` (``sims.cli``, ``paper_checks.cli``, ``real_model.cli``, ``framework_checks.cli``);
those modules must stay cheap
to import (no numpy/torch/sympy/matplotlib at import time), so that ``grpo-audit --help`` is fast
(``tests/test_package_layering.py`` guards the real entry point). ``grpo-audit tables KIND`` is this
package's own command (:mod:`grpo_audit.tables_cli`): it renders the core's tables.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


class _VersionAction(argparse.Action):
    """``--version``: looks the version up (one source: the distribution metadata) when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from . import package_version

        print(f"grpo-audit {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every package's subcommands."""
    from framework_checks import cli as frameworks_cli
    from paper_checks import cli as audit_cli
    from real_model import cli as real_cli
    from sims import cli as sims_cli

    from . import tables_cli

    parser = argparse.ArgumentParser(
        prog="grpo-audit",
        description="Theory-verification library for GRPO: exact tables, toy-world simulations, "
        "real-model gradient geometry and the proof audit of arXiv 2606.29238.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the package version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    tables_cli.register(sub)
    sims_cli.register(sub)
    audit_cli.register(sub)
    real_cli.register(sub)
    frameworks_cli.register(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (an ``OSError`` with its file name and reason)."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror.lower()}"
    return " ".join(str(exc).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["tables"]:  # parsed by the full tables parser (see grpo_audit.tables_cli)
            from . import tables_cli

            return tables_cli.run(argv[1:])
        args = build_parser().parse_args(argv)
        code = args.func(args)
    except (ValueError, TypeError, OSError) as exc:  # OSError: e.g. the disk filled up mid-run
        print(f"grpo-audit: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
