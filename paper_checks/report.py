"""The audit run: every registered claim checked, written as claims.json, REPORT.md and figures.

``run_audit(out_dir, seed=0, quick=False)`` writes:

* ``claims.json``: a list of objects with ``id``, ``location``, ``claim``, ``check``, ``variants``,
  ``verdict``, ``evidence`` (named numbers), ``correction``, ``conditions``, ``short``,
  ``undecided``, ``paper``, ``figure``, ``seconds``;
* ``REPORT.md``: the verdict legend, a summary table (claim, location, verdict, the check's short
  correction or conditions, never cut), the count by verdict, the run's metadata, one section per
  claim with its evidence (and figure), and (seed paper) the regenerated tables (App. A.2 side by
  side with the printed values; Table 1 for toy worlds);
* ``claims_summary.csv`` and ``claims_summary.tex``: the summary table as CSV and LaTeX;
* ``figures/*.png``; ``tables/*.md|csv`` (seed paper); ``meta.json`` (seed, versions, device,
  timing).

``paper="fade"`` audits the FADE abstract (arXiv 2607.01490) instead of the seed paper; every
registered paper (:func:`paper_checks.papers.papers`) is audited the same way, with the tables its
registration names (``Paper.report_tables``).
"""

from __future__ import annotations

import importlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

from grpo_io import environment, locks_out_dir, write_json

from .papers import DEFAULT_PAPER, Paper, get_paper
from .registry import REGISTRY, VERDICT_LEGEND, VERDICTS, ClaimResult, run_claims
from .tables import AuditTable

__all__ = ["run_audit", "summary_table", "summary_rows", "summary_latex", "verdict_legend"]


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
    """The claims summary (id, location, verdict, correction or conditions) as a table, for
    CSV and LaTeX; the last column is each check's short form (:attr:`ClaimResult.summary`)."""
    rows = tuple((i, r.id, " ".join(r.location.split()), r.verdict,
                  " ".join((r.summary or "").split()))
                 for i, r in enumerate(results, 1))
    return AuditTable("Claims summary", ("#", "claim", "location", "verdict",
                                         "correction / conditions"), rows)


_LATEX_ESC = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
              "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
              "^": r"\textasciicircum{}"}


def _latex_escape(text: Any) -> str:
    return "".join(_LATEX_ESC.get(ch, ch) for ch in str(text))


def summary_latex(table: AuditTable) -> str:
    """The claims summary as a LaTeX ``longtable`` (booktabs; every special character escaped,
    wrapping paragraph columns)."""
    lines = [r"% needs \usepackage{longtable,booktabs}",
             r"\begin{longtable}{r p{0.22\linewidth} p{0.17\linewidth} l p{0.34\linewidth}}",
             r"\toprule", " & ".join(_latex_escape(h) for h in table.header) + r" \\",
             r"\midrule", r"\endhead"]
    lines += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{longtable}"]
    return "\n".join(lines) + "\n"


