"""Data-parallel geometry: ``accelerate launch --num_processes 2 --cpu`` (slow tier).

Each process measures the groups it holds; the step's records are gathered over both processes,
and the row weights use the GLOBAL normaliser (dapo: ``sum_i c_i L_i = 1`` over every row of every
process), i.e. the weights of the gradient that DDP's all-reduce produces: ``(1/W) sum_p grad_p``
equals ``-sum_p sum_i w_i psi_i`` (checked in ``trl_ddp_script.check``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("accelerate")

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_two_processes_gather_every_group_with_global_weights(tmp_path, loss_type):
    launcher = shutil.which("accelerate")
    cmd = ([launcher] if launcher else [sys.executable, "-m", "accelerate.commands.launch"])
    if launcher:
        cmd.append("launch")
    # --multi_gpu runs torchrun; without GPUs accelerate uses CPU processes and gloo
    # (``--cpu`` alone would start ONE process unless MPI is set up)
    cmd += ["--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no",
            str(HERE / "trl_ddp_script.py"), str(tmp_path), loss_type, "check"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    chk = json.loads((tmp_path / "ddp_check.json").read_text())
    assert chk["world_size"] == 2 and chk["rel_error"] < 1e-5  # see test_trl_geometry.RTOL
    lines = [json.loads(x) for x in (tmp_path / "geometry.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1]  # written once (main process), per step
    for rec in lines:
        assert rec["num_processes"] == 2 and rec["exact_structure"]
        groups = rec["group_records"]
        assert rec["groups"] == len(groups) == 4  # 2 processes x 8 rows / R=4
        assert rec["groups_skipped"] == 0
        assert {g["process"] for g in groups} == {0, 1}
        assert sorted(g["group"] for g in groups) == [0, 1, 2, 3]
        c = np.concatenate([g["row_weights"] for g in groups if "row_weights" in g])
        L = np.concatenate([g["lengths"] for g in groups if "row_weights" in g])
        if loss_type == "dapo":
            # one global token normaliser: c_i = 1 / (total loss tokens over both processes)
            assert np.allclose(c, c[0]) and float(np.sum(c * L)) == pytest.approx(1.0)
        else:
            # grpo: 1 / (W * B_local * L_i) with W = 2 processes, B_local = 8 rows
            assert np.allclose(c, 1.0 / (2 * 8 * L))
