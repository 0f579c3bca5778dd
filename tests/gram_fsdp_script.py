"""``torchrun`` worker of ``tests/test_real_gram_fsdp.py``: the core's second pass on FSDP2.

Usage: ``torchrun --nproc_per_node W tests/gram_fsdp_script.py OUT_DIR``. A tiny Llama (tied and
untied head) wrapped as verl and Accelerate wrap it (``fully_shard`` per decoder layer, then the
root), one forward through the root (FSDP's lazy initialisation, as training does), then
``trajectory_gram`` (tiled head, the embedding and head are parameters of the sharded root)
against the same call on the plain model. Writes ``OUT_DIR/rank<r>.json``: the relative error
per head kind, and whether every parameter is sharded again afterwards.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch.distributed as dist
from real_gram_helpers import batch, llama, rel_err
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from real_model.gram import trajectory_gram
from real_model.processes import end_process


def main() -> None:
    out_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    out: dict = {"world": dist.get_world_size()}
    for tied in (False, True):
        plain = llama(tied=tied, bias=False, kv_heads=2, seed=5).float()
        model = copy.deepcopy(plain)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        ids, am, cm = batch(R=3, T=7)
        model(input_ids=ids, attention_mask=am)  # FSDP lazy init through the root
        K_ref = trajectory_gram(plain, ids, am, cm.float())
        K = trajectory_gram(model, ids, am, cm.float())
        out["tied" if tied else "untied"] = {
            "rel_err": rel_err(K, K_ref),
            "resharded": all(isinstance(p, DTensor) for p in model.parameters()),
            "tie_kept": (model.lm_head.weight is model.model.embed_tokens.weight) == tied,
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(out))
    # FSDP2 keeps the gloo group alive to the interpreter's teardown, which can abort
    end_process(0)


if __name__ == "__main__":
    main()
