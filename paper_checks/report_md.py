"""REPORT.md, findings first: the paper, the bottom line, the key findings, the counts by kind and
verdict, the real-model run, the run's record, then one entry per claim in paper order.

Entries are short: a claim that holds is one line (what the paper says, the check, three numbers);
a claim that does not is a small section (the paper, the check, the correction or conditions, at
most :data:`EVIDENCE_ROWS` evidence values); claims of one section that share one check (the App.
A.2 cells) are one table. The full evidence of every claim is in ``claims.json`` and in
``evidence/<claim_id>.csv``, linked from its entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .findings import anchor_link, bottom_line, key_findings, kind_verdict_counts, paper_sentence
from .papers import Paper
from .registry import KINDS, REGISTRY, VERDICT_LEGEND, VERDICTS, ClaimResult

__all__ = ["EVIDENCE_ROWS", "OTHER_EVIDENCE", "HOLDS_EVIDENCE", "report_markdown", "claim_entry",
           "flat_evidence", "fmt_value", "real_run_lines"]

#: Evidence values in a refuted claim's table (two per row); the rest are in its CSV.
EVIDENCE_ROWS = 10
#: Evidence values in the table of any other claim with its own section.
OTHER_EVIDENCE = 6
#: Evidence values quoted on the one line of a claim that holds.
HOLDS_EVIDENCE = 3
#: Claims of one section sharing one check become one table from this many on.
GROUP_MIN = 3


def _one(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _sentence(text: str | None) -> str:
    t = _one(text)
    return t if not t or t.endswith((".", "?", "!", ")")) else t + "."


def fmt_value(v: Any) -> str:
    """An evidence value as the report prints it (floats to 6 significant digits)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    if v is None:
        return "n/a"
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    return str(v)


