"""Regenerate the tables of ``docs/performance.md`` from the benchmark scripts.

The page is a sequence of blocks. Each block's specification is an HTML comment, invisible in the
rendered page; what follows it up to ``<!-- performance:end -->`` is generated::

    <!-- performance:begin name=trl-inrun collect=table
    run: OMP_NUM_THREADS=2 python benchmarks/bench_trl_geometry.py --rounds 10
    note: one line printed under the table, kept when the table is regenerated
    -->
    **Command**: `OMP_NUM_THREADS=2 python benchmarks/bench_trl_geometry.py --rounds 10`
    **Machine**: ...
    **Measured**: 2026-11-24

    | the table |
    <!-- performance:end -->

``python benchmarks/performance.py NAME ...`` runs the ``run:`` commands of the named blocks
from the repository root (``PYTHONPATH`` set to it), turns their output into one Markdown table
(``collect=``: ``table``, the last Markdown table the command printed; ``verl``, the mode table
of ``bench_verl_geometry.py``; ``time``, the wall time, CPU time and peak memory of each command)
and rewrites those blocks with the machine and today's date. Several ``run:`` lines give one table
with the command's arguments as its first column. ``--from-output NAME FILE ...`` takes the
outputs from files instead (one per ``run:`` line, e.g. the logs of ``benchmarks/gpu.sh``), with
``--machine`` and ``--date`` saying where and when they ran. ``--list`` lists the blocks;
``--check`` validates the page. Nothing is written unless every command of a block succeeded.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
BEGIN = re.compile(r"<!-- performance:begin (?P<head>[^\n]*)\n(?P<spec>.*?)-->\n(?P<body>.*?)"
                   r"<!-- performance:end -->", re.S)
COLLECTORS = ("table", "verl", "time")


@dataclass
class Block:
    """One block of the page: its name, how its output is collected, its commands and notes."""

    name: str
    collect: str
    runs: list[str]
    notes: list[str] = field(default_factory=list)
    body: str = ""


def parse_page(text: str) -> list[Block]:
    """The blocks of a performance page, in order; a malformed block is a ``ValueError``.

    >>> page = ("<!-- performance:begin name=x collect=time\\nrun: true\\n-->\\n"
    ...         "body\\n<!-- performance:end -->\\n")
    >>> [(b.name, b.collect, b.runs, b.body) for b in parse_page(page)]
    [('x', 'time', ['true'], 'body\\n')]
    """
    blocks = []
    for m in BEGIN.finditer(text):
        head = dict(kv.split("=", 1) for kv in m["head"].split())
        name, collect = head.get("name", ""), head.get("collect", "table")
        if not re.fullmatch(r"[a-z0-9-]+", name):
            raise ValueError(f"performance block without a name=[a-z0-9-]+: {m['head']!r}")
        if collect not in COLLECTORS:
            raise ValueError(f"block {name}: collect={collect!r}, not one of {COLLECTORS}")
        lines = [line.strip() for line in m["spec"].splitlines() if line.strip()]
        bad = [line for line in lines if not line.startswith(("run:", "note:"))]
        if bad:
            raise ValueError(f"block {name}: a specification line is not 'run:' or 'note:': "
                             f"{bad[0]!r}")
        runs = [line[4:].strip() for line in lines if line.startswith("run:")]
        if not runs:
            raise ValueError(f"block {name}: no 'run:' line")
        notes = [line[5:].strip() for line in lines if line.startswith("note:")]
        blocks.append(Block(name, collect, runs, notes, m["body"]))
    names = [b.name for b in blocks]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate block names in {names}")
    return blocks


# --- collectors: a command's output -> (header, rows) --------------------------------------------
def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def markdown_table(output: str) -> tuple[list[str], list[list[str]]]:
    """The last Markdown table in ``output``: its header and rows.

    >>> markdown_table("x\\n| a | b |\\n|---|---:|\\n| 1 | 2 |\\n| 3 | 4 |\\ndone")
    (['a', 'b'], [['1', '2'], ['3', '4']])
    """
    tables, current = [], []
    for line in [*output.splitlines(), ""]:
        if line.strip().startswith("|") and line.strip().endswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    tables = [t for t in tables if len(t) >= 3 and re.fullmatch(r"[|:\-\s]+", t[1].strip())]
    if not tables:
        raise ValueError("no Markdown table in the command's output")
    header, *rows = [_cells(line) for line in tables[-1][:1] + tables[-1][2:]]
    return header, rows


def verl_table(output: str) -> tuple[list[str], list[list[str]]]:
    """The mode table of ``bench_verl_geometry.py``: its fixed-width lines after the
    ``mode  median step s ...`` header, as Markdown cells.

    >>> out = ("mode                     median step s   vs off  mean step s   vs off   paired in "
    ...        "rounds (95% interval)\\n"
    ...        "off                             0.0500   1.000x       0.0510   1.000x   1.000x "
    ...        "(1.000-1.000)\\n"
    ...        "in-run                          0.0577   1.153x       0.0590   1.157x   1.153x "
    ...        "(1.123-1.167)\\n(ratios: ...)")
    >>> verl_table(out)[1][1]
    ['in-run', '0.0577', '1.153x', '0.0590', '1.157x', '1.153x (1.123-1.167)']
    """
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("mode ")
                  and "median step s" in line), None)
    if start is None:
        raise ValueError("no mode table (a line 'mode  median step s ...') in the output")
    rows = []
    pattern = re.compile(r"(?P<mode>.+?)\s+(?P<med>[\d.]+)\s+(?P<r1>[\d.]+x)\s+(?P<mean>[\d.]+)"
                         r"\s+(?P<r2>[\d.]+x)\s+(?P<paired>[\d.]+x \([\d.]+-[\d.]+\))$")
    for line in lines[start + 1:]:
        m = pattern.fullmatch(line.strip())
        if not m:
            break
        rows.append([m["mode"], m["med"], m["r1"], m["mean"], m["r2"], m["paired"]])
    if not rows:
        raise ValueError("the mode table of the output has no rows")
    header = ["mode", "median step (s)", "vs off", "mean step (s)", "vs off (means)",
              "paired in rounds (95%)"]
    return header, rows


def stack(tables: Sequence[tuple[str, tuple[list[str], list[list[str]]]]]
          ) -> tuple[list[str], list[list[str]]]:
    """One table from several commands' tables (same header): a first column names each row's
    command arguments. One table is returned as it is.

    >>> stack([("--a 1", (["x"], [["1"]])), ("--a 2", (["x"], [["2"]]))])
    (['arguments', 'x'], [['`--a 1`', '1'], ['`--a 2`', '2']])
    """
    if len(tables) == 1:
        return tables[0][1]
    header = tables[0][1][0]
    if any(t[1][0] != header for t in tables):
        raise ValueError("the commands of one block printed tables with different columns")
    return ["arguments", *header], [[f"`{args}`", *row] for args, (_, rows) in tables
                                    for row in rows]


def arguments(command: str) -> str:
    """What follows the script (or the ``grpo-audit`` subcommand) in a command.

    >>> arguments("OMP_NUM_THREADS=2 python benchmarks/bench_gram.py --R 8 --tokens 256")
    '--R 8 --tokens 256'
    """
    words = shlex.split(command)
    for i, w in enumerate(words):
        if w.endswith(".py") or w == "grpo-audit":
            return shlex.join(words[i + 1:]) or "(defaults)"
    return command


# --- running ------------------------------------------------------------------------------
SCRATCH = "/tmp/grpo-perf/"


def scratch_outputs(command: str) -> list[str]:
    """The ``--out`` folders of ``command`` under ``/tmp/grpo-perf/``: removed before a run, since
    the commands resume from what a folder holds (a second run would time the resume).

    >>> scratch_outputs("grpo-audit real rank --out /tmp/grpo-perf/rank --no-progress")
    ['/tmp/grpo-perf/rank']
    >>> scratch_outputs("grpo-audit audit --out runs/audit")
    []
    """
    words = shlex.split(command)
    return [w for flag, w in zip(words, words[1:], strict=False)
            if flag == "--out" and w.startswith(SCRATCH)]


def run_command(command: str, collect: str) -> tuple[str, list[str]]:
    """Run ``command`` in a shell at the repository root, its scratch outputs removed first
    (:func:`scratch_outputs`); return its stdout and, for ``collect="time"``, the row
    ``[wall s, CPU s, peak MiB]``. A failure is a ``RuntimeError``."""
    for out in scratch_outputs(command):
        shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"`{command}` exited with {proc.returncode}; nothing was written")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.stdout, [f"{wall:.1f}", f"{cpu:.1f}", f"{after.ru_maxrss / 1024:.0f}"]


def collect_table(block: Block, outputs: Sequence[str],
                  timings: Sequence[list[str]] | None = None) -> tuple[list[str], list[list[str]]]:
    """The block's table from its commands' outputs (and, for ``collect="time"``, timings)."""
    if len(outputs) != len(block.runs):
        raise ValueError(f"block {block.name}: {len(block.runs)} commands, "
                         f"{len(outputs)} outputs")
    if block.collect == "time":
        if timings is None:
            raise ValueError(f"block {block.name} times its commands: run them, not --from-output")
        return (["command", "wall (s)", "CPU (s)", "peak memory (MiB)"],
                [[f"`{cmd}`", *t] for cmd, t in zip(block.runs, timings, strict=True)])
    parse = markdown_table if block.collect == "table" else verl_table
    return stack([(arguments(cmd), parse(out)) for cmd, out in zip(block.runs, outputs,
                                                                    strict=True)])


def _first(pattern: str, path: str) -> str | None:
    """The first group of ``pattern`` in the file at ``path``, or ``None``."""
    try:
        m = re.search(pattern, Path(path).read_text(encoding="utf-8"))
    except OSError:
        return None
    return m.group(1).strip() if m else None


def machine() -> str:
    """This machine in one line: CPU model and cores, memory, GPU, torch, load average."""
    cpu = _first(r"model name\s*:\s*(.+)", "/proc/cpuinfo") or platform.machine()
    parts = [f"{cpu}, {os.cpu_count()} cores"]
    kb = _first(r"MemTotal:\s*(\d+)", "/proc/meminfo")
    if kb:
        parts.append(f"{int(kb) / 2**20:.0f} GiB")
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        if gpu:
            parts.append(gpu.splitlines()[0])
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib import metadata

    try:
        parts.append(f"torch {metadata.version('torch')}")
    except metadata.PackageNotFoundError:
        pass
    parts.append(f"load average {os.getloadavg()[0]:.1f} at the start")
    return "; ".join(parts)


# --- rendering ----------------------------------------------------------------------------
def render_body(block: Block, header: list[str], rows: list[list[str]], *, machine_line: str,
                date: str) -> str:
    """The generated part of a block."""
    label = "Command" if len(block.runs) == 1 else "Commands"
    lines = [f"**{label}**: " + "; ".join(f"`{c}`" for c in block.runs),
             f"**Machine**: {machine_line}", f"**Measured**: {date}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if block.notes:
        lines += [""] + block.notes
    return "\n".join(lines) + "\n"


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with block ``name``'s generated part replaced by ``body``."""
    out, found = [], False
    pos = 0
    for m in BEGIN.finditer(text):
        if dict(kv.split("=", 1) for kv in m["head"].split()).get("name") == name:
            out += [text[pos:m.start("body")], body]
            pos, found = m.end("body"), True
    if not found:
        raise ValueError(f"no block named {name!r} in the page")
    return "".join(out) + text[pos:]


