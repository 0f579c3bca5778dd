"""How often a 2-process gloo run aborts at exit, ending plainly or with ``end_process``.

    PYTHONPATH=$PWD python benchmarks/bench_process_exit.py --runs 30 --parallel 2

Each run is ``torchrun --nproc_per_node 2`` on a worker that wraps a ``Linear(64, 64)`` in DDP,
runs three backwards, then either ends plainly (``barrier`` and ``destroy_process_group``, the
interpreter's teardown after) or calls :func:`real_model.processes.end_process`. ``--parallel``
launches run side by side (load, as a CI machine running other work). Prints, per ending, the
runs that exited non-zero and how many of them printed ``terminate called without an active
exception``. With ``--worker`` the script is the worker (what ``torchrun`` starts).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ABORT = "terminate called without an active exception"


def worker(ending: str) -> None:
    import torch
    import torch.distributed as dist

    from real_model.processes import end_process

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
    if ending == "end_process":
        end_process(0)
    dist.barrier()
    dist.destroy_process_group()


def launch(ending: str, port: int) -> tuple[int, bool]:
    """One ``torchrun`` launch: its exit status and whether a process printed the abort."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(port), __file__, "--worker", ending]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, ABORT in proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="launches per ending")
    ap.add_argument("--parallel", type=int, default=2, help="launches side by side")
    ap.add_argument("--worker", choices=("plain", "end_process"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.runs < 1 or args.parallel < 1:
        ap.error(f"--runs and --parallel must be >= 1 (got {args.runs}, {args.parallel})")
    base = 30000 + os.getpid() % 10000
    for k, ending in enumerate(("plain", "end_process")):
        ports = [base + 2000 * k + i for i in range(args.runs)]
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda p, e=ending: launch(e, p), ports))
        failed = sum(rc != 0 for rc, _ in results)
        aborts = sum(rc != 0 and abort for rc, abort in results)
        print(f"{ending:<12} {failed} of {args.runs} runs exited non-zero, {aborts} of them with "
              f"'{ABORT}' ({args.parallel} side by side)", flush=True)


if __name__ == "__main__":
    main()
