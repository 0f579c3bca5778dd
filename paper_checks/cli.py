"""``grpo-audit audit`` and the audit's table kinds (``grpo-audit tables appendix-a2|table1``).

Cheap to import: numpy, sympy, matplotlib and the claim modules load inside the handlers.
"""

from __future__ import annotations

import argparse
from typing import Any

from .papers import DEFAULT_PAPER, papers

__all__ = ["register", "register_tables", "TABLE_KINDS"]

#: Table kinds this package adds to ``grpo-audit tables``.
#: ``--quick`` help.
QUICK_HELP = "smaller Monte Carlo samples (same claims and verdict rules; faster)"

TABLE_KINDS: dict[str, str] = {
    "appendix-a2": "App. A.2 table recomputed beside the paper's printed values, with exact tails",
    "table1": "Table 1 recomputed for toy worlds, with the feasible effective-rank range",
}


def _progress_line() -> Any:
    """A progress printer for a terminal (stderr is a tty): one line, rewritten in place, that
    says how many claims are done and which one runs; ``None`` elsewhere (nothing extra in a log
    or a pipe)."""
    import sys

    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int, cid: str) -> None:
        text = (f"checking claim {done + 1}/{total}: {cid}" if cid
                else f"{total}/{total} claims checked; writing figures and the report")
        print(f"\r\x1b[K{text}", end="" if cid else "\n", file=sys.stderr, flush=True)

    return show


def _audit(args: argparse.Namespace) -> int:
    import sys

    from .registry import REGISTRY, load_claims, ordered_ids
    from .report import run_audit

    if args.list:
        for cid in ordered_ids(args.paper):
            print(f"{cid}\t{REGISTRY[cid].kind}\t{REGISTRY[cid].location}")
        return 0
    if args.out is None:
        raise ValueError("--out DIR is required (unless --list)")
    if args.only:
        load_claims()
        bad = [i for i in args.only if i not in REGISTRY or REGISTRY[i].paper != args.paper]
        if bad:
            raise ValueError(f"--only: {bad} are not claims of --paper {args.paper} "
                             f"(see --list --paper {args.paper})")
        twice = sorted({i for i in args.only if args.only.count(i) > 1})
        if twice:
            print(f"grpo-audit: note: --only names {', '.join(twice)} more than once; each claim "
                  "is audited and written once", file=sys.stderr)
        args.only = list(dict.fromkeys(args.only))
    run = None
    if args.real is not None:
        from .papers import get_paper
        from .real_run import RealRunError, read_real_rank

        if not get_paper(args.paper).real_checks:
            raise RealRunError(f"--real: no claim of --paper {args.paper} is decided on a "
                               "real-model run")
        run = read_real_rank(args.real)  # checked before the output folder is made
    from grpo_io.paths import prepare_out_dir

    args.out = str(prepare_out_dir(args.out))
    results = run_audit(args.out, seed=args.seed, quick=args.quick, ids=args.only,
                        paper=args.paper, real=run, progress=_progress_line())
    from collections import Counter

    counts = Counter(r.verdict for r in results)
    width = max(len(r.id) for r in results)
    for r in results:
        real = f"  (real run: {r.real_run['verdict']})" if r.real_run else ""
        print(f"{r.id:<{width}}  {r.verdict}{real}")
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f"; total {len(results)}")
    print(f"wrote {args.out}/REPORT.md (key findings first), {args.out}/claims.json, "
          f"{args.out}/evidence/, {args.out}/claims_summary.csv|tex, {args.out}/figures/")
    return 0


def register(sub: Any) -> None:
    """Add ``grpo-audit audit --out DIR [--paper KEY] [--quick] [--seed N] [--only ID ...]
    [--list]``; the ``--paper`` keys are the registered papers (:mod:`paper_checks.papers`)."""
    registered = papers()
    keys = "{" + ",".join(registered) + "}"
    p = sub.add_parser(
        "audit",
        help=f"audit every checkable claim of arXiv {registered[DEFAULT_PAPER].arxiv} (or, with "
        "--paper, of another registered paper): claims.json, REPORT.md, figures",
        description="Check every registered claim of a paper by computation and write "
        "DIR/REPORT.md (the bottom line and the key findings first), DIR/claims.json, "
        "DIR/evidence/<claim>.csv, DIR/claims_summary.csv|tex and DIR/figures/*.png. On a "
        "terminal a progress line shows the claim being checked.",
        usage=f"grpo-audit audit --out DIR [--paper {keys}] [--quick] [--seed N] "
        "[--only ID [ID ...]] [--real FILE]\n"
        f"       grpo-audit audit --list [--paper {keys}]",
    )
    p.add_argument("--paper", choices=list(registered), default=DEFAULT_PAPER,
                   help="; ".join(f"{k}: {v.citation}" for k, v in registered.items())
                   + f" (default {DEFAULT_PAPER})")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output folder, created if missing (required unless --list)",
    )
    p.add_argument("--quick", action="store_true", help=QUICK_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of every random generator (default 0)")
    p.add_argument("--only", nargs="+", metavar="ID", default=None,
                   help="audit only these claims (a claim named twice is audited and written "
                   "once, with a note)")
    p.add_argument("--real", default=None, metavar="FILE",
                   help="results.json of a `grpo-audit real rank` run: the paper's measured claims "
                   "(seed paper: Table 1's effective rank ~2 and top-1 ranges) are also decided "
                   "on that model, beside the computed verdicts")
    p.add_argument("--list", action="store_true",
                   help="list the registered claim ids, kinds and locations (report order) and "
                   "exit")
    p.set_defaults(func=_audit)


def _table(args: argparse.Namespace) -> int:
    from .tables import appendix_a2_table, table1_toy

    if args.table_kind == "appendix-a2":
        tab = appendix_a2_table()
    else:
        tab = table1_toy(seed=args.seed, quick=not args.full)
    fmt = {"md": "md", "csv": "csv", "latex": "latex"}[args.format]
    text = tab.render(fmt)
    print(text, end="")
    if args.out:
        from grpo_io.paths import write_out_file

        write_out_file(args.out, text)
    return 0


def register_tables(tables_sub: Any) -> None:
    """Add the kinds of :data:`TABLE_KINDS` to the ``grpo-audit tables`` sub-subcommands."""
    for kind, help_text in TABLE_KINDS.items():
        k = tables_sub.add_parser(kind, help=help_text, description=help_text)
        k.add_argument("--format", choices=["md", "csv", "latex"], default="md")
        k.add_argument("--out", default=None, help="also write the table to this file")
        if kind == "table1":
            k.add_argument("--seed", type=int, default=0)
            k.add_argument("--full", action="store_true", help="more sampled groups")
        k.set_defaults(func=_table)
