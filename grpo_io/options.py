"""A command's options from its config dataclass: one source for names, defaults, help and checks.

A config is a dataclass (usually frozen) whose fields are made with :func:`option`. The field's
annotation gives the type, :func:`option` gives the default, the help text and the constraints
(bounds, choices, finiteness, what kind of path). From that one declaration:

* :func:`validate` checks an instance: exact types (no ``bool`` for an ``int``, no string for a
  number), finite numbers, bounds, choices, repeated items of a tuple, UTF-8 text. It raises
  :class:`OptionTypeError` (a ``TypeError``) or :class:`OptionError` (a ``ValueError``) whose
  one-line message names the field and its command-line option. Call it from ``__post_init__``
  and a Python config fails at construction;
* :func:`check_paths` checks the path fields (exists, file or folder as needed, readable or
  writable, a UTF-8 name) without creating anything: call it before any model load or write;
* :func:`add_options` adds every field to an ``argparse`` parser (``--field-name``, the dataclass
  default, the help from the metadata, ``nargs`` for tuples, ``store_true`` for flags);
  :func:`from_args` builds the dataclass from the parsed arguments (so the same checks run);
* :func:`from_mapping` builds it from a mapping (a Hydra block, a JSON record), refusing unknown
  keys by name; :func:`option_from` copies a field's declaration under another default (a
  subclass's own default, a prefixed view of another config).

The help text is also stored as ``metadata["help"]``, where ``transformers.HfArgumentParser``
reads it. Supported annotations: ``int``, ``float``, ``str``, ``bool``, ``X | None`` and
``tuple[X, ...]`` (``X`` one of ``int``, ``float``, ``str``). Fields declared without
:func:`option` are left alone. Standard library only: cheap to import.

Example:

>>> import argparse
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Fit:
...     steps: int = option(10, help="optimizer steps", ge=1)
...     lr: float = option(1e-5, help="AdamW learning rate", gt=0)
...     method: str = option("exact", help="Gram engine", choices=("exact", "naive"))
...     R_values: tuple[int, ...] = option((2, 4), help="group sizes", ge=2, flag="--R")
...     data: str | None = option(None, help="data file", path="file")
...     def __post_init__(self) -> None:
...         validate(self)
>>> parser = argparse.ArgumentParser(prog="fit")
>>> add_options(parser, Fit)
>>> from_args(Fit, parser.parse_args(["--lr", "3e-4", "--R", "2", "8"]))
Fit(steps=10, lr=0.0003, method='exact', R_values=(2, 8), data=None)
>>> Fit(steps="2")
Traceback (most recent call last):
    ...
grpo_io.options.OptionTypeError: steps (--steps): must be an integer, got '2' (str)
>>> from_args(Fit, parser.parse_args(["--lr", "nan"]))
Traceback (most recent call last):
    ...
grpo_io.options.OptionError: lr (--lr): must be a finite number > 0, got nan
>>> Fit(R_values=(2, 4, 2))
Traceback (most recent call last):
    ...
grpo_io.options.OptionError: R_values (--R): 2 is given twice; give each value once
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "OPTION_KEY",
    "PATH_KINDS",
    "Option",
    "OptionError",
    "OptionTypeError",
    "OptionField",
    "option",
    "option_from",
    "option_fields",
    "flag_of",
    "check_value",
    "validate",
    "check_path",
    "check_paths",
    "add_options",
    "from_args",
    "from_mapping",
    "defaults",
    "shown_path",
]

#: Key of the :class:`Option` in a field's metadata.
OPTION_KEY = "grpo_io.option"

#: Kinds of path a ``path=`` option can name (see :func:`check_path`).
PATH_KINDS = ("file", "folder", "file_or_folder", "out_folder", "out_file")

_MISSING: Any = dataclasses.MISSING


class OptionError(ValueError):
    """A value out of range, not finite, not one of the choices, or a path that cannot be used;
    the message is one line naming the field and its option."""


class OptionTypeError(TypeError):
    """A value of the wrong type (a string for a number, a bool for an int ...); one line naming
    the field and its option."""


@dataclasses.dataclass(frozen=True)
class Option:
    """What :func:`option` stores in a field's metadata (see :func:`option` for each argument)."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    finite: bool = True
    path: str | None = None
    unique: bool = True
    min_items: int = 1
    cli: bool = True
    flag: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None


