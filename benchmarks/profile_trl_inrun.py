"""Where the in-run capture's time goes: one forward + backward through TRL's fused LM head.

The offline SmolLM2 (float32, CPU) with TRL's ``add_fused_lm_head``; ``--rows`` rows of
``--tokens`` tokens (random ids, the last ``--completion`` scored), loss
``sum u * log p + 0.01 * entropy`` with random ``u`` (any upstream gradient), two row blocks
(two groups). Plain forward + backward and the same inside a
:class:`real_model.gram_capture.GramCapture` are interleaved ``--repeat`` times (after one warm-up
of each); printed: the medians, their ratio, and the seconds of the last captured step spent in
each of the capture's per-layer methods (Linear Grams, embedding, small leaf modules, the fused
head's backward and its vocabulary tiles), timed by wrapping them in this script only.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/profile_trl_inrun.py
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import time
from collections import defaultdict
from typing import Any

HOOKS = ("add_linear", "_rows_grad", "add_embedding", "add_leaf", "_fused_backward",
         "_head_tile")


def _timed(spent: dict[str, float], name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0

    return wrapper


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=117)
    ap.add_argument("--completion", type=int, default=16, help="scored (last) tokens per row")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--lora-r", type=int, default=0,
                    help="> 0: LoRA adapters of this rank on every projection (PEFT, as "
                         "`real trl-train --lora-r`); the rows are the adapters' gradients")
    ap.add_argument("--weight-grads", choices=("host", "rows"), default="rows",
                    help="GramCapture(weight_grads=...): 'rows' (the TRL/verl in-run default) "
                         "takes each Linear's dW from the per-row gradients")
    a = ap.parse_args(argv)
    import torch
    from trl.trainer.utils import add_fused_lm_head

    from real_model.gram_capture import GramCapture
    from real_model.loading import load_model

    torch.manual_seed(0)
    model = load_model("smollm2-offline", device="cpu", dtype="float32").model
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    if a.lora_r:
        import peft

        from real_model.trl_train import TRLTrainConfig, lora_config

        model = peft.get_peft_model(model, lora_config(TRLTrainConfig(lora_r=a.lora_r)))
    R, T = a.rows, a.tokens
    ids = torch.randint(0, model.config.vocab_size, (R, T))
    labels = ids.clone()
    labels[:, : T - a.completion] = -100
    u = torch.randn(R, T - 1)
    spent: dict[str, float] = defaultdict(float)
    for name in HOOKS:
        setattr(GramCapture, name, _timed(spent, name, getattr(GramCapture, name)))

    def step(capture: bool) -> float:
        model.zero_grad(set_to_none=True)
        half = R // 2
        cap = GramCapture(model, blocks=[list(range(half)), list(range(half, R))],
                          weight_grads=a.weight_grads)
        t0 = time.perf_counter()
        if capture:
            cap.__enter__()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                    fused_lm_head=True)
        ((out.log_probs * u).sum() + 0.01 * out.entropy.sum()).backward()
        if capture:
            cap.__exit__(None, None, None)
            cap.result()
        return time.perf_counter() - t0

    step(False)
    step(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(a.repeat):
        for capture in (False, True):
            spent.clear()
            times[capture].append(step(capture))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"SmolLM2 float32 CPU{f', LoRA r={a.lora_r}' if a.lora_r else ''}, {R} rows x {T} "
          f"tokens, TRL fused head, weight_grads="
          f"{a.weight_grads}; {load}")
    print(f"forward+backward median of {a.repeat}: plain {off:.2f} s, captured {on:.2f} s, "
          f"ratio {on / off:.3f}")
    print("last captured step, seconds in the capture's methods: "
          + ", ".join(f"{k} {v:.2f}" for k, v in spent.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
