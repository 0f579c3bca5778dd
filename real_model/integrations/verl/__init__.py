"""The verl integration: the exact per-group gradient geometry inside verl's own training step.

``GeometryFSDPEngine`` (verl's ``FSDPEngineWithLMHead``, :mod:`.engine`) and
``GeometryFSDPEngineConfig`` (its Hydra engine config with a ``geometry`` block, :mod:`.config`)
are built on first access, so importing this package imports no verl. :mod:`.cpu` runs verl on
CPU without Ray (tests, examples, benchmarks). Docs: ``docs/verl.md``.
"""

from __future__ import annotations

from typing import Any

_BUILT: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name not in ("GeometryFSDPEngine", "GeometryFSDPEngineConfig"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _BUILT:
        if name == "GeometryFSDPEngine":
            from .engine import make_engine_class

            _BUILT[name] = make_engine_class(__name__)
        else:
            from .config import make_engine_config_class

            _BUILT[name] = make_engine_config_class(__name__)
    return _BUILT[name]
