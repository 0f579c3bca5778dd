"""Where the in-run capture's time goes: one forward + backward through TRL's fused LM head.

The offline SmolLM2 (float32, CPU) with TRL's ``add_fused_lm_head``; ``--rows`` rows of
``--tokens`` tokens (random ids, the last ``--completion`` scored), loss
``sum u * log p + 0.01 * entropy`` with random ``u`` (any upstream gradient), two row blocks
(two groups). Plain forward + backward and the same inside a
:class:`real_model.gram.GramCapture` are interleaved ``--repeat`` times (after one warm-up
of each); printed: the medians, their ratio, the medians of the forward and of the backward
alone and of TRL's fused-head kernel in each (the host's own work, in both modes), the seconds
of the last captured step spent in each of the capture's per-layer methods (Linear Grams,
embedding, small leaf modules, the fused head's backward and its vocabulary tiles), timed by
wrapping them in this script only, and the
median minor page faults of each step (``getrusage``: fresh memory the step touched).

``--ops N`` then profiles one more plain and one more captured step with ``torch.profiler`` and
prints the ``N`` (operator, input shapes) pairs whose self CPU time grew most under the capture,
with both times and call counts (which products, sums and elementwise passes the capture adds),
and the ``N`` that shrank most (the host's weight-gradient products that the capture's per-row
products replace). Single profiled steps are noisy: compare with the timed medians.

    PYTHONPATH=$PWD OMP_NUM_THREADS=2 python benchmarks/profile_trl_inrun.py [--ops 25]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import resource
import statistics
import subprocess
import time
from collections import defaultdict
from typing import Any

TAPS = {"auto": None, "on": True, "off": False}
HOOKS = (("layers.linear", "add_linear"), ("layers.linear", "_rows_grad"),
         ("layers.embedding", "add_embedding"), ("layers.leaf", "add_leaf"),
         ("layers.fused_head", "_fused_backward"), ("layers.head", "_head_tile"))
"""The engine's per-call work, timed (module under ``real_model.gram``, function)."""


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
    ap.add_argument("--input-taps", choices=tuple(TAPS), default="auto",
                    help="GramCapture(input_taps=...): 'auto' (the TRL/verl in-run setting: taps "
                         "only under gradient checkpointing, so none here), 'on' or 'off'")
    ap.add_argument("--ops", type=int, default=0,
                    help="> 0: also print the N operators (by input shapes) whose self CPU time "
                         "grew most under the capture (torch.profiler, one more step each)")
    a = ap.parse_args(argv)
    import torch
    import trl.trainer.utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    from real_model.gram import EngineOptions, GramCapture
    from real_model.integrations.trl.private import fused_head
    from real_model.loading import load_model

    torch.manual_seed(0)
    model = load_model("smollm2-offline", device="cpu", dtype="float32").model
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    if a.lora_r:
        import peft

        from real_model.integrations.trl.train import TRLTrainConfig, lora_config

        model = peft.get_peft_model(model, lora_config(TRLTrainConfig(lora_r=a.lora_r)))
    R, T = a.rows, a.tokens
    ids = torch.randint(0, model.config.vocab_size, (R, T))
    labels = ids.clone()
    labels[:, : T - a.completion] = -100
    u = torch.randn(R, T - 1)
    spent: dict[str, float] = defaultdict(float)
    for mod, name in HOOKS:
        module = importlib.import_module(f"real_model.gram.{mod}")
        setattr(module, name, _timed(spent, name, getattr(module, name)))
    # TRL's own fused-head kernel, timed in both modes: does the capture slow the host's work?
    fn = trl_utils._ChunkedLogProbFunction
    host: dict[str, float] = defaultdict(float)
    for name in ("forward", "backward"):
        setattr(fn, name, staticmethod(_timed(host, name, getattr(fn, name))))

    parts: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
    faults: dict[bool, list[int]] = {False: [], True: []}

    def step(capture: bool) -> float:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        host.clear()
        model.zero_grad(set_to_none=True)
        half = R // 2
        cap = GramCapture(model, blocks=[list(range(half)), list(range(half, R))],
                          engine=EngineOptions(weight_grads=a.weight_grads),
                          input_taps=TAPS[a.input_taps])
        head = fused_head(cap)  # TRL's fused head reports to the capture
        t0 = time.perf_counter()
        if capture:
            head.__enter__()
            cap.__enter__()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                    fused_lm_head=True)
        t1 = time.perf_counter()
        ((out.log_probs * u).sum() + 0.01 * out.entropy.sum()).backward()
        if capture:
            cap.__exit__(None, None, None)
            head.__exit__(None, None, None)
            cap.result()
        t2 = time.perf_counter()
        parts[capture].append((t1 - t0, t2 - t1, host["forward"], host["backward"]))
        faults[capture].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return t2 - t0

    step(False)
    step(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for c in (False, True):
        parts[c].clear()
        faults[c].clear()
    for _ in range(a.repeat):
        for capture in (False, True):
            spent.clear()
            times[capture].append(step(capture))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"SmolLM2 float32 CPU{f', LoRA r={a.lora_r}' if a.lora_r else ''}, {R} rows x {T} "
          f"tokens, TRL fused head, weight_grads={a.weight_grads}, input_taps={a.input_taps}; "
          f"{load}")
    print(f"forward+backward median of {a.repeat}: plain {off:.2f} s, captured {on:.2f} s, "
          f"ratio {on / off:.3f}")
    f = {c: [statistics.median(x[i] for x in parts[c]) for i in range(4)] for c in parts}
    print(f"medians: forward plain {f[False][0]:.2f} s, captured {f[True][0]:.2f} s; backward "
          f"plain {f[False][1]:.2f} s, captured {f[True][1]:.2f} s; of which TRL's fused head "
          f"forward {f[False][2]:.2f} / {f[True][2]:.2f} s, backward {f[False][3]:.2f} / "
          f"{f[True][3]:.2f} s (plain / captured)")
    print("last captured step, seconds in the capture's methods: "
          + ", ".join(f"{k} {v:.2f}" for k, v in spent.items()))
    print(f"minor page faults per step (median): plain {statistics.median(faults[False]):.0f}, "
          f"captured {statistics.median(faults[True]):.0f}")
    if a.ops > 0:
        print_op_growth(step, a.ops)
    return 0


