"""JSON / JSONL reading and writing with one non-finite policy (see :data:`NONFINITE_POLICY`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "NONFINITE_POLICY",
    "to_jsonable",
    "from_jsonable",
    "dumps",
    "atomic_write_text",
    "write_json",
    "read_json",
    "append_jsonl",
    "iter_jsonl",
    "read_jsonl",
    "rewrite_jsonl",
]

#: The one policy for floats JSON cannot hold.
NONFINITE_POLICY = (
    "NaN -> null (undefined; read back as None); +inf -> \"inf\", -inf -> \"-inf\" "
    "(read back as floats); everything else is strict JSON (allow_nan=False). Limitation: "
    "from_jsonable also reads a genuine string value \"inf\" or \"-inf\" as a float, so records "
    "must not store those two strings as text"
)
_INF = {"inf": math.inf, "-inf": -math.inf}


def _float(v: float) -> float | str | None:
    if math.isnan(v):
        return None
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def to_jsonable(x: Any) -> Any:
    """Recursively convert ``x`` to JSON types under :data:`NONFINITE_POLICY`.

    Mappings (keys become ``str``), lists, tuples, dataclass instances, numpy scalars and arrays
    and torch tensors (``.detach().cpu().numpy()``) are converted without importing numpy or
    torch; other numbers with ``__float__`` (e.g. sympy rationals) become floats; anything else
    is returned unchanged (``json.dumps`` then names it).

    >>> to_jsonable({"a": (1, 2.5), "nan": float("nan"), "z": float("-inf"), 3: True})
    {'a': [1, 2.5], 'nan': None, 'z': '-inf', '3': True}
    """
    if x is None or isinstance(x, str | bool):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return _float(float(x))
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x))
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor
        x = x.detach().cpu().numpy()
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy array or scalar
        return to_jsonable(x.tolist())
    if hasattr(x, "__float__"):  # sympy numbers and the like
        try:
            return _float(float(x))
        except (TypeError, ValueError):
            return str(x)
    return x


def from_jsonable(x: Any) -> Any:
    """Undo :func:`to_jsonable`'s encoding of infinities (``"inf"``/``"-inf"`` -> floats).

    >>> from_jsonable({"z": "inf", "v": [None, "-inf", "text"]})
    {'z': inf, 'v': [None, -inf, 'text']}
    """
    if isinstance(x, str):
        return _INF.get(x, x)
    if isinstance(x, dict):
        return {k: from_jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [from_jsonable(v) for v in x]
    return x


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """``json.dumps(to_jsonable(obj), allow_nan=False)`` (strict JSON)."""
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file beside it, then a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as strict JSON (trailing newline), atomically."""
    atomic_write_text(path, dumps(obj, indent=indent) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file written by :func:`write_json` (infinities restored)."""
    return from_jsonable(json.loads(Path(path).read_text(encoding="utf-8")))


def append_jsonl(path: str | os.PathLike[str], record: Any) -> None:
    """Append one record as a JSON line and flush it (streamed results)."""
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(dumps(record) + "\n")
        fh.flush()


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[Any]:
    """Records of a JSONL file, one at a time; blank lines are skipped, a truncated last line
    (interrupted append) is dropped, and any other line that is not JSON raises ``ValueError``
    naming it. A missing file yields nothing."""
    path = Path(path)
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                return
            raise ValueError(f"{path}: line {n + 1} is not valid JSON") from None
        yield from_jsonable(rec)


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """All records of :func:`iter_jsonl` as a list."""
    return list(iter_jsonl(path))


def rewrite_jsonl(path: str | os.PathLike[str], records: Iterable[Any]) -> None:
    """Rewrite ``path`` with ``records``, atomically (drops a truncated tail before resuming)."""
    atomic_write_text(path, "".join(dumps(r) + "\n" for r in records))
