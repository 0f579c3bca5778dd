"""Rollout throughput: per-group sampling (the old path) vs all groups of a step in one batch.

Both paths run in ONE process on the same model and the same prompts/seeds, alternating
(old, new, old, new, ... ``--repeat`` times; the best time of each is reported), and the script
prints generated tokens per second for each and their ratio, plus how many groups came out
token-identical (batching changes the logits in the last bits, see
``real_model.rollouts.sample_groups``).

    python benchmarks/bench_rollouts.py                       # SmolLM2-135M offline, CPU
    python benchmarks/bench_rollouts.py --device cuda --dtype bfloat16 --model PATH_OR_NAME

Defaults: 8 groups x R=8, up to 96 new tokens, temperature 0.7, few-shot prompts (3 shots) of
generated word problems, the default stop strings (``--no-stop`` samples the full length).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model (default: offline SmolLM2-135M)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--R", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--no-stop", action="store_true", help="no stop strings (full length)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs of each path (best kept)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    from real_model.data import generate_problems
    from real_model.loading import OFFLINE_MODEL, load_model
    from real_model.rollouts import DEFAULT_STOP_STRINGS, build_prompt, prompt_seed, sample_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model or OFFLINE_MODEL, device=args.device, dtype=args.dtype)
    model, tok = loaded.model, loaded.tokenizer
    import numpy as np

    probs = generate_problems(args.groups + 3, rng=np.random.default_rng(args.seed))
    shots, probs = probs[:3], probs[3:]
    prompts = [build_prompt(q.question, shots=shots) for q in probs]
    seeds = [prompt_seed(args.seed, i) for i in range(args.groups)]
    kw = dict(R=args.R, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
              stop_strings=() if args.no_stop else DEFAULT_STOP_STRINGS)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sample_prompts(model, tok, prompts[:1], seeds=seeds[:1], batch_prompts=1,
                   **{**kw, "max_new_tokens": 2})  # warm-up (not timed)
    res: dict[str, Any] = {}
    outs: dict[str, Any] = {}
    for _ in range(args.repeat):
        for name, B in (("old: one group at a time", 1), ("new: all groups in one batch",
                                                          args.groups)):
            sync()
            t0 = time.perf_counter()
            out = sample_prompts(model, tok, prompts, seeds=seeds, batch_prompts=B, **kw)
            sync()
            dt = time.perf_counter() - t0
            toks = int(sum(int(b.lengths.sum()) for b in out))
            if name not in res or dt < res[name]["time_s"]:
                res[name] = {"time_s": dt, "tokens": toks, "tokens_per_s": toks / dt}
            outs[name] = out
    old, new = (outs[k] for k in res)
    same = sum(torch.equal(a.input_ids, b.input_ids) for a, b in zip(old, new, strict=True))
    names = list(res)
    ratio = res[names[1]]["tokens_per_s"] / res[names[0]]["tokens_per_s"]
    desc = loaded.describe() if hasattr(loaded, "describe") else {}
    print(f"Rollout benchmark: {desc.get('name', args.model)}, {args.groups} groups x R={args.R}, "
          f"<= {args.max_new_tokens} new tokens, {loaded.dtype}, {args.device}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| path | wall (s) | generated tokens | tokens/s |\n|---|---:|---:|---:|")
    for k, v in res.items():
        print(f"| {k} | {v['time_s']:.2f} | {v['tokens']} | {v['tokens_per_s']:.1f} |")
    print(f"throughput ratio new/old = {ratio:.2f}x; token-identical groups: {same}/{args.groups}")
    summary = {"config": vars(args), "results": res, "ratio": ratio, "identical_groups": same,
               "torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


if __name__ == "__main__":
    main()
