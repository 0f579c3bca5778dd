"""verl's view of the one geometry config: the ``geometry`` block of its Hydra engine config.

``GeometryFSDPEngineConfig`` is verl's ``FSDPEngineConfig`` plus ``geometry: {...}``, whose keys
are the options verl reads (:func:`real_model.integrations.config.host_fields`), checked when
the config is made, on verl's driver too (:func:`~real_model.integrations.config.from_mapping`;
``enable: false`` turns it off). :func:`block_help` lists the keys with their defaults and help,
from the same fields.
"""

from __future__ import annotations

import os
from typing import Any

from ..config import from_mapping, host_fields

__all__ = ["block_help", "engine_config_class"]

_BUILT: list[type] = []


def block_help() -> dict[str, tuple[Any, str]]:
    """``{key: (default, help)}`` of the Hydra ``geometry`` block (``enable`` first)."""
    out: dict[str, tuple[Any, str]] = {"enable": (True, "Measure the geometry (false: off).")}
    out.update({f.name: (f.default, f.metadata["help"]) for f in host_fields("verl")})
    return out


def engine_config_class() -> type:
    """``GeometryFSDPEngineConfig`` (built at the first call): verl's ``FSDPEngineConfig`` plus
    a ``geometry`` block."""
    if _BUILT:
        return _BUILT[0]
    from dataclasses import dataclass, field

    from verl.workers.config import FSDPEngineConfig

    keys = "\n".join(f"    ``{k}`` (default ``{d!r}``): {h}" for k, (d, h) in block_help().items())

    @dataclass
    class GeometryFSDPEngineConfig(FSDPEngineConfig):
        geometry: dict[str, Any] = field(default_factory=dict)

        def __post_init__(self) -> None:
            super().__post_init__()
            from_mapping(self.geometry, host="verl")  # checked early, on the driver too
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                from .engine import register_geometry_engine

                register_geometry_engine()

    GeometryFSDPEngineConfig.__doc__ = (
        "verl's ``FSDPEngineConfig`` plus a ``geometry`` block. Built by Hydra (``_target_``) on "
        "verl's driver and in its workers; in a worker process (``RANK`` and ``WORLD_SIZE`` set) "
        "it also registers ``GeometryFSDPEngine`` before the worker builds its engine.\n\n"
        "The block's keys:\n\n" + keys)
    GeometryFSDPEngineConfig.__module__ = "real_model.integrations.verl"
    GeometryFSDPEngineConfig.__qualname__ = "GeometryFSDPEngineConfig"
    _BUILT.append(GeometryFSDPEngineConfig)
    return GeometryFSDPEngineConfig
