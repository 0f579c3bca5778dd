"""The `grpo-audit sims` CLI and the experiment registry (quick versions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_audit.cli import main
from sims.cli import EXPERIMENT_NAMES
from sims.experiments import EXPERIMENTS


def test_registry_names_match_cli_choices() -> None:
    assert tuple(EXPERIMENTS) == EXPERIMENT_NAMES


def test_sims_cli_module_is_cheap_to_import() -> None:
    code = (
        "import sys, sims.cli; "
        "print(any(m in sys.modules for m in ('scipy', 'matplotlib', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sims_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sims", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPERIMENTS)


def test_sims_requires_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sims", "moments"]) == 2
    assert "--out" in capsys.readouterr().err


# the three longest quick runs (1.3-2.0 s each, of the default suite's ~2-minute budget) run in
# the slow tier, which also runs every experiment at full size; the CLI path stays in the default
SLOW_QUICK = {"spectra", "multiturn", "tails"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_QUICK else n for n in EXPERIMENT_NAMES])
def test_quick_experiment_writes_json_table_and_figure(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    assert main(["sims", name, "--out", str(out), "--quick", "--seed", "3"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["seed"] == 3 and res["quick"] is True
    assert res["environment"]["numpy"]
    assert (out / "table.md").read_text().startswith(f"# sims: {name}")
    assert (out / "figure.png").stat().st_size > 5_000
    assert res["n_checks"] >= 1
    for c in res["checks"]:
        assert c["passed"] == (abs(c["z"]) <= c["k"]) or c["se"] == 0


def test_sims_exits_nonzero_when_a_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sims.experiments as ex

    def fake(name: str, out: str, *, seed: int, quick: bool) -> dict:
        checks = [{"name": "a", "passed": True}, {"name": "b broken", "passed": False}]
        return {"n_checks": 2, "n_passed": 1, "checks": checks, "wall_time_s": 0.0}

    monkeypatch.setattr(ex, "run_experiment", fake)
    assert main(["sims", "moments", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "1/2 checks passed" in captured.out and "b broken" in captured.err
    fake_ok = lambda *a, **k: {**fake(*a, **k), "n_passed": 2}  # noqa: E731
    monkeypatch.setattr(ex, "run_experiment", fake_ok)
    assert main(["sims", "moments", "--out", str(tmp_path)]) == 0