def option(
    default: Any = _MISSING,
    *,
    help: str,  # noqa: A002 - the argparse / HfArgumentParser name
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Iterable[Any] | None = None,
    finite: bool = True,
    path: str | None = None,
    unique: bool = True,
    min_items: int = 1,
    cli: bool = True,
    flag: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    default_factory: Callable[[], Any] = _MISSING,
) -> Any:
    """A dataclass field declared as an option (use as ``name: type = option(default, ...)``).

    Args:
        default: the default value (immutable: use a tuple for a sequence), or omit and give
            ``default_factory``.
        help: one line for ``--help`` (also stored as ``metadata["help"]``); the command line
            appends "(default ...)" unless the text holds "(default".
        ge, gt, le, lt: bounds (``>=``, ``>``, ``<=``, ``<``) of a number or of each item of a
            tuple of numbers.
        choices: the allowed values (each item of a tuple).
        finite: a float must be finite (default ``True``; NaN never passes a bound).
        path: the value is a path of this kind (:data:`PATH_KINDS`), checked by
            :func:`check_paths`.
        unique: a tuple may not repeat an item (default ``True``).
        min_items: a tuple's least length (default 1; 0 allows an empty tuple).
        cli: add it to the command line (default ``True``).
        flag: the command-line name (default ``--`` + the field name with ``-`` for ``_``).
        metavar: argparse's metavar (default: the flag in capitals; the choices when given).
        parse: turns the command-line text into a value (argparse's ``type``; default: the
            field's type). A ``ValueError`` it raises is argparse's "invalid <its __name__>
            value" message.
        default_factory: as :func:`dataclasses.field`.
    """
    if path is not None and path not in PATH_KINDS:
        raise ValueError(f"path must be one of {PATH_KINDS}, got {path!r}")
    spec = Option(help=help, ge=ge, gt=gt, le=le, lt=lt,
                  choices=None if choices is None else tuple(choices), finite=finite, path=path,
                  unique=unique, min_items=min_items, cli=cli, flag=flag, metavar=metavar,
                  parse=parse)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"help": help, OPTION_KEY: spec})


def option_from(cls: type, name: str, *, default: Any = _MISSING, **changes: Any) -> Any:
    """A copy of field ``name`` of the dataclass ``cls`` (its :class:`Option`), with another
    ``default`` and/or other :class:`Option` attributes (``help=``, ``flag=`` ...).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Base:
    ...     tokens: int = option(64, help="tokens per completion", ge=1)
    >>> @dataclass(frozen=True)
    ... class Short(Base):
    ...     tokens: int = option_from(Base, "tokens", default=48)
    >>> Short(), option_fields(Short)[0].spec.help
    (Short(tokens=48), 'tokens per completion')
    """
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if f is None or OPTION_KEY not in f.metadata:
        raise ValueError(f"{cls.__name__} has no option field {name!r}")
    spec = dataclasses.replace(f.metadata[OPTION_KEY], **changes)
    if default is _MISSING:
        default = f.default
    factory = f.default_factory if default is _MISSING else _MISSING
    return dataclasses.field(default=default, default_factory=factory,
                             metadata={**f.metadata, "help": spec.help, OPTION_KEY: spec})


@dataclasses.dataclass(frozen=True)
class _Kind:
    """A parsed annotation: ``base`` (int, float, str, bool), ``optional``, ``seq`` (tuple)."""

    base: type
    optional: bool = False
    seq: bool = False

    def describe(self) -> str:
        word = {int: "an integer", float: "a number", str: "a string", bool: "True or False"}
        text = word[self.base]
        if self.seq:
            text = f"a tuple of {text.split(' ', 1)[1]}s" if self.base is not bool else text
        return text + (" or None" if self.optional else "")


_BASES = (int, float, str, bool)


