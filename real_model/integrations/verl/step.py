"""One measured verl step: a small record filled while verl runs it, and the protocol after it.

While verl's ``forward_backward_batch`` runs, a :class:`MeasuredStep` keeps the batch's rows,
each micro-batch's Gram capture (:mod:`real_model.gram`, hooks handed over from one
micro-batch to the next) and the gradient of verl's loss w.r.t. its log-probabilities (``u``,
by :func:`real_model.integrations.verl.tap.tap_log_probs`). After verl's backward, before
its optimizer step, :func:`finish` runs the per-step protocol (every rank the same collectives
in the same order; every decision taken from gathered data): (1) gather each rank's rows,
in-run Grams and errors; (2) plan the second passes (:class:`.plan.Plan`, the same everywhere);
(3) gather the rows that change rank; (4) run the same number of second passes on every rank;
(5) gather their Grams; rank 0 builds the records and metrics and broadcasts them. A plan
without second passes skips (3)-(5). The step's training diagnostics (norms, dead groups, noise
scale, SNR: :func:`..protocol.step_diagnostics_fields`) come with the records, from the groups'
Grams and verl's own gradient norm (:func:`host_grad_norm`, one scalar all-reduce).
:class:`VerlGeometry` is what the engine holds across steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...gram import (
    EngineOptions,
    GramCapture,
    GramCaptureError,
    TemperatureScaled,
    checkpointing_enabled,
    reshard_fsdp,
)
from .. import collectives
from ..config import GeometryConfig
from ..jsonl import StepLog, write_step
from ..protocol import (
    aggregate_groups,
    diagnostic_sums,
    diagnostics_metrics,
    gradient_row_metrics,
    gradient_row_metrics_batch,
    group_records,
    step_diagnostics_fields,
)
from .plan import (
    ROW_KEY,
    Plan,
    Row,
    autocast,
    dummy_pass,
    metrics_for_verl,
    pass_row,
    row_gram,
    row_meta,
    rows_of_batch,
    run_pass,
)
from .tap import tap_log_probs

__all__ = ["MicroBatch", "MeasuredStep", "VerlGeometry", "new_capture", "finish",
           "host_grad_norm"]

log = logging.getLogger(__name__)


def new_capture(module: torch.nn.Module, *, rows: int, segments: Any, blocks: list[list[int]],
                input_taps: bool | None = None, engine: EngineOptions | None = None
                ) -> GramCapture:
    """The core's capture of one verl micro-batch: batch-first, or packed (``segments``: verl's
    ``use_remove_padding=True`` runs the micro-batch as one sequence with ``cu_seqlens``).
    verl backpropagates with ``loss.backward()``: without gradient checkpointing the capture
    needs no input taps (``input_taps``: ``checkpointing_enabled`` of the module, found once
    per step; ``None``: the capture looks), so verl's autograd graph is untouched."""
    return GramCapture(module, blocks=blocks, segments=segments, input_taps=input_taps,
                       engine=engine)


@dataclass
class MicroBatch:
    """One micro-batch of a measured step: its rows, their layout, the capture and ``u``."""

    index: int
    keys: list[int]
    offsets: list[int]
    blocks: dict[str, list[int]]
    capture: Any = None
    closed: bool = False
    sink: list = field(default_factory=list)


@dataclass
class MeasuredStep:
    """What one measured step holds while verl runs it (and after, for tests and benches)."""

    rows: dict[int, Row] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # the rows' keys in batch order
    next_row: int = 0  # the next row of ``order`` a micro-batch starts at
    micro: list[MicroBatch] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    active: bool = False  # the batch was read: micro-batches are captured
    entropy_in_loss: bool = False
    input_taps: bool | None = None  # the model checkpoints activations (found per step)


def guarded(st: MeasuredStep, what: str, fn: Callable, *args: Any) -> bool:
    """Run ``fn(*args)``; an exception is recorded in the step, never raised into verl."""
    try:
        fn(*args)
        return True
    except Exception as e:  # never into verl's step
        st.errors.append(f"{what}: {type(e).__name__}: {e}")
        return False


