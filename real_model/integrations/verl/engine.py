"""verl's FSDP engine with the geometry: a thin subclass and its registry entry.

:func:`engine_class` builds ``GeometryFSDPEngine`` (verl's ``FSDPEngineWithLMHead``) whose
``forward_backward_batch`` runs inside :meth:`.step.VerlGeometry.run_step` and whose
``forward_step`` opens each micro-batch's capture; :func:`register_geometry_engine` makes
verl's workers build it. verl is imported only inside these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import GeometryConfig, from_mapping
from .step import VerlGeometry

__all__ = ["engine_geometry", "engine_class", "register_geometry_engine"]

PACKAGE = "real_model.integrations.verl"
"""Where the built class lives (pickles and Hydra find it there)."""
_BUILT: list[type] = []


def engine_geometry(engine_config: Any, geometry: GeometryConfig | None) -> VerlGeometry | None:
    """The engine's geometry: ``geometry``, else its engine config's ``geometry`` block
    (``None``, ``enable: false`` or ``every: 0``: off)."""
    if geometry is None:
        geometry = from_mapping(getattr(engine_config, "geometry", None), host="verl")
    return None if geometry is None or geometry.every == 0 else VerlGeometry(geometry)


def engine_class() -> type:
    """``GeometryFSDPEngine`` (built at the first call): verl's ``FSDPEngineWithLMHead``
    measuring the exact per-group gradient geometry of its own training step."""
    if _BUILT:
        return _BUILT[0]
    from .cpu import register_cpu_platform

    register_cpu_platform()  # no-op with an accelerator; before verl caches its device name
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    class GeometryFSDPEngine(FSDPEngineWithLMHead):  # type: ignore[misc, valid-type]
        """verl's ``FSDPEngineWithLMHead`` measuring the exact per-group gradient geometry.

        Options: the ``geometry`` argument (a ``GeometryConfig``) or, when built by verl's
        worker, the ``geometry`` block of ``GeometryFSDPEngineConfig``.
        """

        def __init__(self, *args: Any, geometry: GeometryConfig | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.geometry = engine_geometry(self.engine_config, geometry)

        def forward_backward_batch(self, data: Any, loss_function: Callable,
                                   forward_only: bool = False) -> Any:
            base = super().forward_backward_batch
            if forward_only or self.geometry is None:
                return base(data, loss_function, forward_only=forward_only)
            return self.geometry.run_step(self, data, loss_function, base)

        def forward_step(self, micro_batch: Any, loss_function: Callable,
                         forward_only: bool) -> Any:
            if self.geometry is not None and self.geometry.active and not forward_only:
                self.geometry.open_micro_batch(self.module, micro_batch)
            return super().forward_step(micro_batch, loss_function, forward_only)

    GeometryFSDPEngine.__module__ = PACKAGE
    GeometryFSDPEngine.__qualname__ = "GeometryFSDPEngine"
    _BUILT.append(GeometryFSDPEngine)
    return GeometryFSDPEngine


def register_geometry_engine() -> type:
    """Register ``GeometryFSDPEngine`` in verl's ``EngineRegistry`` for this platform.

    Key ``(device, vendor)`` of verl's current platform (e.g. ``("cuda", "nvidia")``), backends
    ``fsdp`` and ``fsdp2``, model type ``language_model``: verl's registry looks that key up
    before the device-only key its own ``FSDPEngineWithLMHead`` has, so verl's workers build the
    geometry engine; it measures only when its engine config carries a ``geometry`` block (the
    reference model's engine stays plain). Idempotent; returns the class.
    """
    from verl.utils.device import get_device_name, get_vendor
    from verl.workers.engine import EngineRegistry

    cls = engine_class()
    key = (get_device_name(), get_vendor())
    reg = EngineRegistry._engines.setdefault("language_model", {})
    for backend in ("fsdp", "fsdp2"):
        if reg.get(backend, {}).get(key) is not cls:
            reg.setdefault(backend, {}).pop(key, None)
            EngineRegistry.register(model_type="language_model", backend=backend,
                                    device=key[0], vendor=key[1])(cls)
    return cls