def summary_table(results: list[ClaimResult]) -> str:
    """Markdown: claim id, location, verdict, the check's short correction / conditions."""
    lines = ["| # | claim | location | verdict | correction / conditions |",
             "|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        lines.append(f"| {i} | [`{r.id}`](#{r.id}) | {_cell(r.location)} | **{r.verdict}** | "
                     f"{_cell(r.summary)} |")
    return "\n".join(lines) + "\n"


def _counts(results: list[ClaimResult]) -> str:
    c = Counter(r.verdict for r in results)
    return "| verdict | count |\n|---|---|\n" + "".join(
        f"| {v} | {c.get(v, 0)} |\n" for v in VERDICTS) + f"| **total** | {len(results)} |\n"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _section(r: ClaimResult) -> str:
    out = [f'<a id="{r.id}"></a>', f"#### `{r.id}`: {r.verdict}", "",
           f"- **Location:** {r.location}", f"- **Claim (our paraphrase):** {r.claim}",
           f"- **Check:** {r.check}"]
    if r.variants:
        out.append(f"- **Estimators:** {', '.join(r.variants)}")
    out.append(f"- **Verdict:** {r.verdict}")
    if r.conditions and r.verdict == "holds-with-conditions":
        out.append(f"- **Conditions:** {r.conditions}")
    if r.verdict == "inconclusive" and r.undecided:
        out.append(f"- **Why undecided:** {r.undecided}")
        if r.correction:
            out.append("- **Correction the computation alone points to (not established):** "
                       f"{r.correction}")
    elif r.correction and r.verdict in ("refuted", "inconclusive"):
        label = "Correction" if r.verdict == "refuted" else "Why undecided / what would decide"
        out.append(f"- **{label}:** {r.correction}")
    out += ["", "| evidence | value |", "|---|---|"]
    out += [f"| {k} | {_fmt(v)} |" for k, v in r.evidence.items()]
    if r.figure:
        out += ["", f"![{r.id}]({r.figure})"]
    return "\n".join(out) + "\n"


def _figures(results: list[ClaimResult], fig_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for r in results:
        if r.plot is None:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        r.plot(ax)
        if r.plot_title:
            fig.suptitle(r.plot_title, fontsize=10)
        fig.tight_layout()
        path = fig_dir / f"{r.id}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        r.figure = f"figures/{path.name}"


@locks_out_dir("audit")
def run_audit(out_dir: str | Path, *, seed: int = 0, quick: bool = False,
              ids: list[str] | None = None, paper: str = DEFAULT_PAPER) -> list[ClaimResult]:
    """Run the audit of ``paper`` and write every output under ``out_dir`` (created if needed)."""
    spec = get_paper(paper)
    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = run_claims(ids, seed=seed, quick=quick, paper=paper)
    t_claims = time.perf_counter() - t0
    _figures(results, fig_dir)
    tables_md = _report_tables(spec, out, fig_dir, seed=seed, quick=quick)
    meta = _meta(spec, results, out_dir, seed=seed, quick=quick, t_claims=t_claims,
                 elapsed=time.perf_counter() - t0)
    write_json(out / "claims.json", [r.as_dict() for r in results])
    write_json(out / "meta.json", meta)
    summ = summary_rows(results)
    (out / "claims_summary.csv").write_text(summ.to_csv(), encoding="utf-8")
    (out / "claims_summary.tex").write_text(summary_latex(summ), encoding="utf-8")
    report = _report_head(spec, results, meta) + tables_md + _claim_sections(results)
    (out / "REPORT.md").write_text("\n".join(report), encoding="utf-8")
    return results


def _report_tables(spec: Paper, out: Path, fig_dir: Path, *, seed: int, quick: bool
                   ) -> list[str]:
    """The paper's regenerated tables (``Paper.report_tables``), as Markdown lines."""
    if not spec.report_tables:
        return []
    module, _, name = spec.report_tables.partition(":")
    write_tables = getattr(importlib.import_module(module), name)
    return list(write_tables(out, fig_dir, seed=seed, quick=quick))


def _meta(spec: Paper, results: list[ClaimResult], out_dir: str | Path, *, seed: int,
          quick: bool, t_claims: float, elapsed: float) -> dict[str, Any]:
    """``meta.json``: the paper, the command, the counts, the timings and the environment."""
    return {
        "paper": spec.citation,
        "paper_key": spec.key,
        "seed": seed,
        "quick": quick,
        "command": f"grpo-audit audit --out {out_dir} --seed {seed}"
        + (f" --paper {spec.key}" if spec.key != DEFAULT_PAPER else "")
        + (" --quick" if quick else ""),
        "n_claims": len(results),
        "verdict_counts": dict(Counter(r.verdict for r in results)),
        "refuted": [r.id for r in results if r.verdict == "refuted"],
        "seconds_claims": round(t_claims, 2),
        "seconds_total": round(elapsed, 2),
        "environment": environment(),  # numpy, scipy, sympy, matplotlib, torch; device cpu
    }


def _report_head(spec: Paper, results: list[ClaimResult], meta: dict[str, Any]) -> list[str]:
    """``REPORT.md`` up to the tables: provenance, legend, summary, counts and the run."""
    env = meta["environment"]
    mode = "quick" if meta["quick"] else "full"
    return [
        f"# Proof audit of {spec.citation}",
        "",
        "Every verdict below is computed by the check described in its section"
        + (f"; {spec.provenance}" if spec.provenance else "."),
        "",
        "## Verdict legend",
        "",
        verdict_legend(),
        "## Summary",
        "",
        "Also as `claims_summary.csv` and `claims_summary.tex`.",
        "",
        summary_table(results),
        "### Count by verdict",
        "",
        _counts(results),
        "### Run",
        "",
        f"- Command: `{meta['command']}`",
        f"- Seed: {meta['seed']}; mode: {mode}; time: {meta['seconds_total']:.1f} s",
        f"- Versions: python {env['python']}, numpy {env['numpy']}, scipy {env['scipy']}, "
        f"sympy {env['sympy']}, torch {env['torch']}, matplotlib {env['matplotlib']}",
        f"- Device: {env['device']} ({env['processor']}; {env['platform']})",
        "- Statistical checks: |estimate - exact| <= 4 SE (k = 4).",
        "",
    ]


def _claim_sections(results: list[ClaimResult]) -> list[str]:
    """``## Claims``: one heading per paper section (in report order), one entry per claim."""
    md = ["## Claims", ""]
    section = None
    for r in results:
        sec = REGISTRY[r.id].section
        if sec != section:
            md += [f"### {sec}", ""]
            section = sec
        md.append(_section(r))
    return md