class VerlGeometry:
    """The geometry of one verl engine: its config, optimizer-step counter, the capture factory
    (tests and benchmarks replace it), the measured step and the last step's record. The
    engine calls :meth:`run_step` (around verl's ``forward_backward_batch``) and
    :meth:`open_micro_batch` (from ``forward_step``)."""

    def __init__(self, config: GeometryConfig, *, capture_factory: Callable | None = None) -> None:
        self.config = config
        self.step = 0
        self.capture_factory = capture_factory or new_capture
        self.measured = MeasuredStep()
        self.last_record: dict[str, Any] | None = None
        self.log = StepLog(Path(config.jsonl_path)) if config.jsonl_path else None

    @property
    def micro(self) -> list[MicroBatch]:
        """The micro-batches of the last measured step."""
        return self.measured.micro

    @property
    def active(self) -> bool:
        return self.measured.active

    def run_step(self, engine: Any, data: Any, loss_function: Callable,
                 base: Callable[..., Any]) -> Any:
        """verl's ``forward_backward_batch`` (``base``) with the geometry around it."""
        step, self.step = self.step, self.step + 1
        if not self.config.measures(step):
            return base(data, loss_function, forward_only=False)
        t0 = time.perf_counter()
        st = self.measured = MeasuredStep(entropy_in_loss=_entropy_in_loss(loss_function, data))
        st.active = guarded(st, "reading the batch", _read_batch, st, engine, data)
        loss_fn = _tapped(st, loss_function) if st.active else loss_function
        try:
            out = base(data, loss_fn, forward_only=False)
        finally:
            close_micro_batch(st)
            st.active = False
            if ROW_KEY in data.keys():
                data.pop(ROW_KEY)
        t_step = time.perf_counter() - t0
        metrics, self.last_record = finish(st, engine, self.config, self.log, step, t_step)
        out.setdefault("metrics", {}).update(metrics)
        return out

    def open_micro_batch(self, module: torch.nn.Module, micro_batch: Any) -> None:
        """Start the capture of one micro-batch; the previous micro-batch's capture ends (it
        hands its hooks over to the new one when the core's capture can:
        ``GramCapture.handover``, no hooks re-installed per micro-batch)."""
        st = self.measured
        if not st.active:
            close_micro_batch(st)
            return
        if not guarded(st, "opening a micro-batch", _open, st, self, module, micro_batch):
            close_micro_batch(st)


# ----------------------------------------------------------------- inside verl's step
def _read_batch(st: MeasuredStep, engine: Any, data: Any) -> None:
    from verl.utils import tensordict_utils as tu

    if getattr(engine, "use_ulysses_sp", False):
        raise ValueError("Ulysses sequence parallelism splits rows' tokens over ranks: "
                         "not supported by the geometry")
    rank = torch.distributed.get_rank()
    n = data.batch_size[0]
    uids = tu.get(data, "uid", None)
    if uids is None:
        raise ValueError("the batch has no 'uid' (verl's group id per rollout): groups unknown")
    st.input_taps = checkpointing_enabled(engine.module)
    rows = rows_of_batch(data, [str(u) for u in uids], rank)
    st.rows = {r.key: r for r in rows}
    if len(rows) != n:
        raise ValueError(f"read {len(rows)} rows of a batch of {n}")
    st.order, st.next_row = [r.key for r in rows], 0
    if tu.get_non_tensor_data(data, "use_dynamic_bsz", True):
        # verl rearranges rows into token-balanced micro-batches: tag each row (a key
        # column verl carries along; without dynamic batches rows keep their order and
        # are matched by position, which spares verl the extra column)
        data[ROW_KEY] = torch.tensor(st.order, dtype=torch.int64)


def _tapped(st: MeasuredStep, loss_function: Callable) -> Callable:
    def loss_with_tap(model_output: Any, data: Any, dp_group: Any = None) -> Any:
        mb = st.micro[-1] if st.micro else None
        if mb is not None and st.active:
            try:
                tap_log_probs(model_output, mb.sink)
            except Exception as e:  # never into verl's step
                st.errors.append(f"tapping the log-probs: {type(e).__name__}: {e}")
        return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return loss_with_tap


