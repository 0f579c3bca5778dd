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

``paper="fade"`` audits the FADE abstract (arXiv 2607.01490) and ``paper="grpo-effective-loss"``
arXiv 2503.06639 v4 instead of the seed paper.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from grpo_io import environment, write_json

from .registry import PAPERS, VERDICT_LEGEND, VERDICTS, ClaimResult, run_claims
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


def _a2_figure(fig_dir: Path, *, quick: bool) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from grpo_theory.bounds import hoeffding_bound

    from .claims_appendix import sup_baseline_tail_bernoulli
    from .paper_values import PAPER_A2_EPS, PAPER_A2_R, PAPER_A2_TABLE

    fig, ax = plt.subplots(figsize=(6, 4))
    Rs = np.arange(1, 17 if quick else 33)
    for j, eps in enumerate(PAPER_A2_EPS):
        c = f"C{j}"
        ax.plot(Rs, [hoeffding_bound(R=int(R), eps=eps) for R in Rs], "-", c=c,
                label=f"2exp(-2R eps^2), eps={eps}")
        ax.plot(Rs, [sup_baseline_tail_bernoulli(R=int(R), eps=eps)[0] for R in Rs], ":", c=c,
                label=f"exact sup_p tail, eps={eps}")
        ax.plot(PAPER_A2_R, [PAPER_A2_TABLE[(R, eps)][0] for R in PAPER_A2_R], "x", c=c,
                ms=8, label=f"paper's printed, eps={eps}")
    ax.axhline(1.0, c="k", lw=0.8)
    ax.set_xlabel("group size R")
    ax.set_ylabel("P(|v_hat_R - v| > eps)")
    ax.set_title("App. A.2: Hoeffding vs exact worst-case tail vs printed")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path = fig_dir / "appendix_a2.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"figures/{path.name}"


#: How each paper's side enters its checks (the second sentence of every REPORT.md).
_SOURCE_NOTE: dict[str, str] = {
    "seed": "; the paper's printed numbers are taken from `paper_values/__init__.py` (the one "
    "place they are typed in) and labelled as the paper's.",
    "fade": "; only the abstract is available, so each claim is our paraphrase of it.",
    "grpo-effective-loss": "; each claim is our paraphrase of the v4 text (theorem, section and "
    "equation numbers of the v4 PDF), and the paper's printed formulas and values enter the "
    "checks from `paper_checks/claims/effective_loss/printed.py` (the one place they are typed "
    "in), so that a planted error in them flips the verdict.",
}


def run_audit(out_dir: str | Path, *, seed: int = 0, quick: bool = False,
              ids: list[str] | None = None, paper: str = "seed") -> list[ClaimResult]:
    """Run the audit of ``paper`` and write every output under ``out_dir`` (created if needed)."""
    if paper not in PAPERS:
        raise ValueError(f"unknown paper {paper!r}; known: {sorted(PAPERS)}")
    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = run_claims(ids, seed=seed, quick=quick, paper=paper)
    t_claims = time.perf_counter() - t0
    _figures(results, fig_dir)
    tables_md: list[str] = []
    if paper == "seed":
        from .tables import appendix_a2_table, table1_toy

        tab_dir = out / "tables"
        tab_dir.mkdir(parents=True, exist_ok=True)
        a2_fig = _a2_figure(fig_dir, quick=quick)
        a2 = appendix_a2_table()
        t1 = table1_toy(seed=seed, quick=quick)
        for name, tab in (("appendix_a2", a2), ("table1_toy", t1)):
            (tab_dir / f"{name}.md").write_text(tab.to_markdown(), encoding="utf-8")
            (tab_dir / f"{name}.csv").write_text(tab.to_csv(), encoding="utf-8")
        tables_md = ["## Regenerated tables", "", a2.to_markdown(),
                     f"![appendix A.2]({a2_fig})", "", t1.to_markdown()]
    elapsed = time.perf_counter() - t0
    paper_id = PAPERS[paper][0]
    meta = {
        "paper": paper_id,
        "paper_key": paper,
        "seed": seed,
        "quick": quick,
        "command": f"grpo-audit audit --out {out_dir} --seed {seed}"
        + (f" --paper {paper}" if paper != "seed" else "") + (" --quick" if quick else ""),
        "n_claims": len(results),
        "verdict_counts": dict(Counter(r.verdict for r in results)),
        "refuted": [r.id for r in results if r.verdict == "refuted"],
        "seconds_claims": round(t_claims, 2),
        "seconds_total": round(elapsed, 2),
        "environment": environment(),  # numpy, scipy, sympy, matplotlib, torch; device cpu
    }
    write_json(out / "claims.json", [r.as_dict() for r in results])
    write_json(out / "meta.json", meta)
    summ = summary_rows(results)
    (out / "claims_summary.csv").write_text(summ.to_csv(), encoding="utf-8")
    (out / "claims_summary.tex").write_text(summary_latex(summ), encoding="utf-8")
    env = meta["environment"]
    md = [
        f"# Proof audit of {paper_id}",
        "",
        "Every verdict below is computed by the check described in its section"
        + _SOURCE_NOTE.get(paper, "; each claim is our paraphrase of the paper."),
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
        f"- Seed: {seed}; mode: {'quick' if quick else 'full'}; time: {elapsed:.1f} s",
        f"- Versions: python {env['python']}, numpy {env['numpy']}, scipy {env['scipy']}, "
        f"sympy {env['sympy']}, torch {env['torch']}, matplotlib {env['matplotlib']}",
        f"- Device: {env['device']} ({env['processor']}; {env['platform']})",
        "- Statistical checks: |estimate - exact| <= 4 SE (k = 4).",
        "",
        *tables_md,
        "## Claims",
        "",
    ]
    section = None
    from .registry import REGISTRY

    for r in results:
        sec = REGISTRY[r.id].section
        if sec != section:
            md += [f"### {sec}", ""]
            section = sec
        md.append(_section(r))
    (out / "REPORT.md").write_text("\n".join(md), encoding="utf-8")
    return results
