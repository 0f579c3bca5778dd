"""Output helpers of the real-model experiments: resume checks on top of :mod:`grpo_io`.

A resumed run must match the configuration its folder was written under: :func:`check_config`
(``config.json``) and :func:`check_record_configs` (the ``config`` field of every record) refuse a
mismatch by option name.

JSON(L) writing and reading, the non-finite policy and the environment record are
:mod:`grpo_io`'s (re-exported here for the experiment modules).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpo_io
from grpo_io import append_jsonl, read_jsonl, rewrite_jsonl, write_json
from grpo_io import to_jsonable as jsonable

__all__ = [
    "jsonable",
    "read_json",
    "write_json",
    "append_jsonl",
    "read_jsonl",
    "rewrite_jsonl",
    "environment",
    "check_config",
    "check_record_configs",
]

#: Libraries recorded with every real-model run.
LIBRARIES: tuple[str, ...] = ("numpy", "torch", "transformers")


def environment(device: str | None = None) -> dict[str, Any]:
    """:func:`grpo_io.environment` with real_model's libraries and ``device`` (default cpu)."""
    return grpo_io.environment(libraries=LIBRARIES, device=device or "cpu")


def read_json(path: Path, *, fix: str) -> Any:
    """The JSON value in ``path``; a file that is not valid UTF-8 JSON raises ``ValueError``
    naming it, the parse error and ``fix`` (what the user should do)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); {fix}") from None


def check_config(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` to ``path``, or check that it equals the one already there (resume)."""
    cfg = jsonable(config)
    if path.is_file():
        old = read_json(path, fix="delete it or pass --overwrite")
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


def check_record_configs(
    records: Sequence[dict[str, Any]], key: dict[str, Any], path: Path, *, have_config: bool
) -> None:
    """Refuse records computed under another configuration than ``key`` (by option name).

    Records without a ``config`` field (written by an older version) are accepted only when the
    run's ``config.json`` exists (``have_config``): it then vouches for them.
    """
    want = jsonable(key)
    for n, rec in enumerate(records):
        got = rec.get("config")
        if got is None:
            if have_config:
                continue
            raise ValueError(
                f"{path} holds records without their configuration and {path.parent}/config.json "
                "is missing, so they may come from other settings; use a new --out directory or "
                "pass --overwrite"
            )
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            detail = ", ".join(f"{k}: recorded {got.get(k)!r}, now {want.get(k)!r}" for k in diff)
            raise ValueError(
                f"{path} record {n + 1} was computed with a different configuration ({detail}); "
                "use a new --out directory or pass --overwrite"
            )
