"""Run by ``tests/test_real_trl_ddp.py`` under ``accelerate launch`` with 2 CPU processes (gloo).

Usage: ``accelerate launch --multi_gpu --num_processes 2 tests/trl_ddp_script.py OUT MODE
[LOSS_TYPE [GEOMETRY_MODE]]`` (on a machine without GPUs this runs torchrun with the gloo
backend on CPU).
Trains the tiny model of ``trl_geometry_helpers`` for 2 steps with geometry every step; 6 rows per
process and groups of 4, so group 1 has rows on both processes. Each process writes
``OUT/rank<r>.json``.

Modes:
* ``check`` (DDP) and ``fsdp`` (the model sharded with FSDP2 at load time): before each optimizer
  update, the gradient the data-parallel wrapper itself produced (DDP's all-reduced ``.grad``, or
  FSDP2's reduce-scattered ``.grad`` shards made full) is compared with ``(1/W) sum_p sum_i g_i``
  (every process's rows from their recorded ``u`` and TRL's own log-probabilities on a plain
  replica at the full weights, gathered); and every Gram a process recorded (its own groups and
  the group it received rows of) with the gathered per-row gradients.
* ``fail``: the Gram pass raises on process 1 only at step 0; both processes must skip step 0's
  geometry (same reason), measure step 1 and finish training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _full(t):
    """A plain tensor of ``t`` (FSDP2 parameters and gradients are DTensor shards)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class Checker:
    """``on_pre_optimizer_step``: rows against the reduced gradient, Grams against the rows."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        chk = self

        class _CB(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kw):
                chk.check(state.global_step)

        self.callback = _CB()
        self.trainer = None
        self.results: list[dict] = []

    def _replica(self):
        """A plain copy of the model at the current (full) weights, TRL's fused head added."""
        from trl.trainer.utils import add_fused_lm_head
        from trl_geometry_helpers import tiny_model

        tr = self.trainer
        full = {n: _full(p.detach()).clone() for n, p in tr.model.named_parameters()}
        rep = tiny_model(tr.model.config.vocab_size, tie=tr.model.config.tie_word_embeddings)
        rep.load_state_dict(full, strict=False)  # a tied head is the embedding's weight
        add_fused_lm_head(rep, temperature=tr.temperature, outputs=("log_probs", "entropy"))
        return rep

    def _row_grads(self, rep, gen, rows, weights):
        """``grad sum_t weights[r,t] log pi_rt`` of each local row (TRL's log-probs, replica)."""
        import torch

        tr = self.trainer
        params = list(rep.parameters())
        b = gen.batch
        ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
        am = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
        C = b["completion_ids"].shape[1]
        out = {}
        for r in rows:
            lp, _, _ = tr._get_per_token_logps_and_entropies(rep, ids[[r]], am[[r]], C)
            grads = torch.autograd.grad((lp * weights[[r]].to(lp.dtype)).sum(), params,
                                        allow_unused=True)
            out[int(gen.first_row + r)] = torch.cat([
                (torch.zeros_like(p) if x is None else x).reshape(-1).double()
                for x, p in zip(grads, params, strict=True)])
        return out

    def check(self, step: int) -> None:
        import numpy as np
        import torch
        from accelerate.utils import gather_object

        tr = self.trainer
        last = tr.geometry_last
        rep = self._replica()
        names = [n for n, _ in rep.named_parameters()]
        grads = {n: p.grad for n, p in tr.model.named_parameters()}
        missing = [n for n in names if grads.get(n) is None]
        if missing:
            raise RuntimeError(f"no gradient reached parameters {missing}")
        # the gradient the data-parallel wrapper reduced (DDP: averaged; FSDP2: shards, made full)
        reduced = torch.cat([_full(grads[n]).reshape(-1).double() for n in names])
        seg = last["segments"][0]
        gen, rows, U = seg["generation"], seg["rows"], seg["token_weights"]
        lm = gen.batch["completion_mask"].double()
        g = self._row_grads(rep, gen, rows, U)
        psi = self._row_grads(rep, gen, rows, lm)
        all_g, all_psi = {}, {}
        for part in gather_object([{"g": g, "psi": psi}]):
            all_g.update(part["g"])
            all_psi.update(part["psi"])
        W = tr.accelerator.num_processes
        ours = sum(all_g.values()) / W
        res = {"step": step, "rel_err": float((ours - reduced).norm() / reduced.norm()),
               "K_err": 0.0, "Kg_err": 0.0, "groups": sorted(last["grams"])}
        G = int(tr.num_generations)
        for key, K in last["grams"].items():
            grp_rows = [r for r in sorted(all_g) if gen.group_offset + r // G == key
                        and float(all_psi[r].norm()) > 0]
            P = torch.stack([all_psi[r] for r in grp_rows])
            Q = torch.stack([all_g[r] for r in grp_rows])
            refK, refKg = (P @ P.T).numpy(), (Q @ Q.T).numpy()
            res["K_err"] = max(res["K_err"], float(np.abs(K - refK).max() / np.abs(refK).max()))
            Kg = last["row_grams"][key]
            res["Kg_err"] = max(res["Kg_err"],
                                float(np.abs(Kg - refKg).max() / np.abs(refKg).max()))
        res["diagnostics_ref"] = _diagnostics_by_definition(
            {r: v / W for r, v in all_g.items()}, reduced, lambda r: gen.group_offset + r // G)
        self.results.append(res)


def _diagnostics_by_definition(rows, grad, group_of):
    """Norms, dead groups and the noise parts by their definitions from every process's rows
    (the step's rows: each process's gradient rows over the number of processes) and the
    gradient the data-parallel wrapper reduced."""
    import numpy as np

    by: dict[int, list] = {}
    for r in sorted(rows):
        by.setdefault(group_of(r), []).append(rows[r].numpy())
    gn = np.array([np.linalg.norm(np.sum(v, axis=0)) for v in by.values()])
    norms = np.array([np.linalg.norm(x) for v in by.values() for x in v])
    n, T, S = len(by), float(grad.double().norm() ** 2), float((gn**2).sum())
    return {"groups": float(n), "rollout_grad_norm/max": float(norms.max()),
            "group_grad_norm/mean": float(gn.mean()),
            "dead_groups/count": float(sum(not np.any(v) for v in by.values())),
            "noise/mu_sq": n / (n - 1) * (T - S), "noise/trace_sigma": n / (n - 1) * (n * S - T),
            "scale": max(T, n * S)}


def _fsdp_model(out: Path):
    """The tiny model sharded with FSDP2 over the processes at load time (transformers'
    ``DistributedConfig``; accelerate's own FSDP plugin needs GPUs: on CPU it falls back to DDP)."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM
    from transformers.distributed import DistributedConfig
    from trl_geometry_helpers import tiny_model, tiny_tokenizer

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    path = out / "tiny"
    if dist.get_rank() == 0:
        tiny_model(len(tiny_tokenizer()), eos_logit=1.0, tie=False).save_pretrained(path)
    dist.barrier()
    cfg = DistributedConfig(fsdp_size=dist.get_world_size())
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float64, distributed_config=cfg)


def main() -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trl_geometry_helpers import make_trainer

    from real_model.integrations.trl import meter as trl_meter
    from real_model.processes import end_process

    out, mode = Path(sys.argv[1]), sys.argv[2]
    loss_type = sys.argv[3] if len(sys.argv) > 3 else "grpo"
    geometry_mode = sys.argv[4] if len(sys.argv) > 4 else "second_pass"
    weight_grads = sys.argv[5] if len(sys.argv) > 5 else "rows"
    chk = Checker() if mode in ("check", "fsdp") else None
    model = _fsdp_model(out) if mode == "fsdp" else None
    if mode == "fail":
        real = trl_meter.measure_rows

        def flaky(model, rows, **kw):
            if trainer.state.global_step == 0 and trainer.accelerator.process_index == 1:
                raise RuntimeError("injected failure on process 1")
            return real(model, rows, **kw)

        trl_meter.measure_rows = flaky  # where the meter looks it up
    trainer = make_trainer(
        out, model=model, loss_type=loss_type, max_steps=2, gradient_accumulation_steps=1,
        per_device_train_batch_size=6, learning_rate=1e-3,
        callbacks=[chk.callback] if chk else [],
        geometry_jsonl_path=str(out / "geometry.jsonl"), geometry_mode=geometry_mode,
        geometry_weight_grads=weight_grads,
    )
    if chk is not None:
        chk.trainer = trainer
    trainer.train()
    rank = trainer.accelerator.process_index
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "global_step": int(trainer.state.global_step),
        "checks": chk.results if chk else [],
        "records": [{k: v for k, v in r.items() if k != "group_records"}
                    for r in trainer.geometry_records],
        "logs": [h for h in trainer.state.log_history if "loss" in h],
        "distributed_type": str(trainer.accelerator.distributed_type),
        "fsdp2": any(type(p).__name__ == "DTensor" for p in trainer.model.parameters()),
    }))
    # DDP keeps the gloo group alive past destroy_process_group, and its teardown with the
    # interpreter aborts now and then after training has finished (real_model/processes.py)
    end_process(0)


if __name__ == "__main__":
    main()
