"""Schemas of the JSON records the library reads back, checked as they are read.

A schema is written with plain Python values:

* ``int``, ``float``, ``str``, ``bool``: a value of that JSON type (``int`` excludes ``bool``;
  ``float`` is any number but a ``bool``: JSON does not tell ``1`` from ``1.0``; a string such
  as ``"0.5"`` is not a number);
* ``list`` / ``dict``: any array / object; ``[spec]``: an array whose items match ``spec``;
* ``{"key": spec, "other?": spec}``: an object with these keys (``?``: the key may be missing;
  other keys are allowed);
* :class:`Each` ``(spec)``: an object whose every value matches ``spec`` (any keys);
* a tuple ``(spec, ...)``: any one of them; ``None`` in it allows ``null``;
* :class:`Num` ``(ge=..., le=...)`` / :class:`Int` ``(ge=...)``: a number / integer in bounds.

:func:`check_record` raises :class:`RecordError` (a ``ValueError``) whose message names where
(``"FILE: line 3"``), the key path (``by_R['4'].mixed``) and what is wrong.

>>> schema = {"prompt_index": Int(ge=0), "rewards": [float], "note?": (str, None)}
>>> check_record({"prompt_index": 3, "rewards": [1, 0.5]}, schema, where="r.jsonl: line 1")
>>> check_record({"prompt_index": 3, "rewards": ["1"]}, schema, where="r.jsonl: line 2")
Traceback (most recent call last):
    ...
grpo_io.records.RecordError: r.jsonl: line 2: rewards[0] must be a number, got '1'
>>> check_record({}, schema, where="r.jsonl: line 3")
Traceback (most recent call last):
    ...
grpo_io.records.RecordError: r.jsonl: line 3: key 'prompt_index' is missing
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RecordError", "Int", "Num", "Each", "check_record", "reject_duplicate_keys"]


class RecordError(ValueError):
    """A record that does not match its schema; one line naming the file, line, key and fault."""


@dataclass(frozen=True)
class Num:
    """A number (not a bool) with optional bounds; ``finite=True`` also refuses ``inf``."""

    ge: float | None = None
    le: float | None = None
    finite: bool = False


@dataclass(frozen=True)
class Int:
    """An integer (not a bool) with optional bounds."""

    ge: int | None = None
    le: int | None = None


@dataclass(frozen=True)
class Each:
    """An object whose every value matches ``spec`` (keys of any name)."""

    spec: Any


_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          list: "a list", dict: "an object", None: "null"}


def _describe(spec: Any) -> str:
    if isinstance(spec, tuple):
        return " or ".join(_describe(s) for s in spec)
    if isinstance(spec, list):
        return "a list"
    if isinstance(spec, dict | Each):
        return "an object"
    if isinstance(spec, Num):
        return "a number"
    if isinstance(spec, Int):
        return "an integer"
    return _WORDS.get(spec, str(spec))


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _matches_type(v: Any, spec: Any) -> bool:
    """Whether ``v`` has the outer type of ``spec`` (bounds and contents not yet checked)."""
    if spec is None:
        return v is None
    if spec is int or isinstance(spec, Int):
        return _is_int(v)
    if spec is float or isinstance(spec, Num):
        return _is_num(v)
    if spec in (str, bool):
        return type(v) is spec
    if spec is list or isinstance(spec, list):
        return isinstance(v, list)
    if spec is dict or isinstance(spec, dict | Each):
        return isinstance(v, dict)
    raise TypeError(f"unsupported schema element {spec!r}")


def _check(v: Any, spec: Any, path: str) -> str | None:
    """The fault of ``v`` against ``spec`` at key path ``path`` (``None``: it matches)."""
    here = path or "the record"
    if isinstance(spec, tuple):
        for s in spec:
            if _matches_type(v, s):
                return _check(v, s, path)
        return f"{here} must be {_describe(spec)}, got {_shown(v)}"
    if not _matches_type(v, spec):
        return f"{here} must be {_describe(spec)}, got {_shown(v)}"
    if isinstance(spec, Num | Int):
        if isinstance(spec, Num) and spec.finite and not math.isfinite(v):
            return f"{here} must be finite, got {v!r}"
        if (spec.ge is not None and v < spec.ge) or (spec.le is not None and v > spec.le):
            bounds = " and ".join(f"{op} {b}" for op, b in ((">=", spec.ge), ("<=", spec.le))
                                  if b is not None)
            return f"{here} must be {bounds}, got {v!r}"
    elif isinstance(spec, list) and spec:
        for i, item in enumerate(v):
            fault = _check(item, spec[0], f"{path}[{i}]")
            if fault:
                return fault
    elif isinstance(spec, Each):
        for k, item in v.items():
            fault = _check(item, spec.spec, f"{path}[{k!r}]")
            if fault:
                return fault
    elif isinstance(spec, dict):
        for key, sub in spec.items():
            optional = key.endswith("?")
            name = key[:-1] if optional else key
            if name not in v:
                if optional:
                    continue
                return f"key {(path + '.' if path else '') + name!r} is missing"
            fault = _check(v[name], sub, f"{path}.{name}" if path else name)
            if fault:
                return fault
    return None


def check_record(record: Any, schema: Any, *, where: str) -> None:
    """Check ``record`` against ``schema`` (see the module docstring).

    Raises:
        RecordError: ``"<where>: <key path> must be ..., got ..."`` or ``"... key '...' is
            missing"``.
    """
    fault = _check(record, schema, "")
    if fault is not None:
        raise RecordError(f"{where}: {fault}")


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads(..., object_pairs_hook=reject_duplicate_keys)``: an object that names a key
    twice is an error (``json`` would keep the last value silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise RecordError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out
