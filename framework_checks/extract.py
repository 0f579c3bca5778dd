"""Taking functions and blocks out of a framework's source and executing them with stubs.

A function is compiled from its own source segment (decorators applied, a method dedented out
of its class) into a namespace we choose; a block is the text between two anchor lines. Heavy
imports (ray, omegaconf, deepspeed, ...) are replaced for the duration of an ``exec`` by stub
modules (:func:`stub_modules`); :class:`ConfigStub` stands in for configuration objects.
"""

from __future__ import annotations

import ast
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .source import FrameworkCodeError

__all__ = ["function_defs", "exec_defs", "source_block", "stub_modules", "ConfigStub"]


def function_defs(source: str, names: list[str], *, cls: str | None = None
                  ) -> dict[str, ast.AST]:
    """The ``def`` nodes named ``names`` at module level (or in class ``cls``); an error naming
    the missing ones."""
    body = ast.parse(source).body
    if cls is not None:
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            raise FrameworkCodeError(f"class {cls} not found")
        body = node.body
    found = {n.name: n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    missing = [n for n in names if n not in found]
    if missing:
        where = f"class {cls}" if cls else "module"
        raise FrameworkCodeError(f"{missing} not found in the {where}")
    return {n: found[n] for n in names}


def _decorate(name: str, fn: Callable[..., Any], node: ast.AST, source: str,
              namespace: dict[str, Any]) -> Callable[..., Any]:
    """Apply ``node``'s decorators (those available in ``namespace``; ``staticmethod``,
    ``classmethod`` and registration decorators are left out)."""
    for dec in reversed(node.decorator_list):  # type: ignore[attr-defined]
        text = ast.get_source_segment(source, dec) or ""
        if text in ("staticmethod", "classmethod") or text.startswith("register_"):
            continue
        try:
            fn = eval(text, namespace)(fn)  # noqa: S307
        except NameError as exc:
            raise FrameworkCodeError(
                f"{name}: decorator @{text} is not available ({exc})"
            ) from exc
    return fn


def exec_defs(
    source: str, names: list[str], namespace: dict[str, Any], *, cls: str | None = None
) -> dict[str, Callable[..., Any]]:
    """Execute the named functions (their own source, decorators applied) in ``namespace``."""
    out = {}
    for name, node in function_defs(source, names, cls=cls).items():
        seg = ast.get_source_segment(source, node)
        assert seg is not None
        code = textwrap.dedent(seg) if cls is None else textwrap.dedent("    " + seg)
        exec(compile(code, f"<{name}>", "exec"), namespace)  # noqa: S102
        fn = _decorate(name, namespace[name], node, source, namespace)
        namespace[name] = fn
        out[name] = fn
    return out


def source_block(source: str, start: str, end: str) -> str:
    """The dedented lines from the one holding ``start`` to the end of ``end``."""
    i = source.find(start)
    j = source.find(end, i)
    if i < 0 or j < 0:
        raise FrameworkCodeError(f"anchor {start!r} ... {end!r} not found")
    line0 = source.rfind("\n", 0, i) + 1
    return textwrap.dedent(source[line0 : j + len(end)])


@contextmanager
def stub_modules(mods: dict[str, types.ModuleType]) -> Iterator[None]:
    """``sys.modules`` with ``mods`` in place for the duration, restored afterwards."""
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


class ConfigStub(dict):
    """Attribute- and ``.get``-access config stub (omegaconf/dataclass configs)."""

    def __getattr__(self, k: str) -> Any:
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None
