"""``real train``'s checkpoints: where they live, how they are written, read and resumed from.

Every ``checkpoint_every`` steps (and after the last) :func:`save_checkpoint` writes the model and
AdamW states, the steps done and the step records so far, and the run's configuration to
``checkpoint.pt`` in the run's cache folder (float32 SmolLM2 + AdamW is ~1.6 GB), through a
temporary file, so a killed run leaves the previous checkpoint whole. A checkpoint holds tensors
and plain data only, and is read back with ``torch.load(weights_only=True)``
(:func:`load_checkpoint`): a file holding anything else, e.g. a pickled callable, is refused by
name and nothing in it runs.

The cache folder (:func:`cache_folder`) is, in order: ``--cache-dir``, the folder recorded in
``OUT/checkpoint.json`` by an earlier run, else :func:`default_cache_dir` (derived from the
absolute ``OUT`` path, never inside ``OUT``, so an ``--out`` inside a repository does not collect
checkpoints).

:func:`resume_from_checkpoint` restores a run: the states, the number of steps done, and the step
records up to it (those of ``steps.jsonl``, else the checkpoint's own copy, so a truncated last
line does not shorten the run); a checkpoint of another configuration is refused by option name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_io import atomic_path, read_json
from grpo_io.paths import user_cache_dir
from grpo_io.records import Int, RecordError, check_record

from .run_io import check_record_configs, jsonable

__all__ = [
    "CHECKPOINT_KEYS",
    "default_cache_dir",
    "cache_folder",
    "load_checkpoint",
    "save_checkpoint",
    "resume_from_checkpoint",
    "check_checkpoint_fits",
]


def default_cache_dir(out_dir: str | Path) -> Path:
    """Checkpoint folder of a training run writing to ``out_dir`` (outside ``out_dir``).

    ``train/<id>`` in the user cache folder (:func:`grpo_io.paths.user_cache_dir`:
    ``$GRPO_AUDIT_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/grpo-audit``); ``<id>`` is the
    folder name plus 12 hex digits of the SHA-256 of its absolute path.
    """
    out = Path(out_dir).expanduser().resolve()
    digest = hashlib.sha256(str(out).encode("utf-8")).hexdigest()[:12]
    return user_cache_dir("train", f"{out.name}-{digest}")


def cache_folder(out: Path, cache_dir: str | Path | None) -> Path:
    """The checkpoint folder of a run into ``out``: ``cache_dir`` if given, else the folder that
    ``out/checkpoint.json`` records (an earlier run's), else :func:`default_cache_dir`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    pointer = out / "checkpoint.json"
    if pointer.exists():
        try:
            return Path(read_json(pointer, schema={"cache_dir": str})["cache_dir"])
        except ValueError as exc:
            raise ValueError(
                f"{pointer} is not a valid checkpoint pointer ({exc}); delete it, pass "
                "--cache-dir or --overwrite"
            ) from None
    return default_cache_dir(out)


#: Keys every checkpoint of ``real train`` holds.
CHECKPOINT_KEYS = ("model", "optimizer", "steps_done", "records", "config")


def load_checkpoint(path: str | Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a ``real train`` checkpoint with ``torch.load(..., weights_only=True)``.

    A checkpoint holds only tensors and plain data (the model and AdamW state dicts, ints, and
    the step records and configuration as JSON-like dicts), which ``weights_only=True`` accepts;
    anything else (a pickled callable, an object of some class: a file written by another
    program, or altered) is refused by torch's restricted unpickler before it is built, so
    nothing in the file runs.

    Raises:
        ValueError: one line naming the file and saying how to proceed (a new ``--out``, or
            ``--overwrite`` to discard it).
    """
    import pickle

    import torch

    advice = _ADVICE
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = next((ln.strip() for ln in str(exc).splitlines()
                       if "GLOBAL" in ln or "Unsupported" in ln), "")[:200]
        raise ValueError(
            f"checkpoint {path} holds more than tensors and plain data, so it is not loaded "
            f"(torch.load weights_only=True refused it{': ' + reason if reason else ''}; nothing "
            "in it was run): it was not written by this version of grpo-audit real train, or "
            f"was altered; {advice}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ValueError(
            f"checkpoint {path} is not a readable torch checkpoint ({type(exc).__name__}"
            f"{': ' if str(exc) else ''}{' '.join(str(exc).split())[:200]}); {advice}"
        ) from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(
            f"checkpoint {path} lacks {missing} (an older or foreign checkpoint); {advice}"
        )
    try:
        check_record(state, _STATE, where=f"checkpoint {path}")
    except RecordError as exc:
        raise ValueError(f"{exc}; {advice}") from None
    return state


#: The plain-data part of a checkpoint (the states are checked against the model on resume).
_STATE = {"model": dict, "optimizer": {"state": dict, "param_groups": list},
          "steps_done": Int(ge=0), "records": [{"step": Int(ge=0)}], "config": dict}
_ADVICE = "run into a new --out (or pass --overwrite to discard this checkpoint and its steps)"


def check_checkpoint_fits(path: Path, state: Mapping[str, Any], model: Any) -> None:
    """The model state of checkpoint ``state`` (read from ``path``) has exactly the tensors of
    ``model``: the same names and shapes; else one ``ValueError`` line naming the file, what
    differs and what to do."""
    want = model.state_dict()
    got = state["model"]
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    shapes = [k for k in want if k in got and (not hasattr(got[k], "shape")
                                               or tuple(got[k].shape) != tuple(want[k].shape))]
    if not (missing or extra or shapes):
        return
    parts = []
    for what, keys in (("missing", missing), ("unexpected", extra), ("of another shape", shapes)):
        if keys:
            parts.append(f"{len(keys)} tensors {what} (e.g. {keys[0]})")
    raise ValueError(
        f"checkpoint {path} does not fit the model it is loaded into: {'; '.join(parts)} (a "
        f"checkpoint of another model, or damaged); {_ADVICE}"
    )


def save_checkpoint(
    path: Path,
    model: Any,
    optimizer: Any,
    *,
    steps_done: int,
    records: Sequence[dict[str, Any]],
    config: Mapping[str, Any],
) -> None:
    """Write a checkpoint (the keys :data:`CHECKPOINT_KEYS`) to ``path`` through a temporary file
    beside it (:func:`grpo_io.atomic_path`: removed on any error or interrupt).

    Args:
        path: the checkpoint file (``checkpoint.pt`` in the cache folder).
        model, optimizer: their ``state_dict()`` is saved.
        steps_done: steps trained so far.
        records: the step records of steps ``0 .. steps_done-1`` (JSON-ready).
        config: the run's resume key (saved as JSON-ready data).
    """
    import torch

    with atomic_path(path) as tmp:  # an interrupted save leaves the previous checkpoint whole
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "steps_done": steps_done,
                "records": list(records),
                "config": jsonable(config),
            },
            tmp,
        )


def resume_from_checkpoint(
    path: Path,
    model: Any,
    optimizer: Any,
    *,
    key: Mapping[str, Any],
    records: Sequence[dict[str, Any]],
    jsonl: Path,
) -> tuple[int, list[dict[str, Any]]]:
    """Restore ``model`` and ``optimizer`` from the checkpoint at ``path``, if there is one.

    Args:
        path: the checkpoint file (may be missing: a fresh run).
        model, optimizer: loaded in place.
        key: the run's resume key; a checkpoint recorded under another is refused.
        records: the step records read from ``jsonl`` (``steps.jsonl``).
        jsonl: named in the error when a step record is lost from both files.

    Returns:
        ``(steps_done, kept)``: the steps the checkpoint has trained (0 without one) and the
        records of steps ``0 .. steps_done-1``, each from ``records`` or else from the
        checkpoint's copy.
    """
    if not path.is_file():
        return 0, []
    state = load_checkpoint(path, map_location=next(model.parameters()).device)
    if "config" in state and state["config"] != jsonable(key):
        check_record_configs([{"config": state["config"]}], dict(key), path, have_config=True)
    check_checkpoint_fits(path, state, model)
    model.load_state_dict(state["model"])
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ValueError(
            f"checkpoint {path}: its optimizer state does not fit this model's parameters "
            f"({' '.join(str(exc).split())[:200]}); {_ADVICE}"
        ) from None
    start = int(state["steps_done"])
    have = {int(r["step"]): r for r in records if int(r["step"]) < start}
    saved = {int(r["step"]): r for r in state["records"]}
    missing = [s for s in range(start) if s not in have and s not in saved]
    if missing:
        raise ValueError(
            f"{jsonl} lacks the records of steps {missing} that checkpoint {path} has "
            "already trained; pass --overwrite to start again"
        )
    return start, [have.get(s, saved.get(s)) for s in range(start)]
