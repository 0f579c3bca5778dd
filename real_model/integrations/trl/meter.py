"""The geometry's course through TRL's calls: a small record of the run, and functions of it.

:class:`Run` is what the geometry keeps across TRL's calls (the latest generation batch, where
the current optimizer step stands, the step being measured, what was written). The mixin's
hooks call :func:`on_generation`, :func:`on_micro_step`, :func:`after_micro_step` and
:func:`add_log_fields`. Per due optimizer step: at its first micro-step, and where a new
generation batch starts inside it, TRL's per-token loss gradient ``u`` of the micro-steps to
come (a *segment*) is taken from TRL's own loss (:mod:`.loss`); the step is measured after its
last segment (second pass: :mod:`.rows`) or its last backward (in-run: :mod:`.inrun`), and
:func:`finish_step` gathers every process's :func:`.step.local_payload`. The step's record goes
to TRL's log and the JSONL when TRL has its gradient norm (:func:`on_grad_norm`, before the
optimizer update): the training diagnostics (:func:`..protocol.step_diagnostics_fields`:
norms, dead groups, noise scale, SNR) read it.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import collectives
from ..config import GeometryConfig
from ..jsonl import StepLog, write_step
from ..protocol import diagnostics_metrics, step_diagnostics_fields
from . import private
from .inrun import InRunMicro, inrun_results
from .loss import eval_mode, logp_values, segment_weights
from .rows import (
    Generation,
    GeometryRows,
    RowsMeasurement,
    assemble_rows,
    measure_rows,
    row_payload,
    second_pass_shape,
    select_payload,
    whole_groups_in_chunk,
)
from .step import (
    FSDP2_UNEVEN,
    GeometryStrictError,
    StepState,
    attempt,
    finished_fields,
    local_payload,
)
from .weights import (
    active_dropout,
    entropy_bonus,
    second_pass_only,
    structure_issues,
    structure_notes,
)

__all__ = ["Batches", "Run", "new_run", "on_generation", "on_micro_step", "after_micro_step",
           "add_log_fields", "finish_step", "on_grad_norm"]


@dataclass
class Batches:
    """TRL's generation batches as they come: the latest, how many, whether its micro-batches
    are still to be read, and the rewards TRL gathered for the next one."""

    current: Generation | None = None
    count: int = 0
    untagged: bool = False
    rewards: Any = None


@dataclass
class Run:
    """The geometry of one trainer across TRL's calls."""

    config: GeometryConfig
    log: StepLog
    batches: Batches = field(default_factory=Batches)
    seen_step: int | None = None  # the optimizer step of the last micro-step
    micro: int = 0  # micro-steps of that optimizer step before the current one
    step: StepState | None = None  # the step being measured
    live: InRunMicro | None = None  # the in-run capture of the current micro-step
    records: list[dict[str, Any]] = field(default_factory=list)
    last: dict[str, Any] | None = None  # the last measured step (records, Grams, segments)
    pending_reason: str | None = None  # a skip to add to TRL's next log
    warned: set[str] = field(default_factory=set)
    # a measured step waiting for TRL's gradient norm: (record, every process's diagnostic
    # sums, why the diagnostics cannot be formed or None)
    pending: tuple[dict[str, Any], list[dict[str, float]], str | None] | None = None


def new_run(trainer: Any, config: GeometryConfig) -> Run:
    """The run's record; the JSONL goes to ``jsonl_path`` or ``<output_dir>/geometry.jsonl``
    (a resumed run first drops the records of the steps it redoes)."""
    p = config.jsonl_path
    path = Path(p) if p else Path(trainer.args.output_dir) / "geometry.jsonl"
    return Run(config=config, log=StepLog(path, redo=True))


def _active(tr: Any, run: Run) -> bool:
    return run.config.every != 0 and tr.model.training


