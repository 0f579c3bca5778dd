"""One writer per output folder: an advisory lock on ``DIR/.lock`` held for the whole run.

Every command that writes a folder (``real rank``, ``real train`` and its checkpoint folder,
``real trl-train``, ``sims``, ``audit``, ``compare``, ``frameworks --out``) holds
:func:`lock_out_dir` on it while it works. A second writer of the same folder fails at once with
one :class:`FolderInUseError` line naming the folder and the holder (pid, host, start time and
command line), before it reads, deletes or writes anything there; readers (``compare --real``
reading a ``results.json``) take no lock.

Mechanism: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``DIR/.lock``. The kernel releases the lock when
the holder's file descriptor closes, however the process ends, so a writer killed with SIGKILL
(or by the out-of-memory killer) leaves no lock behind: the next run takes it. The file itself
stays (removing it would let two processes lock two different files of one name); after taking
the lock the holder writes its pid, host, start time and command into it as one JSON line, and
empties it on a clean release. A refused writer reads that text only to describe the holder: a
text left by a killed run (its pid no longer running), or not yet written by a holder that has
just taken the lock, is re-read for up to half a second and then reported as such, never as the
holder.

The lock is per process and re-entrant (a command that locks its folder may call a library
function that locks it again); it is advisory (programs that do not take it are not stopped),
and on network file systems it is only as good as their ``flock``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from .paths import OutPathError, describe_os_error

__all__ = ["LOCK_NAME", "FolderInUseError", "lock_out_dir", "locks_out_dir", "lock_holder"]

#: Name of the lock file inside a locked folder.
LOCK_NAME = ".lock"

# folders this process holds: (st_dev, st_ino) -> [fd, depth]
_HELD: dict[tuple[int, int], list[int]] = {}
_HELD_GUARD = threading.Lock()
# a refused writer re-reads an unreadable / stale holder text this long before reporting it
_SETTLE_S = 0.5

P = ParamSpec("P")
T = TypeVar("T")


class FolderInUseError(OutPathError):
    """Another process is writing the folder; the message names the folder and the holder."""


def _command_line() -> str:
    """This process's command line, ``grpo-audit real rank --out D ...`` for the CLI."""
    import shlex
    argv = list(sys.argv) or [""]
    prog = Path(argv[0]).name
    if prog == "__main__.py":  # python -m PACKAGE
        prog = f"python -m {Path(argv[0]).parent.name}"
    elif prog in ("", "-c"):
        prog = "python -c"
    return " ".join([prog, *(shlex.quote(a) for a in argv[1:])]).replace("\n", "\\n")


def _holder_record(purpose: str) -> dict[str, Any]:
    import socket
    from datetime import datetime

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "purpose": purpose,
        "command": _command_line(),
    }


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def lock_holder(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The holder text of ``folder``'s lock file as a dict (``None`` if empty or unreadable).

    This is what the last holder wrote; whether it still holds the lock is for
    :func:`lock_out_dir` to find out (a killed holder leaves its text behind).
    """
    try:
        text = (Path(folder) / LOCK_NAME).read_text(encoding="utf-8").strip()
        rec = json.loads(text) if text else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("pid"), int) else None


def _describe_holder(folder: Path) -> str:
    """Who holds ``folder`` (re-reading a missing or stale text for up to ``_SETTLE_S``)."""
    import socket

    deadline = time.monotonic() + _SETTLE_S
    this_host = socket.gethostname()
    while True:
        rec = lock_holder(folder)
        live = rec is not None and (rec.get("host") != this_host or _pid_running(rec["pid"]))
        if live or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if rec is None:
        return "a process that has not written its details yet"
    who = (
        f"pid {rec['pid']} on host {rec.get('host', '?')}, started {rec.get('started', '?')}, "
        f"{rec.get('purpose', '?')}: {rec.get('command', '?')}"
    )
    if not live:
        return (f"a process the lock file does not name: its last holder ({who}) is no longer "
                "running, and a process it started, or one that has just taken the lock, holds it")
    return who


@contextlib.contextmanager
def lock_out_dir(
    path: str | os.PathLike[str], *, purpose: str, option: str = "--out"
) -> Iterator[Path]:
    """Hold the advisory write lock of the folder ``path`` (created if missing) for a ``with``.

    Args:
        path: the output folder.
        purpose: what writes it, e.g. ``"real rank"`` (recorded in the lock file).
        option: the option that named the folder, for messages (``--out``, ``--cache-dir``).

    Yields:
        The folder as a :class:`~pathlib.Path`.

    Raises:
        FolderInUseError: another process holds the folder (one line: folder and holder).
        OutPathError: the folder or its lock file cannot be created or locked.
    """
    import fcntl

    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        st = folder.stat()
    except OSError as exc:
        raise OutPathError(
            f"{option} {path}: cannot create the folder ({describe_os_error(exc)})"
        ) from None
    key = (st.st_dev, st.st_ino)
    with _HELD_GUARD:
        if key in _HELD:  # this process already holds it: re-enter
            _HELD[key][1] += 1
            fd = -1
        else:
            fd = _acquire(folder, path, option, purpose, fcntl)
            _HELD[key] = [fd, 1]
    try:
        yield folder
    finally:
        with _HELD_GUARD:
            _HELD[key][1] -= 1
            if _HELD[key][1] == 0:
                fd = _HELD.pop(key)[0]
                _release(fd, fcntl)


def _acquire(folder: Path, path: Any, option: str, purpose: str, fcntl: Any) -> int:
    lock_file = folder / LOCK_NAME
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OutPathError(
            f"{option} {path}: cannot create the lock file {lock_file} ({describe_os_error(exc)})"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FolderInUseError(
                f"{option} {path} is being written by another run ({_describe_holder(folder)}); "
                "wait for it to finish, or write to another folder"
            ) from None
        raise OutPathError(
            f"{option} {path}: cannot lock {lock_file} ({describe_os_error(exc)})"
        ) from None
    try:
        text = json.dumps(_holder_record(purpose)) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode("utf-8"), 0)
    except OSError as exc:
        _release(fd, fcntl)
        raise OutPathError(
            f"{option} {path}: cannot write the lock file {lock_file} ({describe_os_error(exc)})"
        ) from None
    return fd


def _release(fd: int, fcntl: Any) -> None:
    try:
        os.ftruncate(fd, 0)  # a clean exit leaves no holder text behind
    except OSError:  # pragma: no cover - the lock goes with the descriptor anyway
        pass
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def locks_out_dir(
    purpose: str,
    *,
    arg: str = "out_dir",
    option: str = "--out",
    check: Callable[[dict[str, Any]], object] | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorator: hold :func:`lock_out_dir` on the folder passed as ``arg`` during each call.

    ``check(arguments)`` (the call's arguments by name), when given, runs first: options are
    validated before the folder is created or locked.

    >>> import tempfile
    >>> @locks_out_dir("demo", check=lambda a: print("checked x =", a["x"]))
    ... def run(out_dir, *, x=1):
    ...     return x
    >>> with tempfile.TemporaryDirectory() as d:
    ...     run(d, x=2)
    checked x = 2
    2
    """

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        import inspect

        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> T:
            arguments = sig.bind(*args, **kwargs).arguments
            if check is not None:
                check(arguments)
            folder = arguments[arg]
            with lock_out_dir(folder, purpose=purpose, option=option):
                return fn(*args, **kwargs)

        return inner

    return wrap
