"""``load_framework``: a framework's advantage and loss code, from its source, on our layout.

The source is ``--source`` when given, else the installed package, else the pinned wheel in the
user cache (:func:`framework_checks.fetch.pinned_wheel`: fetched once, after saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import openrlhf, trl, verl
from .adapter import FrameworkCode
from .fetch import pinned_wheel
from .source import FrameworkCodeError, SourceTree, find_source

__all__ = ["load_framework", "framework_source", "LOADERS"]

#: framework -> ``load(tree, dtype) -> FrameworkCode`` (one module per framework).
LOADERS = {"trl": trl.load, "verl": verl.load, "openrlhf": openrlhf.load}


def framework_source(
    framework: str,
    source: str | Path | SourceTree | None = None,
    *,
    download: bool = True,
    say: Callable[[str], None] = print,
) -> SourceTree:
    """``framework``'s files: from ``source`` when given, else the installed package, else its
    pinned wheel (:func:`~framework_checks.fetch.pinned_wheel`; ``download`` and ``say`` are its
    options); a :class:`SourceTree` already read is returned as it is."""
    if isinstance(source, SourceTree):
        return source
    if source is not None:
        return find_source(framework, source)
    try:
        return find_source(framework, None)
    except FrameworkCodeError:  # not installed: the pinned wheel is enough (read, not imported)
        return find_source(framework, pinned_wheel(framework, download=download, say=say))


def load_framework(
    framework: str,
    source: str | Path | SourceTree | None = None,
    *,
    dtype: str = "float32",
    download: bool = True,
    say: Callable[[str], None] = print,
) -> FrameworkCode:
    """Load ``framework``'s advantage and loss code (see :mod:`framework_checks`).

    Args:
        framework: ``"trl"``, ``"verl"`` or ``"openrlhf"``.
        source: see :func:`framework_checks.source.find_source`; ``None``: the installed
            package, else the pinned wheel (:func:`framework_source`); or a :class:`SourceTree`
            already read.
        dtype: dtype the rewards are given to the framework in; default ``"float32"`` (what all
            three use in training: TRL's reward tensor, verl's ``token_level_rewards``, OpenRLHF's
            ``promote_types(rewards, float32)``).
        download, say: see :func:`framework_source`.

    Raises:
        FrameworkCodeError: not found, or the code does not have the expected functions.
    """
    tree = framework_source(framework, source, download=download, say=say)
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