# -------------------------------------------------------------------------- TRL's calls
def on_generation(tr: Any, run: Run, out: dict[str, Any]) -> dict[str, Any]:
    """Keep TRL's generation batch (rows, rewards, advantages) and tag its rows."""
    import torch

    b = run.batches
    rw, b.rewards = b.rewards, None
    if not _active(tr, run):
        return out
    B = out["completion_ids"].shape[0]
    pi = tr.accelerator.process_index
    rewards = np.full(B, np.nan)
    if rw is not None:
        wts = tr.reward_weights.to(rw.device).unsqueeze(0)
        full = (rw * wts).nansum(dim=1)
        full[torch.isnan(rw).all(dim=1)] = torch.nan
        rewards = full[pi * B : (pi + 1) * B].detach().double().cpu().numpy()
    A = out["advantages"].detach().double().cpu()
    if A.dim() == 2:  # token-level advantages of a subclass: the row's mean over its mask
        m = out["completion_mask"].double().cpu()
        A = (A * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask",
            "num_items_in_batch", "pixel_values", "image_grid_thw")
    groups_per_gen = _world(tr) * B // int(tr.num_generations) + 1
    b.current = Generation(index=b.count, batch={k: out[k] for k in keys if k in out},
                           rewards=rewards, advantages=A.numpy(), first_row=pi * B,
                           group_offset=b.count * groups_per_gen)
    b.count += 1
    b.untagged = True
    out["geometry_row"] = torch.arange(B, device=out["completion_ids"].device)
    return out


def on_micro_step(tr: Any, run: Run) -> None:
    """After TRL's ``_prepare_inputs``: take ``u`` where a due step (or its new batch) starts;
    measure at the step's last segment (second pass), or arm the in-run capture of this
    micro-step's forward + backward (``in_run`` / ``auto``; measured after the step's last
    backward, :func:`after_micro_step`)."""
    if not _active(tr, run):
        return
    regenerated, tag_error = attempt(lambda: _read_chunk_tags(tr, run.batches))
    regenerated = bool(regenerated) or tag_error is not None
    step = int(tr.state.global_step)
    first = step != run.seen_step
    if first and run.pending is not None:  # TRL gave no gradient norm for it: record it now
        on_grad_norm(tr, run, None)
    run.micro = 0 if first else run.micro + 1
    run.seen_step = step
    if not run.config.measures(step) or run.batches.current is None:
        return
    t0 = time.perf_counter()
    if first or regenerated:
        _start_segment(tr, run, step, first, tag_error)
    st = run.step
    if st is not None and st.step == step and st.mode != "second_pass":
        if st.reason is None:
            _arm_capture(tr, run, st)
        st.spent += time.perf_counter() - t0


def after_micro_step(tr: Any, run: Run, *, completed: bool) -> None:
    """After TRL's ``training_step`` (forward + backward) of a micro-batch: close its in-run
    capture; after the step's last micro-batch, measure and record the step."""
    t0 = time.perf_counter()
    live, run.live = run.live, None
    if live is not None:
        live.close()
    st = run.step
    if st is not None:
        st.spent += time.perf_counter() - t0
    if (completed and st is not None and st.mode != "second_pass"
            and st.finish_at == run.micro and tr.model.training):
        finish_step(tr, run)


def add_log_fields(tr: Any, run: Run, logs: dict[str, Any]) -> None:
    """Add ``geometry/skipped_reason`` to TRL's log when a step's geometry was skipped."""
    if run.pending_reason is not None and tr.model.training:
        logs[run.config.log_prefix + "skipped_reason"] = run.pending_reason
        run.pending_reason = None


# -------------------------------------------------------------------------- a step's segments
def _world(tr: Any) -> int:
    return int(tr.accelerator.num_processes)


def _read_chunk_tags(tr: Any, b: Batches) -> bool:
    """After a new generation: which rows of the batch each buffered chunk holds."""
    if not b.untagged or b.current is None:
        return False
    b.untagged = False
    chunks = private.buffered_inputs(tr)
    b.current.chunk_rows = [ch.pop("geometry_row").cpu().numpy() for ch in chunks]
    if sorted(np.concatenate(b.current.chunk_rows).tolist()) != list(
        range(b.current.batch["completion_ids"].shape[0])
    ):
        raise RuntimeError("geometry: TRL's chunks do not partition the generation batch")
    return True


def _step_mode(config: GeometryConfig, step: int) -> str:
    """The geometry mode of this step (``score_every`` turns a measured step to the second
    pass)."""
    return "second_pass" if config.mode != "second_pass" and config.scores(step) else config.mode


