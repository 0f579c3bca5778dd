"""JSON / JSONL reading and writing with one non-finite policy (see :data:`NONFINITE_POLICY`)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .records import check_record, reject_duplicate_keys

__all__ = [
    "NONFINITE_POLICY",
    "to_jsonable",
    "from_jsonable",
    "dumps",
    "atomic_write_text",
    "atomic_write_bytes",
    "atomic_path",
    "save_figure",
    "read_text_file",
    "decode_utf8",
    "write_json",
    "read_json",
    "append_jsonl",
    "iter_jsonl",
    "iter_jsonl_lines",
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


def _tmp_path(path: Path) -> Path:
    """A temporary file beside ``path``, unique to this process (two writers never share one)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _check_target(path: Path) -> None:
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, flushed, then a rename.

    Readers see the old file or the new one, never a part; on any error or interrupt the
    temporary file is removed and ``path`` is left as it was. A folder at ``path`` is an
    ``IsADirectoryError`` naming it, before anything is written.
    """
    path = Path(path)
    _check_target(path)
    tmp = _tmp_path(path)
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a file name (``savefig``,
    ``torch.save``): renamed to ``path`` when the ``with`` block ends normally, removed on any
    error or interrupt.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with atomic_path(Path(d) / "x.txt") as tmp:
    ...         _ = tmp.write_text("whole")
    ...     print(sorted(p.name for p in Path(d).iterdir()))
    ['x.txt']
    """
    path = Path(path)
    _check_target(path)
    tmp = _tmp_path(path)
    try:
        yield tmp
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_figure(fig: Any, path: str | os.PathLike[str], **kwargs: Any) -> None:
    """``fig.savefig(path, **kwargs)`` through :func:`atomic_path` (the format from the suffix):
    an interrupted save leaves no partial image."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".") or None)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **kwargs)


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as strict JSON (trailing newline), atomically."""
    atomic_write_text(path, dumps(obj, indent=indent) + "\n")


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=reject_duplicate_keys)


def _json_fault(exc: json.JSONDecodeError) -> str:
    return f"not valid JSON ({exc.msg} at column {exc.colno})"


def read_text_file(path: str | os.PathLike[str], *, what: str = "file") -> str:
    """The UTF-8 text of ``path``; a missing file, a folder, an unreadable file or bytes that are
    not UTF-8 raise one ``ValueError`` line naming the file (and the line of the bad byte)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, not a {what}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return decode_utf8(data, where=str(path))


def decode_utf8(data: bytes, *, where: str) -> str:
    """``data`` as UTF-8 text; other bytes raise one ``ValueError`` line naming ``where``, the
    line and the byte.

    >>> decode_utf8(b"ok\\n\\xff", where="f.txt")
    Traceback (most recent call last):
        ...
    ValueError: f.txt: line 2 is not UTF-8 text (byte 0xff)
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{where}: line {line} is not UTF-8 text (byte 0x{data[exc.start]:02x})"
        ) from None


def read_json(path: str | os.PathLike[str], *, schema: Any = None) -> Any:
    """Read a JSON file written by :func:`write_json` (infinities restored), checked against
    ``schema`` (:mod:`grpo_io.records`) when given.

    Raises:
        ValueError: one line naming the file: a folder, not UTF-8, not JSON (with the line), a
            key twice in one object, or a record that does not match ``schema``.
    """
    path = Path(path)
    text = read_text_file(path)
    try:
        obj = from_jsonable(_loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError as exc:  # a key twice in one object
        raise ValueError(f"{path}: {exc}") from None
    if schema is not None:
        check_record(obj, schema, where=str(path))
    return obj


def append_jsonl(path: str | os.PathLike[str], record: Any) -> None:
    """Append one record as a JSON line and flush it (streamed results)."""
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(dumps(record) + "\n")
        fh.flush()


def iter_jsonl(
    path: str | os.PathLike[str], *, schema: Any = None, unique: str | None = None
) -> Iterator[Any]:
    """Records of a JSONL file, one at a time, each checked as it is read.

    Blank lines are skipped; a truncated last line (an interrupted append: no newline at the
    end, and not JSON or cut inside a UTF-8 character) is dropped. Any other fault raises one
    ``ValueError`` line naming the file, the line and the fault: bytes that are not UTF-8, a
    line that is not JSON, a key twice in one object, a record that does not match ``schema``
    (:mod:`grpo_io.records`), or a second record with the same value of the key ``unique``
    (e.g. a prompt index seen twice). A missing file yields nothing; a folder at ``path`` is
    an error.
    """
    for _, rec in iter_jsonl_lines(path, schema=schema, unique=unique):
        yield rec


def iter_jsonl_lines(
    path: str | os.PathLike[str],
    *,
    schema: Any = None,
    unique: str | None = None,
    partial_tail: bool = True,
) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of a JSONL file, with the checks of :func:`iter_jsonl`;
    ``partial_tail=False`` (a data file, not a stream we append to) makes a bad last line an
    error too, and a missing file an error."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, not a file")
    if not path.is_file():
        if partial_tail:
            return
        raise ValueError(f"{path}: no such file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    lines = data.splitlines()
    seen: dict[Any, int] = {}
    for n, raw in enumerate(lines):
        # an interrupted append leaves a last line without its newline
        last = partial_tail and n == len(lines) - 1 and not data.endswith((b"\n", b"\r"))
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if last:
                return
            raise ValueError(
                f"{path}: line {n + 1} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                f"column {exc.start + 1})"
            ) from None
        if not line.strip():
            continue
        try:
            rec = _loads(line)
        except json.JSONDecodeError as exc:
            if last:
                return
            raise ValueError(f"{path}: line {n + 1} is {_json_fault(exc)}") from None
        except ValueError as exc:  # a key twice in one object
            raise ValueError(f"{path}: line {n + 1}: {exc}") from None
        rec = from_jsonable(rec)
        if schema is not None:
            check_record(rec, schema, where=f"{path}: line {n + 1}")
        if unique is not None:
            key = rec.get(unique) if isinstance(rec, dict) else None
            if key in seen:
                raise ValueError(
                    f"{path}: line {n + 1} repeats {unique} {key!r} of line {seen[key]}; "
                    "each may appear once (remove one of the two lines, or pass --overwrite)"
                )
            seen[key] = n + 1
        yield n + 1, rec


def read_jsonl(
    path: str | os.PathLike[str], *, schema: Any = None, unique: str | None = None
) -> list[Any]:
    """All records of :func:`iter_jsonl` as a list (same checks)."""
    return list(iter_jsonl(path, schema=schema, unique=unique))


def rewrite_jsonl(path: str | os.PathLike[str], records: Iterable[Any]) -> None:
    """Rewrite ``path`` with ``records``, atomically (drops a truncated tail before resuming)."""
    atomic_write_text(path, "".join(dumps(r) + "\n" for r in records))
