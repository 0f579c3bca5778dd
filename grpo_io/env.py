"""The one description of the machine and libraries recorded with every run."""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["environment", "package_version"]

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


def environment(
    *, libraries: Sequence[str] = DEFAULT_LIBRARIES, device: str = "cpu"
) -> dict[str, Any]:
    """Python, platform, library versions and device (the caller records its seed).

    Args:
        libraries: distributions whose versions are recorded (``None`` if not installed).
        device: the device the run used, e.g. ``"cpu"`` or ``"cuda:0"``.

    Returns:
        ``{"python", "platform", "processor", "grpo_audit", <each library>, "device",
        "device_name"}`` plus ``"torch_threads"`` when torch is already imported.
    """
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "grpo_audit": package_version("grpo-audit"),
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
