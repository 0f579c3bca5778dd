"""The framework files the KL checks read beyond :data:`framework_checks.source.FILES`, and the
defaults their configuration classes declare.

A :class:`~framework_checks.source.SourceTree` holds the files of the advantage and loss checks;
the KL options live in a few more (TRL's ``grpo_config.py``; verl's ``ray_trainer.py`` for the
in-reward penalty, ``workers/utils/losses.py`` for the KL loss and the two config classes;
OpenRLHF's ``ppo_actor.py`` and its command line). They are read, as text, from the tree's own
origin (the same wheel, installed package or directory), never imported. Defaults are read from
the source (a dataclass field's default, or an ``argparse`` option's ``default=``), so the
report says what the release in hand defaults to.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path
from typing import Any

from .source import FrameworkCodeError, SourceTree

__all__ = ["extra_text", "dataclass_default", "argparse_default", "module_constant"]


def extra_text(tree: SourceTree, rel: str) -> str:
    """The text of ``rel`` from the tree's origin (a ``.whl``, or a directory holding the
    package, possibly under ``purelib/``); an error naming the file and the origin otherwise."""
    origin = Path(tree.origin)
    if origin.suffix == ".whl":
        with zipfile.ZipFile(origin) as zf:
            hits = [n for n in zf.namelist() if n == rel or n.endswith("/" + rel)]
            if hits:
                return zf.read(hits[0]).decode("utf-8")
    else:
        for root in (origin, origin / "purelib"):
            if (root / rel).is_file():
                return (root / rel).read_text(encoding="utf-8")
    raise FrameworkCodeError(f"{tree.framework}: {rel} not found in {tree.origin}")


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
