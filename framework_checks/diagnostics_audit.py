"""The frameworks' own training diagnostics against the exact quantities, in
``grpo-audit frameworks``: verl's ``variance_proxy/*`` (:mod:`.diagnostics_verl`) and TRL's
``frac_reward_zero_std`` / ``reward_std`` (:mod:`.diagnostics_trl`), rendered as Markdown."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .source import FrameworkCodeError, SourceTree, find_source

__all__ = ["audit_diagnostics", "render_diagnostics"]


def audit_diagnostics(
    framework: str, source: str | Path | SourceTree | None = None
) -> dict[str, Any] | None:
    """The diagnostics audit of ``framework`` (None for a framework without one); ``source`` as
    :func:`~framework_checks.source.find_source` takes it, or a :class:`SourceTree` already read.
    A release whose code lacks the expected functions gives ``{"error": ...}``, never a
    traceback."""
    if framework not in ("verl", "trl"):
        return None
    tree = source if isinstance(source, SourceTree) else find_source(framework, source)
    try:
        if framework == "verl":
            from .diagnostics_verl import audit_variance_proxy

            return audit_variance_proxy(tree)
        from .diagnostics_trl import audit_zero_std

        return audit_zero_std(tree)
    except (FrameworkCodeError, SyntaxError, NameError, AttributeError, KeyError) as exc:
        return {"framework": framework, "version": tree.version,
                "error": f"{type(exc).__name__}: {exc}"[:300]}


def _g(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def render_diagnostics(d: dict[str, Any] | None) -> str:
    """The audit as Markdown ("" for None)."""
    if not d:
        return ""
    fw = d["framework"]
    if "error" in d:
        return f"\nDiagnostics audit of {fw} {d['version']} not run: {d['error']}\n"
    if fw == "verl":
        head = (
            f"\n#### verl {d['version']} `variance_proxy/*` against the exact values\n\n"
            "verl's own `compute_variance_proxy_metrics` on tiny float64 policies (seed "
            f"{d['seed']}); exact: per-sequence gradients by autograd. Each cell: verl / exact."
            "\n\n| policy | loss_agg_mode | proxy1 (signal) | proxy2 (total power) | "
            "proxy3 (noise) | proxy1 / proxy3 (SNR) | proxy3 clamped to 0 |\n"
            "|---|---|---|---|---|---|---|\n"
        )
        lines = [
            f"| {c['world']} | {c['loss_agg_mode']} | "
            + " | ".join(f"{_g(c['verl'][k])} / {_g(c['exact'][k])}"
                         for k in ("proxy1", "proxy2", "proxy3", "snr"))
            + f" | {'yes' if c['proxy3_clamped'] else 'no'} |"
            for c in d["cases"]
        ]
    else:
        head = (
            f"\n#### trl {d['version']} `frac_reward_zero_std` and `reward_std` against the "
            "exact values\n\nTRL's own advantage and metric lines (float32). Exact: dead groups "
            "(every advantage exactly 0), constant groups (reward std exactly 0), the mean "
            "within-group std (ddof 1).\n\n| setting | rewards | frac_reward_zero_std | dead "
            "groups | constant groups | reward_std | within-group std |\n"
            "|---|---|---|---|---|---|---|\n"
        )
        lines = [
            f"| `{r['setting']}` | {r['case']} | {_g(r['frac_reward_zero_std'])} | "
            f"{_g(r['dead_share'])} | {_g(r['constant_share'])} | {_g(r['reward_std'])} | "
            f"{_g(r['within_std'])} |"
            for r in d["rows"]
        ]
    what = "\n".join(f"* {f}" for f in d["findings"])
    return head + "\n".join(lines) + "\n\nWhat it measures:\n\n" + what + "\n"
