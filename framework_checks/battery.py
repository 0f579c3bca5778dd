"""The fixed input battery every framework check runs on: rewards ``[P, R]`` and lengths ``[P, R]``.

Seeded, the same on every run: ordinary groups (random normal, random binary, single success,
unequal lengths) where the frameworks should agree with ``grpo_theory``, and edge cases where
they may not (constant groups, one-sample groups, NaN rewards, huge and tiny scales, float
overflow and underflow, empty completions). A case's ``family`` is its name without the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Case", "battery"]


@dataclass(frozen=True)
class Case:
    """One battery input: rewards ``[P, R]`` (NaN allowed) and completion lengths ``[P, R]``."""

    name: str
    rewards: np.ndarray
    lengths: np.ndarray
    family: str = ""

    @property
    def size(self) -> int:
        return int(self.rewards.size)

    def short(self) -> str:
        r = self.rewards
        rows = []
        for p in range(r.shape[0]):
            row = r[p]
            if r.shape[1] > 4 and np.all(row == row[0]):
                rows.append(f"[{row[0]:.6g}]*{r.shape[1]}")
            else:
                rows.append("[" + ", ".join(f"{v:.4g}" for v in row) + "]")
        txt = "[" + ", ".join(rows) + "]"
        if len(txt) > 70:
            txt = txt[:67] + "..."
        L = self.lengths
        if np.all(L == L.flat[0]):
            return f"{txt}, L={int(L.flat[0])}"
        return f"{txt}, L={L.astype(int).tolist()}" if L.size <= 8 else f"{txt}, L varies"


def _case(name: str, r: Any, L: Any = None) -> Case:
    """A case named ``name`` (its family: the name up to the first size or value); lengths 5
    unless given."""
    r = np.asarray(r, dtype=np.float64)
    L = np.full(r.shape, 5) if L is None else np.asarray(L)
    family = name.split(" [")[0].split(" R=")[0].split(" 1e")[0].split(" (")[0]
    return Case(name, r, L.astype(np.int64), family)


def battery(*, seed: int = 0) -> list[Case]:
    """The fixed input battery (seeded; the same on every run)."""
    rng = np.random.default_rng(seed)
    cases = [_case(f"random normal R={R}", rng.normal(size=(3, R)), rng.integers(1, 13, (3, R)))
             for R in (2, 3, 4, 8, 16)]
    cases += [_case(f"random binary R={R}", rng.integers(0, 2, (4, R)),
                    rng.integers(1, 13, (4, R))) for R in (4, 8, 16)]
    return cases + [
        _case("constant [0.7]*16", [[0.7] * 16]),
        _case("constant [123.456]*12", [[123.456] * 12]),
        _case("constant [123.456]*5", [[123.456] * 5]),
        _case("constant [0.1]*3", [[0.1] * 3]),
        _case("constant [1.0]*4 (exact in float32)", [[1.0] * 4]),
        _case("constant [0.7]*16 + a random group", [[0.7] * 16, list(rng.normal(size=16))]),
        _case("single success R=8", [[1.0] + [0.0] * 7]),
        _case("single success R=16", [[1.0] + [0.0] * 15]),
        _case("singletons R=1", [[1.0], [0.0], [0.5], [2.0]]),
        _case("NaN in a group", [[1.0, np.nan, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]),
        _case("NaN group", [[np.nan, np.nan], [1.0, 0.0]]),
        _case("huge scale 1e9", 1e9 * rng.normal(size=(3, 4))),
        _case("tiny scale 1e-9", 1e-9 * rng.normal(size=(3, 4))),
        _case("overflow [1e30, -1e30]", [[1e30, -1e30]]),
        _case("overflow [1e200, -1e200]", [[1e200, -1e200]]),
        _case("underflow [1e-30, 0]", [[1e-30, 0.0]]),
        _case("underflow [4e-233, 0]", [[4e-233, 0.0]]),
        _case("unequal lengths", rng.integers(0, 2, (3, 8)).astype(float),
              rng.integers(1, 201, (3, 8))),
        _case("empty completions", rng.normal(size=(3, 4)),
              [[0, 3, 5, 2], [4, 0, 0, 7], [1, 1, 1, 1]]),
        _case("empty group", [[1.0, 0.0, 0.0], [0.5, 1.0, 0.0]], [[0, 0, 0], [3, 2, 4]]),
    ]
