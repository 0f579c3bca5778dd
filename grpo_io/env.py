"""The one description of the machine and libraries recorded with every run, with grpo-audit's
own version and, when it runs from a git checkout, the commit."""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["environment", "package_version", "git_commit"]

#: Libraries recorded by default (versions from the installed distributions; nothing is imported).
DEFAULT_LIBRARIES: tuple[str, ...] = ("numpy", "scipy", "sympy", "matplotlib", "torch")


def package_version(distribution: str = "grpo-audit") -> str | None:
    """Installed version of ``distribution`` (``None`` when it is not installed).

    The project's own version has one source, ``pyproject.toml``, read through the metadata.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


@cache
def git_commit(root: str | Path | None = None) -> str | None:
    """The commit checked out in the git work tree ``root`` (default: the folder that holds this
    package, i.e. the repository root of a source checkout), read from its ``.git`` files (no
    ``git`` process, no import); ``None`` when ``root`` is not a work tree (an installed package)
    or the files cannot be read.

    Only ``root`` itself is looked at, never its parents (an installed copy inside another
    repository's virtual environment is not that repository's commit). Follows a worktree's
    ``.git`` file (``gitdir: ...``) and its ``commondir``, a symbolic ``HEAD`` to its loose ref or
    to ``packed-refs``; a detached ``HEAD`` is the commit itself.
    """
    folder = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    dot = folder / ".git"
    try:
        if dot.is_dir():
            return _head_commit(dot)
        if dot.is_file():
            text = dot.read_text(encoding="utf-8").strip()
            if text.startswith("gitdir:"):
                return _head_commit((folder / text.split(":", 1)[1].strip()).resolve())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None


def _head_commit(gitdir: Path) -> str | None:
    head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
    if not head.startswith("ref:"):
        return head if _is_sha(head) else None
    ref = head.split(":", 1)[1].strip()
    common = gitdir
    if (gitdir / "commondir").is_file():
        common = (gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip()).resolve()
    for base in dict.fromkeys((gitdir, common)):
        loose = base / ref
        if loose.is_file():
            sha = loose.read_text(encoding="utf-8").strip()
            return sha if _is_sha(sha) else None
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and _is_sha(parts[0]):
                return parts[0]
    return None


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def environment(
    *, libraries: Sequence[str] = DEFAULT_LIBRARIES, device: str = "cpu"
) -> dict[str, Any]:
    """Python, platform, library versions and device (the caller records its seed).

    Args:
        libraries: distributions whose versions are recorded (``None`` if not installed).
        device: the device the run used, e.g. ``"cpu"`` or ``"cuda:0"``.

    Returns:
        ``{"python", "platform", "processor", "grpo_audit", "grpo_audit_commit", <each library>,
        "device", "device_name"}`` plus ``"torch_threads"`` when torch is already imported;
        ``grpo_audit`` is the installed version, ``grpo_audit_commit`` the commit of the git
        checkout the code runs from (``None`` outside one; :func:`git_commit`).
    """
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "grpo_audit": package_version("grpo-audit"),
        "grpo_audit_commit": git_commit(),
    }
    for lib in libraries:
        env[lib] = package_version(lib)
    env["device"] = device
    env["device_name"] = env["processor"]
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch_threads"] = torch.get_num_threads()
        if device.startswith("cuda") and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(torch.device(device))
    return env
