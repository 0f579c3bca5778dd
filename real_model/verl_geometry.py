"""Old import path of the verl integration, kept as a re-export for users' scripts and Hydra
configs (``_target_: real_model.verl_geometry.GeometryFSDPEngineConfig``): use
:mod:`real_model.integrations.verl`."""

from __future__ import annotations

from typing import Any

from .integrations.config import GeometryConfig

__all__ = ["GeometryConfig", "GeometryFSDPEngine",  # noqa: F822 (lazy)
           "GeometryFSDPEngineConfig"]  # noqa: F822 (lazy)


def __getattr__(name: str) -> Any:
    if name in ("GeometryFSDPEngine", "GeometryFSDPEngineConfig"):
        from .integrations import verl

        return getattr(verl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
