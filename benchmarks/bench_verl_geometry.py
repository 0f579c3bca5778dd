"""Step-time overhead of the verl geometry (``GeometryFSDPEngine``) on verl's own CPU training step.

The step is verl's ``engine.train_batch`` (micro-batched forward + backward + optimizer step,
FSDP2, float32, gloo) on a tiny random Llama, as in ``tests/test_real_verl_geometry.py``: a GRPO
batch of ``--groups`` x ``--rollouts`` rows, ``--micro-batch`` rows per micro-batch (a multiple of
``--rollouts``: every group in one micro-batch, the in-run path). Modes, run in rotation (one step
of each per round, so that load changes hit all modes alike; the order rotates by one mode each
round), median step time per mode:

* ``off``: plain engine (no geometry);
* ``in-run``: geometry every step, ``score_every=0`` (the gradient-row Gram from verl's own
  backward, the per-step collectives and metrics; no second pass);
* ``in-run, per call``: the same with ``batch_small_calls=False`` (every module call adds its
  own term in the backward; the default batches the small calls after each micro-batch's
  backward);
* ``in-run + score``: geometry and the score Gram (second pass, unit weights) every step;
* ``every 10``: geometry and score Gram at every 10th step (one engine state across the rounds;
  the amortised cost is ``(mean of the measured steps + 9 x mean of the others) / 10``, the
  median would miss the measured steps).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_verl_geometry.py
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 benchmarks/bench_verl_geometry.py

``--floors`` adds two modes that measure what any in-run capture of this design pays before its
arithmetic: ``protocol only`` (the in-run protocol with a capture that installs nothing and
returns zero Grams: reading the batch, tagging rows, the log-prob tap, the per-step gather and
metrics) and ``protocol + empty hooks`` (the same capture with one forward hook per trainable
module that hooks its output's gradient with a no-op: the least that sees every module's input
and output gradient).

``--kinds`` adds a mode, in-run with timers around the core's per-module contributions,
and prints where the in-run overhead goes per step: Linear layers by identity (``identity``:
from the ``[N, N]`` token kernels, "ghost" norms) and per-sample method, norms, the embedding,
the LM head, unpacking packed micro-batches, and the rest (hooks, input taps, the extra autograd
nodes, building the captures, the per-step protocol) as the difference.

``--grouped-rows`` adds a mode, in-run with the packed rows' per-row weight-gradient products as
one grouped product (``gram.rows.GROUPED_DEVICE_TYPES``; off by default). ``--bf16-rows``
adds a mode, in-run with bf16 Linears on the ``rows`` path on every device (float32 rows; by
default on CPU only, ``gram.rows.ROWS_LOW_PRECISION_DEVICE_TYPES``). ``--small-calls
TOKENS ELEMENTS`` adds a mode, in-run with larger small-call limits (the defaults, 512 tokens and
65536 entries, were set on CPU): calls up to those sizes take the batched token kernels, a few
operators per distinct input instead of a dozen per call, at up to ``N^2 (d_in + d_out)``
multiply-adds a call. ``--kernel-ratio R`` adds a mode, in-run with
``gram.small_calls.SMALL_CALL_KERNEL_RATIO`` set to ``R`` (default 40; 0: Linear calls are small by
their size alone, as before that bound). ``--logprobs
one-pass`` replaces verl's log-prob fallback (without the ``flash_attn`` package it runs one
log-softmax per packed token, which on a GPU makes the plain step several times slower) with
verl's one-pass ``logprobs_from_logits_naive``. ``--profile`` runs one plain and one in-run step
under ``torch.profiler`` after the rounds: host and device time, top operators, and the operator
calls the geometry adds. ``--op-sites`` counts, for one plain and one in-run step, the operators
dispatched on the host (a ``TorchDispatchMode``: each one a kernel launch on a GPU, where a step
this small is bound by the host) and names the library function that dispatched each (the first
frame outside torch; ``verl/torch`` when that frame is not the library's).

Every step is on-policy, as the first update after verl's ``compute_log_prob``: before each
(timed) step the batch's ``old_log_probs`` are set from the engine's current weights (untimed
``infer_batch``). Without it the rounds would train one batch again and again against the same
old log-probs, and after a few steps every token's ratio leaves the clip range: the loss's
gradient, and every Gram, is zero (so were the figures of this benchmark before 2026-11-27).

Needs the ``verl`` extra. Timings on a shared CPU are noisy: compare the ratios of one run (the
modes run interleaved, one step each per round); the load average (``os.getloadavg``, as
``uptime`` prints it) is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ratios import paired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=5)
    ap.add_argument("--max-response", type=int, default=7)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="compute dtype (bf16: float32 master weights, bf16 compute, as verl's "
                         "GPU default)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="verl's model.lora_rank (0: full fine-tuning; > 0: PEFT LoRA adapters "
                         "on every Linear, a fresh adapter, only the adapters trained)")
    ap.add_argument("--checkpointing", action="store_true",
                    help="verl's enable_gradient_checkpointing (the capture taps module inputs)")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds (one step per mode)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    ap.add_argument("--kinds", action="store_true",
                    help="also time the in-run overhead per module kind (an extra mode)")
    ap.add_argument("--floors", action="store_true",
                    help="also time the protocol alone and with empty hooks (two extra modes)")
    ap.add_argument("--logprobs", choices=["verl", "one-pass"], default="verl",
                    help="verl: verl's logprobs_from_logits as installed (without the flash_attn "
                         "package its fallback loops over the packed tokens, one log-softmax "
                         "each); one-pass: verl's logprobs_from_logits_naive (one log-softmax "
                         "over all tokens), standing in for flash_attn's fused cross-entropy")
    ap.add_argument("--grouped-rows", action="store_true",
                    help="add a mode: in-run with the packed rows' per-row products as one "
                         "grouped product (torch._grouped_mm; gram.rows.GROUPED_DEVICE_TYPES)")
    ap.add_argument("--profile", action="store_true",
                    help="after the rounds, profile one plain and one in-run step "
                         "(torch.profiler): top operators by self CPU and device time, and the "
                         "operator calls the geometry adds")
    ap.add_argument("--bf16-rows", action="store_true",
                    help="add a mode: in-run with bf16/fp16 Linears on weight_grads='rows' on "
                         "every device (gram.rows.ROWS_LOW_PRECISION_DEVICE_TYPES; CPU only "
                         "by default): float32 rows, verl's dW from them")
    ap.add_argument("--small-calls", type=int, nargs=2, metavar=("TOKENS", "ELEMENTS"),
                    help="add a mode: in-run with other small-call limits "
                         "(gram.small_calls.SMALL_CALL_TOKENS, SMALL_CALL_ELEMENTS; defaults 512, "
                         "65536, set for CPU): calls up to these sizes take the batched token "
                         "kernels, a few operators per distinct input")
    ap.add_argument("--kernel-ratio", type=int, metavar="R",
                    help="add a mode: in-run with gram.small_calls.SMALL_CALL_KERNEL_RATIO = R "
                         "(default 40: a Linear call is also small when N^2 (d_in + d_out) <= R "
                         "n d_in d_out; 0: by its size alone)")
    ap.add_argument("--op-sites", action="store_true",
                    help="after the rounds, count the operators one plain and one in-run step "
                         "dispatch, by the library function that dispatched them")
    args = ap.parse_args()
    if args.rounds < 1 or args.warmup < 0 or args.lora_rank < 0:
        ap.error(f"--rounds must be >= 1, --warmup and --lora-rank >= 0 (got {args.rounds}, "
                 f"{args.warmup}, {args.lora_rank})")
    if args.kernel_ratio is not None and args.kernel_ratio < 0:
        ap.error(f"--kernel-ratio must be >= 0 (got {args.kernel_ratio})")
    load0 = os.getloadavg()

    from real_model.integrations.verl import cpu as vc

    rank, world = vc.init_process_group()
    vc.register_cpu_platform()
    from real_model.integrations import verl as iverl
    from real_model.integrations.config import GeometryConfig
    from real_model.integrations.verl.step import VerlGeometry

    if args.logprobs == "one-pass":
        from verl.workers.engine.fsdp import transformer_impl

        transformer_impl.logprobs_from_logits = one_pass_logprobs
    tmp = Path(os.environ.get("BENCH_VERL_DIR", tempfile.gettempdir())) / (
        f"bench_verl_llama_{args.hidden}_{args.layers}_{args.vocab}")
    path = vc.save_tiny_llama(tmp, hidden=args.hidden, layers=args.layers, vocab=args.vocab)
    engine = vc.make_engine(path, micro_batch_size=args.micro_batch,
                            engine_cls=iverl.GeometryFSDPEngine, compute_dtype=args.dtype,
                            lora_rank=args.lora_rank, gradient_checkpointing=args.checkpointing)
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    rewards = [[(g + i) % 2 for i in range(args.rollouts)] for g in range(args.groups)]
    batch = vc.grpo_batch(rewards, seed=0, prompt_len=args.prompt_len, vocab=args.vocab,
                          max_response=args.max_response, model_path=path, logp_noise=0.1)
    loss = vc.make_loss_fn(rollout_n=args.rollouts, micro_batch_size=args.micro_batch)
    # one geometry per mode for the whole run, as an engine keeps its own
    modes: dict[str, Any] = {
        "off": None,
        "in-run": VerlGeometry(GeometryConfig(score_every=0)),
        "in-run, per call": VerlGeometry(GeometryConfig(score_every=0,
                                                              batch_small_calls=False)),
        "in-run + score": VerlGeometry(GeometryConfig(score_every=1)),
        "every 10": VerlGeometry(GeometryConfig(every=10, score_every=1)),
    }
    if args.floors:
        for name, hooks in (("protocol only", False), ("protocol + empty hooks", True)):
            modes[name] = VerlGeometry(GeometryConfig(score_every=0),
                                          capture_factory=EmptyCapture.factory(hooks))
    from real_model.gram import rows as gram_rows
    from real_model.gram import small_calls

    settings: dict[str, ModuleSettings] = {}  # module constants a mode's steps run with
    if args.grouped_rows:
        modes["in-run, grouped rows"] = VerlGeometry(GeometryConfig(score_every=0))
        settings["in-run, grouped rows"] = ModuleSettings(
            {(gram_rows, "GROUPED_DEVICE_TYPES"): ("cpu", "cuda")})
    if args.bf16_rows:
        modes["in-run, bf16 rows"] = VerlGeometry(GeometryConfig(score_every=0))
        settings["in-run, bf16 rows"] = ModuleSettings(
            {(gram_rows, "ROWS_LOW_PRECISION_DEVICE_TYPES"): ("cpu", "cuda")})
    if args.small_calls:
        tokens, elements = args.small_calls
        small = f"in-run, small {tokens}"
        modes[small] = VerlGeometry(GeometryConfig(score_every=0))
        settings[small] = ModuleSettings({(small_calls, "SMALL_CALL_TOKENS"): tokens,
                                          (small_calls, "SMALL_CALL_ELEMENTS"): elements})
    if args.kernel_ratio is not None:
        ratio = f"in-run, kernel ratio {args.kernel_ratio}"
        modes[ratio] = VerlGeometry(GeometryConfig(score_every=0))
        settings[ratio] = ModuleSettings(
            {(small_calls, "SMALL_CALL_KERNEL_RATIO"): args.kernel_ratio})
    timers = KindTimers() if args.kinds else None
    if timers is not None:
        modes["in-run (timed)"] = VerlGeometry(GeometryConfig(score_every=0))
    times: dict[str, list[float]] = {m: [] for m in modes}
    measured = [0, 0]  # in-run: groups with a nonzero gradient, groups
    names = list(modes)
    last: dict[str, float] = {}
    for r in range(args.warmup + args.rounds):
        # the order rotates from round to round: no mode always follows the same one (in 2
        # processes a fixed order put the every-10 mode, after the score pass, at +8-11%)
        for mode in names[r % len(names):] + names[:r % len(names)]:
            cfg = modes[mode]
            if timers is not None:
                timers.active = mode == "in-run (timed)" and r >= args.warmup
            if r == args.warmup and mode == "every 10":
                cfg.step = 0  # the first timed round is a measured step
            data = on_policy(engine, cfg, batch, rank, world, args.micro_batch)
            with settings.get(mode, NO_SETTINGS):
                sync()
                t0 = time.perf_counter()
                with engine.train_mode():
                    engine.train_batch(data, loss)
                sync()
                dt = time.perf_counter() - t0
            last[mode] = dt
            if r >= args.warmup:
                times[mode].append(dt)
                if mode == "in-run":  # what the geometry measured: not a vanished gradient
                    groups = (cfg.last_record or {}).get("groups") or []
                    measured[0] += sum(bool(g.get("grad_norm")) for g in groups)
                    measured[1] += len(groups)
        if rank == 0:  # progress, on stderr
            label = (f"warm-up {r + 1}/{args.warmup}" if r < args.warmup else
                     f"round {r - args.warmup + 1}/{args.rounds}")
            print(f"{label}: " + ", ".join(f"{m} {last[m]:.3f} s" for m in modes),
                  file=sys.stderr, flush=True)
    if rank == 0:
        tokens = float(batch["input_ids"].offsets().diff().float().mean())
        _report(args, world, times, load0, tokens)
        print(f"in-run steps: {measured[0]} of {measured[1]} groups had a nonzero gradient "
              "(||sum_i g_i|| > 0)")
        if timers is not None:
            timers.report(args.rounds, statistics.median(times["in-run"])
                          - statistics.median(times["off"]))
    if args.op_sites:
        sites = {}
        counted = ["off", "in-run", *settings]  # the in-run modes with their own settings too
        for mode in counted:
            data = on_policy(engine, modes[mode], batch, rank, world, args.micro_batch)
            with settings.get(mode, NO_SETTINGS), engine.train_mode(), OpSites() as ops:
                engine.train_batch(data, loss)
            sites[mode] = ops.sites
        if rank == 0:
            for mode in counted[1:]:
                print(f"[{mode}] " + op_sites_summary(sites["off"], sites[mode], top=15))
    if args.profile:
        calls = {}
        for mode in ("off", "in-run"):
            data = on_policy(engine, modes[mode], batch, rank, world, args.micro_batch)
            calls[mode] = profile_step(partial(engine.train_batch, data, loss), engine, sync,
                                       label=mode, top=20, show=rank == 0)
        if rank == 0:
            added = {k: n - calls["off"].get(k, 0) for k, n in calls["in-run"].items()}
            print(f"operator calls per step: off {sum(calls['off'].values())}, in-run "
                  f"{sum(calls['in-run'].values())}; most added by the geometry: "
                  + ", ".join(f"{k} +{n}" for k, n in sorted(added.items(),
                                                              key=lambda kv: -kv[1])[:12]))


def on_policy(engine: Any, geometry: Any, batch: Any, rank: int, world: int,
              micro_batch: int) -> Any:
    """This rank's slice of ``batch`` with its old log-probs from the engine's current weights
    (verl's ``compute_log_prob``; untimed), the engine set to ``geometry``."""
    from real_model.integrations.verl import cpu as vc

    engine.geometry = geometry
    data = vc.rank_slice(batch, rank, world, micro_batch_size=micro_batch)
    vc.set_old_log_probs(engine, data)
    return data


def one_pass_logprobs(logits: Any, labels: Any, inplace_backward: bool = True) -> Any:
    """verl's ``logprobs_from_logits`` signature on verl's ``logprobs_from_logits_naive``: one
    log-softmax over all tokens (``--logprobs one-pass``)."""
    from verl.utils.torch_functional import logprobs_from_logits_naive

    return logprobs_from_logits_naive(logits, labels)


def profile_step(step: Callable[[], Any], engine: Any, sync: Callable[[], None], *, label: str,
                 top: int, show: bool) -> dict[str, int]:
    """One step under ``torch.profiler``: prints its wall time, the host's CPU time (all threads)
    and the device kernels' time (the profiler's own totals: operators' self CPU, kernels' self)
    and the ``top`` operators by self CPU and by device time; returns the ``aten::`` operators'
    call counts (each a dispatch on the host, most a kernel launch on a GPU)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        with engine.train_mode():
            step()
        sync()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    counts = {e.key: e.count for e in events if e.key.startswith("aten::")}
    if show:
        host = events.self_cpu_time_total / 1e6  # the tables' totals, by torch's own rule
        device = sum(e.self_device_time_total for e in events
                     if e.device_type != DeviceType.CPU and not e.is_user_annotation) / 1e6
        print(f"profiled {label} step: wall {wall:.3f} s (under the profiler), host CPU "
              f"{host:.3f} s (all threads), device kernels {device:.3f} s, "
              f"{sum(counts.values())} aten calls")
        print(events.table(sort_by="self_cpu_time_total", row_limit=top,
                           max_name_column_width=60))
        if len(acts) > 1:
            print(events.table(sort_by="self_device_time_total", row_limit=top,
                               max_name_column_width=60))
    return counts


class ModuleSettings:
    """Module constants set for a block and restored after it: ``{(module, name): value}``."""

    def __init__(self, values: dict[tuple[Any, str], Any]) -> None:
        self.values = values
        self._saved: dict[tuple[Any, str], Any] = {}

    def __enter__(self) -> ModuleSettings:
        for (mod, name), value in self.values.items():
            self._saved[(mod, name)] = getattr(mod, name)
            setattr(mod, name, value)
        return self

    def __exit__(self, *exc: Any) -> None:
        for (mod, name), value in self._saved.items():
            setattr(mod, name, value)
        self._saved.clear()


NO_SETTINGS = ModuleSettings({})


class OpSites:
    """A ``TorchDispatchMode`` counting the operators dispatched inside it by call site: the
    library function (``file:function`` under ``real_model/``) of the first frame outside torch,
    or ``"verl/torch"`` when that frame is not the library's (the host's own work, and autograd's
    backward, which runs outside Python frames)."""

    HOST = "verl/torch"

    def __init__(self) -> None:
        from collections import Counter

        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                counter.sites[counter.site()] += 1
                return func(*args, **(kwargs or {}))

        self.sites: Counter[str] = Counter()
        self._mode = _Mode()

    def site(self) -> str:
        """The call site of the operator being dispatched (called from ``__torch_dispatch__``)."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename.replace(os.sep, "/")
            if "/torch/" not in name:
                if "/real_model/" in name:
                    return f"{Path(name).name}:{frame.f_code.co_name}"
                return self.HOST
            frame = frame.f_back
        return self.HOST

    def __enter__(self) -> OpSites:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def op_sites_summary(off: dict[str, int], inrun: dict[str, int], *, top: int) -> str:
    """The plain and in-run steps' operator counts, what the geometry added, and the library
    functions that dispatched the most in the in-run step.

    >>> print(op_sites_summary({"verl/torch": 10}, {"verl/torch": 8, "g.py:f": 5}, top=3))
    operators dispatched per step: off 10, in-run 13 (+3); by the library 5, by verl/torch -2
          5  g.py:f
    """
    host = OpSites.HOST
    n_off, n_in = sum(off.values()), sum(inrun.values())
    ours = sorted(((n, s) for s, n in inrun.items() if s != host), reverse=True)[:top]
    lines = [f"operators dispatched per step: off {n_off}, in-run {n_in} ({n_in - n_off:+d}); "
             f"by the library {n_in - inrun.get(host, 0)}, by {host} "
             f"{inrun.get(host, 0) - off.get(host, 0):+d}"]
    lines += [f"{n:>7d}  {s}" for n, s in ours]
    return "\n".join(lines)


