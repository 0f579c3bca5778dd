"""The audit run: every registered claim of a paper checked, written as claims.json, REPORT.md,
per-claim evidence and figures.

``run_audit(out_dir, seed=0, quick=False, ids=None, paper="seed", real=None)`` writes:

* ``claims.json``: a list of objects, one per claim: ``id``, ``kind`` (what the verdict is about,
  :data:`paper_checks.registry.KINDS`), ``location``, ``claim``, ``check``, ``variants``,
  ``verdict``, ``evidence`` (named numbers, in full), ``correction``, ``conditions``, ``short``,
  ``undecided``, ``finding`` (the check's one-line result with its numbers), ``real_run`` (the
  verdict on a ``--real`` run, or ``null``), ``consequence_rank`` (1 = the most consequential,
  :mod:`paper_checks.findings`), ``paper``, ``figure``, ``evidence_csv``, ``seconds`` and
  ``grpo_audit`` (``{"version", "commit", "command"}``: the code that wrote it and the command
  that reproduces the run);
* ``REPORT.md``: findings first (:mod:`paper_checks.report_md`): the paper, the bottom line, the
  key findings ranked, the counts by kind and verdict, the real-model run, the run's record, then
  one short entry per claim, and the paper's regenerated tables;
* ``evidence/<claim_id>.csv``: every evidence value of a claim (``key,value``; nested keys as
  ``a.b``), and ``evidence/<claim_id>_real_run.csv`` for a verdict on a real run;
* ``claims_summary.csv`` and ``claims_summary.tex``: the claims as a table (kind, verdict, the
  short correction or conditions);
* ``figures/*.png``; ``tables/*.md|csv`` (where the paper has regenerated tables); ``meta.json``
  (the paper, the command that reproduces the run, seed, counts, the key findings in order, the
  real run, timing, and the environment with grpo-audit's version and git commit).

Every registered paper (:func:`paper_checks.papers.papers`) is audited the same way, with the
tables and real-run checks its registration names (``Paper.report_tables``,
``Paper.real_checks``). Nothing is written before every input is checked: the claim ids, and the
``--real`` file (:func:`paper_checks.real_run.read_real_rank`).
"""

from __future__ import annotations

import csv
import importlib
import io
import shlex
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo_io import atomic_write_text, environment, locks_out_dir, save_figure, write_json

from .findings import KIND_TIER, ranked
from .papers import DEFAULT_PAPER, Paper, get_paper
from .plotting import legends_outside
from .real_run import RealRankRun, RealRunError, decide_on_run, read_real_rank, real_claims
from .registry import VERDICT_LEGEND, VERDICTS, ClaimResult, ordered_ids, run_claims
from .report_md import flat_evidence, report_markdown
from .tables import AuditTable

__all__ = ["run_audit", "write_audit", "audit_command", "summary_table", "summary_rows",
           "summary_latex", "verdict_legend", "evidence_csv"]

Progress = Callable[[int, int, str], None]


def _cell(text: str | None) -> str:
    """One Markdown table cell: whitespace collapsed, pipes escaped, never cut."""
    if not text:
        return "-"
    return " ".join(text.split()).replace("|", "\\|")


def verdict_legend() -> str:
    """Markdown table of :data:`paper_checks.registry.VERDICT_LEGEND`."""
    return "| verdict | meaning |\n|---|---|\n" + "".join(
        f"| **{v}** | {VERDICT_LEGEND[v]} |\n" for v in VERDICTS)


def summary_rows(results: list[ClaimResult]) -> AuditTable:
    """The claims summary (id, kind, location, verdict, correction or conditions) as a table, for
    CSV and LaTeX; the last column is each check's short form (:attr:`ClaimResult.summary`)."""
    rows = tuple((i, r.id, r.kind, " ".join(r.location.split()), r.verdict,
                  " ".join((r.summary or "").split()))
                 for i, r in enumerate(results, 1))
    return AuditTable("Claims summary", ("#", "claim", "kind", "location", "verdict",
                                         "correction / conditions"), rows)


_LATEX_ESC = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
              "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
              "^": r"\textasciicircum{}"}


def _latex_escape(text: Any) -> str:
    return "".join(_LATEX_ESC.get(ch, ch) for ch in str(text))


def summary_latex(table: AuditTable, *, note: str = "") -> str:
    """The claims summary as a LaTeX ``longtable`` (booktabs; every special character escaped,
    wrapping paragraph columns); ``note`` becomes a comment line (the run's version)."""
    lines = ([f"% {note}"] if note else []) + [
        r"% needs \usepackage{longtable,booktabs}",
        r"\begin{longtable}{r p{0.2\linewidth} l p{0.15\linewidth} l p{0.3\linewidth}}",
        r"\toprule", " & ".join(_latex_escape(h) for h in table.header) + r" \\",
        r"\midrule", r"\endhead"]
    lines += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{longtable}"]
    return "\n".join(lines) + "\n"


