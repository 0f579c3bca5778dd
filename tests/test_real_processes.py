"""``real_model.processes.end_process``: the exit status, flushed output, the process group
destroyed, and a failed shutdown reported, each in a child process (the call ends its process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_child(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(20000 + os.getpid() % 20000),
           "RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_end_process_exits_with_its_code_after_flushing_without_atexit_handlers(tmp_path):
    proc = run_child("""
        import atexit, logging, sys
        from real_model.processes import end_process
        logging.basicConfig(filename="log.txt", level=logging.INFO)
        atexit.register(lambda: print("atexit ran"))
        print("stdout line", end="")  # no newline: stays in the buffer until flushed
        sys.stderr.write("stderr line")
        logging.info("logged line")
        end_process(3)
        print("after end_process")
    """, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "stdout line"  # flushed; neither the atexit handler nor later code ran
    assert proc.stderr == "stderr line"
    assert "logged line" in (tmp_path / "log.txt").read_text()


@pytest.mark.slow  # a gloo process group in a child process
def test_end_process_destroys_the_process_group_a_ddp_model_holds(tmp_path):
    proc = run_child("""
        import torch, torch.distributed as dist
        from real_model.processes import end_process
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
        model(torch.ones(4, 3)).sum().backward()
        real = dist.destroy_process_group
        def destroy(*args, **kwargs):
            real(*args, **kwargs)
            print("destroyed, initialised:", dist.is_initialized())
        dist.destroy_process_group = destroy
        end_process(0)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "destroyed, initialised: False"


def test_end_process_reports_a_failed_shutdown_and_exits_1(tmp_path):
    proc = run_child("""
        import torch.distributed as dist
        from real_model.processes import end_process
        dist.init_process_group("gloo")
        def barrier(*args, **kwargs):
            raise RuntimeError("peer gone")
        dist.barrier = barrier
        end_process(0)
    """, tmp_path)
    assert proc.returncode == 1
    assert "process group not shut down cleanly: RuntimeError: peer gone" in proc.stderr


@pytest.mark.slow
def test_bench_process_exit_counts_runs_and_end_process_runs_exit_0(tmp_path):
    """``benchmarks/bench_process_exit.py`` with one launch per ending: both lines printed, and
    the run that ends with ``end_process`` exits 0 (the plain one may abort: torch's)."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_process_exit.py"),
                           "--runs", "1", "--parallel", "1"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["plain", "end_process"]
    assert lines[1].startswith("end_process  0 of 1 runs exited non-zero, 0 of them")