def check_body(block: Block) -> list[str]:
    """Problems of a block's generated part: the command, machine and date lines, and one
    well-formed table."""
    problems = []
    lines = block.body.splitlines()
    for label, pattern in (("Command", r"\*\*Commands?\*\*: .*`.+`.*"),
                           ("Machine", r"\*\*Machine\*\*: .+"),
                           ("Measured", r"\*\*Measured\*\*: \d{4}-\d{2}-\d{2}\b.*")):
        if not any(re.fullmatch(pattern, line) for line in lines):
            problems.append(f"block {block.name}: no '**{label}**' line")
    table = [line for line in lines if line.startswith("|")]
    if len(table) < 3 or not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", table[1].replace(" ", "")):
        problems.append(f"block {block.name}: no Markdown table (header, separator, rows)")
    else:
        width = len(_cells(table[0]))
        problems += [f"block {block.name}: row {i} has {len(_cells(row))} cells, the header "
                     f"{width}" for i, row in enumerate(table[1:], 1) if len(_cells(row)) != width]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="blocks to regenerate")
    ap.add_argument("--page", default=str(PAGE))
    ap.add_argument("--list", action="store_true", help="list the blocks and their commands")
    ap.add_argument("--check", action="store_true", help="validate the page and exit")
    ap.add_argument("--from-output", nargs="+", metavar="FILE",
                    help="the outputs of the one named block's commands, in order")
    ap.add_argument("--machine", default=None, help="the machine line (default: this machine)")
    ap.add_argument("--date", default=None, help="the date line (default: today)")
    a = ap.parse_args(argv)
    page = Path(a.page)
    text = page.read_text(encoding="utf-8")
    try:
        blocks = {b.name: b for b in parse_page(text)}
    except ValueError as exc:
        print(f"performance.py: {page}: {exc}", file=sys.stderr)
        return 2
    if a.list or a.check:
        problems = [p for b in blocks.values() for p in check_body(b)]
        if a.list:
            for b in blocks.values():
                print(f"{b.name} (collect={b.collect})\n" + "".join(f"  {r}\n" for r in b.runs))
        for p in problems:
            print(f"performance.py: {page}: {p}", file=sys.stderr)
        return 1 if problems else 0
    unknown = [n for n in a.names if n not in blocks]
    if not a.names or unknown:
        print(f"performance.py: name the blocks to regenerate (unknown: {unknown}); --list "
              f"lists them: {', '.join(blocks)}", file=sys.stderr)
        return 2
    if a.from_output and len(a.names) != 1:
        print("performance.py: --from-output takes the outputs of exactly one block",
              file=sys.stderr)
        return 2
    date = a.date or datetime.date.today().isoformat()
    for name in a.names:
        block = blocks[name]
        try:
            if a.from_output:
                outputs = [Path(f).read_text(encoding="utf-8") for f in a.from_output]
                header, rows = collect_table(block, outputs)
                machine_line = a.machine or machine()
            else:
                machine_line = a.machine or machine()  # before the commands: their load is not it
                done = [run_command(cmd, block.collect) for cmd in block.runs]
                header, rows = collect_table(block, [o for o, _ in done], [t for _, t in done])
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"performance.py: block {name}: {exc}", file=sys.stderr)
            return 1
        text = replace_block(text, name, render_body(block, header, rows,
                                                     machine_line=machine_line, date=date))
        tmp = page.with_name(page.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, page)  # never a half-written page
        print(f"performance.py: rewrote block {name} of {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
