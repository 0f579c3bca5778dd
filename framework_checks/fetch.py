"""A framework that is not installed: its pinned wheel, fetched once into the user cache.

``grpo-audit frameworks`` reads a framework's source as text and never imports the framework
(:mod:`framework_checks.source`), so the wheel alone is enough: no dependencies, no install.
:func:`pinned_wheel` returns the cached wheel of :data:`PINNED` (checked against its SHA-256),
downloading it first with ``pip download --no-deps`` when it is not there yet (after saying so
on one line), and otherwise raises :class:`~framework_checks.source.FrameworkCodeError` with one
line that names the exact fix. The wheel is the one PyPI serves for CPython 3.11 on
manylinux x86-64 (OpenRLHF ships no pure wheel); only its text is read, so it serves on any
platform.

The cache folder is ``wheels`` in the user cache folder
(:func:`grpo_io.paths.user_cache_dir`: ``$GRPO_AUDIT_CACHE`` if that variable is set, else
``${XDG_CACHE_HOME:-~/.cache}/grpo-audit``). Stdlib and :mod:`grpo_io` only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_io.paths import user_cache_dir

from .source import FrameworkCodeError

__all__ = ["PinnedWheel", "PINNED", "wheel_cache", "pinned_wheel", "download_command",
           "missing_framework_fix"]


@dataclass(frozen=True)
class PinnedWheel:
    """The release of a framework the checks were written against, as PyPI serves it."""

    version: str
    filename: str
    sha256: str

    def requirement(self, framework: str) -> str:
        """``name==version``."""
        return f"{framework}=={self.version}"


#: The releases the checks read (``pyproject.toml``'s ``trl`` and ``verl`` extras pin the same).
PINNED: dict[str, PinnedWheel] = {
    "trl": PinnedWheel(
        "1.16.0", "trl-1.16.0-py3-none-any.whl",
        "c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396",
    ),
    "verl": PinnedWheel(
        "0.9.1", "verl-0.9.1-py3-none-any.whl",
        "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14",
    ),
    "openrlhf": PinnedWheel(
        "0.11.2", "openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl",
        "c969d70db03a70724c3d8a5a01186c6e0728bce624fb3dff95e39b5396acefa6",
    ),
}

#: ``pip download`` options: this one wheel, whatever the local platform and Python.
_PLATFORM = ("--only-binary=:all:", "--platform", "manylinux1_x86_64", "--python-version", "3.11",
             "--implementation", "cp", "--abi", "cp311")


def wheel_cache() -> Path:
    """``wheels`` in the user cache folder (:func:`grpo_io.paths.user_cache_dir`)."""
    return user_cache_dir("wheels")


def download_command(framework: str, dest: str | Path = ".") -> list[str]:
    """The ``pip download`` command line that fetches ``framework``'s pinned wheel into ``dest``."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", *_PLATFORM,
            "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "20",
            "--dest", str(dest), PINNED[framework].requirement(framework)]


def missing_framework_fix(framework: str) -> str:
    """What to run when ``framework`` is neither installed nor fetchable: the extra (where
    ``pyproject.toml`` has one), or a wheel fetched elsewhere and passed with ``--source``."""
    pin = PINNED[framework]
    install = f"pip install -e '.[{framework}]'" if framework in ("trl", "verl") else (
        f"pip install --no-deps {pin.requirement(framework)} (Linux x86-64, Python 3.11: its "
        "only wheel; the checks read its files and never import it)")
    return (f"{install}, or on a machine with network `pip download --no-deps "
            f"{pin.requirement(framework)} {' '.join(_PLATFORM)}` and pass "
            f"--source {pin.filename}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pinned_wheel(
    framework: str,
    *,
    download: bool = True,
    say: Callable[[str], None] = print,
    run: Callable[..., subprocess.CompletedProcess[str]] | None = None,
) -> Path:
    """The cached pinned wheel of ``framework``, fetched first when it is missing.

    Args:
        framework: a key of :data:`PINNED`.
        download: fetch a missing wheel (``False``: raise with the fix instead).
        say: where the one line announcing a download goes.
        run: runs the pip command (default ``subprocess.run``; tests pass a stand-in for pip).

    Raises:
        FrameworkCodeError: not cached and ``download`` is off, pip failed (offline), or the
            file's SHA-256 is not the pinned one; one line naming the exact fix.
    """
    pin = PINNED[framework]
    cache = wheel_cache()
    wheel = cache / pin.filename
    if wheel.is_file() and _sha256(wheel) == pin.sha256:
        return wheel
    fix = missing_framework_fix(framework)
    if not download:
        raise FrameworkCodeError(f"{framework} is not installed here and --no-download was given; "
                                 f"fix: {fix}")
    say(f"{framework} is not installed here: fetching its pinned wheel "
        f"{pin.requirement(framework)} (source only, no dependencies, nothing installed) "
        f"into {cache}")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            proc = (run or subprocess.run)(download_command(framework, tmp), capture_output=True,
                                           text=True, check=False)
            got = Path(tmp) / pin.filename
            if proc.returncode != 0 or not got.is_file():
                last = (proc.stderr or proc.stdout or "").strip().splitlines()
                why = last[-1].strip() if last else f"exit status {proc.returncode}"
                raise FrameworkCodeError(f"could not download {pin.requirement(framework)} "
                                         f"(pip: {why}); fix: {fix}")
            digest = _sha256(got)
            if digest != pin.sha256:
                raise FrameworkCodeError(
                    f"the downloaded {pin.filename} has SHA-256 {digest}, not the pinned "
                    f"{pin.sha256}; it was not used; fix: {fix}")
            os.replace(got, wheel)
    except OSError as exc:
        raise FrameworkCodeError(f"could not fetch {pin.requirement(framework)} into {cache} "
                                 f"({exc}); fix: {fix}") from None
    return wheel
