"""``grpo-audit tables KIND``: print exact bound/tail tables (Markdown, CSV or LaTeX).

``KIND`` is a sub-subcommand. This module adds the kinds of :mod:`grpo_theory.tables`
(hoeffding, chebyshev, bernstein, exact-baseline-tail, exact-advantage-tail) and then lets
``paper_checks.cli.register_tables(tables_subparsers)`` add its own (``appendix-a2``, ``table1``)
when that function exists. Cheap to import: numpy/sympy are imported inside the handler.

Example::

    grpo-audit tables hoeffding --R 2 4 8 16 --eps 0.3 0.2 0.1 --format md
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register", "TABLE_KINDS", "add_common_table_arguments"]

TABLE_KINDS: dict[str, str] = {
    "hoeffding": "Hoeffding bound on P(|v_hat_R - v| > eps) (Appendix A.2)",
    "chebyshev": "Chebyshev bound on P(|A_i| > eps) (Thm 4.1(iv)); needs --sigma2 or --p",
    "bernstein": "Bernstein bound on P(|v_hat_R - v| > eps); needs --sigma2 or --p",
    "exact-baseline-tail": "exact P(|v_hat_R - p| > eps), Bernoulli(p); sup over p without --p",
    "exact-advantage-tail": "exact P(|A_1| > eps), Bernoulli(p), --estimator (default grpo)",
}


def add_common_table_arguments(p: argparse.ArgumentParser) -> None:
    """``--R``, ``--eps``, ``--format``, ``--digits``, ``--out`` (shared by every table kind)."""
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
    from .tables import bound_table

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
        text = json.dumps(table.as_dict(), indent=2) + "\n"
    else:
        text = table.render(args.format, digits=args.digits)
    print(text, end="")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


def register(sub: Any) -> None:
    """Add ``tables`` with one sub-subcommand per kind, then the audit's kinds if available."""
    p = sub.add_parser(
        "tables",
        help="print exact bound/tail tables (Markdown, CSV, LaTeX)",
        description="Tables with rows R and columns eps; cells >= 1 are flagged vacuous.",
    )
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
    try:
        from paper_checks import cli as audit_cli
    except ImportError:  # pragma: no cover - paper_checks is part of this distribution
        return
    reg = getattr(audit_cli, "register_tables", None)
    if callable(reg):
        reg(tables_sub)
