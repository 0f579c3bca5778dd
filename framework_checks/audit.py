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

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .battery import Case, battery
from .load import load_framework
from .ours import ADVANTAGE_MAP, LOSS_MAP

__all__ = ["RTOL", "DEFAULT_SETTING", "audit_framework", "compare"]

RTOL = 1e-5


# --- comparing ------------------------------------------------------------------------------------
def compare(
    fw: Callable[[], np.ndarray], ours: Callable[[], np.ndarray], carry: np.ndarray
) -> dict[str, Any]:
    """Run both sides; classify; ``carry`` marks the entries that matter (tokens exist)."""
    fw_err = our_err = None
    a = b = None
    try:
        a = np.asarray(fw(), dtype=np.float64)
    except Exception as exc:  # noqa: BLE001 - any framework failure is a finding
        fw_err = f"{type(exc).__name__}: {exc}"[:160]
    try:
        b = np.asarray(ours(), dtype=np.float64)
    except (ValueError, TypeError) as exc:
        our_err = f"{type(exc).__name__}: {exc}"[:160]
    if fw_err and our_err:
        return {"status": "both refuse", "framework": fw_err, "grpo_theory": our_err}
    if our_err:
        assert a is not None
        nonfinite = bool(np.any(~np.isfinite(a[carry])))
        return {
            "status": "grpo_theory refuses",
            "grpo_theory": our_err,
            "framework_nonfinite": nonfinite,
            "framework_max_abs": float(np.nanmax(np.abs(a[carry]), initial=0.0)),
        }
    if fw_err:
        return {"status": "framework raises", "framework": fw_err}
    assert a is not None and b is not None
    x, y = a[carry], b[carry]
    if x.size == 0:
        return {"status": "agree", "max_abs_diff": 0.0, "max_rel_diff": 0.0}
    if np.any(~np.isfinite(x)):
        i = int(np.argmax(~np.isfinite(x)))
        return {
            "status": "framework non-finite",
            "max_abs_diff": math.inf,
            "at": {"framework": float(x[i]), "grpo_theory": float(y[i])},
        }
    scale = float(np.max(np.abs(y)))
    d = float(np.max(np.abs(x - y)))
    rel = d / scale if scale > 0 else (0.0 if d == 0 else math.inf)
    status = "agree" if d <= RTOL * scale else "differs"
    i = int(np.argmax(np.abs(x - y)))
    return {
        "status": status,
        "max_abs_diff": d,
        "max_rel_diff": rel,
        "at": {"framework": float(x[i]), "grpo_theory": float(y[i])},
    }


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
    framework: str, source: str | None = None, *, dtype: str = "float32"
) -> dict[str, Any]:
    """Run the battery for one framework; returns a JSON-ready dict (``rows``, ``cases``)."""
    fc = load_framework(framework, source, dtype=dtype)
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
        "rows": rows,
        "kl": audit_kl(framework, source, dtype=dtype),
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