def _start_segment(tr: Any, run: Run, step: int, first: bool, tag_error: str | None) -> None:
    """A due step, or a new generation batch inside it, starts: collect its segment."""
    GA = int(tr.current_gradient_accumulation_steps)
    S = int(tr.args.steps_per_generation)
    gen_every = S * int(tr.num_iterations)
    m = private.micro_step(tr)
    remaining = GA - run.micro
    n_micro = min(remaining, gen_every - m % gen_every)
    if first:
        run.step = StepState(step=step, t0=time.perf_counter(), mode=_step_mode(run.config, step))
    if run.step is None:  # the step's first micro-step was not seen (e.g. resumed)
        return
    _collect_segment(tr, run, [(m + k) % S for k in range(n_micro)], tag_error)
    if n_micro == remaining:
        if run.step.mode == "second_pass":
            finish_step(tr, run)
        else:
            run.step.finish_at = GA - 1


def _arm_capture(tr: Any, run: Run, st: StepState) -> None:
    """Open the in-run capture around this micro-step's forward + backward for the groups
    whose rows are all in this micro-batch (a micro-batch used once in the step)."""
    gen = run.batches.current
    assert gen is not None
    j = private.micro_step(tr) % int(tr.args.steps_per_generation)
    whole = st.inrun.get((gen.index, j))
    if not whole:
        return
    micro = InRunMicro(gen=gen, chunk=j, groups=whole)
    st.micro.append(micro)
    micro.open(tr, tr.accelerator.unwrap_model(tr.model), config=run.config)
    run.live = micro


def _rng_devices() -> list[int]:
    import torch

    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


def _collect_segment(tr: Any, run: Run, chunks: list[int], pre_error: str | None) -> None:
    """``u`` of the micro-steps ``chunks`` of this step on the current generation batch.

    Collectives, called by every process whatever happened locally: agreement after the
    local preparation, TRL's own loss (TRL's collectives), agreement after it.
    """
    import torch

    st, gen = run.step, run.batches.current
    assert st is not None and gen is not None
    if st.reason is not None:  # an earlier segment failed on some process: all skip
        return
    with torch.random.fork_rng(devices=_rng_devices()):
        prep, err = (None, pre_error) if pre_error else attempt(
            lambda: _prepare(tr, run, chunks))
        st.reason = collectives.first_reason(err)
        if st.reason is not None:
            return
        U, err = attempt(lambda: segment_weights(tr, gen, prep))
        st.reason = collectives.first_reason(err)
    if st.reason is None:
        for j, whole in prep["whole"].items():
            st.inrun[(gen.index, j)] = whole
        st.segments.append({"chunks": chunks, "rows": prep["rows"], "token_weights": U,
                            "generation": gen, "issues": prep["issues"]})


def _prepare(tr: Any, run: Run, chunks: list[int]) -> dict[str, Any]:
    """Local checks, the whole groups of each micro-batch (in-run modes) and the log-prob
    values TRL's loss needs for the micro-batches whose ``u`` the second pass needs
    (no-grad forward, eval mode)."""
    gen, st = run.batches.current, run.step
    assert gen is not None and st is not None
    multimodal = any(k in gen.batch for k in ("pixel_values", "image_grid_thw"))
    issues = structure_issues(tr.args, aux_loss=bool(getattr(tr, "aux_loss_enabled", False)),
                              multimodal=multimodal)
    dropout = active_dropout(tr.accelerator.unwrap_model(tr.model))
    if dropout:
        issues.append("dropout is active in TRL's step (" + ", ".join(dropout) + "): the "
                      "geometry is measured without dropout")
    relevant = (issues if st.mode != "in_run"
                else [i for i in issues if not second_pass_only(i)])
    if relevant and run.config.strict:
        raise GeometryStrictError("geometry (strict): " + "; ".join(relevant))
    if multimodal:
        raise ValueError("geometry: image inputs are not supported by the Gram pass")
    counts = {j: chunks.count(j) for j in sorted(set(chunks))}
    whole: dict[int, dict[int, list[int]]] = {}
    if st.mode != "second_pass":
        G = int(tr.num_generations)
        for j, c in counts.items():
            found = (whole_groups_in_chunk(gen.chunk_rows[j], first_row=gen.first_row,
                                           group_size=G) if c == 1 else {})
            whole[j] = {gen.group_offset + g: pos for g, pos in found.items()}
    u_chunks = [j for j in counts if st.mode == "second_pass" or (
        st.mode == "auto"
        and sum(map(len, whole.get(j, {}).values())) < len(gen.chunk_rows[j]))]
    buffered = private.buffered_inputs(tr)
    vals = {j: logp_values(tr, buffered[j]) for j in u_chunks}
    rows = np.concatenate([gen.chunk_rows[j] for j in counts])
    return {"counts": counts, "values": vals, "rows": np.sort(rows), "issues": issues,
            "whole": whole, "u_chunks": u_chunks}