def _kind(annotation: Any, where: str) -> _Kind:
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        optional = len(rest) < len(args)
        if len(rest) != 1:
            raise TypeError(f"{where}: annotation {annotation!r} is not supported")
        annotation, args = rest[0], typing.get_args(rest[0])
    if annotation in _BASES:
        return _Kind(annotation, optional)
    if typing.get_origin(annotation) is tuple and len(args) == 2 and args[1] is Ellipsis \
            and args[0] in (int, float, str):
        return _Kind(args[0], optional, seq=True)
    raise TypeError(f"{where}: annotation {annotation!r} is not supported (int, float, str, "
                    "bool, X | None, tuple[X, ...])")


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One option of a config class: its ``name``, parsed type ``kind``, :class:`Option`
    ``spec``, command-line ``flag`` and the dataclass ``field``."""

    name: str
    kind: _Kind
    spec: Option
    flag: str
    field: dataclasses.Field[Any]

    def default(self) -> Any:
        """The field's default (``default_factory()`` when it has one)."""
        f = self.field
        return f.default_factory() if f.default is _MISSING else f.default  # type: ignore[misc]


_FIELDS: dict[type, tuple[OptionField, ...]] = {}


def option_fields(cls: type) -> tuple[OptionField, ...]:
    """The :func:`option` fields of the dataclass ``cls`` (class or instance), in field order."""
    if not isinstance(cls, type):
        cls = type(cls)
    got = _FIELDS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = tuple(
            OptionField(f.name, _kind(hints[f.name], f"{cls.__name__}.{f.name}"),
                        f.metadata[OPTION_KEY], flag_of(f), f)
            for f in dataclasses.fields(cls) if OPTION_KEY in f.metadata
        )
        _FIELDS[cls] = got
    return got


def flag_of(f: dataclasses.Field[Any] | OptionField) -> str:
    """The command-line name of a field: its ``flag=``, else ``--`` + name with ``-`` for ``_``."""
    spec = f.spec if isinstance(f, OptionField) else f.metadata.get(OPTION_KEY)
    return (spec and spec.flag) or "--" + f.name.replace("_", "-")


def _bounds_text(spec: Option) -> str:
    parts = [f"{op} {v:g}" if isinstance(v, float) else f"{op} {v}"
             for op, v in ((">=", spec.ge), (">", spec.gt), ("<=", spec.le), ("<", spec.lt))
             if v is not None]
    return " and ".join(parts)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (OverflowError, ValueError, TypeError):
        return False


def _shown(v: Any) -> str:
    return repr(v) if isinstance(v, str) else f"{v!r}"[:200]


def _check_item(v: Any, kind: _Kind, spec: Option, label: str) -> None:
    base = kind.base
    if base is bool:
        if not isinstance(v, bool):
            raise OptionTypeError(f"{label}: must be True or False, got {_shown(v)} "
                                  f"({type(v).__name__})")
        return
    if base is str:
        if not isinstance(v, str):
            raise OptionTypeError(f"{label}: must be a string, got {_shown(v)} "
                                  f"({type(v).__name__})")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise OptionError(f"{label}: {_shown(v)} is not valid UTF-8 text") from None
    elif base is int:
        if not _is_int(v):
            raise OptionTypeError(f"{label}: must be an integer, got {_shown(v)} "
                                  f"({type(v).__name__})")
    elif not _is_real(v):
        raise OptionTypeError(f"{label}: must be a number, got {_shown(v)} ({type(v).__name__})")
    if base in (int, float):
        bounds = _bounds_text(spec)
        finite = base is float and spec.finite
        if finite and not _finite(v):
            raise OptionError(f"{label}: must be a finite number{' ' + bounds if bounds else ''}"
                              f", got {v!r}")
        ok = ((spec.ge is None or v >= spec.ge) and (spec.gt is None or v > spec.gt)
              and (spec.le is None or v <= spec.le) and (spec.lt is None or v < spec.lt))
        if not ok:
            what = "a finite number" if finite else ("an integer" if base is int else "a number")
            raise OptionError(f"{label}: must be {what} {bounds}, got {v!r}")
    if spec.choices is not None and v not in spec.choices:
        raise OptionError(f"{label}: must be one of {', '.join(map(str, spec.choices))}, "
                          f"got {_shown(v)}")


