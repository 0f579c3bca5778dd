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

from .parser import Parser, printable

__all__ = ["Parser", "build_parser", "main", "entry", "check_common_options", "printable"]


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

    parser = Parser(
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
        return printable(f"{exc.filename}: {exc.strerror.lower()}")
    return printable(" ".join(str(exc).split()))


#: The largest seed (numpy and torch both take it).
MAX_SEED = 2**63 - 1


def check_common_options(args: argparse.Namespace) -> None:
    """The options several commands share, checked before the command runs (nothing written):
    ``--seed`` an integer in ``[0, 2^63 - 1]``, and a command's output folder ``--out`` usable
    (:func:`grpo_io.options.check_path`: a UTF-8 name, not a file, a writable parent). The
    real-model commands and ``tables`` check their options from their dataclasses."""
    from grpo_io.options import check_path

    seed = getattr(args, "seed", None)
    if seed is not None and not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"--seed {seed}: must be an integer >= 0 and <= {MAX_SEED}")
    out = getattr(args, "out", None)
    if out is not None and getattr(args, "command", None) in ("audit", "sims", "frameworks"):
        check_path(out, "out_folder", option="--out")


#: What to do after Ctrl-C, per command (one line; the command exits with status 130).
INTERRUPTED = {
    "real rank": "interrupted; rerun the same command to resume",
    "real train": "interrupted; rerun the same command to resume",
    "real trl-train": "interrupted; real trl-train does not resume (TRL keeps no checkpoint "
                      "here): rerun the same command with --overwrite to start again",
}
#: Ctrl-C in any other command (their files are written whole or not at all).
INTERRUPTED_OTHER = "interrupted; files already written are whole; rerun the same command"


def _interrupted(argv: Sequence[str]) -> str:
    words = [a for a in argv[:2] if not a.startswith("-")]
    return INTERRUPTED.get(" ".join(words), INTERRUPTED_OTHER)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit code (0 done, 1 a check
    failed where the command says so, 2 an error: one line on stderr, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["tables"]:  # parsed by the full tables parser (see grpo_audit.tables_cli)
            from . import tables_cli

            inner = tables_cli.build_tables_parser().parse_args(argv[1:])
            check_common_options(inner)
            return int(inner.func(inner) or 0)
        args = build_parser().parse_args(argv)
        check_common_options(args)
        code = args.func(args)
    except KeyboardInterrupt:
        print(f"grpo-audit: {_interrupted(argv)}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, ImportError) as exc:  # OSError: e.g. a full disk
        print(f"grpo-audit: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return int(code or 0)


def entry() -> int:
    """The ``grpo-audit`` console script and ``python -m grpo_audit``: :func:`main`, and after an
    interrupt (status 130) SIGINT is ignored until the process exits, so that a second Ctrl-C
    cannot turn the clean exit into a traceback or a death by signal."""
    code = main()
    if code == 130:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(entry())