class EmptyCapture:
    """A capture that measures nothing (``--floors``): zero Grams, and with ``hooks`` one forward
    hook per trainable module that registers a no-op gradient hook on the output."""

    def __init__(self, module: Any, *, blocks: list[list[int]], hooks: bool, **_: Any) -> None:
        from real_model.gram.plan import plan_of

        self.modules = [m for m, _, _ in plan_of(module).modules.values()] if hooks else []
        self.blocks, self.handles, self.ok, self.input_taps = blocks, [], True, False

    @classmethod
    def factory(cls, hooks: bool) -> Any:
        return lambda module, **kw: cls(module, hooks=hooks, **kw)

    def __enter__(self) -> EmptyCapture:
        self.handles = [m.register_forward_hook(_hook_output) for m in self.modules]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()

    def problems(self) -> list[str]:
        return []

    def result(self) -> list[Any]:
        import torch

        return [torch.zeros(len(b), len(b), dtype=torch.float64) for b in self.blocks]


def _hook_output(module: Any, args: Any, out: Any) -> None:
    if getattr(out, "requires_grad", False):
        out.register_hook(_no_op)


def _no_op(grad: Any) -> None:
    return None


class KindTimers:
    """Wall time of the core's per-module contributions, by kind, while ``active``."""

    def __init__(self) -> None:
        from real_model.gram import GramCapture, linear_gram, small_calls
        from real_model.gram.layers import linear as linear_rule
        from real_model.gram.packed import PackedRows

        self.active = False
        self.seconds: dict[str, float] = {}
        self._wrap(GramCapture, "_contribute", self._kind_of_call)
        self._wrap(PackedRows, "unpack", lambda *a, **k: "  of which unpacking (all)")
        self._wrap(linear_gram, "linear_weight_gram_identity",
                   lambda *a, **k: "  of which Linear identity")
        self._wrap(linear_rule, "linear_weight_gram_identity_packed",
                   lambda *a, **k: "  of which Linear identity")
        self._wrap(linear_gram, "linear_weight_gram_per_sample",
                   lambda *a, **k: "  of which Linear per-sample")
        # weight_grads="rows": the Linear's dW and Grams from its per-row gradients (the
        # batched products replace verl's own dW product, so this is not all overhead)
        self._wrap(linear_rule, "_rows_grad", lambda *a, **k: "linear layers (rows, dW)")
        # batch_small_calls: the small calls' terms, added after the backward, batched
        self._wrap(small_calls, "add_small_calls", lambda *a, **k: "small calls (batched)")

    @staticmethod
    def _kind_of_call(cap: Any, call: Any, *args: Any, **kwargs: Any) -> str:
        kind = cap.plan.modules[call.name][1]
        if kind == "linear":
            return "LM head" if call.name in cap.engine.embedding_of_head or call.name.endswith(
                "lm_head") else "linear layers"
        return {"embedding": "embedding", "generic": "norms"}.get(kind, kind)

    def _wrap(self, owner: Any, name: str, label: Any) -> None:
        fn = getattr(owner, name)
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not timers.active:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = label(*args, **kwargs)
                timers.seconds[key] = timers.seconds.get(key, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)

    def report(self, rounds: int, overhead: float) -> None:
        print(f"in-run overhead per step, by kind (timed mode; median overhead "
              f"{overhead * 1e3:.1f} ms):")
        total = 0.0
        for key, sec in sorted(self.seconds.items()):
            ms = 1e3 * sec / rounds
            total += 0 if key.startswith(" ") else ms
            print(f"  {key:<28}{ms:>9.2f} ms")
        print(f"  {'rest (hooks, taps, protocol)':<28}{overhead * 1e3 - total:>9.2f} ms")


