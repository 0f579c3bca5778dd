"""Output helpers of the real-model experiments: resume checks on top of :mod:`grpo_io`.

JSON(L) writing and reading, the non-finite policy and the environment record are
:mod:`grpo_io`'s (re-exported here for the experiment modules).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpo_io
from grpo_io import append_jsonl, read_jsonl, rewrite_jsonl, write_json
from grpo_io import to_jsonable as jsonable

__all__ = [
    "jsonable",
    "write_json",
    "append_jsonl",
    "read_jsonl",
    "rewrite_jsonl",
    "environment",
    "check_config",
]

#: Libraries recorded with every real-model run.
LIBRARIES: tuple[str, ...] = ("numpy", "torch", "transformers")


def environment(device: str | None = None) -> dict[str, Any]:
    """:func:`grpo_io.environment` with real_model's libraries and ``device`` (default cpu)."""
    return grpo_io.environment(libraries=LIBRARIES, device=device or "cpu")


def check_config(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` to ``path``, or check that it equals the one already there (resume)."""
    cfg = jsonable(config)
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"{path} is not valid JSON ({exc}); delete it or pass --overwrite"
            ) from None
        if not isinstance(old, dict):
            raise ValueError(f"{path} must hold a JSON object; delete it or pass --overwrite")
        if old != cfg:
            diff = sorted(k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k))
            raise ValueError(
                f"{path.parent} holds a run with a different configuration (differs in {diff}); "
                "use a new --out directory or pass --overwrite"
            )
        return
    write_json(path, cfg)
