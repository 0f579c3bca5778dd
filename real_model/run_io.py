"""Output helpers of the real-model experiments: resume checks and record schemas on top of
:mod:`grpo_io`.

A resumed run must match the configuration its folder was written under: :func:`check_config`
(``config.json``) and :func:`check_record_configs` (the ``config`` field of every record) refuse a
mismatch by option name.

Every file a run reads back is checked as it is read (one line naming the file, the line and the
fault; :mod:`grpo_io.records`): :func:`read_rank_records` (``real rank``'s ``results.jsonl``,
one record per prompt index), :func:`read_train_steps` (``real train``'s ``steps.jsonl``, one per
step), :func:`read_results` (a ``results.json`` given to ``compare --real``).

JSON(L) writing and reading, the non-finite policy and the environment record are
:mod:`grpo_io`'s (re-exported here for the experiment modules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpo_io
from grpo_io import append_jsonl, read_jsonl, rewrite_jsonl, write_json
from grpo_io import to_jsonable as jsonable
from grpo_io.records import Each, Int, RecordError, check_record

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
    "RANK_RECORD",
    "TRAIN_STEP",
    "RESULTS",
    "read_rank_records",
    "read_train_steps",
    "read_results",
]

_NUM = (float, None)  # a number, or null (NaN and "undefined" are written as null)

#: A line of ``real rank``'s ``results.jsonl`` (the keys a resumed run and the summary read).
RANK_RECORD = {
    "prompt_index": Int(ge=0),
    "rewards": [float],
    "by_R": Each({"mixed": bool, "estimators": Each({"max_rank": Int(ge=0)})}),
    "config?": dict,
}
#: A line of ``real train``'s (or ``real trl-train``'s) ``steps.jsonl``.
TRAIN_STEP = {"step": Int(ge=0), "accuracy": _NUM, "spectra": dict, "config?": dict}
#: A ``results.json`` of ``real rank`` / ``real trl-train`` as ``compare --real`` reads it.
RESULTS = {
    "experiment": str,
    "model?": ({"name?": str}, None),
    "accuracy?": _NUM,
    "summary": [{
        "R": Int(ge=2),
        "effective_rank_mean": _NUM,
        "effective_rank_sd": _NUM,
        "top1_mean": _NUM,
        "top1_sd": _NUM,
        "mixed_groups": Int(ge=0),
    }],
}
_RESULT_KINDS = ("real_rank", "real_trl_train")


def read_rank_records(path: Path) -> list[dict[str, Any]]:
    """The records of ``real rank``'s ``results.jsonl`` at ``path``, each checked against
    :data:`RANK_RECORD`; a prompt index seen twice is an error naming both lines (a resumed run
    never counts a prompt twice)."""
    return read_jsonl(path, schema=RANK_RECORD, unique="prompt_index")


def read_train_steps(path: Path) -> list[dict[str, Any]]:
    """The records of a ``steps.jsonl`` at ``path``, each checked against :data:`TRAIN_STEP`;
    a step seen twice is an error naming both lines."""
    return read_jsonl(path, schema=TRAIN_STEP, unique="step")


def read_results(path: Path) -> dict[str, Any]:
    """A ``real rank`` / ``real trl-train`` ``results.json``, checked against :data:`RESULTS`
    (one summary row per ``R``).

    Raises:
        ValueError: one line naming the file and what is wrong (and the command that writes
            such a file).
    """
    fix = "pass the results.json of `grpo-audit real rank --out DIR`"
    try:
        res = grpo_io.read_json(path)
        kind = res.get("experiment") if isinstance(res, dict) else None
        if kind not in _RESULT_KINDS:
            raise RecordError(f"{path} is not a `real rank` or `real trl-train` results.json "
                              f"(experiment {kind!r})")
        check_record(res, RESULTS, where=str(path))
    except ValueError as exc:
        raise ValueError(f"{exc}; {fix}") from None
    Rs = [row["R"] for row in res["summary"]]
    if len(set(Rs)) < len(Rs):
        raise ValueError(f"{path}: summary holds R = {sorted(Rs)}, some twice; {fix}")
    return res


#: Libraries recorded with every real-model run.
LIBRARIES: tuple[str, ...] = ("numpy", "torch", "transformers")


def environment(device: str | None = None) -> dict[str, Any]:
    """:func:`grpo_io.environment` with real_model's libraries and ``device`` (default cpu)."""
    return grpo_io.environment(libraries=LIBRARIES, device=device or "cpu")


def read_json(path: Path, *, fix: str, schema: Any = None) -> Any:
    """The JSON value in ``path`` (checked against ``schema`` when given); a file that is not
    valid UTF-8 JSON, or does not match, raises one ``ValueError`` line naming it, the fault and
    ``fix`` (what the user should do)."""
    try:
        return grpo_io.read_json(path, schema=schema)
    except ValueError as exc:
        raise ValueError(f"{exc}; {fix}") from None


def check_config(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` to ``path``, or check that it equals the one already there (resume)."""
    cfg = jsonable(config)
    if path.is_file():
        old = read_json(path, fix="delete it or pass --overwrite", schema=dict)
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
