"""The framework audit as Markdown: one table per framework, one line per setting and kind of
discrepancy, and the default setting's values on the edge cases."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["render_markdown"]


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.2g}"
    return str(x)


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table (one line per setting and kind of discrepancy)."""
    head = (
        f"### {report['framework']} {report['version']} ({report['dtype']}; source "
        f"`{report['source']}`{'; commit ' + report['commit'] if report['commit'] else ''})\n\n"
        f"agree: |framework - grpo_theory| <= {report['rtol']:g} * max|grpo_theory| on every "
        "completion with tokens (losses: per-sequence gradient weights at ratio 1).\n\n"
        "| setting | grpo_theory | agree | max rel diff (agreeing) | discrepancy (family) | "
        "cases | smallest input showing it | max abs diff (family) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    if report["not_representable"]:
        head = head.replace(
            "\n\n| setting",
            f"\n\nSkipped (rewards not representable in {report['dtype']}): "
            + ", ".join(report["not_representable"])
            + ".\n\n| setting",
            1,
        )
    for row in report["rows"]:
        base = (
            f"| `{row['setting']}` | {row['grpo_theory']} | {row['agree']}/{row['total']} | "
            f"{_fmt(row['max_rel_diff_agreeing'])} |"
        )
        if not row["discrepancies"]:
            lines.append(base + " - | - | - | - |")
            continue
        for kind, info in row["discrepancies"].items():
            s = info["smallest"]
            there: Any = info["max_abs_diff"]
            if kind.startswith("grpo_theory refuses"):
                there = "framework non-finite" if s.get("framework_nonfinite") else "-"
            elif kind.startswith("framework raises"):
                there = s.get("framework", "")[:60]
            elif kind.startswith("framework non-finite"):
                there = "NaN/inf"
            detail = f"{s['case']}: `{s['input']}`"
            lines.append(f"{base} {kind} | {len(info['cases'])} | {detail} | {_fmt(there)} |")
            base = "| | | | |"
    edge = ""
    if report["edge_values"]:
        edge = (
            f"\nEdge values of `{report['edge_values'][0]['setting']}` (the advantage of the "
            "largest disagreement in each case):\n\n"
            "| case | framework | grpo_theory |\n|---|---|---|\n"
        )
        edge += "\n".join(
            f"| {e['case']} | {e['framework'] + 0.0:.3g} | {e['grpo_theory'] + 0.0:.4g} |"
            for e in report["edge_values"]
        )
        edge += "\n"
    from .kl_audit import render_kl_markdown

    kl = render_kl_markdown(report["kl"]) if report.get("kl") else ""
    return head + "\n".join(lines) + "\n" + edge + kl
