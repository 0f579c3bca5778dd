"""The light install: ``pip install -e .`` brings only what the main job (``grpo-audit audit``,
``tables``, ``sims``) needs, and the audit runs where torch and the ``real`` extra are absent.

README's quick start promises this; ``.ci/run`` checks it in a fresh virtual environment. Here it
is checked without installing anything: the dependency lists of pyproject, the module-level
imports of the packages on the audit's path (default tier), and an audit of one claim in a
subprocess whose imports of torch and the ``real`` extra fail as they would where those are not
installed (slow tier).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the packages the audit, the tables and the toy worlds import
AUDIT_PATH = ("grpo_io", "paper_values", "grpo_theory", "sims", "paper_checks", "grpo_audit")
OURS = {"grpo_io", "paper_values", "grpo_theory", "sims", "real_model", "paper_checks",
        "framework_checks", "grpo_audit"}
#: import name -> distribution, for the core dependencies
CORE = {"numpy": "numpy", "scipy": "scipy", "sympy": "sympy", "mpmath": "mpmath",
        "matplotlib": "matplotlib"}
#: what the light install does not have: torch and the `real` extra
HEAVY = ("torch", "transformers", "tqdm", "accelerate", "gguf", "safetensors", "trl", "peft")


def _dist(requirement: str) -> str:
    """``"numpy>=1.26"`` -> ``"numpy"``; ``"mkdocstrings[python]>=0.26"`` -> ``"mkdocstrings"``."""
    name = requirement
    for sep in "[<>=!~; ":
        name = name.split(sep)[0]
    return name.lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_core_dependencies_are_what_the_audit_imports_and_torch_is_an_extra() -> None:
    project = _project()
    assert {_dist(r) for r in project["dependencies"]} == set(CORE.values())
    extras = {k: {_dist(r) for r in v} for k, v in project["optional-dependencies"].items()}
    assert {"torch", "tqdm", "transformers"} <= extras["real"]
    assert {"torch", "tqdm"} <= extras["verl"]  # verl's own environment has no `real` extra
    assert {"mkdocs", "mkdocs-material", "mkdocstrings"} <= extras["docs"]


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names a module imports when it is imported: statements outside functions,
    ``if TYPE_CHECKING:`` blocks left out."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody,
                             *(h.body for h in node.handlers)):
                    visit(part)
            elif isinstance(node, ast.ClassDef | ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body)
    return out


def test_audit_path_imports_no_third_party_module_but_the_core_dependencies() -> None:
    allowed = set(CORE) | OURS | set(sys.stdlib_module_names) | {"__future__"}
    bad = [f"{path.relative_to(ROOT)}: {name}"
           for pkg in AUDIT_PATH for path in sorted((ROOT / pkg).rglob("*.py"))
           for name in sorted(_module_level_imports(path) - allowed)]
    assert not bad, "module-level imports outside the light install:\n" + "\n".join(bad)


def test_module_level_import_parser_skips_functions_and_type_checking(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""
        import numpy as np
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import torch
        try:
            import scipy.special
        except ImportError:
            import tqdm
        class C:
            import sympy
        def f():
            import transformers
    """))
    assert _module_level_imports(src) == {"numpy", "typing", "scipy", "tqdm", "sympy"}


_BLOCKED_AUDIT = """
import importlib.abc, json, sys
HEAVY = set(json.loads(sys.argv[1]))
tried = []
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
from grpo_audit.cli import main
code = main(sys.argv[2:])
print(json.dumps({"code": code, "tried": sorted(set(tried)),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}))
"""


@pytest.mark.slow  # a fresh interpreter importing scipy and matplotlib (seconds); CI's step 1
def test_audit_runs_where_torch_and_the_real_extra_are_not_installed(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKED_AUDIT, json.dumps(HEAVY), "audit", "--quick",
         "--only", "table1_internal_consistency", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin",
             "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "tried": [], "loaded": []}, result
    assert (out / "REPORT.md").is_file() and (out / "claims.json").is_file()
    assert [r["id"] for r in json.loads((out / "claims.json").read_text())] == [
        "table1_internal_consistency"]