def _open(st: MeasuredStep, geo: VerlGeometry, module: torch.nn.Module, micro_batch: Any) -> None:
    from verl.utils import tensordict_utils as tu

    offsets = micro_batch["input_ids"].offsets().tolist()
    if ROW_KEY in micro_batch.keys():
        keys = [int(k) for k in micro_batch[ROW_KEY].tolist()]
    else:  # verl cut the batch into micro-batches in order: the next rows, lengths checked
        n = int(micro_batch.batch_size[0])
        keys = st.order[st.next_row:st.next_row + n]
        st.next_row += n
        if [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)] != [
                st.rows[k].tokens for k in keys]:
            raise ValueError("a micro-batch's rows are not the batch's next rows in order "
                             "(use_dynamic_bsz=False): rows cannot be matched")
    blocks: dict[str, list[int]] = {}
    for j, k in enumerate(keys):
        blocks.setdefault(st.rows[k].uid, []).append(j)
        st.rows[k].mb = len(st.micro)
    packed = bool(tu.get_non_tensor_data(micro_batch, "use_remove_padding", True))
    segments = offsets if packed else None
    mb = MicroBatch(len(st.micro), keys, offsets, blocks)
    row_blocks = list(blocks.values())
    cap = _handover(st, geo, segments, row_blocks)
    if cap is None:
        close_micro_batch(st)
        options = EngineOptions(weight_grads=geo.config.weight_grads,
                                batch_small_calls=bool(geo.config.batch_small_calls))
        cap = geo.capture_factory(module, rows=len(keys), segments=segments, blocks=row_blocks,
                                  input_taps=st.input_taps, engine=options)
        st.micro.append(mb)
        mb.capture = cap
        cap.__enter__()
    else:
        st.micro.append(mb)
        mb.capture = cap


def _handover(st: MeasuredStep, geo: VerlGeometry, segments: Any,
              blocks: list[list[int]]) -> GramCapture | None:
    """The previous micro-batch's capture handed over to this one's rows (its Gram kept,
    its small calls added), or ``None``: a new capture is needed (none open, a custom
    capture factory, input taps, or the handover refused)."""
    prev = st.micro[-1] if st.micro and not st.micro[-1].closed else None
    if (prev is None or geo.capture_factory is not new_capture
            or not isinstance(prev.capture, GramCapture) or prev.capture.input_taps):
        return None
    try:
        cap = prev.capture.handover(segments=segments, blocks=blocks)
    except Exception:  # noqa: BLE001 - the usual close-and-build path instead
        return None
    prev.closed = True
    return cap


def close_micro_batch(st: MeasuredStep) -> None:
    """End the current micro-batch's capture (after verl's backward of it)."""
    if not st.micro or st.micro[-1].closed or st.micro[-1].capture is None:
        return
    mb = st.micro[-1]
    mb.closed = True
    guarded(st, "closing a micro-batch", mb.capture.__exit__, None, None, None)
    done = getattr(mb.capture, "backward_done", None)  # verl's backward of it has run
    if done is not None:
        guarded(st, "closing a micro-batch", done)
    flush = getattr(mb.capture, "flush", None)  # its small calls: their tensors go now
    if flush is not None:
        guarded(st, "adding a micro-batch's small calls", flush)


def _entropy_in_loss(loss_function: Any, data: Any) -> bool:
    """True when verl's loss adds an entropy bonus (``calculate_entropy`` and ``entropy_coeff``)."""
    try:
        from verl.utils import tensordict_utils as tu

        cfg = getattr(loss_function, "keywords", {}).get("config")
        coeff = float(getattr(cfg, "entropy_coeff", 0.0) or 0.0)
        return bool(tu.get_non_tensor_data(data, "calculate_entropy", False)) and coeff != 0.0
    except Exception:
        return True  # unknown: treat as present (second passes are then not claimed exact)


