"""A progress bar for full-size ``sims`` runs, on a terminal only.

:func:`progress` wraps the loop over an experiment's cells (group size x estimator, world,
training variant): a ``tqdm`` bar on stderr when stderr is a terminal and the run is full size
(a plain ``label: i/n`` line where tqdm is not installed: the light install has no tqdm);
otherwise the items unchanged, so quick runs (the audit's), pipes, logs and tests print nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["progress", "show_progress"]

T = TypeVar("T")


def show_progress(*, quick: bool) -> bool:
    """Whether a bar is drawn: a full-size run (not ``quick``) with stderr on a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    return not quick and isatty is not None and bool(isatty())


def progress(items: Iterable[T], *, label: str, quick: bool) -> Iterator[T]:
    """``items``, with a bar named ``label`` on stderr when :func:`show_progress` says so (the
    bar is removed when done: the command's own summary line follows)."""
    if not show_progress(quick=quick):
        yield from items
        return
    seq = list(items)
    try:
        from tqdm import tqdm
    except ImportError:  # the light install (`pip install -e .`) has no tqdm: a plain line
        yield from _plain(seq, label)
        return
    yield from tqdm(seq, desc=label, total=len(seq), leave=False, file=sys.stderr,
                    dynamic_ncols=True)


def _plain(seq: list[T], label: str) -> Iterator[T]:
    """``label: i/n`` rewritten in place on stderr, cleared when done."""
    n = len(seq)
    for i, item in enumerate(seq):
        print(f"\r{label}: {i}/{n}", end="", file=sys.stderr, flush=True)
        yield item
    print("\r\033[K", end="", file=sys.stderr, flush=True)
