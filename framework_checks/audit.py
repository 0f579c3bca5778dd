"""The framework audit behind ``grpo-audit frameworks``: the frameworks' own code against
``grpo_theory``.

For every advantage setting and loss mode a framework ships (and this library maps), the audit
runs the framework's code (:func:`framework_checks.load.load_framework`) in its training dtype on
the fixed battery (:func:`framework_checks.battery.battery`) and compares it with the
``grpo_theory`` function that the conventions table says is equivalent
(:data:`framework_checks.ours.ADVANTAGE_MAP`, :data:`~framework_checks.ours.LOSS_MAP`). Each
case ends in one of

* ``agree``: ``|framework - ours| <= 1e-5 * max|ours|`` on every token-carrying completion;
* ``differs``: a larger difference (its max abs diff is reported);
* ``framework non-finite``: the framework returns NaN/inf where ``grpo_theory`` is finite;
* ``framework raises`` / ``grpo_theory refuses`` / ``both refuse``: an exception on one or both
  sides (``grpo_theory`` refuses NaN rewards, one-sample groups, 0/0 baselines by design).

Per setting the report lists the agreeing cases, the largest difference among them, and for
each kind of discrepancy the smallest input that shows it. Everything printed is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .battery import Case, battery
from .compare import RTOL, compare
from .diagnostics_audit import audit_diagnostics
from .load import framework_source, load_framework
from .ours import ADVANTAGE_MAP, LOSS_MAP

__all__ = [
    "RTOL", "DEFAULT_SETTING", "ORDINARY_FAMILIES", "audit_framework", "compare",
    "summarise_report",
]

def _advantage_result(fn: Callable[..., np.ndarray], ours: Callable[..., np.ndarray],
                      c: Case) -> dict[str, Any]:
    return compare(partial(fn, c.rewards, c.lengths), partial(ours, c.rewards, c.lengths),
                   c.lengths > 0)


def _loss_result(fn: Callable[..., np.ndarray], ours: Callable[..., np.ndarray], c: Case
                 ) -> dict[str, Any] | None:
    """Weights at ratio 1 for alternating advantages ``1, -0.5``; ``None`` for a case with NaN
    rewards or no token (nothing to weigh)."""
    if np.any(np.isnan(c.rewards)) or c.lengths.max() == 0:
        return None
    A = np.where(np.arange(c.size).reshape(c.rewards.shape) % 2 == 0, 1.0, -0.5)
    width = max(int(c.lengths.max()), 1)
    return compare(partial(fn, c.lengths, A), partial(ours, c.lengths, width), c.lengths > 0)


def _setting_results(kind: str, fn: Callable[..., np.ndarray],
                     ours: Callable[..., np.ndarray], cases: list[Case]) -> list[dict[str, Any]]:
    """One setting on every case of the battery."""
    results = []
    for c in cases:
        res = _advantage_result(fn, ours, c) if kind == "advantage" else _loss_result(fn, ours, c)
        if res is None:
            continue
        res.update(case=c.name, family=c.family, size=c.size, input=c.short())
        results.append(res)
    return results


def audit_framework(
    framework: str,
    source: str | None = None,
    *,
    dtype: str = "float32",
    download: bool = True,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the battery for one framework; returns a JSON-ready dict (``rows``, ``summary``:
    :func:`summarise_report`). ``download``, ``say``: see
    :func:`~framework_checks.load.framework_source` (a framework that is not installed is read
    from its pinned wheel)."""
    tree = framework_source(framework, source, download=download, say=say)
    fc = load_framework(framework, tree, dtype=dtype)
    cases, skipped = [], []
    for c in battery():
        (cases if _representable(c.rewards, dtype) else skipped).append(c)
    rows: list[dict[str, Any]] = []
    for kind, table, ours_map in (
        ("advantage", fc.advantages, ADVANTAGE_MAP),
        ("loss", fc.losses, LOSS_MAP),
    ):
        for setting, fn in table.items():
            if setting in ours_map:
                label, ours = ours_map[setting]
                results = _setting_results(kind, fn, ours, cases)
                rows.append(_summarise(kind, setting, label, results))
    from .kl_audit import audit_kl  # the KL options at the gradient level

    return {
        "framework": fc.framework,
        "version": fc.version,
        "source": fc.origin,
        "commit": fc.commit,
        "dtype": dtype,
        "rtol": RTOL,
        "not_representable": [c.name for c in skipped],
        "edge_values": _edge_values(framework, rows),
        "summary": summarise_report(rows),
        "rows": rows,
        "diagnostics": audit_diagnostics(framework, tree),
        "kl": audit_kl(framework, tree, dtype=dtype),
    }


