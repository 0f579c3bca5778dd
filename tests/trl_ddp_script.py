"""Run by ``tests/test_trl_ddp.py`` under ``accelerate launch --num_processes 2 --cpu``.

Usage: ``accelerate launch --multi_gpu --num_processes 2 tests/trl_ddp_script.py OUT LOSS_TYPE
[check]`` (on a machine without GPUs this runs torchrun with the gloo backend on CPU).
Trains the tiny model of ``test_trl_geometry`` for 2 steps with geometry every step. With
``check``, it first compares, on one generation batch, the data-parallel gradient
``(1/W) sum_p grad_p`` (what DDP's all-reduce produces) with ``-sum_p sum_i w_i psi_i`` and writes
the relative error to ``OUT/ddp_check.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_trl_geometry import make_trainer

    from real_model.trl_geometry import GeometryConfig

    out, loss_type = Path(sys.argv[1]), sys.argv[2]
    if len(sys.argv) > 3 and sys.argv[3] == "check":
        check(out, loss_type)
    tr = make_trainer(
        out, loss_type=loss_type, max_steps=2, gradient_accumulation_steps=1,
        per_device_train_batch_size=8,
        geometry=GeometryConfig(jsonl_path=str(out / "geometry.jsonl")),
    )
    tr.train()


def check(out: Path, loss_type: str) -> None:
    import json

    import torch
    import torch.distributed as dist
    from test_trl_geometry import make_trainer, trl_scores, trl_step

    tr = make_trainer(out / "check", loss_type=loss_type, gradient_accumulation_steps=1,
                      per_device_train_batch_size=8)
    grad, params = trl_step(tr)  # this process's gradient (no all-reduce)
    last = tr.geometry_last
    w = torch.as_tensor(last["c"] * last["advantages"])
    ours = -(w @ trl_scores(tr, params))
    W = dist.get_world_size()
    dist.all_reduce(grad)
    grad /= W  # DDP averages the replicas' gradients
    dist.all_reduce(ours)  # our weights already carry the 1/W
    err = float((ours - grad).norm() / grad.norm())
    if dist.get_rank() == 0:
        (out / "ddp_check.json").write_text(json.dumps({"world_size": W, "rel_error": err}))


if __name__ == "__main__":
    main()
