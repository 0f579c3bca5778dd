"""Output paths of the ``grpo-audit`` commands, checked before any work, with one-line errors.

Every command that writes calls :func:`prepare_out_dir` (a folder: ``--out DIR``) or
:func:`write_out_file` (a file: ``tables ... --out FILE``). A path that cannot be used raises
:class:`OutPathError` (a ``ValueError``) whose message names the option, the path and the reason;
the CLI prints it as one line and exits with status 2. The cases:

* a missing folder is created (with its parents);
* an existing file, device or other non-folder where a folder is needed (``/dev/null``): error;
* a path component that is a file (``file.txt/out``): error naming that component;
* no permission or a read-only file system: error;
* a folder where a file is needed: error;
* a full disk (``ENOSPC``, e.g. ``/dev/full``) or any other write failure: error with the reason.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["OutPathError", "prepare_out_dir", "write_out_file", "describe_os_error",
           "user_cache_dir"]

#: The variable that names the user cache folder (checkpoints, fetched wheels).
CACHE_ENV = "GRPO_AUDIT_CACHE"


class OutPathError(ValueError):
    """An output path that cannot be used; the message is one line naming the path."""


_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a path component is not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.EDQUOT: "disk quota exceeded",
}


def describe_os_error(exc: OSError) -> str:
    """A short reason for ``exc`` (``errno`` name in words, else the system message)."""
    return _REASONS.get(exc.errno or -1, exc.strerror or str(exc))


def user_cache_dir(*parts: str) -> Path:
    """The user cache folder of grpo-audit, joined with ``parts``: ``$GRPO_AUDIT_CACHE`` if that
    variable is set, else ``${XDG_CACHE_HOME:-~/.cache}/grpo-audit`` (checkpoints of
    ``real train``, wheels fetched by ``frameworks``). Nothing is created.
    """
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root, *parts).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base.joinpath("grpo-audit", *parts)


def _file_component(p: Path) -> Path | None:
    """The first existing component of ``p`` that is not a folder (``None`` if there is none)."""
    for parent in reversed([p, *p.parents]):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def prepare_out_dir(path: str | os.PathLike[str], *, option: str = "--out") -> Path:
    """Create (if needed) and check an output folder; return it as a :class:`~pathlib.Path`.

    Writes and removes a small probe file, so a read-only or full file system is reported here,
    before any computation, rather than after it.

    Raises:
        OutPathError: the path is not a usable folder (message: option, path, reason).
    """
    p = Path(path).expanduser()
    bad = _file_component(p)
    if bad == p:
        raise OutPathError(f"{option} {path}: exists and is not a folder (give a folder path)")
    if bad is not None:
        raise OutPathError(f"{option} {path}: {bad} is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutPathError(
            f"{option} {path}: cannot create the folder ({describe_os_error(exc)})"
        ) from None
    probe = p / f".grpo-audit-write-test-{os.getpid()}"
    try:
        with probe.open("wb") as fh:
            fh.write(b"grpo-audit\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise OutPathError(
            f"{option} {path}: cannot write into the folder ({describe_os_error(exc)})"
        ) from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:  # pragma: no cover - unwritable folder already reported
            pass
    return p


def write_out_file(path: str | os.PathLike[str], text: str, *, option: str = "--out") -> Path:
    """Write ``text`` (UTF-8) to the output file ``path``, creating its folder if needed.

    A regular file is written atomically (a temporary file, then a rename: never half a table);
    character devices such as ``/dev/null`` and ``/dev/stdout`` are written in place;
    ``/dev/full`` reports a full disk.

    Raises:
        OutPathError: the path is a folder, a component is a file, or writing fails.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise OutPathError(f"{option} {path}: is a folder, not a file (give a file path)")
    bad = _file_component(p.parent)
    if bad is not None:
        raise OutPathError(f"{option} {path}: {bad} is a file, not a folder")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and not p.is_file():  # a character device such as /dev/null: in place
            with p.open("w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
        else:  # a regular file: whole or not at all
            from .jsonio import atomic_write_text

            atomic_write_text(p, text)
    except OSError as exc:
        raise OutPathError(f"{option} {path}: cannot write ({describe_os_error(exc)})") from None
    return p