def flat_evidence(ev: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``(key, value)`` pairs of an evidence dict, nested dicts flattened to ``a.b`` keys (lists
    kept whole)."""
    out: list[tuple[str, Any]] = []
    for k, v in ev.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += flat_evidence(v, key + ".")
        else:
            out.append((key, v))
    return out


def _shown(r: ClaimResult, n: int) -> list[tuple[str, Any]]:
    """The ``n`` evidence values a short table shows: the check's ``key_evidence`` first, then the
    others in the check's order."""
    flat = flat_evidence(r.evidence)
    first = [kv for kv in flat if kv[0] in r.key_evidence]
    first.sort(key=lambda kv: r.key_evidence.index(kv[0]))
    rest = [kv for kv in flat if kv[0] not in r.key_evidence]
    return (first + rest)[:n]


def _csv_link(r: ClaimResult) -> str:
    n = len(flat_evidence(r.evidence))
    if not r.evidence_csv:
        return f"{n} values in claims.json"
    return f"[all {n}: {r.evidence_csv}]({r.evidence_csv})"


def _evidence_table(r: ClaimResult) -> list[str]:
    shown = _shown(r, EVIDENCE_ROWS if r.verdict == "refuted" else OTHER_EVIDENCE)
    cells = [f"{_one(k)} | {_one(fmt_value(v))}" for k, v in shown]
    if len(cells) % 2:
        cells.append(" | ")
    head = f"| evidence ({len(shown)} shown; {_csv_link(r)}) | value | evidence | value |"
    return [head, "|---|---:|---|---:|"] + [f"| {cells[i]} | {cells[i + 1]} |"
                                             for i in range(0, len(cells), 2)]


def _check_text(r: ClaimResult) -> str:
    est = f" Estimators: {', '.join(r.variants)}." if r.variants else ""
    return _sentence(r.check) + est


def _anchor(cid: str) -> str:
    return f'<a id="{cid}"></a>'


def real_run_lines(r: ClaimResult) -> list[str]:
    """The entry's line on the real-model run, if the audit was given one that decides it."""
    if not r.real_run:
        return []
    return [f"- **On the real-model run ({_one(r.real_run['run']['model'])}):** "
            f"**{r.real_run['verdict']}**: {_sentence(r.real_run['finding'])} Evidence: "
            f"[{r.real_run['evidence_csv']}]({r.real_run['evidence_csv']})"]


def claim_entry(r: ClaimResult) -> list[str]:
    """One claim's entry: a line for a plain ``holds``, else a section with its evidence table."""
    fig = f" ![{r.id}]({r.figure})" if r.figure else ""
    if r.verdict == "holds" and not r.real_run:
        ev = "; ".join(f"{_one(k)} = {_one(fmt_value(v))}" for k, v in _shown(r, HOLDS_EVIDENCE))
        return [f"- {_anchor(r.id)}**`{r.id}`**: **holds** ({r.kind}; {_one(r.location)}). "
                f"The paper: {_sentence(r.claim)} Check: {_check_text(r)} Evidence: {ev} "
                f"({_csv_link(r)}).{fig}"]
    out = ["", f"#### {_anchor(r.id)}`{r.id}`: {r.verdict} ({r.kind}; {_one(r.location)})",
           f"- **The paper:** {_sentence(r.claim)}",
           f"- **Check:** {_check_text(r)}"]
    if r.verdict == "holds-with-conditions" and r.conditions:
        out.append(f"- **Conditions:** {_sentence(r.conditions)}")
    if r.verdict == "inconclusive" and r.undecided:
        out.append(f"- **Why undecided:** {_sentence(r.undecided)}")
        if r.correction:
            out.append("- **Correction the computation alone points to (not established):** "
                       f"{_sentence(r.correction)}")
    elif r.correction and r.verdict == "refuted":
        out.append(f"- **Correction:** {_sentence(r.correction)}")
    elif r.correction and r.verdict == "inconclusive":
        out.append(f"- **What would decide it:** {_sentence(r.correction)}")
    elif r.verdict == "inconclusive" and r.short:
        out.append(f"- **What would decide it:** {_sentence(r.short)}")
    out += real_run_lines(r)
    out += [""] + _evidence_table(r)
    if fig:
        out += ["", fig.strip()]
    return out + [""]


def _group_table(rs: Sequence[ClaimResult]) -> list[str]:
    """Claims sharing one check: one row each (anchor, location, the paper, verdict, computed)."""
    r0 = rs[0]
    out = ["", f"**{len(rs)} claims checked the same way** ({r0.kind}). Check: {_check_text(r0)}",
           "", "| claim | where | the paper | verdict | computed | evidence |",
           "|---|---|---|---|---|---|"]
    for r in rs:
        out.append(f"| {_anchor(r.id)}`{r.id}` | {_one(r.location)} | {_one(r.claim)} | "
                   f"**{r.verdict}** | {_one(r.headline) or '-'} | "
                   f"[csv]({r.evidence_csv}) |" if r.evidence_csv else
                   f"| {_anchor(r.id)}`{r.id}` | {_one(r.location)} | {_one(r.claim)} | "
                   f"**{r.verdict}** | {_one(r.headline) or '-'} | claims.json |")
    return out + [""]


def _claims_md(results: Sequence[ClaimResult]) -> list[str]:
    """``## Claims``: paper sections in report order; in each, groups sharing a check become a
    table, the rest an entry each."""
    md = ["## Claims", "",
          "In the paper's order. A claim that holds is one line; any other verdict has its own "
          "entry with the correction, conditions or what would decide it, and a short evidence "
          "table (every value: `claims.json` and the linked `evidence/<claim>.csv`)."]
    by_section: dict[str, list[ClaimResult]] = {}
    for r in results:
        by_section.setdefault(REGISTRY[r.id].section, []).append(r)
    for section, rs in by_section.items():
        md += ["", f"### {section}", ""]
        checks: dict[str, list[ClaimResult]] = {}
        for r in rs:
            checks.setdefault(r.check, []).append(r)
        done: set[str] = set()
        for r in rs:
            if r.id in done:
                continue
            same = checks[r.check]
            if len(same) >= GROUP_MIN:
                md += _group_table(same)
                done.update(x.id for x in same)
            else:
                md += claim_entry(r)
                done.add(r.id)
    return [line for i, line in enumerate(md) if line or (i and md[i - 1])]  # no double blanks


def _legend() -> list[str]:
    return (["Verdicts: " + "; ".join(f"**{v}**: {VERDICT_LEGEND[v]}" for v in VERDICTS) + ".",
             "", "Kinds (what a verdict is about): "
             + "; ".join(f"**{k}**: {d}" for k, d in KINDS.items()) + ".", ""])


def _run_md(meta: dict[str, Any]) -> list[str]:
    env = meta["environment"]
    mode = "quick" if meta["quick"] else "full"
    commit = env.get("grpo_audit_commit")
    libs = ", ".join(f"{k} {env.get(k)}" for k in ("numpy", "scipy", "sympy", "matplotlib",
                                                    "torch"))
    return ["## Run", "",
            f"- Command: `{meta['command']}`",
            f"- grpo-audit {env.get('grpo_audit')}"
            + (f" (git commit {commit[:12]})" if commit else "")
            + f"; seed {meta['seed']}; mode {mode}; {meta['seconds_total']:.1f} s",
            f"- Python {env['python']}, {libs}; device {env['device']} ({env['processor']}; "
            f"{env['platform']})",
            "- Statistical checks: |estimate - exact| <= 4 SE (k = 4).",
            "- Files: `claims.json` (every claim, its full evidence and these fields), "
            "`evidence/<claim>.csv`, `claims_summary.csv|tex`, `meta.json`, `figures/`"
            + (", `tables/`" if meta.get("tables") else "") + ".", ""]


def _real_md(spec: Paper, results: Sequence[ClaimResult], meta: dict[str, Any]) -> list[str]:
    """``## Real-model run``: what was decided on the ``--real`` run, or the command that would
    decide it (only for a paper with real checks)."""
    if not spec.real_checks:
        return []
    real = meta.get("real")
    here = {r.id for r in results}
    links = ", ".join(anchor_link(c) if c in here else f"`{c}`"
                      for c in meta.get("real_claims") or [])
    out = ["## Real-model run", ""]
    if real is None:
        out += [f"Not given. The paper's measured claims ({links}) can also be decided on a real "
                "model's run, beside the verdicts above:", "",
                "```",
                "grpo-audit real rank --out runs/rank",
                f"{meta['command']} --real runs/rank/results.json",
                "```", ""]
        return out
    decided = [r for r in results if r.real_run]
    out.append(f"`{real['file']}`: model **{real['model']}** ({real['size']}), "
               f"{real['num_groups']} prompts, estimator {real['estimator']}; groups with mixed "
               f"rewards per R: {real['mixed']}. "
               + ("Decided on it (beside the computed verdicts, which do not change):" if decided
                  else f"None of the claims audited here is decided on it (it decides {links})."))
    out.append("")
    for r in decided:
        out.append(f"- {anchor_link(r.id)}: **{r.real_run['verdict']}**: "
                   f"{_sentence(r.real_run['finding'])}")
    return out + [""]


def report_markdown(spec: Paper, results: Sequence[ClaimResult], meta: dict[str, Any],
                    tables_md: Sequence[str]) -> str:
    """The whole REPORT.md."""
    real = meta.get("real")
    real_sentence = None
    decided = [r for r in results if r.real_run]
    if real is not None and decided:
        real_sentence = (f"On the real-model run given ({real['model']}, {real['size']}): "
                         + "; ".join(f"{anchor_link(r.id)} {r.real_run['verdict']}"
                                     for r in decided) + ".")
    lines = [f"# Proof audit of arXiv {spec.arxiv} ({spec.title})", "",
             paper_sentence(spec), "", "## Bottom line", "",
             *bottom_line(spec, results, real_run=real_sentence), "",
             *key_findings(results),
             "## Counts by kind and verdict", "", *kind_verdict_counts(results), "",
             *_legend(), *_real_md(spec, results, meta), *_run_md(meta),
             *_claims_md(results), "", *tables_md]
    text = "\n".join(lines).rstrip("\n") + "\n"
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text