def summary_table(results: list[ClaimResult]) -> str:
    """Markdown: claim id, kind, location, verdict, the check's short correction / conditions."""
    lines = ["| # | claim | kind | location | verdict | correction / conditions |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        lines.append(f"| {i} | [`{r.id}`](#{r.id}) | {r.kind} | {_cell(r.location)} | "
                     f"**{r.verdict}** | {_cell(r.summary)} |")
    return "\n".join(lines) + "\n"


def evidence_csv(evidence: dict[str, Any]) -> str:
    """``key,value`` rows of every evidence value (nested keys ``a.b``, lists as ``a[i]``;
    numbers at full precision, ``null`` as an empty cell)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("key", "value"))
    for k, v in flat_evidence(evidence):
        for key, x in ([(f"{k}[{i}]", y) for i, y in enumerate(v)] if isinstance(v, list)
                       else [(k, v)]):
            w.writerow((key, "" if x is None else repr(x) if isinstance(x, float)
                        else str(x).lower() if isinstance(x, bool) else x))
    return buf.getvalue()


def audit_command(out_dir: str | Path, *, seed: int, quick: bool, paper: str,
                  ids: Sequence[str] | None, real: str | None) -> str:
    """The ``grpo-audit audit`` command line that reproduces a run (``--only`` and ``--real``
    included), shell-quoted."""
    parts = ["grpo-audit", "audit", "--out", str(out_dir)]
    if paper != DEFAULT_PAPER:
        parts += ["--paper", paper]
    parts += ["--seed", str(seed)]
    if quick:
        parts.append("--quick")
    if ids is not None:
        parts += ["--only", *ids]
    if real is not None:
        parts += ["--real", real]
    return shlex.join(parts)


def _figures(results: list[ClaimResult], fig_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for r in results:
        if r.plot is None:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        r.plot(ax)
        if r.plot_title:
            fig.suptitle(r.plot_title, fontsize=10)
        fig.tight_layout()
        legends_outside(fig)
        path = fig_dir / f"{r.id}.png"
        save_figure(fig, path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        r.figure = f"figures/{path.name}"


def _check_inputs(spec: Paper, ids: list[str] | None, real: str | Path | RealRankRun | None
                  ) -> tuple[list[str] | None, RealRankRun | None]:
    """The claim ids (each once, all of ``spec``'s) and the real run, checked before anything is
    written."""
    if ids is not None:
        ids = list(dict.fromkeys(ids))  # a claim named twice is audited (and written) once
        known = set(ordered_ids(spec.key))
        bad = [i for i in ids if i not in known]
        if bad:
            raise ValueError(f"--only: {bad} are not claims of --paper {spec.key} "
                             f"(see --list --paper {spec.key})")
    if real is None or isinstance(real, RealRankRun):
        run = real
    else:
        run = read_real_rank(real)
    if run is not None and not spec.real_checks:
        raise RealRunError(f"--real: no claim of --paper {spec.key} is decided on a real-model "
                           "run (only a paper that registers real_checks takes --real)")
    return ids, run


@locks_out_dir("audit", check=lambda a: _check_inputs(
    get_paper(a.get("paper", DEFAULT_PAPER)), a.get("ids"), a.get("real")))
def run_audit(out_dir: str | Path, *, seed: int = 0, quick: bool = False,
              ids: list[str] | None = None, paper: str = DEFAULT_PAPER,
              real: str | Path | RealRankRun | None = None,
              progress: Progress | None = None) -> list[ClaimResult]:
    """Run the audit of ``paper`` and write every output under ``out_dir`` (created if needed).

    Args:
        ids: audit only these claims (each once, in the order given); default all.
        real: a ``grpo-audit real rank`` ``results.json`` (or one already read): the paper's
            empirical claims are also decided on it (``Paper.real_checks``).
        progress: called as ``progress(done, total, claim_id)`` before each claim and as
            ``progress(total, total, "")`` when the claims are done.
    """
    spec = get_paper(paper)
    ids, run = _check_inputs(spec, ids, real)
    t0 = time.perf_counter()
    results = run_claims(ids, seed=seed, quick=quick, paper=paper, progress=progress)
    write_audit(out_dir, spec, results, seed=seed, quick=quick, ids=ids, run=run,
                seconds_claims=time.perf_counter() - t0, started=t0)
    return results


def write_audit(out_dir: str | Path, spec: Paper, results: list[ClaimResult], *, seed: int,
                quick: bool, ids: list[str] | None, run: RealRankRun | None,
                seconds_claims: float, started: float | None = None, figures: bool = True
                ) -> dict[str, Any]:
    """Write every output of an audit whose claims are checked (``results``, which it annotates
    with their figure, evidence CSV and real-run verdict); returns ``meta.json``'s content.

    ``figures=False`` draws no claim figure (the paper's tables and their figures are written).
    """
    t0 = time.perf_counter() if started is None else started
    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    if figures:
        _figures(results, fig_dir)
    tables_md = _report_tables(spec, out, fig_dir, seed=seed, quick=quick)
    env = environment()
    real_ids = _decide_real(spec, run, results)
    _write_evidence(results, out)
    order = {r.id: i for i, r in enumerate(ranked(results), 1)}
    command = audit_command(out_dir, seed=seed, quick=quick, paper=spec.key, ids=ids,
                            real=None if run is None else run.path)
    version = {"version": env.get("grpo_audit"), "commit": env.get("grpo_audit_commit"),
               "command": command}
    meta = _meta(spec, results, command, seed=seed, quick=quick, t_claims=seconds_claims,
                 elapsed=time.perf_counter() - t0, env=env, run=run, tables=bool(tables_md))
    meta["real_claims"] = real_ids
    write_json(out / "claims.json", [{**r.as_dict(), "consequence_rank": order[r.id],
                                      "grpo_audit": version} for r in results])
    write_json(out / "meta.json", meta)
    summ = summary_rows(results)
    atomic_write_text(out / "claims_summary.csv", summ.to_csv())
    atomic_write_text(out / "claims_summary.tex", summary_latex(
        summ, note=f"grpo-audit {version['version']}"
        + (f" (git commit {version['commit']})" if version["commit"] else "")
        + f": {command}"))
    atomic_write_text(out / "REPORT.md", report_markdown(spec, results, meta, tables_md))
    return meta


def _decide_real(spec: Paper, run: RealRankRun | None, results: list[ClaimResult]
                 ) -> list[str]:
    """Attach the verdicts on the real run to their claims; returns the ids of every claim of
    the paper that a real run decides (with or without one, audited here or not)."""
    if not spec.real_checks:
        return []
    ids = [r.id for r in results]
    if run is not None:
        verdicts = decide_on_run(spec.real_checks, run, ids)
        for r in results:
            v = verdicts.get(r.id)
            if v is not None:
                r.real_run = {"verdict": v.verdict, "finding": v.finding,
                              "evidence": v.evidence, "run": run.describe(),
                              "evidence_csv": f"evidence/{r.id}_real_run.csv"}
    return list(real_claims(spec.real_checks))


def _write_evidence(results: list[ClaimResult], out: Path) -> None:
    ev_dir = out / "evidence"
    ev_dir.mkdir(parents=True, exist_ok=True)
    for r in results:
        r.evidence_csv = f"evidence/{r.id}.csv"
        atomic_write_text(out / r.evidence_csv, evidence_csv(r.evidence))
        if r.real_run:
            atomic_write_text(out / r.real_run["evidence_csv"],
                              evidence_csv(r.real_run["evidence"]))


def _report_tables(spec: Paper, out: Path, fig_dir: Path, *, seed: int, quick: bool
                   ) -> list[str]:
    """The paper's regenerated tables (``Paper.report_tables``), as Markdown lines."""
    if not spec.report_tables:
        return []
    module, _, name = spec.report_tables.partition(":")
    write_tables = getattr(importlib.import_module(module), name)
    return list(write_tables(out, fig_dir, seed=seed, quick=quick))


def _meta(spec: Paper, results: list[ClaimResult], command: str, *, seed: int, quick: bool,
          t_claims: float, elapsed: float, env: dict[str, Any], run: RealRankRun | None,
          tables: bool) -> dict[str, Any]:
    """``meta.json``: the paper, the command, the counts, the key findings, the real run, the
    timings and the environment."""
    key = [r.id for r in ranked(results)
           if r.verdict != "holds" and KIND_TIER[r.kind] < 3]
    return {
        "paper": spec.citation,
        "paper_key": spec.key,
        "seed": seed,
        "quick": quick,
        "command": command,
        "n_claims": len(results),
        "verdict_counts": dict(Counter(r.verdict for r in results)),
        "kind_verdict_counts": {k: dict(Counter(r.verdict for r in results if r.kind == k))
                                for k in dict.fromkeys(r.kind for r in results)},
        "refuted": [r.id for r in results if r.verdict == "refuted"],
        "key_findings": key,
        "real": None if run is None else {**run.describe(), "size": run.size,
                                          "mixed": run.mixed},
        "tables": tables,
        "seconds_claims": round(t_claims, 2),
        "seconds_total": round(elapsed, 2),
        "environment": env,  # python, grpo-audit version and commit, libraries, device
    }