# ----------------------------------------------------------------- after verl's backward
def finish(st: MeasuredStep, engine: Any, config: GeometryConfig, log_: StepLog | None,
           step: int, t_step: float) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """The per-step protocol (module docstring): ``(metrics, record)`` of the step."""
    t0 = time.perf_counter()
    rank, world = collectives.rank(), collectives.world_size()
    grad_norm = host_grad_norm(engine)  # every rank, first: before any second pass
    local = _local_summary(st, 1.0 / world, rank) if not st.errors else None
    everyone = collectives.all_gather({"errors": st.errors, "summary": local})
    reasons = _reasons(everyone)
    if reasons:
        return _failed(config, log_, step, reasons, t_step, t0)
    try:  # the same inputs on every rank: the same outcome everywhere
        plan = Plan(everyone, world, score=config.scores(step),
                    max_rows=int(config.second_pass_rows))
    except Exception as e:
        return _failed(config, log_, step, [f"planning: {type(e).__name__}: {e}"], t_step, t0)
    if plan.n_passes == 0:  # every group in-run: each rank holds what rank 0 would build
        payload = _build_payload(config, log_ if rank == 0 else None, step, plan, [], t_step,
                                 t0, grad_norm)
    else:
        inputs, reasons = _exchange_rows(st, plan, rank)
        if reasons:
            return _failed(config, log_, step, reasons, t_step, t0)
        errors, grams = _run_passes(engine, plan, rank, inputs)
        results = collectives.all_gather({"errors": errors, "grams": grams})
        payload = None
        if rank == 0:
            payload = _build_payload(config, log_, step, plan, results, t_step, t0, grad_norm)
        payload = collectives.broadcast(payload)
    if not payload["ok"]:
        return _failed(config, log_, step, payload["reasons"], t_step, t0)
    return payload["metrics"], payload["record"]


def host_grad_norm(engine: Any) -> float | None:
    """verl's gradient norm of the step before its optimizer update, as its ``optimizer_step``
    computes it before clipping (``actor/grad_norm``): the 2-norm of every parameter's
    gradient, one all-reduce of a scalar across the FSDP ranks (DTensor gradients; FSDP1:
    its own ``clip_grad_norm_`` at ``max_norm = inf``, which scales by exactly 1). ``None``
    when it cannot be formed (the noise scale then says so); every rank calls it."""
    try:
        params = [p for p in engine.module.parameters() if p.grad is not None]
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if isinstance(engine.module, FSDP):
            total = engine.module.clip_grad_norm_(float("inf"))
        else:
            total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
            full = getattr(total, "full_tensor", None)
            total = full() if callable(full) else total
        value = float(total)
        return value if np.isfinite(value) else None
    except Exception as e:  # never into verl's step
        log.warning("geometry: verl's gradient norm not formed (%s: %s): no noise scale",
                    type(e).__name__, e)
        return None


def _reasons(gathered: list[Mapping[str, Any]]) -> list[str]:
    """Every rank's errors from an all-gather, as ``"rank r: error"``."""
    return [f"rank {r}: {e}" for r, x in enumerate(gathered) for e in x["errors"]]


