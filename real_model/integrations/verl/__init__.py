"""The verl integration: the exact per-group gradient geometry inside verl's own training step.

``GeometryFSDPEngine`` (verl's ``FSDPEngineWithLMHead``, :mod:`.engine`) and
``GeometryFSDPEngineConfig`` (its Hydra engine config with a ``geometry`` block, :mod:`.config`)
are built on first access, so importing this package imports no verl. :mod:`.cpu` runs verl on
CPU without Ray (tests, examples, benchmarks). Docs: ``docs/verl.md``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "GeometryFSDPEngine":
        from .engine import engine_class

        return engine_class()
    if name == "GeometryFSDPEngineConfig":
        from .config import engine_config_class

        return engine_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
