"""``benchmarks/gpu.sh``: the one script that runs every GPU measurement into a folder.

The measurements need a CUDA GPU; here the script's flow is checked with stand-ins for
``python3`` and ``nvidia-smi`` on ``PATH`` that record their arguments (each step runs, is logged,
and its exit status is summarised; a failing step does not stop the others), and its refusals
are checked for real (no folder given; no CUDA GPU).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"
STEPS = ["pytest_gpu", "bench_gram_nemotron_bf16", "bench_gram_nemotron_4layer_f32",
         "bench_rollouts", "bench_trl_geometry"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_script_parses_and_needs_an_output_folder() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    res = _run([])
    assert res.returncode == 2 and "usage: bash benchmarks/gpu.sh OUT_DIR" in res.stderr


def test_without_a_cuda_gpu_it_refuses_in_one_line(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    res = _run([str(tmp_path / "out")], env)
    assert res.returncode == 2
    assert res.stderr.strip() == "gpu.sh: torch sees no CUDA GPU here; these measurements need one"


def _stand_ins(bin_dir: Path, log: Path, fail_on: str) -> dict[str, str]:
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\necho "python3 $*" >> "{log}"\n'
        f'case "$*" in *{fail_on}*) echo "boom"; exit 3;; esac\necho "ran: $*"\n')
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'name, memory.total, driver_version'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def test_every_step_runs_is_logged_and_summarised_even_after_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    env = _stand_ins(tmp_path / "bin", log, fail_on="bench_rollouts.py")
    out = tmp_path / "out"
    res = _run([str(out)], env)
    assert res.returncode == 1, res.stdout + res.stderr  # one step failed
    summary = (out / "summary.txt").read_text().split("\n")
    assert [line.split()[0] for line in summary if line] == STEPS
    assert dict(line.split() for line in summary if line)["bench_rollouts"] == "3"
    for step in STEPS:
        assert (out / f"{step}.log").is_file()
    calls = log.read_text()
    assert "-m pytest -m gpu" in calls
    assert "--config nemotron-mini-4b --random-init --device cuda --dtype bfloat16 --R 16" in calls
    assert "--layers 4 --vocab 32000 --dtype float32" in calls
    assert f"--json {out}/bench_gram_nemotron_bf16.json" in calls
    assert "benchmarks/bench_trl_geometry.py --device cuda" in calls
    assert (out / "device.txt").read_text().startswith("name, memory.total")


def test_with_a_verl_python_the_verl_steps_run_with_it(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    env = _stand_ins(tmp_path / "bin", log, fail_on="no-step-fails")
    verl_python = tmp_path / "bin" / "verl_python"
    verl_python.write_text(f'#!/bin/sh\necho "verl_python $*" >> "{log}"\n')
    verl_python.chmod(0o755)
    env["VERL_PYTHON"] = str(verl_python)
    out = tmp_path / "out"
    res = _run([str(out)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = [line.split()[0] for line in (out / "summary.txt").read_text().split("\n") if line]
    assert summary == [*STEPS, "pytest_gpu_verl", "bench_verl_bf16", "bench_verl_bf16_long"]
    verl_calls = [c for c in log.read_text().split("\n") if c.startswith("verl_python")]
    assert len(verl_calls) == 3 and "tests/test_real_verl_gpu.py" in verl_calls[0]
    assert all("--dtype bf16" in c and "--logprobs one-pass" in c and "--op-sites" in c
               and "--bf16-rows" in c for c in verl_calls[1:])
    assert "--small-calls 2048 4400000" in verl_calls[1]
