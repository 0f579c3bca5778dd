"""verl's own GRPO actor update on CPU with the exact per-group gradient geometry, no GPU, no Ray.

Each step builds a GRPO batch of ``--prompts`` groups of ``--rollouts`` random rollouts with random
binary rewards (verl's GRPO advantages), computes the old log-probabilities with verl's engine
(``infer_batch``, as verl's ``compute_log_prob``), then runs verl's ``train_batch`` (micro-batched
forward + backward + optimizer step) on the geometry engine. Every ``--every`` steps the engine
measures the Gram of the actual gradient rows of each group (and the score Gram), prints the
aggregates verl's trainer would log under ``actor/geometry/...`` and appends a JSON line to
``--jsonl`` (default ``runs/verl_geometry_cpu.jsonl``; the example starts the file afresh, while
the engine itself appends, so that a resumed verl run continues its file). ``--lora-rank``
trains verl's LoRA adapters instead of the full model (the geometry then measures the adapters'
gradient rows).

    PYTHONPATH=$PWD python examples/verl_geometry_cpu.py --steps 3
    PYTHONPATH=$PWD torchrun --nproc_per_node 2 examples/verl_geometry_cpu.py --steps 3

Needs the ``verl`` extra (``pip install -e '.[verl]'`` in its own environment). The model is a
tiny random Llama written to ``--model-dir``; any Hugging Face causal LM directory works.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--loss-agg-mode", default="token-mean")
    ap.add_argument("--policy-loss", default="vanilla")
    ap.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "verl_tiny_llama"))
    ap.add_argument("--jsonl", default="runs/verl_geometry_cpu.jsonl",
                    help="the measured steps' JSON lines (written afresh)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="verl's model.lora_rank (0: full fine-tuning)")
    args = ap.parse_args()
    if args.steps < 1 or args.every < 1 or args.lora_rank < 0:
        ap.error(f"--steps and --every must be >= 1 and --lora-rank >= 0 (got {args.steps}, "
                 f"{args.every}, {args.lora_rank})")

    import numpy as np

    from real_model.integrations.verl import cpu as vc

    rank, world = vc.init_process_group()
    vc.register_cpu_platform()  # verl's CPU platform (only when this machine has no GPU)
    from real_model.integrations.config import GeometryConfig
    from real_model.integrations.verl import GeometryFSDPEngine

    path = vc.save_tiny_llama(args.model_dir)
    if rank == 0:  # this run's records only (the engine appends)
        Path(args.jsonl).unlink(missing_ok=True)
    # score_every=1: the score Gram (a second pass) at every measured step, beside the rows'
    geometry = GeometryConfig(every=args.every, score_every=1, jsonl_path=args.jsonl)
    engine = vc.make_engine(path, micro_batch_size=args.micro_batch,
                            engine_cls=GeometryFSDPEngine, geometry=geometry,
                            lora_rank=args.lora_rank)
    loss_fn = vc.make_loss_fn(rollout_n=args.rollouts, micro_batch_size=args.micro_batch,
                              loss_agg_mode=args.loss_agg_mode, loss_mode=args.policy_loss)
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        rewards = rng.integers(0, 2, size=(args.prompts, args.rollouts))
        batch = vc.grpo_batch(rewards, seed=step)
        data = vc.rank_slice(batch, rank, world, micro_batch_size=args.micro_batch)
        vc.set_old_log_probs(engine, data)  # verl's compute_log_prob at the current weights
        with engine.train_mode():
            out = engine.train_batch(data, loss_fn)
        if rank == 0:
            _print(step, out["metrics"])
    # FSDP2 keeps the gloo process group alive to the interpreter's teardown, which now and
    # then aborts after the work is done: leave without it (real_model/processes.py)
    from real_model.processes import end_process

    end_process(0)


def _print(step: int, metrics: dict) -> None:
    geo = {k: v[0] for k, v in metrics.items() if k.startswith("geometry/")}
    if not geo:
        print(f"step {step}: not measured")
        return
    if geo["geometry/failed"]:
        print(f"step {step}: geometry failed (reason in the log and the JSONL)")
        return
    keys = ("effective_rank/mean", "top1_fraction/mean", "grad_norm/mean", "cos_SF/mean",
            "common_share/mean", "in_run_groups", "second_pass_groups", "mixed_groups")
    shown = ", ".join(f"{k.split('/')[0]}={geo['geometry/' + k]:.4g}" for k in keys
                      if "geometry/" + k in geo)
    print(f"step {step}: {shown}")


if __name__ == "__main__":
    main()
