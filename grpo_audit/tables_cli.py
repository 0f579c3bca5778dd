"""``grpo-audit tables KIND``: print exact bound/tail tables (Markdown, CSV, LaTeX or JSON).

``KIND`` is a sub-subcommand. The kinds and their descriptions have one source,
:data:`grpo_theory.tables.TABLE_KINDS` (plus :data:`paper_checks.cli.TABLE_KINDS`, the audit's own
``appendix-a2`` and ``table1``). So that ``grpo-audit --help`` stays cheap (no numpy), the
``tables`` parser registered on the top-level parser is a placeholder (it lists ``tables`` in the
help), and
:func:`grpo_audit.cli.main` hands everything after ``tables`` to :func:`run`, which builds the full
``tables`` parser (one sub-subcommand per kind, importing :mod:`grpo_theory.tables`), so
``grpo-audit tables --help`` and ``grpo-audit tables KIND --help`` work as usual.

Example::

    grpo-audit tables hoeffding --R 2 4 8 16 --eps 0.3 0.2 0.1 --format md
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register", "run", "build_tables_parser", "add_common_table_arguments"]


def add_common_table_arguments(p: argparse.ArgumentParser) -> None:
    """``--R``, ``--eps``, ``--format``, ``--digits``, ``--out`` (shared by every core kind)."""
    p.add_argument("--R", type=int, nargs="+", default=[2, 4, 8, 16], help="group sizes (rows)")
    p.add_argument(
        "--eps", type=float, nargs="+", default=[0.3, 0.2, 0.1], help="thresholds (columns)"
    )
    p.add_argument("--format", choices=["md", "csv", "latex", "json"], default="md")
    p.add_argument("--digits", type=int, default=3, help="significant digits (md, latex)")
    p.add_argument("--out", default=None, help="also write the table to this file")


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _handler(args: argparse.Namespace) -> int:
    from grpo_io import dumps
    from grpo_theory.tables import bound_table

    from .render import render_bound_table

    opts: dict[str, Any] = {}
    for item in getattr(args, "option", None) or []:
        if "=" not in item:
            raise ValueError(f"--option must look like NAME=VALUE, got {item!r}")
        key, val = item.split("=", 1)
        opts[key] = _option_value(val)
    table = bound_table(
        args.table_kind,
        R_values=args.R,
        eps_values=args.eps,
        digits=args.digits,
        sigma2=getattr(args, "sigma2", None),
        p=getattr(args, "p", None),
        width=getattr(args, "width", 1.0),
        estimator=getattr(args, "estimator", "grpo"),
        estimator_options=opts,
    )
    if args.format == "json":
        text = dumps(table.as_dict(), indent=2) + "\n"
    else:
        text = render_bound_table(table, args.format, digits=args.digits)
    print(text, end="")
    if args.out:
        from grpo_io.paths import write_out_file

        write_out_file(args.out, text)
    return 0


_DESCRIPTION = "Tables with rows R and columns eps; cells >= 1 are flagged vacuous."


def build_tables_parser(prog: str = "grpo-audit tables") -> argparse.ArgumentParser:
    """The full ``tables`` parser: one sub-subcommand per kind (imports the core's tables)."""
    from grpo_theory.tables import TABLE_KINDS

    p = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION)
    tables_sub = p.add_subparsers(dest="table_kind", metavar="KIND")
    tables_sub.required = True
    for kind, help_text in TABLE_KINDS.items():
        k = tables_sub.add_parser(kind, help=help_text, description=help_text)
        add_common_table_arguments(k)
        if kind in ("hoeffding", "bernstein"):
            k.add_argument("--width", type=float, default=1.0, help="reward range (default 1)")
        if kind in ("chebyshev", "bernstein"):
            g = k.add_mutually_exclusive_group(required=True)
            g.add_argument("--sigma2", type=float, help="reward variance")
            g.add_argument("--p", type=float, help="Bernoulli p (sigma2 = p(1-p))")
        if kind == "exact-baseline-tail":
            k.add_argument("--p", type=float, default=None, help="Bernoulli p (omit: sup over p)")
        if kind == "exact-advantage-tail":
            k.add_argument("--p", type=float, required=True, help="Bernoulli p")
            k.add_argument("--estimator", default="grpo", help="registry name (default grpo)")
            k.add_argument(
                "--option",
                action="append",
                metavar="NAME=VALUE",
                help="estimator option, repeatable (e.g. --option ddof=0 --option eps=1e-4)",
            )
        k.set_defaults(func=_handler)
    from paper_checks import cli as audit_cli

    audit_cli.register_tables(tables_sub)
    return p


def run(argv: list[str]) -> int:
    """Parse ``argv`` (what follows ``grpo-audit tables``) with the full parser and run it."""
    inner = build_tables_parser().parse_args(argv)
    return int(inner.func(inner) or 0)


def _dispatch(args: argparse.Namespace) -> int:
    return run(args.tables_argv)


def register(sub: Any) -> None:
    """Add ``tables`` to the top-level parser; its kinds are parsed when it runs."""
    p = sub.add_parser(
        "tables",
        help="print exact bound/tail tables (Markdown, CSV, LaTeX); "
        "'grpo-audit tables --help' lists the kinds",
        description=_DESCRIPTION,
        add_help=False,
    )
    p.add_argument("tables_argv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_dispatch)
