"""``torchrun`` worker of tests/test_real_verl_distributed.py (1 or 2 processes, gloo, CPU, FSDP2).

Usage: ``torchrun --nproc_per_node W tests/verl_dist_script.py MODEL_DIR OUT_DIR``. Writes
``OUT_DIR/rank<r>.json`` with, per configuration, the reference comparison of
:func:`verl_harness.check_step` (errors, per-group Grams and paths) and the failure scenario.

Scenarios (same batch of 4 groups x 4 rollouts in every process count):

* ``contiguous/<policy>/<agg>``: rows in verl's order, 4 rows per micro-batch: each group in one
  micro-batch of one rank (in-run path; with 2 processes groups 0-1 on rank 0, 2-3 on rank 1);
* ``interleaved/<policy>``: rows reordered so that every micro-batch of 2 rows mixes groups and
  every group spans both ranks (second pass, gathered rows);
* ``lora/contiguous``, ``lora/interleaved``: the same two layouts with verl's LoRA
  (``lora_rank=4``, started from a saved adapter whose ``B`` is not zero);
* ``failure``: two full ``train_batch`` steps (backward + optimizer); step 0 has a failure injected
  on the last rank only: every rank must finish both steps, agree that step 0's geometry failed
  (with the injected reason) and measure step 1.
* ``pass_failure``: the same with groups spread over the ranks (second pass), the failure injected
  inside the second pass's capture (a Linear's term, in its backward or batched after it) on the
  last rank: its backward still runs to the end, so no rank waits in FSDP's collectives.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path

import verl_harness as H

from real_model.integrations import config as gconfig
from real_model.integrations import verl as iverl
from real_model.integrations.verl import cpu as vc
from real_model.integrations.verl import step as verl_step
from real_model.processes import end_process


def main() -> None:
    # a native crash of a worker (seen once in CI: rank 1 SIGSEGV, rank 0 then waiting in a gloo
    # collective) prints that worker's Python stack to its stderr, which the test shows
    faulthandler.enable()
    model_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    rank, world = vc.init_process_group()
    vc.register_cpu_platform()
    import torch
    from verl.utils import tensordict_utils as tu

    path = vc.save_tiny_llama(model_dir)
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig())
    batch = vc.grpo_batch(H.REWARDS, seed=1, logp_noise=0.3, model_path=path)
    out: dict = {"world": world, "rank": rank}
    policies = ("vanilla", "gspo", "cispo", "sapo")
    for policy in policies:
        for agg in (H.AGG_MODES if policy != "sapo" else ("token-mean",)):
            engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig())
            data = vc.rank_slice(batch, rank, world, micro_batch_size=4)
            loss = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_mode=policy,
                                   loss_agg_mode=agg)
            out[f"contiguous/{policy}/{agg}"] = _public(H.check_step(engine, path, data, loss))
    # in-run only (no score pass, whole groups): no second pass at all in the step
    engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig(score_every=0))
    data = vc.rank_slice(batch, rank, world, micro_batch_size=4)
    out["in_run_only"] = _public(H.check_step(engine, path, data,
                                              vc.make_loss_fn(rollout_n=4, micro_batch_size=4)))
    mixed = tu.index_select_tensor_dict(batch, H.INTERLEAVED)
    for policy in policies:
        engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig())
        data = vc.rank_slice(mixed, rank, world, micro_batch_size=2)
        loss = vc.make_loss_fn(rollout_n=4, micro_batch_size=2, loss_mode=policy)
        out[f"interleaved/{policy}"] = _public(H.check_step(engine, path, data, loss))
    out.update(_lora_scenarios(path, model_dir, batch, mixed, rank, world, torch))
    out["failure"] = _failure_scenario(engine, batch, rank, world, torch)
    out["pass_failure"] = _pass_failure_scenario(engine, mixed, rank, world)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out))
    # FSDP2 keeps the gloo group alive to the interpreter's teardown, which can abort
    end_process(0)


def _lora_scenarios(path, model_dir, batch, mixed, rank, world, torch) -> dict:
    """verl's LoRA from a saved adapter (``B`` not zero): in-run and second pass."""
    adapter = model_dir.with_name(model_dir.name + "_lora")
    if rank == 0:
        vc.save_lora_adapter(path, adapter, rank=4)
    torch.distributed.barrier()
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig(), lora_rank=4,
                            lora_adapter_path=adapter)
    out = {}
    for name, td, mb in (("lora/contiguous", batch, 4), ("lora/interleaved", mixed, 2)):
        engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig())
        data = vc.rank_slice(td, rank, world, micro_batch_size=mb)
        out[name] = _public(H.check_step(engine, path, data,
                                         vc.make_loss_fn(rollout_n=4, micro_batch_size=mb)))
    return out


def _failure_scenario(engine, batch, rank, world, torch) -> dict:
    engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig())
    real = verl_step.row_meta

    def broken(*a, **k):
        raise RuntimeError(f"injected failure on rank {rank}")

    steps = []
    loss = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    for step in range(2):
        verl_step.row_meta = broken if (step == 0 and rank == world - 1) else real
        data = vc.rank_slice(batch, rank, world, micro_batch_size=4)
        with engine.train_mode():
            res = engine.train_batch(data, loss)
        verl_step.row_meta = real
        rec = engine.geometry.last_record
        steps.append({"failed": res["metrics"]["geometry/failed"][0],
                      "reasons": rec.get("failed"), "finished": True})
    checksum = float(sum(float(p.full_tensor().double().sum())
                         for p in engine.module.parameters()))
    return {"steps": steps, "param_checksum": checksum}


def _pass_failure_scenario(engine, mixed, rank, world) -> dict:
    from real_model.gram import small_calls
    from real_model.gram.layers import linear as linear_rule

    engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig(score_every=0))
    real_pass = verl_step.run_pass
    real = {(owner, name): getattr(owner, name) for owner, name in (
        (linear_rule, "add_linear"), (small_calls, "add_small_calls"))}

    def broken_linear(*a, **k):
        raise RuntimeError(f"injected second-pass failure on rank {rank}")

    def failing_pass(*a, **k):  # a Linear's term fails, added in the backward or batched after it
        for owner, name in real:
            setattr(owner, name, broken_linear)
        try:
            return real_pass(*a, **k)
        finally:
            for (owner, name), fn in real.items():
                setattr(owner, name, fn)

    steps = []
    loss = vc.make_loss_fn(rollout_n=4, micro_batch_size=2)
    for step in range(2):
        verl_step.run_pass = failing_pass if (step == 0 and rank == world - 1) else real_pass
        data = vc.rank_slice(mixed, rank, world, micro_batch_size=2)
        with engine.train_mode():
            res = engine.train_batch(data, loss)
        verl_step.run_pass = real_pass
        rec = engine.geometry.last_record
        steps.append({"failed": res["metrics"]["geometry/failed"][0],
                      "reasons": rec.get("failed"), "paths": [g["path"] for g in
                                                              rec.get("groups", [])]})
    checksum = float(sum(float(p.full_tensor().double().sum())
                         for p in engine.module.parameters()))
    return {"steps": steps, "param_checksum": checksum}


def _public(res: dict) -> dict:
    """The check's results, with the engine's geometry metrics but their timings."""
    out = {k: v for k, v in res.items() if k != "metrics"}
    out["metrics"] = {k: v for k, v in res.get("metrics", {}).items()
                      if k.startswith("geometry/") and "seconds" not in k}
    return out


if __name__ == "__main__":
    main()
