"""Package layering and the cost of the real entry point.

Layers, bottom to top: ``grpo_io``, ``paper_values`` (leaves) < ``grpo_theory`` < ``sims``,
``real_model`` < ``paper_checks``, ``framework_checks`` < ``grpo_audit``. A module may import
only its own layer and those below (parsed from the source with :mod:`ast`, so lazy imports
inside functions count too).
"""

from __future__ import annotations

import ast
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "grpo_io",
    "paper_values",
    "grpo_theory",
    "sims",
    "real_model",
    "paper_checks",
    "framework_checks",
    "grpo_audit",
)
OURS = set(PACKAGES)
#: What each package may NOT import (anything above it, and siblings where stated).
FORBIDDEN: dict[str, set[str]] = {
    "grpo_io": OURS - {"grpo_io"},
    "paper_values": OURS - {"paper_values"},  # data only
    "grpo_theory": {"paper_values", "sims", "real_model", "paper_checks", "framework_checks",
                    "grpo_audit"},
    "sims": {"real_model", "paper_checks", "framework_checks", "grpo_audit"},
    "real_model": {"paper_checks", "framework_checks", "grpo_audit"},
    "paper_checks": {"framework_checks", "grpo_audit"},
    # the frameworks' own code against the theory: needs grpo_theory and grpo_io only
    "framework_checks": {"paper_values", "sims", "real_model", "paper_checks", "grpo_audit"},
}


def imported_top_packages(path: Path) -> set[str]:
    """Top-level package names a module imports anywhere (module level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value.split(".")[0])
    return out


def upward_imports(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in sorted(imported_top_packages(path) & FORBIDDEN[package]):
            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_nothing_above_its_layer(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert upward_imports(package) == []


def test_import_parser_finds_lazy_and_aliased_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import os.path as p\n"
        "from . import sibling\n"
        "def f():\n"
        "    from sims.checks import x\n"
        "    import importlib; importlib.import_module('paper_checks.registry')\n",
        encoding="utf-8",
    )
    assert imported_top_packages(src) == {"os", "sims", "importlib", "paper_checks"}


def _best_of(cmd: list[str], n: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    best = float("inf")
    for _ in range(n):
        # the child's CPU time (user + system), not wall time: on a shared machine the wall clock
        # also counts the time other processes hold the cores
        t0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        t1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime))
        assert res.returncode == 0, res.stderr
        assert "usage: grpo-audit" in res.stdout
    return best


#: Budget for ``grpo-audit --help`` through the real entry point (< 0.5 s: help answers at once).
HELP_BUDGET_S = 0.5


def test_help_via_python_m_is_cheap() -> None:
    assert _best_of([sys.executable, "-m", "grpo_audit", "--help"], 3) < HELP_BUDGET_S


def _declared_entry_point() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("grpo-audit = "))
    return line.split("=", 1)[1].strip().strip('"')


def test_help_via_console_script_is_cheap(tmp_path: Path) -> None:
    """The console script as pip writes it for pyproject's entry point (and the installed one,
    when it is on PATH and points at the same entry point)."""
    target = _declared_entry_point()
    assert target == "grpo_audit.cli:entry"
    module, func = target.split(":")
    script = tmp_path / "grpo-audit"
    script.write_text(
        f"#!{sys.executable}\nimport re, sys\nfrom {module} import {func}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({func}())\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    assert _best_of([str(script), "--help"], 3) < HELP_BUDGET_S
    installed = shutil.which("grpo-audit")
    if installed and f"from {module} import {func}" in Path(installed).read_text(errors="replace"):
        assert _best_of([installed, "--help"], 3) < HELP_BUDGET_S


def test_building_the_parser_loads_no_heavy_library() -> None:
    code = (
        "import sys; from grpo_audit.cli import build_parser; build_parser();"
        "print(sorted(m for m in ('numpy', 'torch', 'sympy', 'matplotlib', 'scipy',"
        " 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert res.stdout.strip() == "[]"


def test_version_flag_prints_the_distribution_version() -> None:
    from importlib.metadata import version

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "grpo_audit", "--version"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.strip() == f"grpo-audit {version('grpo-audit')}"


#: Packages in which no module imports a private name (``_x``) of another module.
NO_PRIVATE_IMPORTS = ("grpo_theory", "paper_checks", "framework_checks", "grpo_audit")


def _private_names_imported(path: Path) -> list[str]:
    """``from X import _y`` where ``_y`` is a private name of module ``X`` (a private submodule of
    the importer's own package, ``from . import _helpers``, is the package's business)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        for a in node.names:
            if not a.name.startswith("_") or a.name.startswith("__"):
                continue
            here = path.parent
            if node.level == 1 and not node.module and ((here / f"{a.name}.py").is_file()
                                                         or (here / a.name).is_dir()):
                continue
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {a.name}")
    return hits


def test_no_private_name_is_imported_across_modules() -> None:
    bad = [hit for pkg in NO_PRIVATE_IMPORTS for f in sorted((ROOT / pkg).rglob("*.py"))
           for hit in _private_names_imported(f)]
    assert not bad, bad


