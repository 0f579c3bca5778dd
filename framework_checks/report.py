"""The framework audit as Markdown: per framework a one-paragraph conclusion (:func:`conclusion`),
a table with one line per setting and kind of discrepancy, and the default setting's values on
the edge cases."""

from __future__ import annotations

import math
from typing import Any

from .diagnostics_audit import render_diagnostics

__all__ = ["render_markdown", "conclusion"]

#: The battery's input families (:mod:`framework_checks.battery`) in words.
FAMILY_WORDS = {
    "random normal": "ordinary groups of normal rewards",
    "random binary": "ordinary groups of binary rewards",
    "single success": "groups with a single success",
    "unequal lengths": "groups with completions of unequal lengths",
    "constant": "groups whose rewards are all equal",
    "singletons": "one-completion groups (R=1)",
    "NaN in a group": "groups with a NaN reward",
    "NaN group": "groups whose rewards are all NaN",
    "huge scale": "rewards of scale 1e9",
    "tiny scale": "rewards of scale 1e-9",
    "overflow": "rewards near the float32 overflow",
    "underflow": "rewards near the float32 underflow",
    "empty completions": "groups with empty completions",
    "empty group": "groups whose completions are all empty",
}


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _cases(n: int) -> str:
    return f"{n} case{'s' if n != 1 else ''}"


def _difference_words(d: dict[str, Any]) -> str:
    """One discrepancy of :func:`framework_checks.audit.summarise_report` in words (the
    framework's side of it: differs, NaN/inf, raises)."""
    where = FAMILY_WORDS.get(d["family"], d["family"])
    status = d["status"]
    if status == "differs":
        fw, ours = d["framework"], d["grpo_theory"]
        there = (f"; e.g. {d['example']}: framework {fw + 0.0:.3g}, grpo_theory "
                 f"{ours + 0.0:.4g}") if fw is not None and ours is not None else ""
        return (f"on {where} it differs by up to {_fmt(d['max_abs_diff'])} "
                f"({_cases(d['cases'])}{there})")
    if status == "framework non-finite":
        return (f"on {where} it returns NaN or inf where grpo_theory is finite "
                f"({_cases(d['cases'])})")
    if status == "framework raises":
        return f"on {where} it raises ({_cases(d['cases'])}: {str(d['error'])[:60]})"
    return f"on {where}: {d['kind']} ({_cases(d['cases'])})"


def _refusal_words(ds: list[dict[str, Any]]) -> str:
    """The inputs ``grpo_theory`` refuses by design, and what the framework returns there."""
    where = _join([FAMILY_WORDS.get(d["family"], d["family"]) for d in ds])
    nonfinite = {bool(d.get("framework_nonfinite")) for d in ds}
    got = {frozenset({True}): "NaN or inf", frozenset({False}): "finite values"}.get(
        frozenset(nonfinite), "NaN or inf on some and finite values on others")
    return f"grpo_theory refuses {where} by design, where the framework returns {got}"


def conclusion(report: dict[str, Any]) -> str:
    """The report's opening paragraph, generated from its ``summary``: how many settings agree
    with ``grpo_theory`` on every case, and each difference in words (per setting: ordinary
    inputs first, then edge cases, then the inputs ``grpo_theory`` refuses by design)."""
    s = report["summary"]
    head = (f"**Conclusion.** {report['framework']} {report['version']} ({report['dtype']}): "
            f"{s['agree']} of {s['settings']} settings agree with grpo_theory on every case of "
            "the battery")
    if not s["differences"]:
        return head + "."
    ordinary = {d["setting"] for d in s["differences"] if d["ordinary"]}
    edge_only = len({d["setting"] for d in s["differences"]} - ordinary)
    head += (f"; {len(ordinary)} differ on ordinary inputs and {edge_only} only on edge cases. "
             if ordinary else f"; the other {edge_only} differ only on edge cases. ")
    parts = []
    for setting in dict.fromkeys(d["setting"] for d in s["differences"]):
        ds = [d for d in s["differences"] if d["setting"] == setting]
        words = [_difference_words(d) for d in sorted(ds, key=lambda d: not d["ordinary"])
                 if d["status"] != "grpo_theory refuses"]
        refused = [d for d in ds if d["status"] == "grpo_theory refuses"]
        if refused:
            words.append(_refusal_words(refused))
        parts.append(f"`{setting}`: " + "; ".join(words) + ".")
    return head + " ".join(parts)


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.2g}"
    return str(x)


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the heading, the :func:`conclusion` paragraph, then the table
    (one line per setting and kind of discrepancy) and the default setting's edge values."""
    head = (
        f"### {report['framework']} {report['version']} ({report['dtype']}; source "
        f"`{report['source']}`{'; commit ' + report['commit'] if report['commit'] else ''})\n\n"
        f"{conclusion(report)}\n\n"
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
    return (head + "\n".join(lines) + "\n" + edge + render_diagnostics(report.get("diagnostics"))
            + kl)
