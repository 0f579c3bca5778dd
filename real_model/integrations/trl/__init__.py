"""The TRL integration: the exact per-group gradient geometry inside TRL's ``GRPOTrainer``.

``GeometryGRPOTrainer`` (``GeometryMixin + trl.GRPOTrainer``) and ``GeometryGRPOConfig`` (a
``trl.GRPOConfig`` with the ``geometry_*`` options) are built on first access, so importing
this package imports no TRL. Every private name of TRL used is in :mod:`.private`. Docs:
``docs/trl.md``.
"""

from __future__ import annotations

from typing import Any

_BUILT: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name not in ("GeometryGRPOTrainer", "GeometryGRPOConfig"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _BUILT:
        if name == "GeometryGRPOTrainer":
            from .trainer import make_trainer_class

            _BUILT[name] = make_trainer_class(__name__)
        else:
            from .config import make_config_class

            _BUILT[name] = make_config_class(__name__)
    return _BUILT[name]