#: The battery's ordinary inputs (:mod:`framework_checks.battery`): where a framework should
#: agree with ``grpo_theory``; every other family is an edge case.
ORDINARY_FAMILIES = ("random normal", "random binary", "single success", "unequal lengths")


def summarise_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the conclusion of a framework's report says, computed from its ``rows``.

    Returns:
        ``settings`` (how many were compared), ``agree`` (those without any discrepancy),
        ``differences``: one dict per setting and kind of discrepancy (``setting``, ``kind``
        (``rows``' discrepancy kind), ``status``, ``family``, ``ordinary`` (the family is one of
        :data:`ORDINARY_FAMILIES`), ``cases``, ``max_abs_diff``, and for the smallest input
        showing it ``example`` (the case name), ``framework`` / ``grpo_theory`` (their values at
        the largest difference, when both are numbers), ``framework_nonfinite`` (where
        ``grpo_theory`` refuses: whether the framework returned NaN/inf) and ``error`` (the
        refusal or exception, when one side raised)).
    """
    differences = []
    for row in rows:
        for kind, info in row["discrepancies"].items():
            small = info["smallest"]
            at = small.get("at") or {}
            differences.append({
                "setting": row["setting"],
                "kind": kind,
                "status": small["status"],
                "family": small["family"],
                "ordinary": small["family"] in ORDINARY_FAMILIES,
                "cases": len(info["cases"]),
                "max_abs_diff": info["max_abs_diff"],
                "example": small["case"],
                "framework": at.get("framework"),
                "grpo_theory": at.get("grpo_theory"),
                "framework_nonfinite": small.get("framework_nonfinite"),
                "error": small.get("framework") if small["status"] == "framework raises"
                else small.get("grpo_theory") if "refuses" in small["status"] else None,
            })
    return {
        "settings": len(rows),
        "agree": sum(not row["discrepancies"] for row in rows),
        "differences": differences,
    }


DEFAULT_SETTING = {
    "trl": 'GRPOConfig(scale_rewards="group")',
    "verl": "algorithm.adv_estimator=grpo",
    "openrlhf": "--algo.advantage.estimator group_norm",
}
EDGE_FAMILIES = ("constant", "overflow", "underflow")


def _representable(r: np.ndarray, dtype: str) -> bool:
    """True when every reward survives the cast to ``dtype`` (no inf, no flush to 0)."""
    if dtype == "float64":
        return True
    with np.errstate(over="ignore", under="ignore"):
        x = r.astype(np.float32)
    ok = np.isnan(r) | (np.isfinite(x) & ((r == 0) | (x != 0)))
    return bool(np.all(ok))


def _edge_values(framework: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The default setting's value on constant / overflow / underflow cases (both sides)."""
    row = next((r for r in rows if r["setting"] == DEFAULT_SETTING[framework]), None)
    if row is None:
        return []
    out = []
    for res in row["results"]:
        if res["family"] in EDGE_FAMILIES and "at" in res:
            out.append(
                {
                    "setting": row["setting"],
                    "case": res["case"],
                    "framework": res["at"]["framework"],
                    "grpo_theory": res["at"]["grpo_theory"],
                }
            )
    return out


def _summarise(kind: str, setting: str, ours: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    agree = [r for r in results if r["status"] in ("agree", "both refuse")]
    max_agree = max((r.get("max_rel_diff", 0.0) for r in agree), default=0.0)
    kinds: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: (r["size"], r["case"])):
        if r["status"] in ("agree", "both refuse"):
            continue
        k = kinds.setdefault(
            f"{r['status']} ({r['family']})", {"cases": [], "smallest": r, "max_abs_diff": 0.0}
        )
        k["cases"].append(r["case"])
        d = r.get("max_abs_diff")
        if isinstance(d, float):
            k["max_abs_diff"] = max(k["max_abs_diff"], d)
    return {
        "kind": kind,
        "setting": setting,
        "grpo_theory": ours,
        "agree": len(agree),
        "total": len(results),
        "max_rel_diff_agreeing": max_agree,
        "discrepancies": kinds,
        "results": results,
    }