# -------------------------------------------------------------------------- measuring a step
def finish_step(tr: Any, run: Run) -> None:
    """The step's measurement, then gather, aggregate, log and write its record."""
    import torch

    st, run.step = run.step, None
    assert st is not None
    rec = _step_base(tr, run.config, st)
    if st.reason is not None:
        _skip(tr, run, rec, st.reason)
        return
    t_finish = time.perf_counter()
    with torch.random.fork_rng(devices=_rng_devices()):
        inrun, meas, err, uneven = _measure(tr, run.config, st)
    seconds = (time.perf_counter() - st.t0 if st.mode == "second_pass"
               # in-run modes: the geometry's work outside TRL's step (the hooks' time inside
               # it is not separable: see benchmarks/bench_trl_geometry.py)
               else st.spent + time.perf_counter() - t_finish)
    gathered = collectives.all_gather(local_payload(
        st, inrun, meas, err, seconds, success_threshold=run.config.success_threshold,
        world=_world(tr)))
    reason, fields, groups = finished_fields(gathered, mode=st.mode, uneven=uneven)
    if reason is not None:
        _skip(tr, run, rec, reason)
        return
    rec.update(fields)
    if run.config.keep_groups:
        rec["group_records"] = groups
    run.pending = (rec, [p["sums"] for p in gathered], _diagnostics_gap(gathered, rec))
    local = inrun if (err is None and inrun is not None) else {}
    run.last = {"step": st.step, "segments": st.segments, "record": rec,
                "grams": {**meas.grams, **(local.get("grams") or {})},
                "row_grams": {**meas.row_grams, **(local.get("row_grams") or {})},
                "passes": meas.passes, "proportional": meas.proportional, "in_run": st.micro}


def _step_base(tr: Any, config: GeometryConfig, st: StepState) -> dict[str, Any]:
    return {
        "step": st.step,
        "geometry_mode": config.mode,
        "step_mode": st.mode,
        "weight_grads": "host" if st.mode == "second_pass" else config.weight_grads,
        "num_processes": _world(tr),
        "loss_type": tr.loss_type,
        "num_generations": int(tr.num_generations),
        "num_iterations": int(tr.num_iterations),
        "steps_per_generation": int(tr.args.steps_per_generation),
        "gradient_accumulation_steps": int(tr.current_gradient_accumulation_steps),
        "beta": float(tr.beta),
        "notes": structure_notes(tr.args),
    }


def _measure(tr: Any, config: GeometryConfig, st: StepState
             ) -> tuple[dict[str, Any] | None, RowsMeasurement | None, str | None, str | None]:
    """This process's in-run groups and second pass: ``(inrun, measurement, error, uneven)``
    (``uneven``: under FSDP2 the processes' second passes differ, so none runs; the in-run
    groups stay)."""
    inrun, err = attempt(lambda: inrun_results(
        st, config=config, group_size=int(tr.num_generations), score_ok=not entropy_bonus(tr.args)))
    done = inrun["done"] if inrun is not None else set()
    if st.mode == "in_run":
        return inrun, RowsMeasurement(), err, None
    rows, err2 = _exchange(tr, st, done)
    err, collective = _agree_collective_pass(tr, config, rows, err or err2)
    if err is not None and err.startswith(FSDP2_UNEVEN) and inrun is not None:
        # every process saw the same shapes: keep the in-run groups, skip the rest
        uneven = err.replace("no process measured this step", "no process ran the second pass")
        return inrun, RowsMeasurement(), None, uneven
    if err is not None:
        return inrun, None, err, None
    meas, err = attempt(lambda: _second_pass(tr, config, rows, one_group_per_pass=collective))
    return inrun, meas, err, None


