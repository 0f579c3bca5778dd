"""The core's second pass (``trajectory_gram``, tiled head) on an FSDP2 model in 1 and 2
processes (``torchrun``, gloo, CPU): equal to the plain model's Gram (tied and untied head), every
parameter sharded again afterwards. Slow tier (two ``torchrun`` launches, ~20 s each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("gram_fsdp_script.py")
TOL = 1e-5  # relative, float32 (measured 0: the same kernels on the same weights)


@pytest.mark.parametrize("world", [1, 2])
def test_fsdp2_pass_equals_plain_model_and_reshards(tmp_path, world):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, str(SCRIPT.parent), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
           "--master_port", str(29700 + world + os.getpid() % 500), str(SCRIPT), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for r in range(world):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        for head in ("untied", "tied"):
            assert res[head]["rel_err"] <= TOL, (r, head, res[head])
            assert res[head]["resharded"] and res[head]["tie_kept"], (r, head, res[head])
