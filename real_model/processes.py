"""Ending a ``torch.distributed`` process without the interpreter's teardown of its process group.

torch 2.13 on CPU keeps the gloo process group alive after ``dist.destroy_process_group()`` once
DDP or FSDP2 has wrapped a model: its worker threads (``pt_gloo_runloop``, ``gloo_tcp_loop``)
survive the call and the deletion of the model, and the group is torn down with the interpreter.
That teardown aborts now and then, after all the work is done: ``terminate called without an
active exception``, SIGABRT, and ``torchrun`` (or ``accelerate launch``) then stops the other
processes and exits non-zero. It needs neither TRL, verl nor the geometry. Measured 2026-11-28
on a 2-core machine, torch 2.13.0+cpu, a 9-line script: a DDP-wrapped ``Linear(64, 64)``, three
backwards, ``barrier`` and ``destroy_process_group`` under ``torchrun --nproc_per_node 2``:

* ending plainly: 1 of 44 runs aborted one after another; 5 of 36 with two launches side by side
  while other work ran; 1 of 30 with two side by side (``benchmarks/bench_process_exit.py --runs
  30 --parallel 2``);
* ending with :func:`end_process` instead: 0 of 60 beside the other work, 0 of 30 in that
  benchmark run.

A CI run of ``tests/test_real_trl_ddp.py`` (the failure test) aborted this way.

:func:`end_process` is the scripts' way out: the harness's counterpart of
:func:`real_model.integrations.verl.cpu.init_process_group`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def end_process(code: int = 0) -> NoReturn:
    """End this process with exit status ``code``, skipping the interpreter's teardown.

    Flushes ``sys.stdout``, ``sys.stderr`` and the ``logging`` handlers; with a process group
    initialised, waits for every process (``barrier``) and destroys the group; then leaves with
    ``os._exit(code)``. What the process wrote to files before the call is complete; ``atexit``
    handlers and object finalisers do not run. A failure of the barrier or of the destruction
    (another process gone) is printed to stderr and the status becomes 1 if ``code`` was 0.
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - reported, and the process still ends
        print(f"end_process: process group not shut down cleanly: {type(err).__name__}: {err}",
              file=sys.stderr)
        code = code or 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream
            pass
    os._exit(code)