def check_value(value: Any, kind: _Kind, spec: Option, *, label: str) -> None:
    """Check one value of an option (see :func:`validate`); ``label`` starts the message."""
    if value is None:
        if kind.optional:
            return
        raise OptionTypeError(f"{label}: must be {kind.describe()}, got None")
    if not kind.seq:
        _check_item(value, kind, spec, label)
        return
    if not isinstance(value, tuple | list):
        raise OptionTypeError(f"{label}: must be {kind.describe()}, got {_shown(value)} "
                              f"({type(value).__name__})")
    if len(value) < spec.min_items:
        raise OptionError(f"{label}: needs at least {spec.min_items} "
                          f"value{'s' if spec.min_items > 1 else ''}, got none")
    for item in value:
        _check_item(item, kind, spec, label)
    if spec.unique:
        seen: list[Any] = []
        for item in value:
            if item in seen:
                raise OptionError(f"{label}: {item!r} is given twice; give each value once")
            seen.append(item)


def _label(f: OptionField) -> str:
    return f"{f.name} ({f.flag})" if f.spec.cli else f.name


def validate(obj: Any) -> None:
    """Check every :func:`option` field of the dataclass instance ``obj`` (paths: only their
    type and name; :func:`check_paths` checks the files).

    Raises:
        OptionTypeError: a value of the wrong type (message: field, option, value, its type).
        OptionError: out of range, not finite, not a choice, repeated, not UTF-8.
    """
    for f in option_fields(obj):
        check_value(getattr(obj, f.name), f.kind, f.spec, label=_label(f))


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` as printable text: bytes that are not UTF-8 shown as ``\\xNN``."""
    raw = os.fsencode(path)
    return raw.decode("utf-8", "backslashreplace")


def _nearest_existing(p: Path) -> Path:
    for q in (p, *p.parents):
        if q.exists():
            return q
    return Path(".")


def check_path(value: str | os.PathLike[str], kind: str, *, option: str) -> Path:
    """Check a path of ``kind`` (:data:`PATH_KINDS`) named by ``option``; nothing is created.

    * every kind: the name is UTF-8 (a name holding other bytes is refused: files and reports
      quote it) and not empty;
    * ``"file"``: exists, is not a folder, is readable; ``"folder"``: exists, is a folder, is
      readable; ``"file_or_folder"``: exists, is readable;
    * ``"out_folder"``: a folder, or missing with a writable folder as its nearest existing
      ancestor (no component is a file); ``"out_file"``: not a folder, and its folder as for
      ``"out_folder"``.

    Returns:
        The path (``~`` expanded).

    Raises:
        OptionError: one line naming the option, the path and the reason.
    """
    if kind not in PATH_KINDS:
        raise ValueError(f"kind must be one of {PATH_KINDS}, got {kind!r}")
    text = os.fspath(value)
    shown = shown_path(text)
    head = f"{option} {shown}"
    if isinstance(text, bytes):
        raise OptionTypeError(f"{head}: give the path as text, not bytes")
    if not text.strip():
        raise OptionError(f"{option}: the path is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise OptionError(f"{head}: the name is not valid UTF-8; use a UTF-8 name") from None
    p = Path(text).expanduser()
    try:
        if kind in ("file", "folder", "file_or_folder"):
            if not p.exists():
                what = {"file": "file", "folder": "folder"}.get(kind, "file or folder")
                raise OptionError(f"{head}: no such {what}")
            if kind == "file" and p.is_dir():
                raise OptionError(f"{head}: is a folder, not a file")
            if kind == "folder" and not p.is_dir():
                raise OptionError(f"{head}: is a file, not a folder")
            mode = os.R_OK | (os.X_OK if p.is_dir() else 0)
            if not os.access(p, mode):
                raise OptionError(f"{head}: not readable (permission denied)")
            return p
        folder = p if kind == "out_folder" else p.parent
        if kind == "out_file" and p.is_dir():
            raise OptionError(f"{head}: is a folder, not a file (give a file path)")
        if kind == "out_folder" and p.exists() and not p.is_dir():
            raise OptionError(f"{head}: exists and is not a folder (give a folder path)")
        base = _nearest_existing(folder)
        if not base.is_dir():
            raise OptionError(f"{head}: {shown_path(base)} is a file, not a folder")
        if not os.access(base, os.W_OK | os.X_OK):
            raise OptionError(f"{head}: cannot write into {shown_path(base)} (permission denied)")
        if kind == "out_file" and p.exists() and not os.access(p, os.W_OK):
            raise OptionError(f"{head}: not writable (permission denied)")
    except OSError as exc:  # e.g. a name too long, a loop of links
        raise OptionError(f"{head}: cannot be used ({exc.strerror or exc})") from None
    return p


def check_paths(obj: Any) -> None:
    """:func:`check_path` on every ``path=`` field of ``obj`` that is not ``None``."""
    for f in option_fields(obj):
        value = getattr(obj, f.name)
        if f.spec.path is not None and value is not None:
            check_path(value, f.spec.path, option=f.flag)


def _help(f: OptionField) -> str:
    text = f.spec.help
    d = f.default()
    if f.kind.base is not bool and d is not None and "(default" not in text:
        shown = " ".join(map(str, d)) if isinstance(d, tuple) else str(d)
        text += f" (default {shown or 'none'})"
    return text.replace("%", "%%")


def _parse_int(text: str) -> int:
    return int(text)


_parse_int.__name__ = "int"  # argparse: "invalid int value"


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    only: Iterable[str] | None = None,
    required: Iterable[str] = (),
    group: str | None = None,
) -> None:
    """Add the command-line options of the dataclass ``cls`` (fields with ``cli=True``).

    Each field ``x_y`` becomes ``--x-y`` (or its ``flag=``) with ``dest="x_y"``, the field's
    default, its help (the default appended) and its choices; a tuple takes ``nargs="+"``
    (``"*"`` when ``min_items=0``); a ``bool`` defaulting to ``False`` is a ``store_true`` flag,
    one defaulting to ``True`` gets ``--x-y/--no-x-y``. Values are checked when the dataclass is
    built (:func:`from_args`), so that a Python config and the command line share one check.

    Args:
        parser: the parser (or argument group) to add to.
        cls: the config dataclass.
        exclude: field names to leave out.
        only: add only these field names (default: all).
        required: field names the command line must give (argparse ``required=True``).
        group: title of an argument group to put them in (default: the parser itself).
    """
    target: Any = parser.add_argument_group(group) if group else parser
    skip, must = set(exclude), set(required)
    keep = None if only is None else set(only)
    for f in option_fields(cls):
        if not f.spec.cli or f.name in skip or (keep is not None and f.name not in keep):
            continue
        kw: dict[str, Any] = {"dest": f.name, "default": f.default(), "help": _help(f)}
        if f.name in must:
            kw["required"] = True
        if f.kind.base is bool:
            kw["action"] = argparse.BooleanOptionalAction if kw["default"] else "store_true"
        else:
            kw["type"] = f.spec.parse or {int: _parse_int, float: float, str: str}[f.kind.base]
            if f.kind.seq:
                kw["nargs"] = "+" if f.spec.min_items >= 1 else "*"
            if f.spec.choices is not None:
                kw["choices"] = f.spec.choices
            if f.spec.choices is None:  # argparse would name the field (dest), not the flag
                kw["metavar"] = f.spec.metavar or f.flag.lstrip("-").upper().replace("-", "_")
        target.add_argument(f.flag, **kw)


def from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """``cls(**options, **extra)`` from parsed ``args`` (lists become tuples; fields that
    ``args`` lacks keep their defaults). The dataclass's own checks run as it is built."""
    kw: dict[str, Any] = {}
    for f in option_fields(cls):
        if f.name in extra or not hasattr(args, f.name):
            continue
        v = getattr(args, f.name)
        kw[f.name] = tuple(v) if f.kind.seq and isinstance(v, list) else v
    return cls(**kw, **extra)


def from_mapping(cls: type, values: Mapping[str, Any], *, where: str = "config") -> Any:
    """``cls(**values)``, refusing keys that are not fields of ``cls`` by name (``where``
    names the mapping, e.g. a file or a Hydra block)."""
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in values if k not in known)
    if unknown:
        raise OptionError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**values)


def defaults(cls: type) -> dict[str, Any]:
    """``{name: default}`` of the :func:`option` fields of ``cls`` (e.g. a Hydra block)."""
    return {f.name: f.default() for f in option_fields(cls)}