def _theory_imports(path: Path) -> set[str]:
    """The ``grpo_theory`` modules one of its modules imports (anywhere in the file)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_theory."):
            out.add(node.module.split(".")[1])
    return out


def test_grpo_theory_has_no_import_cycle() -> None:
    mods = {f.stem: _theory_imports(f) for f in (ROOT / "grpo_theory").glob("*.py")
            if f.stem != "__init__"}
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(m: str, path: tuple[str, ...]) -> None:
        state[m] = 1
        for n in sorted(mods.get(m, ())):
            assert state.get(n) != 1, f"import cycle: {' -> '.join((*path, m, n))}"
            if n not in state:
                visit(n, (*path, m))
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, ())
    assert "registry" in mods and not mods["registry"], "the registry imports nothing of ours"


# ------------------------------------------------------------------ real_model: engine and hosts
REAL = ROOT / "real_model"
HOSTS = ("trl", "verl")
#: Modules outside ``real_model/integrations/`` allowed to import a host or an integration:
#: the old import paths kept as re-exports.
HOST_FACING = {"real_model/trl_geometry.py", "real_model/verl_geometry.py"}
#: The command line may dispatch a command to an integration (``real trl-train`` runs in
#: ``integrations/trl/train.py``), lazily, but imports no host itself.
COMMANDS = {"real_model/cli.py": ("real_model.integrations.trl.train",)}


def _real_files(under: str = "") -> list[Path]:
    return sorted((REAL / under).rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)).replace(os.sep, "/")


def _imported_modules(path: Path) -> set[str]:
    """Dotted names a module imports, relative imports resolved (``real_model.x.y``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    pkg = list(path.relative_to(ROOT).with_suffix("").parts)
    if pkg[-1] != "__init__":
        pkg = pkg[:-1]
    else:
        pkg = pkg[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_real_model_outside_integrations_imports_no_host_and_no_integration() -> None:
    bad = []
    for f in _real_files():
        rel = _rel(f)
        if rel.startswith("real_model/integrations/") or rel in HOST_FACING:
            continue
        mods = _imported_modules(f)
        allowed = COMMANDS.get(rel, ())
        bad += [f"{rel} imports {m}" for m in sorted(mods)
                if m.split(".")[0] in HOSTS or (m.startswith("real_model.integrations")
                                                 and not m.startswith(allowed))]
    assert not bad, bad


def test_host_integrations_never_import_each_other() -> None:
    bad = []
    for host in HOSTS:
        other = next(h for h in HOSTS if h != host)
        for f in _real_files(f"integrations/{host}"):
            mods = _imported_modules(f)
            bad += [f"{_rel(f)} imports {m}" for m in sorted(mods)
                    if m.split(".")[0] == other
                    or m.startswith(f"real_model.integrations.{other}")]
    assert not bad, bad


_HOST_WORD = re.compile(r"\b(trl|TRL|verl)\b")


def test_the_gram_engine_names_no_host() -> None:
    bad = [f"{_rel(f)}:{n}" for f in _real_files("gram")
           for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
           if _HOST_WORD.search(line) or "_getframe" in line]
    assert not bad, bad


def test_frame_inspection_and_host_private_names_only_under_integrations() -> None:
    from real_model.integrations.trl.private import MODULE_PRIVATE, TRAINER_PRIVATE

    words = ["_getframe", "FSDPEngineWithLMHead", *(m.rsplit(".", 1)[1] for m in MODULE_PRIVATE)]
    found = [re.compile(rf"\b{w}\b") for w in words]
    found += [re.compile(rf"\.{n}\b") for n in TRAINER_PRIVATE]  # an attribute of the trainer
    bad = [f"{_rel(f)}: {r.pattern}" for f in _real_files()
           if not _rel(f).startswith("real_model/integrations/")
           for r in found if r.search(f.read_text(encoding="utf-8"))]
    assert not bad, bad


#: Size limits of ``real_model``: a module a reader can hold, a class that does one job.
MAX_MODULE_LINES, MAX_CLASS_LINES = 800, 500


def test_real_model_modules_and_classes_stay_small() -> None:
    bad = []
    for f in _real_files():
        text = f.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            bad.append(f"{_rel(f)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (
                    n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                bad.append(f"{_rel(f)}: class {node.name} {n} lines")
    assert not bad, bad


def test_real_model_has_no_import_cycle() -> None:
    """Between modules (a package's ``__init__`` re-exports are followed like any import)."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
             for f in _real_files()}
    graph = {m: {d for d in _imported_modules(f) if d in files and d != m}
             for m, f in files.items()}
    # a package imported for its submodule is not an edge to the package's __init__ imports
    state: dict[str, int] = {}

    def visit(m: str, path: tuple[str, ...]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if files[n].name == "__init__.py" and m.startswith(n + "."):
                continue  # a module of the package: Python runs the package first, no cycle
            assert state.get(n) != 1, f"import cycle: {' -> '.join((*path, m, n))}"
            if n not in state:
                visit(n, (*path, m))
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, ())