def _exchange(tr: Any, st: StepState, done: set[tuple[int, int]]
              ) -> tuple[GeometryRows | None, str | None]:
    """This process's rows to measure by the second pass: its own groups' rows plus those
    sent to it, less the rows ``done`` (``(generation, row)`` measured in-run).

    A group belongs to the process holding its first row; with several processes every
    process takes part in the one exchange (an empty payload after a local failure).
    """
    pi = tr.accelerator.process_index
    G = int(tr.num_generations)
    parts: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []

    def split() -> None:
        for seg in st.segments:
            gen, rows = seg["generation"], seg["rows"]
            rows = rows[[(gen.index, int(r)) not in done for r in rows]]
            B = gen.batch["completion_ids"].shape[0]
            owner = (((gen.first_row + rows) // G) * G) // B
            parts.append(row_payload(gen, seg["token_weights"], rows[owner == pi], G,
                                     local=True))
            out = row_payload(gen, seg["token_weights"], rows[owner != pi], G, local=False)
            out["owner"] = owner[owner != pi]
            sent.append(out)

    _, err = attempt(split)
    if _world(tr) > 1:
        for other in collectives.all_gather(sent if err is None else None):
            for p in other or []:
                keep = np.asarray(p["owner"]) == pi
                if err is None and keep.any():
                    parts.append(select_payload(p, keep))
    if err is not None:
        return None, err
    return attempt(lambda: assemble_rows(parts))


def _agree_collective_pass(tr: Any, config: GeometryConfig, rows: GeometryRows | None,
                           err: str | None) -> tuple[str | None, bool]:
    """FSDP2 with several processes: a forward of the second pass is collective (an
    all-gather per module), so every process runs the same forwards or none. The processes
    exchange their errors and :func:`.rows.second_pass_shape`; unless all agree, every process
    skips the step with one reason. Returns ``(error, collective)``; collective passes measure
    one group per forward (their count then depends only on the agreed shape, not on each
    process's memory or row lengths)."""
    if _world(tr) == 1:
        return err, False
    from ...gram import fsdp_sharded

    if not fsdp_sharded(tr.accelerator.unwrap_model(tr.model)):
        return err, False
    grad_norm = config.mode == "second_pass" and bool(config.grad_norm)
    shape, err2 = (None, err) if err is not None else attempt(
        lambda: second_pass_shape(rows, grad_norm=grad_norm))
    gathered = collectives.all_gather({"err": err2, "shape": shape})
    errors = [p["err"] for p in gathered if p["err"]]
    if errors:
        return errors[0], True
    shapes = [tuple(p["shape"]) for p in gathered]
    if len(set(shapes)) > 1:
        return (f"{FSDP2_UNEVEN} (passes, forwards per pass by process: {shapes}); a "
                "sharded forward is collective, so no process measured this step"), True
    return None, True


def _second_pass(tr: Any, config: GeometryConfig, rows: GeometryRows, *,
                 one_group_per_pass: bool = False) -> RowsMeasurement:
    from ...gram import reshard_fsdp

    model = tr.accelerator.unwrap_model(tr.model)
    try:
        # in-run modes: the second pass covers some groups only (no process gradient norm)
        cfg = config if config.mode == "second_pass" else replace(config, grad_norm=False)
        if one_group_per_pass and not cfg.grad_norm:
            cfg = replace(cfg, memory_budget_mb=2.0**-20)  # 1 byte: one group per forward
        with eval_mode(model), _without_input_require_grads(model):
            return measure_rows(model, rows, config=cfg, temperature=float(tr.temperature),
                                group_size=int(tr.num_generations))
    finally:
        reshard_fsdp(model)


class _without_input_require_grads:  # noqa: N801 - a context manager used like a function
    """Remove HF's ``enable_input_require_grads`` hooks for the block, restore them after.

    PEFT + gradient checkpointing make the input embeddings' output require grad (the hook may
    be registered several times); the Gram pass, in eval mode, has no checkpointing and needs the
    embedding outputs free of gradient.
    """

    def __init__(self, model: Any) -> None:
        get = getattr(model, "get_input_embeddings", None)
        self.emb = get() if callable(get) else None

    def __enter__(self) -> None:
        if self.emb is None:
            return
        hooks = self.emb._forward_hooks
        self.saved = dict(hooks)
        for key, fn in list(hooks.items()):
            if getattr(fn, "__name__", "") == "make_inputs_require_grads":
                del hooks[key]

    def __exit__(self, *exc: Any) -> None:
        if self.emb is None:
            return
        hooks = self.emb._forward_hooks
        hooks.clear()
        hooks.update(self.saved)


# -------------------------------------------------------------------------- the step's record
def on_grad_norm(tr: Any, run: Run, grad_norm: Any) -> None:
    """TRL's gradient norm of the step (before clipping; ``None``: none): the pending measured
    step gets its diagnostics and goes to TRL's log and the JSONL. The norm is the host's
    (the same on every process); without one, the geometry's own ``grad_norm`` (one process,
    full Gram), else the noise scale says that no norm was given (``noise/status`` 2)."""
    if run.pending is None:
        return
    rec, parts, gap = run.pending
    run.pending = None
    g = None if grad_norm is None else float(grad_norm.item() if hasattr(grad_norm, "item")
                                                else grad_norm)
    source = "host" if g is not None else ("geometry" if rec["grad_norm"] is not None else None)
    if g is None:
        g = rec["grad_norm"]
    if gap is None:
        rec["diagnostics"], err = attempt(lambda: step_diagnostics_fields(
            parts, total_grad_norm=g, num_groups=int(rec["groups"])))
        gap = err
    if gap is not None:
        rec["diagnostics"] = None
        rec["diagnostics_reason"] = gap
    else:
        rec["diagnostics_grad_norm_from"] = source
    _record(tr, run, rec)


def _diagnostics_gap(gathered: list[dict[str, Any]], rec: dict[str, Any]) -> str | None:
    """Why the step's diagnostics cannot be formed (a group with gradient not measured: the
    noise scale needs every group), or ``None``."""
    errors = [p["sums_err"] for p in gathered if p.get("sums_err")]
    if errors:
        return f"diagnostic sums: {errors[0]}"
    missing = rec["groups_with_gradient"] - rec["groups_measured"]
    if missing > 0:
        return (f"{missing} group(s) with gradient not measured: the diagnostics need every "
                "group of the step")
    if not rec["groups"]:
        return "no group in the step"
    return None


def _skip(tr: Any, run: Run, rec: dict[str, Any], reason: str) -> None:
    """Every process knows ``reason``: record it, log it; raise under ``strict``."""
    if run.config.strict:
        raise GeometryStrictError(f"geometry of step {rec['step']} failed: {reason}")
    rec.update({"skipped": True, "skipped_reason": reason})
    if reason not in run.warned:
        warnings.warn(f"geometry: step {rec['step']} not measured: {reason}", stacklevel=3)
        run.warned.add(reason)
    run.pending_reason = reason
    private.metrics_buffer(tr)[run.config.log_prefix + "skipped"].append(1.0)
    _write(tr, run, rec)


def _record(tr: Any, run: Run, rec: dict[str, Any]) -> None:
    """Push the step's aggregates into TRL's metric buffer and write the JSONL line."""
    pre = run.config.log_prefix
    buf = private.metrics_buffer(tr)
    buf[pre + "skipped"].append(0.0)
    buf[pre + "groups"].append(float(rec["groups"]))
    buf[pre + "mixed_groups"].append(float(rec["mixed_groups"]))
    n = rec["groups_with_gradient"]
    buf[pre + "groups_measured_fraction"].append(
        float(rec["groups_measured"]) / n if n else 1.0)
    buf[pre + "exact"].append(float(rec["exact"]))
    buf[pre + "time_s"].append(float(rec["geometry_time_s"]))
    if rec["grad_norm"] is not None:
        buf[pre + "grad_norm"].append(float(rec["grad_norm"]))
    for name, st in rec["metrics"].items():
        for key in ("mean", "sd", "min", "max", "count"):
            if st[key] is not None:
                buf[f"{pre}{name}/{key}"].append(float(st[key]))
    for key, v in diagnostics_metrics(rec.get("diagnostics") or {}, prefix=pre).items():
        buf[key].append(v)
    _write(tr, run, rec)


def _write(tr: Any, run: Run, rec: dict[str, Any]) -> None:
    run.records.append(rec)
    if tr.accelerator.is_main_process:
        write_step(run.log, rec)
