"""Helpers the audit's figures share (matplotlib is never imported here: the axes come in).

* :func:`plot_merged`: draw several series, each distinct curve once; curves that coincide are
  drawn once with their labels joined (" = "), so that no curve hides under another.
* :func:`legends_outside`: move every legend of a figure to the right of its axes, off the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["plot_merged", "legends_outside"]


def plot_merged(ax: Any, series: Sequence[tuple[str, str, Any]], *, rtol: float = 1e-9) -> None:
    """Plot ``(label, style, y)`` series on ``ax``; series equal to an earlier one (to ``rtol``)
    join its label instead of being drawn over it."""
    groups: list[tuple[list[str], str, np.ndarray]] = []
    for label, style, y in series:
        arr = np.asarray(y, dtype=float)
        for labels, _, other in groups:
            if other.shape == arr.shape and np.allclose(other, arr, rtol=rtol, atol=0.0):
                labels.append(label)
                break
        else:
            groups.append(([label], style, arr))
    for labels, style, arr in groups:
        ax.plot(arr, style, label=" = ".join(labels))


def legends_outside(fig: Any) -> None:
    """Move every legend of ``fig`` to the right of its axes, off the data (further right where
    the axes has a twin, past the twin's labels). Call it after ``fig.tight_layout()`` and save
    with ``bbox_inches="tight"``: the axes keep their size and the image grows to hold the
    legends."""
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        texts = leg.get_texts()
        labels = [t.get_text() for t in texts]
        size = texts[0].get_fontsize() if texts else 8
        handles = list(leg.legend_handles)
        twin = any(o is not ax and o.get_position().bounds == ax.get_position().bounds
                   for o in fig.axes)
        leg.remove()
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.2 if twin else 1.02, 1.0),
                  borderaxespad=0.0, fontsize=size)
