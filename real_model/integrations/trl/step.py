"""The record of one measured TRL step, and the step's outcome as pure functions of it.

While TRL runs a due optimizer step, the integration fills a :class:`StepState` (its segments:
rows and TRL's per-token loss gradient ``u``; its in-run captures; any failure). After the
step's last backward every process sends :func:`local_payload` of it to the others; from the
gathered payloads :func:`finished_fields` gives the step's JSONL fields (or the one reason every
process skips it for), the same on every process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..protocol import aggregate_groups, diagnostic_sums, padded_gram
from .weights import second_pass_only

__all__ = ["FSDP2_UNEVEN", "GeometryStrictError", "attempt", "StepState", "local_payload",
           "finished_fields", "skipped_groups", "local_diagnostic_sums"]

#: Start of the reason given when FSDP2 processes would run different second-pass forwards.
FSDP2_UNEVEN = "FSDP2: the processes would run different second-pass forwards"


class GeometryStrictError(RuntimeError):
    """Raised under ``strict=True`` instead of skipping a step's geometry."""


def attempt(fn: Any) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, reason)`` for any exception (a strict error re-raises)."""
    try:
        return fn(), None
    except GeometryStrictError:
        raise
    except Exception as exc:  # noqa: BLE001 - the geometry must never stop training
        _free_memory()
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class StepState:
    """The optimizer step being measured: its segments (rows and ``u``) and any failure."""

    step: int
    t0: float
    segments: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    mode: str = "second_pass"  # this step's geometry mode
    # in-run: (generation, chunk) -> {group: positions in the chunk} of whole groups
    inrun: dict[tuple[int, int], dict[int, list[int]]] = field(default_factory=dict)
    micro: list[Any] = field(default_factory=list)  # ``inrun.InRunMicro`` of the step
    finish_at: int | None = None  # micro-step after whose backward the step is measured
    spent: float = 0.0  # in-run modes: seconds of geometry work outside TRL's own step


NO_INRUN: dict[str, Any] = {"groups": [], "present": [], "failed": {}, "errors": []}


def local_payload(st: StepState, inrun: Mapping[str, Any] | None, meas: Any, err: str | None,
                  seconds: float, *, success_threshold: float = 0.5,
                  world: int = 1) -> dict[str, Any]:
    """What this process sends the others after the step: its failure, its groups' records
    (second pass and in-run), its groups' diagnostic sums (scalars), its gradient's squared
    norm, time and issues. ``world``: the processes, whose gradients the data-parallel wrapper
    averages (each row of the optimizer's gradient is a process's row over ``world``)."""
    ok = err is None
    local = inrun if (ok and inrun is not None) else NO_INRUN
    second = [dict(g, path="second_pass") for g in meas.groups] if ok else []
    sums, sums_err = attempt(lambda: local_diagnostic_sums(
        second + local["groups"], {**meas.row_grams, **(local.get("row_grams") or {})},
        success_threshold=success_threshold, scale=1.0 / world)) if ok else ({}, None)
    return {
        "err": err, "groups": second + local["groups"], "sums": sums, "sums_err": sums_err,
        "sq": meas.local_grad_sq if ok else None,
        "time": seconds,
        "issues": sorted({i for s in st.segments for i in s["issues"]}),
        "present": local["present"], "failed": local["failed"], "errors": local["errors"],
    }


def finished_fields(gathered: Sequence[Mapping[str, Any]], *, mode: str, uneven: str | None
                    ) -> tuple[str | None, dict[str, Any], list[dict[str, Any]]]:
    """``(reason, fields, groups)`` of the step from every process's :func:`local_payload`:
    the first process's failure (then nothing else), else the step's JSONL fields and its
    group records (the same on every process)."""
    reasons = [p["err"] for p in gathered if p["err"]]
    if reasons:
        return reasons[0], {}, []
    groups = [g for p in gathered for g in p["groups"]]
    skipped = (skipped_groups(gathered, groups, default=uneven)
               if mode == "in_run" or uneven else [])
    issues = sorted({i for p in gathered for i in p["issues"]})
    if not any(g["path"] == "second_pass" for g in groups):
        issues = [i for i in issues if not second_pass_only(i)]
    sq = [p["sq"] for p in gathered]
    fields = {
        "exact": not issues,
        "issues": issues,
        "groups_with_gradient": sum(bool(g["has_gradient"]) for g in groups) + len(skipped),
        "groups_measured": sum("grad_norm" in g for g in groups),
        "grad_norm": (math.sqrt(sq[0]) if len(sq) == 1 and sq[0] is not None else None),
        **aggregate_groups(groups),
        "in_run_groups": sum(g["path"] == "in_run" for g in groups),
        "second_pass_groups": sum(g["path"] == "second_pass" for g in groups),
        "skipped_groups": skipped,
        "in_run_errors": sorted({e for p in gathered for e in p["errors"]}),
        "geometry_time_s": float(max(p["time"] for p in gathered)),
    }
    return None, fields, groups


def skipped_groups(gathered: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]],
                    *, default: str | None = None) -> list[dict[str, Any]]:
    """The groups of the step not measured, with the reason: ``in_run`` mode (groups not whole
    in one micro-batch, or whose capture failed), or ``auto`` when the second pass was dropped
    (``default``: why)."""
    measured = {int(g["group"]) for g in groups}
    failed = {int(k): v for p in gathered for k, v in p["failed"].items()}
    present = sorted({int(k) for p in gathered for k in p["present"]} - measured)
    default = default or ("rows not all in one micro-batch on one process (geometry_mode=auto "
                          "measures such groups by the second pass)")
    return [{"group": k, "reason": failed.get(k, default)} for k in present]


def local_diagnostic_sums(groups: Sequence[Mapping[str, Any]], row_grams: Mapping[int, Any], *,
                          success_threshold: float, scale: float = 1.0) -> dict[str, float]:
    """:func:`..protocol.diagnostic_sums` of this process's groups: each group's Gram of its
    rows in the step (``row_grams[group]`` over its ``measured_rows``; zero rows for the rows
    with an empty loss mask, all zero for a group without gradient), their loss-token counts
    and rewards. A group counts the rows it has in this optimizer step (``rows_present``).
    ``scale``: the factor of every row in the optimizer's gradient (``1 / processes`` under
    data parallelism, which averages; the Grams scale by its square)."""
    inputs = []
    for g in groups:
        rows = list(g["rows"])
        measured = g.get("measured_rows", []) if g["has_gradient"] else []
        K = (scale * scale) * row_grams[int(g["group"])] if measured else np.zeros((0, 0))
        inputs.append((padded_gram(K, [rows.index(r) for r in measured], len(rows)),
                       g["lengths"], g["rewards"]))
    return diagnostic_sums(inputs, success_threshold=success_threshold)
