"""Old import path of the TRL integration, kept as a re-export for users' scripts and for
checkpoints pickled before the move: use :mod:`real_model.integrations.trl`."""

from __future__ import annotations

from typing import Any

from .integrations.config import GeometryConfig
from .integrations.trl.trainer import GeometryMixin

__all__ = ["GeometryConfig", "GeometryMixin", "GeometryGRPOConfig",  # noqa: F822 (lazy)
           "GeometryGRPOTrainer"]  # noqa: F822 (lazy)


def __getattr__(name: str) -> Any:
    if name in ("GeometryGRPOConfig", "GeometryGRPOTrainer"):
        from .integrations import trl

        return getattr(trl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
