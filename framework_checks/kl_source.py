"""The defaults the frameworks' configuration classes declare, read from their source text.

The KL options live in files of :data:`framework_checks.source.FILES` beside the advantage and
loss code (TRL's ``grpo_config.py``; verl's ``ray_trainer.py`` for the in-reward penalty,
``workers/utils/losses.py`` for the KL loss and the two config classes; OpenRLHF's
``ppo_actor.py`` and its command line), read as text with the rest, never imported. Defaults are
read from the source (a dataclass field's default, or an ``argparse`` option's ``default=``), so
the report says what the release in hand defaults to.
"""

from __future__ import annotations

import ast
from typing import Any

from .source import FrameworkCodeError

__all__ = ["dataclass_default", "argparse_default", "module_constant"]


def _literal(node: ast.AST, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as exc:
        raise FrameworkCodeError(f"{what}: default is not a literal") from exc


def dataclass_default(source: str, cls: str, name: str) -> Any:
    """The default of field ``name`` of class ``cls`` (``name: T = value`` or
    ``name: T = field(default=value, ...)``)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                        and st.target.id == name and st.value is not None):
                    v = st.value
                    if isinstance(v, ast.Call) and getattr(v.func, "id", "") == "field":
                        for kw in v.keywords:
                            if kw.arg == "default":
                                return _literal(kw.value, f"{cls}.{name}")
                        raise FrameworkCodeError(f"{cls}.{name} has no default")
                    return _literal(v, f"{cls}.{name}")
            raise FrameworkCodeError(f"field {name} not found in class {cls}")
    raise FrameworkCodeError(f"class {cls} not found")


def argparse_default(source: str, option: str) -> Any:
    """The ``default=`` of ``parser.add_argument(option, ...)`` (``store_true`` options: False
    unless given)."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == option):
            kws = {kw.arg: kw.value for kw in node.keywords}
            if "default" in kws:
                return _literal(kws["default"], option)
            action = kws.get("action")
            if isinstance(action, ast.Constant) and action.value == "store_true":
                return False
            return None
    raise FrameworkCodeError(f"option {option} not found")


def module_constant(source: str, name: str) -> Any:
    """The literal value of the module-level assignment ``name = value``."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            return _literal(node.value, name)
    raise FrameworkCodeError(f"module constant {name} not found")
