"""Which rule adds a module's Gram contribution, registered by module type (opacus' idiom).

A rule is a class with a ``kind`` (the name the capture records), ``check(name, module,
params)`` (raise ``ValueError`` naming the module when its parameters cannot be attributed per
row) and ``contribute(p, call, x, delta, host_fn)`` (add one call's term to the pass ``p``).
``@register(nn.Linear)`` makes a rule handle that type and its subclasses; a leaf module of no
registered type falls back to the rule registered with ``register(fallback=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["register", "rule_for", "rule_of_kind"]

_BY_TYPE: dict[type, Any] = {}
_BY_KIND: dict[str, Any] = {}
_FALLBACK: list[Any] = []


def register(*types: type[nn.Module], fallback: bool = False) -> Callable[[Any], Any]:
    """Class decorator: the rule handles modules of ``types`` (and their subclasses); with
    ``fallback``, any module no registered type covers."""

    def add(rule: Any) -> Any:
        for t in types:
            _BY_TYPE[t] = rule
        _BY_KIND[rule.kind] = rule
        if fallback:
            _FALLBACK[:] = [rule]
        return rule

    return add


def rule_for(module: nn.Module) -> Any:
    """The rule of ``module``'s type: the nearest registered class in its MRO, else the
    fallback."""
    for cls in type(module).__mro__:
        rule = _BY_TYPE.get(cls)
        if rule is not None:
            return rule
    if not _FALLBACK:  # pragma: no cover - the rules register when real_model.gram is imported
        raise RuntimeError("no layer rule registered: import real_model.gram first")
    return _FALLBACK[0]


def rule_of_kind(kind: str) -> Any:
    """The rule registered under ``kind``."""
    return _BY_KIND[kind]