def _local_summary(st: MeasuredStep, scale: float, rank: int) -> dict[str, Any] | None:
    """Rows (metadata) and in-run Grams of this rank; ``None`` and an error on failure."""
    try:
        inrun = {}
        for mb in st.micro:
            if len(mb.sink) != 1:
                raise ValueError(f"micro-batch {mb.index}: {len(mb.sink)} log-prob gradients "
                                 "(expected one backward through verl's log-probs)")
            g = mb.sink[0]
            bounds = mb.offsets
            ends = [b - 1 for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
            if ends and bool(g[ends].ne(0).any()):  # each row's last log-prob: one check
                raise ValueError("verl's loss depends on the wrapped-around last "
                                 "log-prob of a row: unexpected layout")
            for j, k in enumerate(mb.keys):
                st.rows[k].u_span = (g, bounds[j], bounds[j + 1], scale)
            try:
                grams = mb.capture.result()  # raises with every problem of the capture
            except GramCaptureError as e:
                raise ValueError(f"micro-batch {mb.index}: {e}") from e
            for uid, K in zip(mb.blocks, grams, strict=True):
                K = K.detach().cpu()
                inrun[(uid, rank, mb.index)] = (K if scale == 1.0 else K * (scale * scale)).numpy()
        rows = [row_meta(r, rank) for r in st.rows.values()]
        return {"rows": rows, "inrun": inrun, "entropy": st.entropy_in_loss}
    except Exception as e:
        st.errors.append(f"collecting the step: {type(e).__name__}: {e}")
        return None


def _exchange_rows(st: MeasuredStep, plan: Plan, rank: int) -> tuple[dict[int, dict], list[str]]:
    """Second-pass inputs of the rows this rank owns: its own, plus those other ranks hold
    (one all-gather, always run: it also carries every rank's errors)."""
    errors: list[str] = []
    try:
        own = {k: pass_row(st.rows[k]) for k in plan.rows_needed_by(rank) if k in st.rows}
        send = {k: pass_row(st.rows[k]) for k in plan.moved.get(rank, ())}
    except Exception as e:
        own, send = {}, {}
        errors.append(f"second-pass inputs: {type(e).__name__}: {e}")
    parts = collectives.all_gather({"errors": errors, "rows": send})
    for part in parts:
        own.update(part["rows"])
    return own, _reasons(parts)


def _run_passes(engine: Any, plan: Plan, rank: int,
                inputs: dict[int, dict[str, Any]]) -> tuple[list[str], dict]:
    """This rank's second passes, padded with dummy passes to the most any rank runs."""
    grams: dict[tuple[str, str], np.ndarray] = {}
    errors: list[str] = []
    mine = plan.passes[rank]
    # full logits through the FSDP root's own forward (FSDP gathers the head's weight there)
    model = TemperatureScaled(engine.module, plan.temperature)
    for i in range(plan.n_passes):
        chunk = mine[i] if i < len(mine) else None
        try:
            with autocast(engine):
                if chunk is None:
                    dummy_pass(model)
                    continue
                kind, groups = chunk
                grams.update(run_pass(model, kind, groups, plan, inputs))
        except Exception as e:
            errors.append(f"second pass {i}: {type(e).__name__}: {e}")
    try:
        reshard_fsdp(engine.module)  # every rank, whatever its passes did
    except Exception as e:
        errors.append(f"resharding after the second passes: {type(e).__name__}: {e}")
    return errors, grams


def _failed(config: GeometryConfig, log_: StepLog | None, step: int, reasons: list[str],
            t_step: float, t0: float) -> tuple[dict[str, list[float]], dict[str, Any]]:
    msg = f"geometry of optimizer step {step} skipped: " + "; ".join(reasons)
    if config.strict:
        raise RuntimeError(msg)
    log.warning(msg)
    rec = {"step": step, "failed": reasons, "seconds": {
        "step_with_hooks": t_step, "geometry": time.perf_counter() - t0}}
    if collectives.rank() == 0 and log_ is not None:
        write_step(log_, rec)
    return {config.log_prefix + "failed": [1.0]}, rec


def _build_payload(config: GeometryConfig, log_: StepLog | None, step: int, plan: Plan,
                   results: list, t_step: float, t0: float,
                   grad_norm: float | None = None) -> dict[str, Any]:
    """Records and metrics of the step (``log_``: append the JSONL record there)."""
    reasons = _reasons(results)
    if reasons:
        return {"ok": False, "reasons": reasons}
    try:
        grams: dict[tuple[str, str], np.ndarray] = {}
        for x in results:
            grams.update(x["grams"])
        row_metrics = _row_metrics(config, plan, grams)
        records = [group_record(config, g, plan, grams, row_metrics) for g in plan.groups]
        agg = aggregate_groups([r for r in records if "error" not in r])
        seconds = {"step_with_hooks": t_step, "geometry": time.perf_counter() - t0}
        rec = {"step": step, "world_size": plan.world, "failed": None,
               "layout": plan.layout(), "aggregate": agg, "seconds": seconds,
               "config": asdict(config)}
        if config.keep_groups:
            rec["groups"] = records
        diag, reason = _diagnostics(config, plan, grams, records, grad_norm)
        rec["diagnostics"] = diag
        if reason is not None:
            rec["diagnostics_reason"] = reason
        if log_ is not None:
            write_step(log_, rec)
        metrics = metrics_for_verl(agg, plan.layout(), seconds, prefix=config.log_prefix)
        metrics.update({k: [v] for k, v in diagnostics_metrics(
            diag or {}, prefix=config.log_prefix).items()})
        return {"ok": True, "metrics": metrics, "record": rec}
    except Exception as e:
        return {"ok": False, "reasons": [f"rank 0 metrics: {type(e).__name__}: {e}"]}


def _diagnostics(config: GeometryConfig, plan: Plan, grams: dict, records: list[dict[str, Any]],
                 grad_norm: float | None) -> tuple[dict[str, float] | None, str | None]:
    """The step's diagnostics from every group's Gram of its gradient rows and verl's gradient
    norm, or ``(None, why not)``: a group without its Gram (unsupported, failed) leaves the
    noise scale without its units. Rank 0 holds every group's ``[R, R]`` Gram (gathered by the
    protocol); only those small matrices and scalars crossed ranks."""
    missing = [uid for uid, rec in zip(plan.groups, records, strict=True)
               if row_gram(plan, grams, uid) is None or "error" in rec]
    if missing:
        return None, (f"{len(missing)} group(s) without a Gram of their gradient rows "
                      "(unsupported or failed): the diagnostics need every group of the step")
    try:
        inputs = [(row_gram(plan, grams, uid), [r["length"] for r in rows],
                   [r["reward"] for r in rows]) for uid, rows in plan.groups.items()]
        sums = diagnostic_sums(inputs, success_threshold=config.success_threshold)
        return step_diagnostics_fields([sums], total_grad_norm=grad_norm,
                                       num_groups=len(plan.groups)), None
    except Exception as e:  # noqa: BLE001 - the records stand without the diagnostics
        return None, f"diagnostics: {type(e).__name__}: {e}"


def _row_metrics(config: GeometryConfig, plan: Plan, grams: dict) -> dict[str, dict[str, Any]]:
    """The gradient-row metrics of the groups measured without a score Gram, all at once
    (``gradient_row_metrics_batch``); ``{}`` when one fails (each group then computes its
    own and records its own error)."""
    want = {}
    for uid in plan.groups:
        Kg = row_gram(plan, grams, uid)
        if Kg is not None and grams.get(("score", uid)) is None:
            want[uid] = Kg
    try:
        return dict(zip(want, gradient_row_metrics_batch(list(want.values()), rtol=config.rtol),
                        strict=True))
    except Exception:  # noqa: BLE001 - per group below, with the group's own error
        return {}


def group_record(config: GeometryConfig, uid: str, plan: Plan, grams: dict,
                 row_metrics: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """One group's JSON record: placement, path, rewards, metrics and its Grams."""
    rows = plan.groups[uid]
    rec: dict[str, Any] = {"uid": uid, "R": len(rows), "path": plan.path[uid],
                           "keys": [r["key"] for r in rows],
                           "placement": sorted({(r["rank"], r["mb"]) for r in rows})}
    Kg = row_gram(plan, grams, uid)
    Ks = grams.get(("score", uid))
    rewards = [r["reward"] for r in rows]
    A = np.array([r["advantage"] for r in rows])
    lengths = [r["length"] for r in rows]
    have_r = all(x is not None for x in rewards)
    succ = (np.array(rewards, dtype=np.float64) > config.success_threshold if have_r else None)
    rec.update({"rewards": rewards if have_r else None, "advantages": A.tolist(),
                "lengths": lengths,
                "token_level_advantages": any(r["adv_varies"] for r in rows),
                "num_success": int(succ.sum()) if have_r else None,
                "mixed": bool(succ.any() and not succ.all()) if have_r else bool(np.any(A))})
    try:
        if Ks is not None and have_r:  # score geometry, plus the rows' metrics from Kg
            rec.update(group_records(Ks, rewards, A, None, lengths, rtol=config.rtol,
                                     exact_structure=False, row_gram=Kg,
                                     success_threshold=config.success_threshold))
        elif Kg is not None:
            got = row_metrics.get(uid)
            rec.update(got if got is not None else gradient_row_metrics(Kg, rtol=config.rtol))
        if Kg is None and plan.path[uid] == "unsupported":
            rec["unsupported"] = plan.reason[uid]
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["gram"] = None if Kg is None else np.asarray(Kg).tolist()
    rec["score_gram"] = None if Ks is None else np.asarray(Ks).tolist()
    return rec
