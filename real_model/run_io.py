"""Output helpers of the real-model experiments: resume checks and record schemas on top of
:mod:`grpo_io`.

A resumed run must match the configuration its folder was written under: :func:`check_config`
(``config.json``) and :func:`check_record_configs` (the ``config`` field of every record) refuse a
mismatch by option name.

Every file a run reads back is checked as it is read (one line naming the file, the line and the
fault; :mod:`grpo_io.records`): :func:`read_rank_records` (``real rank``'s ``results.jsonl``,
one record per prompt index), :func:`read_train_steps` (``real train``'s ``steps.jsonl``, one per
step), :func:`read_results` (a ``results.json`` given to ``compare --real`` or
``audit --real``).

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
from grpo_io.records import Each, Int, Num, RecordError, check_record

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
    "SUMMARY_ROW",
    "RESULTS",
    "RESULTS_BY_EXPERIMENT",
    "read_rank_records",
    "read_train_steps",
    "read_results",
]

_NUM = (float, None)  # a number, or null (NaN and "undefined" are written as null)
_FINITE = (Num(finite=True), None)  # a finite number, or null (undefined)

#: A line of ``real rank``'s ``results.jsonl`` (the keys a resumed run and the summary read).
RANK_RECORD = {
    "prompt_index": Int(ge=0),
    "rewards": [float],
    "by_R": Each({"mixed": bool, "estimators": Each({"max_rank": Int(ge=0)})}),
    "config?": dict,
}
#: A line of ``real train``'s (or ``real trl-train``'s) ``steps.jsonl``.
TRAIN_STEP = {"step": Int(ge=0), "accuracy": _NUM, "spectra": dict, "config?": dict}
#: A ``summary`` row of a ``results.json`` (:func:`real_model.outputs.summarize_rank`): group
#: size ``R``, its groups, and the main estimator's means and sds over the mixed ones.
SUMMARY_ROW = {
    "R": Int(ge=2),
    "groups": Int(ge=0),
    "mixed_groups": Int(ge=0),
    "effective_rank_mean": _FINITE,
    "effective_rank_sd": _FINITE,
    "top1_mean": _FINITE,
    "top1_sd": _FINITE,
}
#: What the readers of a real-model ``results.json`` use (``compare --real``, ``audit --real``),
#: per experiment; the key order is the order of the checks.
RESULTS = {
    "experiment": str,
    "summary": [SUMMARY_ROW],
    "model": {"name": str, "num_parameters?": (Int(ge=1), None)},
    "accuracy?": _FINITE,
}
RESULTS_BY_EXPERIMENT: dict[str, dict[str, Any]] = {
    "real_rank": {**RESULTS, "main_estimator": str, "num_groups": Int(ge=0)},
    "real_trl_train": RESULTS,
}
#: The command that writes each experiment's ``results.json``.
_COMMANDS = {"real_rank": "real rank", "real_trl_train": "real trl-train"}


def read_rank_records(path: Path) -> list[dict[str, Any]]:
    """The records of ``real rank``'s ``results.jsonl`` at ``path``, each checked against
    :data:`RANK_RECORD`; a prompt index seen twice is an error naming both lines (a resumed run
    never counts a prompt twice)."""
    return read_jsonl(path, schema=RANK_RECORD, unique="prompt_index")


def read_train_steps(path: Path) -> list[dict[str, Any]]:
    """The records of a ``steps.jsonl`` at ``path``, each checked against :data:`TRAIN_STEP`;
    a step seen twice is an error naming both lines."""
    return read_jsonl(path, schema=TRAIN_STEP, unique="step")


def _results_fault(res: dict[str, Any]) -> str | None:
    """What the schema cannot say: a named model, a non-empty summary, no ``R`` twice, no more
    mixed groups than groups, and a mean wherever there is a mixed group."""
    if not res["model"]["name"]:
        return "model.name is empty"
    if not res["summary"]:
        return "summary has no rows"
    for i, row in enumerate(res["summary"]):
        if row["mixed_groups"] > row["groups"]:
            return (f"summary[{i}].mixed_groups ({row['mixed_groups']}) exceeds "
                    f"summary[{i}].groups ({row['groups']})")
        if row["mixed_groups"] > 0 and row["effective_rank_mean"] is None:
            return (f"summary[{i}] has {row['mixed_groups']} mixed groups but "
                    "effective_rank_mean is null")
    Rs = [row["R"] for row in res["summary"]]
    if len(set(Rs)) < len(Rs):
        return f"summary holds R = {sorted(Rs)}, some twice"
    return None


def read_results(
    path: Path,
    *,
    experiments: Sequence[str] = tuple(RESULTS_BY_EXPERIMENT),
    fix: str = "pass the results.json of `grpo-audit real rank --out DIR`",
) -> dict[str, Any]:
    """A real-model ``results.json`` of one of ``experiments`` (default: ``real rank`` and
    ``real trl-train``), checked against its schema (:data:`RESULTS_BY_EXPERIMENT`) and
    :func:`_results_fault`'s cross-field rules.

    Raises:
        ValueError: one line naming the file, the field and what is wrong, then ``fix`` (what
            the user should do).
    """
    try:
        res = grpo_io.read_json(path)
        kind = res.get("experiment") if isinstance(res, dict) else None
        if kind not in experiments:
            what = (f"experiment {kind!r}" if isinstance(res, dict)
                    else f"it holds a {type(res).__name__}, not an object")
            names = " or ".join(f"`{_COMMANDS[e]}`" for e in experiments)
            raise RecordError(f"{path} is not a {names} results.json ({what})")
        check_record(res, RESULTS_BY_EXPERIMENT[kind], where=str(path))
        fault = _results_fault(res)
        if fault is not None:
            raise RecordError(f"{path}: {fault}")
    except ValueError as exc:
        raise ValueError(f"{exc}; {fix}") from None
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
