"""``load_framework``: a framework's advantage and loss code, from its source, on our layout."""

from __future__ import annotations

from pathlib import Path

from . import openrlhf, trl, verl
from .adapter import FrameworkCode
from .source import FrameworkCodeError, find_source

__all__ = ["load_framework", "LOADERS"]

#: framework -> ``load(tree, dtype) -> FrameworkCode`` (one module per framework).
LOADERS = {"trl": trl.load, "verl": verl.load, "openrlhf": openrlhf.load}


def load_framework(
    framework: str, source: str | Path | None = None, *, dtype: str = "float32"
) -> FrameworkCode:
    """Load ``framework``'s advantage and loss code (see :mod:`framework_checks`).

    Args:
        framework: ``"trl"``, ``"verl"`` or ``"openrlhf"``.
        source: see :func:`framework_checks.source.find_source`.
        dtype: dtype the rewards are given to the framework in; default ``"float32"`` (what all
            three use in training: TRL's reward tensor, verl's ``token_level_rewards``, OpenRLHF's
            ``promote_types(rewards, float32)``).

    Raises:
        FrameworkCodeError: not found, or the code does not have the expected functions.
    """
    tree = find_source(framework, source)
    try:
        return LOADERS[framework](tree, dtype)
    except (
        FrameworkCodeError,
        ImportError,
        SyntaxError,
        NameError,
        AttributeError,
        KeyError,
    ) as exc:  # a release whose code does not have the expected shape
        raise FrameworkCodeError(
            f"{framework} {tree.version} ({tree.origin}): cannot load its code: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