def _report(args: Any, world: int, times: dict[str, list[float]],
            load0: tuple[float, float, float], tokens_per_row: float) -> None:
    import torch

    base = statistics.median(times["off"])
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"verl {_version('verl')}, torch {torch.__version__}, {world} process(es), {device}, "
          f"CPU threads {torch.get_num_threads()}, load average {load0[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")
    variant = f", LoRA rank {args.lora_rank}" if args.lora_rank else ""
    variant += ", one-pass log-probs" if args.logprobs == "one-pass" else ""
    variant += ", gradient checkpointing" if args.checkpointing else ""
    print(f"{args.dtype}{variant}; Llama hidden {args.hidden}, {args.layers} layers, "
          f"vocab {args.vocab}; "
          f"{args.groups} groups x {args.rollouts} rollouts, micro-batch {args.micro_batch}, "
          f"{args.rounds} rounds; {tokens_per_row:.0f} tokens per row (mean, prompt + response)")
    mean0 = statistics.fmean(times["off"])
    print(f"{'mode':<24}{'median step s':>14}{'vs off':>9}{'mean step s':>13}{'vs off':>9}"
          f"   paired in rounds (95% interval)")
    for mode, ts in times.items():
        med, mean = statistics.median(ts), statistics.fmean(ts)
        mid, lo, hi = paired(times["off"], ts)
        print(f"{mode:<24}{med:>14.4f}{med / base:>8.3f}x{mean:>13.4f}{mean / mean0:>8.3f}x"
              f"   {mid:.3f}x ({lo:.3f}-{hi:.3f})")
    print("(ratios: each mode's median (mean) step over the plain engine's, modes interleaved; "
          "paired: the median over rounds of the step over the plain step of its round, with a "
          "seeded bootstrap interval over rounds)")
    inrun = statistics.median(times["in-run"]) / base - 1
    every10 = amortised_mean(times["every 10"], every=10) / mean0 - 1
    every10_med = (amortised_mean(times["every 10"], every=10, center=statistics.median)
                   / base - 1)
    print(f"in-run geometry overhead, every step: {100 * inrun:+.1f}% of the step (medians); "
          f"geometry + score every 10 steps: {100 * every10_med:+.1f}% (medians) and "
          f"{100 * every10:+.1f}% (means; one slow step of any mode, e.g. a garbage collection, "
          "moves the means), amortised: (measured + 9 x plain) / 10; the table's every-10 row "
          "is the plain median (mean)")


def amortised_mean(ts: list[float], *, every: int,
                   center: Callable[[list[float]], float] = statistics.fmean) -> float:
    """Mean step time when one step in ``every`` is measured: ``ts`` are the timed steps of the
    ``every`` mode, the measured ones at indices ``0, every, 2 every, ...``;
    ``(center(measured) + (every - 1) center(plain)) / every``, so that a run whose length is
    not a multiple of ``every`` does not weigh the measured steps more (or less) than 1 in
    ``every``. With only measured steps (one round), their ``center``. ``center``: the mean
    (default), or ``statistics.median`` (robust to a one-off slow step).

    >>> amortised_mean([11.0, 1.0, 1.0], every=10)
    2.0
    >>> amortised_mean([3.0], every=10)
    3.0
    >>> amortised_mean([11.0, 1.0, 1.0, 49.0], every=10, center=statistics.median)  # mean: 16.6
    2.0
    """
    measured = ts[::every]
    plain = [t for i, t in enumerate(ts) if i % every]
    if not plain:
        return center(measured)
    return (center(measured) + (every - 1) * center(plain)) / every


def _version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
    from real_model.processes import end_process

    end_process(0)  # no teardown of FSDP2's gloo group with the interpreter (it can abort)
