"""The collectives of a measured step, one implementation for every host (``torch.distributed``).

Every process calls them in the same order whatever happened locally; with one process (or no
process group) they return at once, without pickling.
"""

from __future__ import annotations

from typing import Any

__all__ = ["world_size", "rank", "all_gather", "broadcast", "first_reason"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def world_size() -> int:
    """Processes of the default group (1 without one)."""
    dist = _dist()
    return 1 if dist is None else int(dist.get_world_size())


def rank() -> int:
    """This process's rank (0 without a group)."""
    dist = _dist()
    return 0 if dist is None else int(dist.get_rank())


def all_gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (one process: ``[obj]`` itself)."""
    n = world_size()
    if n == 1:
        return [obj]
    out: list[Any] = [None] * n
    _dist().all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every process (one process: ``obj`` itself)."""
    if world_size() == 1:
        return obj
    box = [obj]
    _dist().broadcast_object_list(box, src=0)
    return box[0]


def first_reason(err: str | None) -> str | None:
    """The first process's failure (the same on every process), or ``None``: one all-gather."""
    reasons = [r for r in all_gather(err) if r]
    return reasons[0] if reasons else None
