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
from dataclasses import dataclass
from typing import Any

from grpo_io.options import add_options, check_path, from_args, option, validate

__all__ = ["register", "run", "build_tables_parser", "add_common_table_arguments", "TableOptions"]


@dataclass(frozen=True)
class TableOptions:
    """Options of ``grpo-audit tables KIND`` (each kind takes the common ones and its own)."""

    R_values: tuple[int, ...] = option((2, 4, 8, 16), help="group sizes (rows)", ge=1,
                                       flag="--R")
    eps: tuple[float, ...] = option((0.3, 0.2, 0.1), help="thresholds (columns)", gt=0)
    format: str = option("md", help="output format", choices=("md", "csv", "latex", "json"))
    digits: int = option(3, help="significant digits (md, latex)", ge=1, le=17)
    out: str | None = option(None, help="also write the table to this file", path="out_file")
    width: float = option(1.0, help="reward range", gt=0)
    sigma2: float | None = option(None, help="reward variance", ge=0)
    p: float | None = option(None, help="Bernoulli p (chebyshev, bernstein: sigma2 = p(1-p); "
                             "exact-baseline-tail: omit for the sup over p)", ge=0, le=1)
    estimator: str = option("grpo", help="grpo_theory registry name")

    def __post_init__(self) -> None:
        validate(self)


#: The options every core kind takes.
COMMON = ("R_values", "eps", "format", "digits", "out")


def add_common_table_arguments(p: argparse.ArgumentParser) -> None:
    """``--R``, ``--eps``, ``--format``, ``--digits``, ``--out`` (shared by every core kind)."""
    add_options(p, TableOptions, only=COMMON)


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _handler(args: argparse.Namespace) -> int:
    from grpo_io import dumps
    from grpo_theory.tables import bound_table

    from .render import render_bound_table

    cfg = from_args(TableOptions, args)  # every value checked as it is built
    if cfg.out is not None:
        check_path(cfg.out, "out_file", option="--out")
    opts: dict[str, Any] = {}
    for item in getattr(args, "option", None) or []:
        if "=" not in item:
            raise ValueError(f"--option must look like NAME=VALUE, got {item!r}")
        key, val = item.split("=", 1)
        if key in opts:
            raise ValueError(f"--option {key} is given twice; give each option once")
        opts[key] = _option_value(val)
    table = bound_table(
        args.table_kind,
        R_values=cfg.R_values,
        eps_values=cfg.eps,
        digits=cfg.digits,
        sigma2=cfg.sigma2,
        p=cfg.p,
        width=cfg.width,
        estimator=cfg.estimator,
        estimator_options=opts,
    )
    if cfg.format == "json":
        text = dumps(table.as_dict(), indent=2) + "\n"
    else:
        text = render_bound_table(table, cfg.format, digits=cfg.digits)
    print(text, end="")
    if cfg.out:
        from grpo_io.paths import write_out_file

        write_out_file(cfg.out, text)
    return 0


_DESCRIPTION = "Tables with rows R and columns eps; cells >= 1 are flagged vacuous."


def build_tables_parser(prog: str = "grpo-audit tables") -> argparse.ArgumentParser:
    """The full ``tables`` parser: one sub-subcommand per kind (imports the core's tables)."""
    from grpo_theory.tables import TABLE_KINDS

    from .parser import Parser

    p = Parser(prog=prog, description=_DESCRIPTION)
    tables_sub = p.add_subparsers(dest="table_kind", metavar="KIND")
    tables_sub.required = True
    for kind, help_text in TABLE_KINDS.items():
        k = tables_sub.add_parser(kind, help=help_text, description=help_text)
        add_common_table_arguments(k)
        if kind in ("hoeffding", "bernstein"):
            add_options(k, TableOptions, only=("width",))
        if kind in ("chebyshev", "bernstein"):
            g = k.add_mutually_exclusive_group(required=True)
            add_options(g, TableOptions, only=("sigma2", "p"))  # type: ignore[arg-type]
        if kind == "exact-baseline-tail":
            add_options(k, TableOptions, only=("p",))
        if kind == "exact-advantage-tail":
            add_options(k, TableOptions, only=("p", "estimator"), required=("p",))
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
