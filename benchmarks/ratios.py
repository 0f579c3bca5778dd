"""Ratios of step times the geometry benchmarks print, with seeded bootstrap intervals.

A step's time over a plain step's, paired within rounds (each round runs every mode once, so the
pair shares the machine's speed of that moment), summarised by the median over rounds; the
interval resamples rounds with replacement. Used by ``bench_trl_geometry.py`` and
``bench_verl_geometry.py`` (``best_of``: ``bench_diagnostics.py``, ``bench_sims.py``);
doctests run in ``tests/test_benchmark_summaries.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def boot_medians(x: Any, *, rng: Any, draws: int) -> Any:
    """Medians of ``draws`` resamples of ``x`` with replacement, ``[draws]``.

    >>> import numpy as np
    >>> boot_medians(np.array([2.0, 2.0]), rng=np.random.default_rng(0), draws=3).tolist()
    [2.0, 2.0, 2.0]
    """
    import numpy as np

    return np.median(rng.choice(x, size=(draws, len(x))), axis=1)


def central(values: Any, level: float) -> tuple[float, float]:
    """The central ``level`` quantiles of ``values``.

    >>> central([1.0, 2.0, 3.0, 4.0, 5.0], 0.5)
    (2.0, 4.0)
    """
    import numpy as np

    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired(off: Sequence[float], other: Sequence[float], *, level: float = 0.95,
           draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)`` of ``other[r] / off[r]`` over rounds ``r`` and its bootstrap
    interval (rounds resampled, ``draws`` times, seeded). Pairing cancels drifts of the
    machine's speed slower than a round, which a ratio of medians does not.

    >>> paired([1.0, 2.0, 4.0], [1.1, 2.2, 4.4])
    (1.1, 1.1, 1.1)
    """
    import numpy as np

    if len(off) != len(other) or not len(off):
        raise ValueError(f"need as many rounds of both modes, at least one (got {len(off)} "
                         f"and {len(other)})")
    x = np.asarray(other, dtype=float) / np.asarray(off, dtype=float)
    lo, hi = central(boot_medians(x, rng=np.random.default_rng(seed), draws=draws), level)
    return float(np.median(x)), lo, hi


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` wall times of ``fn()`` (seconds).

    >>> best_of(lambda: None, 2) >= 0.0
    True
    """
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best
