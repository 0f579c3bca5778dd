"""TRL's view of the one geometry config: ``GeometryGRPOConfig``, a ``trl.GRPOConfig`` whose
``geometry_<name>`` fields are generated from
:class:`~real_model.integrations.config.GeometryConfig` (types, defaults and help text from its
fields: TrlParser, YAML, the command line and checkpoints see the same options), checked when the
config is made.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ..config import GeometryConfig, check_values, host_fields

__all__ = ["PREFIX", "field_name", "settings_from_args", "make_config_class"]

PREFIX = "geometry_"


def field_name(option: str) -> str:
    """The ``GRPOConfig`` field of a geometry option (``every`` -> ``geometry_every``)."""
    return PREFIX + option


def settings_from_args(args: Any) -> GeometryConfig:
    """The :class:`GeometryConfig` of the ``geometry_*`` fields of ``args`` (defaults if absent),
    checked with the fields' own names."""
    kw = {f.name: getattr(args, field_name(f.name)) for f in host_fields("trl")
          if hasattr(args, field_name(f.name))}
    check_values(kw, prefix=PREFIX)
    return GeometryConfig(**kw)


def make_config_class(module: str) -> type:
    """``GeometryGRPOConfig``: ``trl.GRPOConfig`` plus one ``geometry_<name>`` field per option
    TRL reads; ``__post_init__`` checks them; ``geometry_config()`` gives the
    :class:`GeometryConfig`. ``module``: where pickled checkpoints find the class."""
    from trl import GRPOConfig

    hints = typing.get_type_hints(GeometryConfig)
    specs = [(field_name(f.name), hints[f.name],
              dataclasses.field(default=f.default, metadata={"help": f.metadata["help"]}))
             for f in host_fields("trl")]

    def __post_init__(self: Any) -> None:
        GRPOConfig.__post_init__(self)
        settings_from_args(self)  # checks the geometry fields

    def geometry_config(self: Any) -> GeometryConfig:
        """The :class:`GeometryConfig` of this config's ``geometry_*`` fields."""
        return settings_from_args(self)

    cls = dataclasses.make_dataclass(
        "GeometryGRPOConfig", specs, bases=(GRPOConfig,),
        namespace={"__post_init__": __post_init__, "geometry_config": geometry_config,
                   "__doc__": "``trl.GRPOConfig`` plus the geometry options as ``geometry_*`` "
                              "fields (see ``real_model.integrations.config.GeometryConfig``)."},
    )
    cls.__module__ = module
    return cls
