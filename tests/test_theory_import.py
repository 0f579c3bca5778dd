"""`import grpo_theory` is cheap: no sympy/scipy/torch/matplotlib, and within 0.15 s of numpy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT_BUDGET_S = 0.15  # the core stays cheap: import grpo_theory <= import numpy + 0.15 s
HEAVY = ("sympy", "scipy", "torch", "matplotlib")


def _run(code: str, pycache: Path | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if pycache is not None:
        # bytecode cached as in any installed package (PYTHONDONTWRITEBYTECODE would time the
        # compiler on every import): the first of the repeated imports writes it
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
        cwd=ROOT,
    ).stdout.strip()


def _import_seconds(module: str, pycache: Path) -> float:
    # CPU time of the import, not wall time: on a shared machine the wall clock also counts the time
    # other processes hold the cores, which is not the import's cost
    code = f"import time; t = time.process_time(); import {module}; print(time.process_time() - t)"
    return float(_run(code, pycache))


def test_import_grpo_theory_loads_no_sympy_scipy_torch_matplotlib() -> None:
    out = _run(
        "import sys, grpo_theory; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert out == "", f"import grpo_theory loaded {out}"


def test_import_grpo_theory_within_budget_of_numpy(tmp_path: Path) -> None:
    # min of 3 fresh processes each (the min is the stable statistic)
    numpy_s = min(_import_seconds("numpy", tmp_path) for _ in range(3))
    core_s = min(_import_seconds("grpo_theory", tmp_path) for _ in range(3))
    assert core_s <= numpy_s + IMPORT_BUDGET_S, (core_s, numpy_s)
