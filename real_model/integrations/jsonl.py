"""The per-step JSONL of a host's geometry, written through ``grpo_io`` (strict JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_io import append_jsonl, read_jsonl, rewrite_jsonl

__all__ = ["StepLog", "write_step"]


@dataclass
class StepLog:
    """Where a run's step records go. ``redo``: a run that starts again at a step already on
    file (a resumed TRL run) first drops the records of that step and later ones."""

    path: Path
    redo: bool = False
    ready: bool = False


def write_step(log: StepLog, rec: dict[str, Any]) -> None:
    """Append ``rec`` (with its ``step``); the folder is made at the first record."""
    if not log.ready:
        log.path.parent.mkdir(parents=True, exist_ok=True)
        if log.redo and log.path.is_file():
            keep = [r for r in read_jsonl(log.path) if int(r.get("step", -1)) < rec["step"]]
            rewrite_jsonl(log.path, keep)
        log.ready = True
    append_jsonl(log.path, rec)
