"""One comparison of a framework's output with ``grpo_theory``'s, shared by the framework audit
(:mod:`framework_checks.audit`) and its KL part (:mod:`framework_checks.kl_audit`).

:func:`compare` runs both sides and ends in one of

* ``agree``: ``|framework - ours| <= RTOL * max|ours|`` on every entry that matters (``carry``);
* ``differs``: a larger difference (its max abs diff is reported);
* ``framework non-finite``: the framework returns NaN/inf where ``grpo_theory`` is finite;
* ``framework raises`` / ``grpo_theory refuses`` / ``both refuse``: an exception on one or both
  sides.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RTOL", "compare"]

#: Relative tolerance of ``agree``: float32 rounding of the frameworks' training dtype, with room.
RTOL = 1e-5


def compare(
    fw: Callable[[], np.ndarray], ours: Callable[[], np.ndarray], carry: np.ndarray
) -> dict[str, Any]:
    """Run both sides; classify; ``carry`` marks the entries that matter (tokens exist)."""
    fw_err = None
    a = None
    # a framework's own warnings on an edge case (torch's std() of one sample...) are part of
    # the finding: recorded with the result, not printed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            a = np.asarray(fw(), dtype=np.float64)
        except Exception as exc:  # noqa: BLE001 - any framework failure is a finding
            fw_err = f"{type(exc).__name__}: {exc}"[:160]
    res = _classify(a, fw_err, ours, carry)
    if caught:
        res["framework_warnings"] = sorted({f"{w.category.__name__}: {w.message}"[:160]
                                            for w in caught})
    return res


def _classify(a: np.ndarray | None, fw_err: str | None, ours: Callable[[], np.ndarray],
              carry: np.ndarray) -> dict[str, Any]:
    """:func:`compare`'s verdict, once the framework has run (``a`` or ``fw_err``): runs
    ``grpo_theory``'s side and classifies."""
    our_err = b = None
    try:
        b = np.asarray(ours(), dtype=np.float64)
    except (ValueError, TypeError) as exc:
        our_err = f"{type(exc).__name__}: {exc}"[:160]
    if fw_err and our_err:
        return {"status": "both refuse", "framework": fw_err, "grpo_theory": our_err}
    if our_err:
        assert a is not None
        nonfinite = bool(np.any(~np.isfinite(a[carry])))
        return {
            "status": "grpo_theory refuses",
            "grpo_theory": our_err,
            "framework_nonfinite": nonfinite,
            "framework_max_abs": float(np.nanmax(np.abs(a[carry]), initial=0.0)),
        }
    if fw_err:
        return {"status": "framework raises", "framework": fw_err}
    assert a is not None and b is not None
    x, y = a[carry], b[carry]
    if x.size == 0:
        return {"status": "agree", "max_abs_diff": 0.0, "max_rel_diff": 0.0}
    if np.any(~np.isfinite(x)):
        i = int(np.argmax(~np.isfinite(x)))
        return {
            "status": "framework non-finite",
            "max_abs_diff": math.inf,
            "at": {"framework": float(x[i]), "grpo_theory": float(y[i])},
        }
    scale = float(np.max(np.abs(y)))
    d = float(np.max(np.abs(x - y)))
    rel = d / scale if scale > 0 else (0.0 if d == 0 else math.inf)
    status = "agree" if d <= RTOL * scale else "differs"
    i = int(np.argmax(np.abs(x - y)))
    return {
        "status": status,
        "max_abs_diff": d,
        "max_rel_diff": rel,
        "at": {"framework": float(x[i]), "grpo_theory": float(y[i])},
    }