def op_times(step: Any, capture: bool) -> dict[tuple[str, str], tuple[float, int]]:
    """Self CPU milliseconds and calls of each (operator, input shapes) in one ``step``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(capture)
    return {(e.key, str(e.input_shapes)): (e.self_cpu_time_total / 1e3, e.count)
            for e in prof.key_averages(group_by_input_shape=True)}


def print_op_growth(step: Any, n: int) -> None:
    """The ``n`` (operator, shapes) whose self CPU time grew most from a plain to a captured
    step (one profiled step each)."""
    plain, captured = op_times(step, False), op_times(step, True)
    rows = []
    for key in set(plain) | set(captured):
        (t0, c0), (t1, c1) = plain.get(key, (0.0, 0)), captured.get(key, (0.0, 0))
        rows.append((t1 - t0, key, t0, c0, t1, c1))
    rows.sort(key=lambda r: r[0], reverse=True)
    total0 = sum(t for t, _ in plain.values())
    total1 = sum(t for t, _ in captured.values())
    print(f"torch.profiler, self CPU time of one step: plain {total0:.0f} ms, captured "
          f"{total1:.0f} ms; the {n} (operator, input shapes) that grew most:")
    print(f"{'growth ms':>10}  {'plain ms/calls':>15}  {'captured ms/calls':>18}  operator shapes")
    for grow, (op, shapes), t0, c0, t1, c1 in rows[:n]:
        print(f"{grow:>10.1f}  {t0:>9.1f}/{c0:<5d}  {t1:>12.1f}/{c1:<5d}  {op} {shapes[:100]}")
    print(f"... and the {n} that shrank most (host operators the capture replaces, or noise):")
    for grow, (op, shapes), t0, c0, t1, c1 in rows[::-1][:n]:
        print(f"{grow:>10.1f}  {t0:>9.1f}/{c0:<5d}  {t1:>12.1f}/{c1:<5d}  {op} {shapes[:100]}")


if __name__ == "__main__":
    raise SystemExit(main())
