"""Exact per-rollout gradient geometry inside verl's own training step (verl 0.9.1, FSDP engines).

:class:`GeometryFSDPEngine` is verl's ``FSDPEngineWithLMHead`` that, every ``every`` optimizer
steps, measures per group (rollouts sharing verl's ``uid``) the Gram of the ACTUAL gradient rows of
that step::

    K_ij = <g_i, g_j>,   g_i = (1/W) d L_local / d theta restricted to rollout i
                             = (1/W) sum_t u_it grad_theta log pi_theta(y_it | y_i,<t),

``L_local`` verl's own loss on the process that holds row ``i`` (``ppo_loss``: any policy loss of
``verl.trainer.ppo.core_algos``, any ``loss_agg_mode``, its global normalisers ``dp_size``,
``batch_num_tokens``, ``global_batch_size`` as detached constants, KL loss), ``u_it = dL/dlogp_it``
verl's per-token loss gradient and ``W`` the data-parallel size (FSDP averages the ranks'
gradients). So ``sum_i g_i`` over all ranks and micro-batches is the gradient the engine hands the
optimizer (before clipping), and ``K`` is taken at the weights of that step, before the update.

Two paths, chosen per group from where verl put its rows:

* **in-run** (a group's rows in one micro-batch on one rank): the per-row Gram is captured from
  verl's own forward and single backward (per-module hooks: layer inputs and output gradients),
  no extra pass; exact for any loss, the entropy bonus included.
* **second pass** (a group's rows spread over micro-batches or ranks): the rows' token ids,
  position ids and ``u`` (captured in-run from verl's loss by an identity autograd node on the
  log-probabilities, so verl's gradient is unchanged) are gathered to one owner rank, which runs
  :func:`real_model.gram.trajectory_gram` with token weights ``u`` on verl's FSDP module
  (all ranks run the same number of passes: FSDP gathers parameters collectively). The module's
  ``.grad`` is not touched. Exact for every loss built on the log-probabilities; an entropy bonus
  (``entropy_coeff != 0``) is not on the log-probabilities, so such groups are reported as
  unsupported.

**Score geometry** (the Gram of the trajectory scores ``psi_i = grad sum_t m_it log pi``, unit
weights on the response tokens, seed paper Eq. 18) by the second pass every ``score_every`` steps,
and the framework-agnostic per-group metrics (effective rank, ..., cosines, FADE masses) from the
shared metrics functions. Per measured step the per-group values are aggregated over the mixed
groups and returned in the engine's ``metrics`` dict (verl's worker all-gathers it, the trainer
prefixes ``actor/`` and sends it to its logger: ``actor/geometry/effective_rank/mean``, ...) and
one JSON line per step goes to ``jsonl_path`` (rank 0).

**Placement.** verl's trainer repeats each prompt ``rollout.n`` times contiguously
(``repeat(interleave=True)``), then ``trainer.balance_batch`` (default True) reorders the batch to
balance tokens over data-parallel ranks, which scatters a group's rows over ranks; each rank's
slice is cut into mini-batches (``ppo_mini_batch_size * rollout.n`` rows, shuffled when
``actor.shuffle``) and micro-batches (``ppo_micro_batch_size_per_gpu`` rows in order, or token
balanced with ``use_dynamic_bsz``). The in-run path covers every group whose rows end up in one
micro-batch; ``trainer.balance_batch=False``, ``actor.shuffle=False``, ``use_dynamic_bsz=False``
and a micro-batch size that is a multiple of ``rollout.n`` keep every group there. What the second
pass gathers: token ids, position ids and ``u`` of the rows of split groups (``O(rows x tokens)``
numbers), never activations or gradients.

**Failures** never stop verl's step: hooks and the loss tap collect errors instead of raising;
after the step every rank reports success or a reason through a collective, all ranks skip the
step's geometry together when any failed (``geometry/failed = 1``, reasons logged and in the
JSONL), ``strict=True`` raises on every rank instead.

Unsupported (reported, the step goes on): Ulysses sequence parallelism, per-row temperatures in
the second pass, and parameters the capture cannot attribute per row. verl is imported lazily:
importing this module needs no verl. Docs: ``docs/verl.md``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_theory.spectral import DEFAULT_RTOL

from .geometry_metrics import (
    aggregate_groups,
    gradient_row_metrics,
    gradient_row_metrics_batch,
    group_records,
)
from .gram import model_device, reshard_fsdp, trajectory_gram
from .gram_capture import WEIGHT_GRADS, GramCapture, GramCaptureError, checkpointing_enabled
from .trl_geometry import TemperatureScaled

__all__ = [
    "GeometryConfig",
    "VerlGeometry",
    "GeometryFSDPEngine",  # noqa: F822 (built lazily by __getattr__: no verl import here)
    "GeometryFSDPEngineConfig",  # noqa: F822
    "register_geometry_engine",
    "metrics_for_verl",
]

log = logging.getLogger(__name__)

ROW_KEY = "grpo_geometry_row"  # per-row int64 key added to verl's batch during a measured step
ROW_SHIFT = 32  # row key = rank << ROW_SHIFT | local index


@dataclass(frozen=True)
class GeometryConfig:
    """Options of the in-run verl geometry (defaults stated).

    Attributes:
        every: measure the gradient-row Gram at optimizer steps ``0, k, 2k, ...`` (default 1).
        score_every: also the score Gram (second pass, unit weights) at steps ``0, k, ...``
            (default ``None``: same as ``every``; 0: never).
        jsonl_path: per-step JSON lines (rank 0; default ``None``: no file).
        strict: raise on every rank when the geometry fails (default False: log, skip, go on).
        success_threshold: a rollout succeeds when its reward (sum of ``token_level_scores``)
            exceeds this (default 0.5).
        rtol: numerical-rank tolerance of the spectral metrics (default ``DEFAULT_RTOL``).
        second_pass_rows: at most this many rows per second-pass forward (whole groups; a larger
            group runs alone; default 16).
        store_grams: write each group's Gram matrices into the JSONL (default True).
        linear_method, gram_precision: the core's per-Linear identity and product dtype
            (:class:`real_model.gram_capture.GramCapture`; defaults ``"auto"``).
        weight_grads: who forms each Linear's weight gradient in verl's backward on measured
            steps (``GramCapture(weight_grads=...)``): ``"rows"`` (default) the capture, as the
            sum of the per-row gradients its Gram forms anyway (verl's gradient equal up to
            float rounding), or ``"host"``: verl's own (bit-identical; one more product per
            Linear).
        batch_small_calls: add the terms of small module calls (a few tokens x narrow layers,
            ``real_model.gram_capture.SMALL_CALL_ELEMENTS``; a Linear call also when its token
            kernels cost less than its per-row gradients, ``SMALL_CALL_KERNEL_RATIO``) together
            after each micro-batch's backward, batched (``GramCapture(batch_small_calls=...)``;
            a batched Linear keeps verl's own ``dW``); ``False``: each call adds its own in the
            backward (default True).
    """

    every: int = 1
    score_every: int | None = None
    jsonl_path: str | None = None
    strict: bool = False
    success_threshold: float = 0.5
    rtol: float = DEFAULT_RTOL
    second_pass_rows: int = 16
    store_grams: bool = True
    linear_method: str = "auto"
    gram_precision: str = "auto"
    weight_grads: str = "rows"
    batch_small_calls: bool = True

    def __post_init__(self) -> None:
        if self.weight_grads not in WEIGHT_GRADS:
            raise ValueError(f"weight_grads must be one of {WEIGHT_GRADS}, got "
                             f"{self.weight_grads!r}")
        if int(self.every) < 1:
            raise ValueError(f"every must be a positive integer, got {self.every!r}")
        if self.score_every is not None and int(self.score_every) < 0:
            raise ValueError(f"score_every must be >= 0 or None, got {self.score_every!r}")
        if int(self.second_pass_rows) < 1:
            raise ValueError(f"second_pass_rows must be >= 1, got {self.second_pass_rows!r}")

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | None) -> GeometryConfig | None:
        """From a config mapping (verl's Hydra ``geometry`` block); ``None``/``enable: false``
        -> ``None`` (geometry off). Unknown keys are an error naming them."""
        if m is None:
            return None
        d = dict(m)
        if not d.pop("enable", True):
            return None
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown geometry option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def measures(self, step: int) -> bool:
        return step % int(self.every) == 0

    def scores(self, step: int) -> bool:
        k = int(self.every if self.score_every is None else self.score_every)
        return k > 0 and step % k == 0


# ---------------------------------------------------------------------------------------------
# the per-token loss gradient u = dL/dlogp, captured without changing verl's gradient
def tap_log_probs(model_output: Mapping[str, Any], sink: list) -> None:
    """Append the gradient of verl's loss w.r.t. the nested ``log_probs`` (its ``values()``, one
    entry per packed token) to ``sink`` when the backward reaches them: a gradient hook on the
    jagged tensor's values when the jagged tensor is a view of them (the same numbers, without
    the nested tensor's slower unwrapping), else on the nested tensor itself (verl's autograd
    graph and its outputs unchanged either way)."""
    lp = model_output["log_probs"]
    # a nested tensor's own attributes, read without its __torch_function__ (~5 us each)
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad, nested, grad_fn = lp.requires_grad, lp.is_nested, lp.grad_fn
    if not requires_grad:
        raise ValueError("verl's log-probs need no gradient: nothing to attribute per token")
    values = _jagged_values(lp) if nested else None  # a jagged view's: its gradient is plain
    if (values is not None and values.requires_grad and values.grad_fn is not None
            and grad_fn is not None and _feeds(grad_fn, values.grad_fn)):
        lp = values
    lp.register_hook(functools.partial(_keep_values, sink))


def _feeds(node: Any, target: Any) -> bool:
    """Whether autograd node ``node`` passes its gradient straight to ``target`` (the jagged
    view's ``ViewFromJagged`` node reading the values)."""
    return any(nxt is target for nxt, _ in node.next_functions)


def _keep_values(sink: list, grad: torch.Tensor) -> None:
    """Gradient hook: keep the per-token values (a failure leaves ``sink`` short, which the step's
    summary reports; it never raises into verl's backward)."""
    try:
        sink.append((grad.values() if grad.is_nested else grad.reshape(-1)).detach())
    except Exception:  # noqa: BLE001
        pass


def _capture(module: torch.nn.Module, *, rows: int, segments: Any,
             blocks: list[list[int]], input_taps: bool | None = None,
             **options: Any) -> GramCapture:
    """The core's capture of one verl micro-batch: batch-first, or packed (``segments``: verl's
    ``use_remove_padding=True`` runs the micro-batch as one sequence with ``cu_seqlens``).
    verl backpropagates with ``loss.backward()``: without gradient checkpointing the capture
    needs no input taps (``input_taps``: :func:`checkpointing_enabled` of the module, found
    once per step; ``None``: the capture looks), so verl's autograd graph is untouched."""
    return GramCapture(module, blocks=blocks, segments=segments, input_taps=input_taps,
                       **options)


# ---------------------------------------------------------------------------------------------
@dataclass
class _MicroBatch:
    """One micro-batch of a measured step: its rows, their layout, the capture and ``u``."""

    index: int
    keys: list[int]
    offsets: list[int]
    blocks: dict[str, list[int]]
    capture: Any = None
    closed: bool = False
    sink: list = field(default_factory=list)


@dataclass
class _Row:
    """What the geometry keeps of one local row of verl's batch: its ``tokens`` are
    ``ids_all[start:stop]`` of the packed batch (:attr:`ids`, :attr:`pos`: copied on use, by
    the second passes only)."""

    key: int
    uid: str
    reward: float | None
    advantage: float
    adv_varies: bool
    length: int
    tokens: int
    packed: tuple[torch.Tensor, torch.Tensor, int] = field(repr=False)  # ids, pos, start
    mb: int = -1
    u_span: tuple[torch.Tensor, int, int, float] | None = field(default=None, repr=False)

    @property
    def u(self) -> torch.Tensor | None:
        """``dL/dlogp`` of the row's tokens, float64, scaled for the data-parallel average
        (formed on use, by the second passes only)."""
        if self.u_span is None:
            return None
        g, a, b, scale = self.u_span
        return g[a:b].detach().cpu().double() * scale

    @property
    def ids(self) -> torch.Tensor:
        ids, _, start = self.packed
        return ids[start:start + self.tokens].detach().cpu()

    @property
    def pos(self) -> torch.Tensor:
        _, pos, start = self.packed
        return pos[start:start + self.tokens].detach().cpu()


class VerlGeometry:
    """State of the geometry inside one engine: step counter, the measured step's rows and
    micro-batches, and the per-step protocol (see the module docstring).

    Methods called by :class:`GeometryFSDPEngine`: :meth:`run_step` (wraps verl's
    ``forward_backward_batch``) and :meth:`open_micro_batch` (from ``forward_step``).
    """

    def __init__(self, config: GeometryConfig, *, capture_factory: Callable | None = None) -> None:
        self.config = config
        self.step = 0
        self.capture_factory = capture_factory or _capture
        self.config_record = asdict(config)  # frozen: one conversion for every step's record
        self.options = {"linear_method": config.linear_method,
                        "gram_precision": config.gram_precision}
        self.rows: dict[int, _Row] = {}
        self.order: list[int] = []  # the rows' keys in batch order, and the next one's index
        self.next_row = 0
        self.micro: list[_MicroBatch] = []
        self.errors: list[str] = []
        self.active = False
        self.input_taps: bool | None = None  # per step: the model checkpoints activations
        self.last_record: dict[str, Any] | None = None

    # ----------------------------------------------------------------- inside verl's step
    def run_step(self, engine: Any, data: Any, loss_function: Callable,
                 base: Callable[..., Any]) -> Any:
        """verl's ``forward_backward_batch`` (``base``) with the geometry around it."""
        step, self.step = self.step, self.step + 1
        if not self.config.measures(step):
            return base(data, loss_function, forward_only=False)
        t0 = time.perf_counter()
        self.rows, self.micro, self.errors = {}, [], []
        self.entropy_in_loss = _entropy_in_loss(loss_function, data)
        self.active = self._guard("reading the batch", self._read_batch, engine, data)
        loss_fn = self._tapped(loss_function) if self.active else loss_function
        try:
            out = base(data, loss_fn, forward_only=False)
        finally:
            self.close_micro_batch()
            self.active = False
            if ROW_KEY in data.keys():
                data.pop(ROW_KEY)
        t_step = time.perf_counter() - t0
        metrics = self.finish(engine, step, t_step)
        out.setdefault("metrics", {}).update(metrics)
        return out

    def _guard(self, what: str, fn: Callable, *args: Any) -> bool:
        try:
            fn(*args)
            return True
        except Exception as e:  # never into verl's step
            self.errors.append(f"{what}: {type(e).__name__}: {e}")
            return False

    def _read_batch(self, engine: Any, data: Any) -> None:
        from verl.utils import tensordict_utils as tu

        if getattr(engine, "use_ulysses_sp", False):
            raise ValueError("Ulysses sequence parallelism splits rows' tokens over ranks: "
                             "not supported by the geometry")
        rank = torch.distributed.get_rank()
        n = data.batch_size[0]
        uids = tu.get(data, "uid", None)
        if uids is None:
            raise ValueError("the batch has no 'uid' (verl's group id per rollout): groups unknown")
        self.input_taps = checkpointing_enabled(engine.module)
        rows = _rows_of_batch(data, [str(u) for u in uids], rank)
        self.rows = {r.key: r for r in rows}
        if len(rows) != n:
            raise ValueError(f"read {len(rows)} rows of a batch of {n}")
        self.order, self.next_row = [r.key for r in rows], 0
        if tu.get_non_tensor_data(data, "use_dynamic_bsz", True):
            # verl rearranges rows into token-balanced micro-batches: tag each row (a key
            # column verl carries along; without dynamic batches rows keep their order and
            # are matched by position, which spares verl the extra column)
            data[ROW_KEY] = torch.tensor(self.order, dtype=torch.int64)

    def _tapped(self, loss_function: Callable) -> Callable:
        geometry = self

        def loss_with_tap(model_output: Any, data: Any, dp_group: Any = None) -> Any:
            mb = geometry.micro[-1] if geometry.micro else None
            if mb is not None and geometry.active:
                try:
                    tap_log_probs(model_output, mb.sink)
                except Exception as e:  # never into verl's step
                    geometry.errors.append(f"tapping the log-probs: {type(e).__name__}: {e}")
            return loss_function(model_output=model_output, data=data, dp_group=dp_group)

        return loss_with_tap

    def open_micro_batch(self, module: torch.nn.Module, micro_batch: Any) -> None:
        """Start the capture of one micro-batch; the previous micro-batch's capture ends (it
        hands its hooks over to the new one when the core's capture can:
        ``GramCapture.handover``, no hooks re-installed per micro-batch)."""
        if not self.active:
            self.close_micro_batch()
            return
        if not self._guard("opening a micro-batch", self._open, module, micro_batch):
            self.close_micro_batch()

    def _open(self, module: torch.nn.Module, micro_batch: Any) -> None:
        from verl.utils import tensordict_utils as tu

        offsets = micro_batch["input_ids"].offsets().tolist()
        if ROW_KEY in micro_batch.keys():
            keys = [int(k) for k in micro_batch[ROW_KEY].tolist()]
        else:  # verl cut the batch into micro-batches in order: the next rows, lengths checked
            n = int(micro_batch.batch_size[0])
            keys = self.order[self.next_row:self.next_row + n]
            self.next_row += n
            if [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)] != [
                    self.rows[k].tokens for k in keys]:
                raise ValueError("a micro-batch's rows are not the batch's next rows in order "
                                 "(use_dynamic_bsz=False): rows cannot be matched")
        blocks: dict[str, list[int]] = {}
        for j, k in enumerate(keys):
            blocks.setdefault(self.rows[k].uid, []).append(j)
            self.rows[k].mb = len(self.micro)
        packed = bool(tu.get_non_tensor_data(micro_batch, "use_remove_padding", True))
        segments = offsets if packed else None
        mb = _MicroBatch(len(self.micro), keys, offsets, blocks)
        row_blocks = list(blocks.values())
        cap = self._handover(segments, row_blocks)
        if cap is None:
            self.close_micro_batch()
            cap = self.capture_factory(module, rows=len(keys), segments=segments,
                                       blocks=row_blocks, **self.options,
                                       weight_grads=self.config.weight_grads,
                                       batch_small_calls=bool(self.config.batch_small_calls),
                                       input_taps=self.input_taps)
            self.micro.append(mb)
            mb.capture = cap
            cap.__enter__()
        else:
            self.micro.append(mb)
            mb.capture = cap

    def _handover(self, segments: torch.Tensor | None,
                  blocks: list[list[int]]) -> GramCapture | None:
        """The previous micro-batch's capture handed over to this one's rows (its Gram kept,
        its small calls added), or ``None``: a new capture is needed (none open, a custom
        capture factory, input taps, or the handover refused)."""
        prev = self.micro[-1] if self.micro and not self.micro[-1].closed else None
        if (prev is None or self.capture_factory is not _capture
                or not isinstance(prev.capture, GramCapture) or prev.capture.input_taps):
            return None
        try:
            cap = prev.capture.handover(segments=segments, blocks=blocks)
        except Exception:  # noqa: BLE001 - the usual close-and-build path instead
            return None
        prev.closed = True
        return cap

    def close_micro_batch(self) -> None:
        """End the current micro-batch's capture (after verl's backward of it)."""
        if not self.micro or self.micro[-1].closed or self.micro[-1].capture is None:
            return
        mb = self.micro[-1]
        mb.closed = True
        self._guard("closing a micro-batch", mb.capture.__exit__, None, None, None)
        done = getattr(mb.capture, "backward_done", None)  # verl's backward of it has run
        if done is not None:
            self._guard("closing a micro-batch", done)
        flush = getattr(mb.capture, "flush", None)  # its small calls: their tensors go now
        if flush is not None:
            self._guard("adding a micro-batch's small calls", flush)

    # ----------------------------------------------------------------- after verl's backward
    def finish(self, engine: Any, step: int, t_step: float) -> dict[str, list[float]]:
        """The per-step protocol after verl's backward, before its optimizer step.

        Every rank runs the same collectives in the same order whatever happens locally, and
        every decision to go on is taken from gathered data (identical on all ranks):
        (1) gather each rank's rows, in-run Grams and errors; (2) plan the second passes (the
        same plan everywhere); (3) gather the rows that change rank, with each rank's errors;
        (4) run the same number of second passes on every rank; (5) gather their Grams and
        errors; rank 0 builds the records and metrics and broadcasts them. A plan without second
        passes (every group in-run) skips (3)-(5): every rank builds the records and metrics
        from the gathered data of (1), rank 0 writes the JSONL (one collective per step).
        """
        t0 = time.perf_counter()
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        local = self._local_summary(1.0 / world, rank) if not self.errors else None
        everyone = _all_gather({"errors": self.errors, "summary": local})
        reasons = _reasons(everyone)
        if reasons:
            return self._failed(step, reasons, t_step, t0)
        try:  # the same inputs on every rank: the same outcome everywhere
            plan = _Plan(everyone, world, score=self.config.scores(step),
                         max_rows=int(self.config.second_pass_rows))
        except Exception as e:
            return self._failed(step, [f"planning: {type(e).__name__}: {e}"], t_step, t0)
        if plan.n_passes == 0:  # every group in-run: each rank holds what rank 0 would build
            payload = self._build_payload(step, plan, [], t_step, t0, write=rank == 0)
        else:
            inputs, reasons = self._exchange_rows(plan, rank)
            if reasons:
                return self._failed(step, reasons, t_step, t0)
            errors, grams = self._run_passes(engine, plan, rank, inputs)
            results = _all_gather({"errors": errors, "grams": grams})
            payload = None
            if rank == 0:
                payload = self._build_payload(step, plan, results, t_step, t0)
            payload = _broadcast(payload)
        if not payload["ok"]:
            return self._failed(step, payload["reasons"], t_step, t0)
        self.last_record = payload["record"]
        return payload["metrics"]

    def _exchange_rows(self, plan: _Plan, rank: int) -> tuple[dict[int, dict], list[str]]:
        """Second-pass inputs of the rows this rank owns: its own, plus those other ranks hold
        (one all-gather, always run: it also carries every rank's errors)."""
        errors: list[str] = []
        try:
            own = {k: _pass_row(self.rows[k]) for k in plan.rows_needed_by(rank)
                   if k in self.rows}
            send = {k: _pass_row(self.rows[k]) for k in plan.moved.get(rank, ())}
        except Exception as e:
            own, send = {}, {}
            errors.append(f"second-pass inputs: {type(e).__name__}: {e}")
        parts = _all_gather({"errors": errors, "rows": send})
        for part in parts:
            own.update(part["rows"])
        return own, _reasons(parts)

    def _failed(self, step: int, reasons: list[str], t_step: float,
                t0: float) -> dict[str, list[float]]:
        msg = f"geometry of optimizer step {step} skipped: " + "; ".join(reasons)
        if self.config.strict:
            raise RuntimeError(msg)
        log.warning(msg)
        rec = {"step": step, "failed": reasons, "seconds": {
            "step_with_hooks": t_step, "geometry": time.perf_counter() - t0}}
        self.last_record = rec
        if torch.distributed.get_rank() == 0 and self.config.jsonl_path:
            _append_jsonl(self.config.jsonl_path, rec)
        return {"geometry/failed": [1.0]}

    def _local_summary(self, scale: float, rank: int) -> dict[str, Any] | None:
        """Rows (metadata) and in-run Grams of this rank; ``None`` and an error on failure."""
        try:
            inrun = {}
            for mb in self.micro:
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
                    self.rows[k].u_span = (g, bounds[j], bounds[j + 1], scale)
                try:
                    grams = mb.capture.result()  # raises with every problem of the capture
                except GramCaptureError as e:
                    raise ValueError(f"micro-batch {mb.index}: {e}") from e
                for uid, K in zip(mb.blocks, grams, strict=True):
                    K = K.detach().cpu()
                    inrun[(uid, rank, mb.index)] = (K if scale == 1.0 else
                                                    K * (scale * scale)).numpy()
            rows = [_row_meta(r, rank) for r in self.rows.values()]
            return {"rows": rows, "inrun": inrun, "entropy": self.entropy_in_loss}
        except Exception as e:
            self.errors.append(f"collecting the step: {type(e).__name__}: {e}")
            return None

    def _run_passes(self, engine: Any, plan: _Plan, rank: int,
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
                with _autocast(engine):
                    if chunk is None:
                        _dummy_pass(model)
                        continue
                    kind, groups = chunk
                    grams.update(_pass(model, kind, groups, plan, inputs, self.options))
            except Exception as e:
                errors.append(f"second pass {i}: {type(e).__name__}: {e}")
        try:
            reshard_fsdp(engine.module)  # every rank, whatever its passes did
        except Exception as e:
            errors.append(f"resharding after the second passes: {type(e).__name__}: {e}")
        return errors, grams

    def _build_payload(self, step: int, plan: _Plan, results: list, t_step: float,
                       t0: float, *, write: bool = True) -> dict[str, Any]:
        """Records and metrics of the step (``write``: append the JSONL record)."""
        reasons = _reasons(results)
        if reasons:
            return {"ok": False, "reasons": reasons}
        try:
            grams: dict[tuple[str, str], np.ndarray] = {}
            for x in results:
                grams.update(x["grams"])
            row_metrics = self._row_metrics(plan, grams)
            records = [self._group_record(g, plan, grams, row_metrics) for g in plan.groups]
            agg = aggregate_groups([r for r in records if "error" not in r])
            seconds = {"step_with_hooks": t_step, "geometry": time.perf_counter() - t0}
            rec = {"step": step, "world_size": plan.world, "failed": None,
                   "layout": plan.layout(), "aggregate": agg, "seconds": seconds,
                   "config": self.config_record, "groups": records}
            if self.config.jsonl_path and write:
                _append_jsonl(self.config.jsonl_path, rec)
            metrics = metrics_for_verl(agg, plan.layout(), seconds)
            return {"ok": True, "metrics": metrics, "record": rec}
        except Exception as e:
            return {"ok": False, "reasons": [f"rank 0 metrics: {type(e).__name__}: {e}"]}

    def _row_metrics(self, plan: _Plan, grams: dict) -> dict[str, dict[str, Any]]:
        """The gradient-row metrics of the groups measured without a score Gram, all at once
        (``gradient_row_metrics_batch``); ``{}`` when one fails (each group then computes its
        own and records its own error)."""
        want = {}
        for uid in plan.groups:
            Kg = _row_gram(plan, grams, uid)
            if Kg is not None and grams.get(("score", uid)) is None:
                want[uid] = Kg
        try:
            return dict(zip(want, gradient_row_metrics_batch(list(want.values()),
                                                             rtol=self.config.rtol),
                            strict=True))
        except Exception:  # noqa: BLE001 - per group below, with the group's own error
            return {}

    def _group_record(self, uid: str, plan: _Plan, grams: dict,
                      row_metrics: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """One group's JSON record: placement, path, rewards, metrics (and its Grams)."""
        rows = plan.groups[uid]
        rec: dict[str, Any] = {"uid": uid, "R": len(rows), "path": plan.path[uid],
                               "keys": [r["key"] for r in rows],
                               "placement": sorted({(r["rank"], r["mb"]) for r in rows})}
        Kg = _row_gram(plan, grams, uid)
        Ks = grams.get(("score", uid))
        rewards = [r["reward"] for r in rows]
        A = np.array([r["advantage"] for r in rows])
        lengths = [r["length"] for r in rows]
        have_r = all(x is not None for x in rewards)
        succ = (np.array(rewards, dtype=np.float64) > self.config.success_threshold
                if have_r else None)
        rec.update({"rewards": rewards if have_r else None, "advantages": A.tolist(),
                    "lengths": lengths,
                    "token_level_advantages": any(r["adv_varies"] for r in rows),
                    "num_success": int(succ.sum()) if have_r else None,
                    "mixed": bool(succ.any() and not succ.all()) if have_r else bool(np.any(A))})
        try:
            if Ks is not None and have_r:  # score geometry, plus the rows' metrics from Kg
                rec.update(group_records(Ks, rewards, A, None, lengths, rtol=self.config.rtol,
                                         exact_structure=False, row_gram=Kg,
                                         success_threshold=self.config.success_threshold))
            elif Kg is not None:
                got = row_metrics.get(uid)
                rec.update(got if got is not None else
                           gradient_row_metrics(Kg, rtol=self.config.rtol))
            if Kg is None and plan.path[uid] == "unsupported":
                rec["unsupported"] = plan.reason[uid]
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        if self.config.store_grams:
            rec["gram"] = None if Kg is None else np.asarray(Kg).tolist()
            rec["score_gram"] = None if Ks is None else np.asarray(Ks).tolist()
        return rec


def _row_gram(plan: _Plan, grams: Mapping[tuple[str, str], np.ndarray],
              uid: str) -> np.ndarray | None:
    """Group ``uid``'s Gram of the gradient rows: in-run, or from its second pass."""
    return plan.inrun.get(uid) if plan.path[uid] == "in_run" else grams.get(("grad", uid))


# ---------------------------------------------------------------------------------------------
class _Plan:
    """Where each group is measured, decided identically on every rank from the gathered rows.

    ``path[uid]``: ``"in_run"`` (all rows in one micro-batch of one rank, Gram captured),
    ``"second_pass"`` (rows spread: gathered to the owner, the rank with most of them, ties
    broken round robin in group order) or ``"unsupported"`` (spread and an entropy bonus in the
    loss). ``passes[rank]``: that rank's second passes ``(kind, [uids])``, kind ``"grad"``
    (weights ``u``) or ``"score"`` (unit weights on response tokens), at most ``max_rows`` rows
    each (whole groups).
    """

    def __init__(self, everyone: list[dict], world: int, *, score: bool, max_rows: int) -> None:
        self.world = world
        rows = [r for x in everyone for r in x["summary"]["rows"]]
        entropy = any(x["summary"]["entropy"] for x in everyone)
        temps = {r["temperature"] for r in rows}
        if len(temps) > 1:
            raise ValueError(f"rows with different temperatures {sorted(temps)}: not supported")
        self.temperature = temps.pop() if temps else 1.0
        self.groups: dict[str, list[dict]] = {}
        for r in sorted(rows, key=lambda r: r["key"]):
            self.groups.setdefault(r["uid"], []).append(r)
        inrun = {k: v for x in everyone for k, v in x["summary"]["inrun"].items()}
        self.inrun: dict[str, np.ndarray] = {}
        self.path: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.owner: dict[str, int] = {}
        for g, (uid, rs) in enumerate(self.groups.items()):
            places = {(r["rank"], r["mb"]) for r in rs}
            counts = np.bincount([r["rank"] for r in rs], minlength=world)
            most = np.flatnonzero(counts == counts.max())
            self.owner[uid] = int(most[g % most.size])  # ties: round robin in group order
            if len(places) == 1:
                self.path[uid] = "in_run"
                self.inrun[uid] = inrun[(uid, *places.pop())]
            elif entropy:
                self.path[uid] = "unsupported"
                self.reason[uid] = ("rows spread over micro-batches/ranks and an entropy bonus "
                                    "in the loss: the second pass sees only the log-prob terms")
            else:
                self.path[uid] = "second_pass"
        self.passes: list[list[tuple[str, list[str]]]] = [[] for _ in range(world)]
        for kind in ("grad", "score"):
            todo = [u for u in self.groups if (self.path[u] == "second_pass" if kind == "grad"
                                               else score)]
            for rank in range(world):
                self.passes[rank] += _chunks(kind, [u for u in todo if self.owner[u] == rank],
                                             self.groups, max_rows)
        self.n_passes = max(len(p) for p in self.passes)
        self.moved: dict[int, list[int]] = {}
        for rank in range(world):
            for _kind, uids in self.passes[rank]:
                for u in uids:
                    for r in self.groups[u]:
                        if r["rank"] != rank and r["key"] not in self.moved.get(r["rank"], []):
                            self.moved.setdefault(r["rank"], []).append(r["key"])

    def rows_needed_by(self, rank: int) -> list[int]:
        return [r["key"] for _, uids in self.passes[rank] for u in uids for r in self.groups[u]]

    def layout(self) -> dict[str, int]:
        paths = list(self.path.values())
        return {"groups": len(paths), "in_run_groups": paths.count("in_run"),
                "second_pass_groups": paths.count("second_pass"),
                "unsupported_groups": paths.count("unsupported"),
                "second_passes": self.n_passes,
                "moved_rows": sum(len(v) for v in self.moved.values())}


def _chunks(kind: str, uids: list[str], groups: dict[str, list], max_rows: int
            ) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    cur: list[str] = []
    n = 0
    for u in uids:
        k = len(groups[u])
        if cur and n + k > max_rows:
            out.append((kind, cur))
            cur, n = [], 0
        cur.append(u)
        n += k
    if cur:
        out.append((kind, cur))
    return out


# ---------------------------------------------------------------------------------------------
def _rows_of_batch(data: Any, uids: list[str], rank: int) -> list[_Row]:
    """The local rows of verl's (no-padding) batch: ids, positions, rewards, advantages."""
    from verl.utils import tensordict_utils as tu

    ids = data["input_ids"]
    pos = data["position_ids"]
    if pos.dim() == 3:
        raise ValueError("3-D (mRoPE) position ids are not supported by the geometry")
    rm = data["response_mask"].to(torch.float64)
    adv = data["advantages"].to(torch.float64)
    scores = data.get("token_level_scores", None)
    if scores is None:
        scores = data.get("token_level_rewards", None)
    temperature = tu.get_non_tensor_data(data, "temperature", 1.0)
    if isinstance(temperature, torch.Tensor):
        t = torch.unique(temperature.reshape(-1))
        if t.numel() != 1:
            raise ValueError("per-row temperatures are not supported by the geometry")
        temperature = float(t)
    lens = rm.sum(-1)
    a_mean = (adv * rm).sum(-1) / lens.clamp(min=1)
    varies = ((adv - a_mean[:, None]).abs() * rm).amax(-1) > 1e-6 * a_mean.abs().clamp(min=1)
    # per-row values as Python numbers in one conversion each (not one per row)
    rewards = (None if scores is None else scores.to(torch.float64).sum(-1).tolist())
    a_list, v_list, l_list = a_mean.tolist(), varies.tolist(), lens.to(torch.int64).tolist()
    out = []
    bounds = ids.offsets().tolist()  # the rows' tokens in the packed values (not unbound here)
    if pos.offsets().tolist() != bounds:
        raise ValueError("verl's position ids and input ids have different row lengths")
    values = tuple(t.values() if (v := _jagged_values(t)) is None else v for t in (ids, pos))
    for i in range(len(bounds) - 1):
        r = _Row(key=(rank << ROW_SHIFT) | i, uid=uids[i],
                 reward=None if rewards is None else float(rewards[i]),
                 advantage=float(a_list[i]), adv_varies=bool(v_list[i]), length=int(l_list[i]),
                 tokens=bounds[i + 1] - bounds[i], packed=(*values, bounds[i]))
        r.temperature = float(temperature)  # type: ignore[attr-defined]
        out.append(r)
    return out


def _jagged_values(t: torch.Tensor) -> torch.Tensor | None:
    """A jagged nested tensor's packed values, its ``_values`` (the plain tensor ``values()``
    views, without that view's dispatch through the nested tensor: ~0.1 ms), or ``None`` when
    ``t`` has none (a strided nested tensor, a plain tensor)."""
    v = getattr(t, "_values", None)
    return v if isinstance(v, torch.Tensor) and not v.is_nested else None


def _row_meta(r: _Row, rank: int) -> dict[str, Any]:
    return {"key": r.key, "uid": r.uid, "rank": rank, "mb": r.mb, "reward": r.reward,
            "advantage": r.advantage, "adv_varies": r.adv_varies, "length": r.length,
            "temperature": r.temperature}  # type: ignore[attr-defined]


def _pass_row(r: _Row) -> dict[str, Any]:
    """A row's second-pass inputs in trajectory alignment: ``w[t]`` weights ``log pi(ids[t]|<t)``.

    verl's log-prob at position ``t`` scores token ``t + 1``, so ``w_grad[t + 1] = u[t]``; the
    score weights are 1 on the row's last ``length`` (response) tokens.
    """
    ids = r.ids
    L = ids.numel()
    w_grad = torch.zeros(L, dtype=torch.float64)
    u = r.u
    if u is not None:
        w_grad[1:] = u[:-1]
    w_score = torch.zeros(L, dtype=torch.float64)
    w_score[L - r.length:] = 1.0
    return {"ids": ids, "pos": r.pos, "grad": w_grad, "score": w_score}


def _pass(model: torch.nn.Module, kind: str, uids: list[str], plan: _Plan,
          inputs: dict[int, dict[str, Any]], options: Mapping[str, Any]
          ) -> dict[tuple[str, str], np.ndarray]:
    """One second pass over whole groups: ``trajectory_gram`` with the ``kind`` weights."""
    keys = [r["key"] for u in uids for r in plan.groups[u]]
    rows = [inputs[k] for k in keys]
    T = max(x["ids"].numel() for x in rows)
    n = len(rows)
    ids = torch.zeros(n, T, dtype=torch.long)
    pos = torch.zeros(n, T, dtype=torch.long)
    am = torch.zeros(n, T, dtype=torch.long)
    w = torch.zeros(n, T, dtype=torch.float64)
    for i, x in enumerate(rows):
        L = x["ids"].numel()
        ids[i, :L], pos[i, :L], am[i, :L], w[i, :L] = x["ids"], x["pos"], 1, x[kind]
    dev = model_device(model)
    K = trajectory_gram(model, ids.to(dev), am.to(dev), w.to(dev), position_ids=pos.to(dev),
                        **options)
    K = K.detach().cpu().double().numpy()
    out, start = {}, 0
    for u in uids:
        k = len(plan.groups[u])
        out[(kind, u)] = K[start:start + k, start:start + k]
        start += k
    return out


def _dummy_pass(model: torch.nn.Module) -> None:
    """A pass with zero weights: the same FSDP collectives as a real one, no result."""
    dev = model_device(model)
    ids = torch.ones(1, 2, dtype=torch.long, device=dev)
    trajectory_gram(model, ids, torch.ones_like(ids), torch.zeros(1, 2, device=dev),
                    position_ids=torch.arange(2, device=dev)[None])


def _autocast(engine: Any) -> Any:
    import contextlib

    dtype = getattr(engine, "_autocast_dtype", torch.float32)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=model_device(engine.module).type, dtype=dtype)


def _reasons(gathered: list[Mapping[str, Any]]) -> list[str]:
    """Every rank's errors from an all-gather, as ``"rank r: error"``."""
    return [f"rank {r}: {e}" for r, x in enumerate(gathered) for e in x["errors"]]


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (one process: ``[obj]`` itself, no pickling round)."""
    dist = torch.distributed
    if dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (one process: ``obj`` itself)."""
    if torch.distributed.get_world_size() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _append_jsonl(path: str | Path, rec: Mapping[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as f:
        f.write(json.dumps(rec, default=_json_default) + "\n")


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


# ---------------------------------------------------------------------------------------------
def metrics_for_verl(aggregate: Mapping[str, Any], layout: Mapping[str, int],
                     seconds: Mapping[str, float]) -> dict[str, list[float]]:
    """The step's aggregates as verl's engine metrics: ``{"geometry/<metric>/<stat>": [value]}``.

    Values are one-element lists, as verl's micro-batch metrics are (its worker all-gathers them
    over ranks and flattens the lists; the trainer averages: every rank sends the same values,
    but for the timings ``seconds_*`` of a step without second passes: each rank's own).
    Only finite numbers are sent.
    """
    out: dict[str, list[float]] = {"geometry/failed": [0.0]}
    for name, st in aggregate["metrics"].items():
        for stat in ("mean", "sd", "min", "max"):
            v = st.get(stat)
            if v is not None and math.isfinite(v):
                out[f"geometry/{name}/{stat}"] = [float(v)]
    out["geometry/mixed_groups"] = [float(aggregate["mixed_groups"])]
    for k, v in layout.items():
        out[f"geometry/{k}"] = [float(v)]
    for k, v in seconds.items():
        out[f"geometry/seconds_{k}"] = [float(v)]
    return out


# ---------------------------------------------------------------------------------------------
# verl classes, built lazily (no verl import at module import)
def _make_engine_class() -> type:
    from .verl_cpu import register_cpu_platform

    register_cpu_platform()  # no-op with an accelerator; before verl caches its device name
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    class GeometryFSDPEngine(FSDPEngineWithLMHead):  # type: ignore[misc, valid-type]
        """verl's ``FSDPEngineWithLMHead`` measuring the exact per-group gradient geometry.

        Options: the ``geometry`` argument (a :class:`GeometryConfig`) or, when built by verl's
        worker, the ``geometry`` block of :class:`GeometryFSDPEngineConfig`.
        """

        def __init__(self, *args: Any, geometry: GeometryConfig | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if geometry is None:
                geometry = GeometryConfig.from_mapping(
                    getattr(self.engine_config, "geometry", None))
            self.geometry = None if geometry is None else VerlGeometry(geometry)

        def forward_backward_batch(self, data: Any, loss_function: Callable,
                                   forward_only: bool = False) -> Any:
            base = super().forward_backward_batch
            if forward_only or self.geometry is None:
                return base(data, loss_function, forward_only=forward_only)
            return self.geometry.run_step(self, data, loss_function, base)

        def forward_step(self, micro_batch: Any, loss_function: Callable,
                         forward_only: bool) -> Any:
            if self.geometry is not None and self.geometry.active and not forward_only:
                self.geometry.open_micro_batch(self.module, micro_batch)
            return super().forward_step(micro_batch, loss_function, forward_only)

    return GeometryFSDPEngine


def _make_engine_config_class() -> type:
    from dataclasses import dataclass as _dc
    from dataclasses import field as _field

    from verl.workers.config import FSDPEngineConfig

    @_dc
    class GeometryFSDPEngineConfig(FSDPEngineConfig):
        """verl's ``FSDPEngineConfig`` plus a ``geometry`` block (:class:`GeometryConfig` keys).

        Built by Hydra (``_target_``) on verl's driver and in its workers; in a worker process
        (``RANK`` and ``WORLD_SIZE`` set, as verl's Ray workers have them) it also registers
        :class:`GeometryFSDPEngine` for the worker's platform (:func:`register_geometry_engine`)
        before the worker builds its engine. The driver registers nothing."""

        geometry: dict[str, Any] = _field(default_factory=dict)

        def __post_init__(self) -> None:
            super().__post_init__()
            GeometryConfig.from_mapping(self.geometry)  # validate early, on the driver too
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                register_geometry_engine()

    return GeometryFSDPEngineConfig


_LAZY: dict[str, Callable[[], type]] = {
    "GeometryFSDPEngine": _make_engine_class,
    "GeometryFSDPEngineConfig": _make_engine_config_class,
}
_BUILT: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if name not in _BUILT:
            _BUILT[name] = _LAZY[name]()
            _BUILT[name].__module__ = __name__
            _BUILT[name].__qualname__ = name
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_geometry_engine() -> type:
    """Register :class:`GeometryFSDPEngine` in verl's ``EngineRegistry`` for this platform.

    Key ``(device, vendor)`` of verl's current platform (e.g. ``("cuda", "nvidia")``), backends
    ``fsdp`` and ``fsdp2``, model type ``language_model``: verl's registry looks that key up
    before the device-only key its own ``FSDPEngineWithLMHead`` has, so verl's workers build the
    geometry engine; it measures only when its engine config carries a ``geometry`` block (the
    reference model's engine stays plain). Idempotent; returns the class.
    """
    from verl.utils.device import get_device_name, get_vendor
    from verl.workers.engine import EngineRegistry

    cls = __getattr__("GeometryFSDPEngine")
    key = (get_device_name(), get_vendor())
    reg = EngineRegistry._engines.setdefault("language_model", {})
    for backend in ("fsdp", "fsdp2"):
        if reg.get(backend, {}).get(key) is not cls:
            reg.setdefault(backend, {}).pop(key, None)
            EngineRegistry.register(model_type="language_model", backend=backend,
                                    device=key[0], vendor=key[1])(cls)
    return cls


def _entropy_in_loss(loss_function: Any, data: Any) -> bool:
    """True when verl's loss adds an entropy bonus (``calculate_entropy`` and ``entropy_coeff``)."""
    try:
        from verl.utils import tensordict_utils as tu

        cfg = getattr(loss_function, "keywords", {}).get("config")
        coeff = float(getattr(cfg, "entropy_coeff", 0.0) or 0.0)
        return bool(tu.get_non_tensor_data(data, "calculate_entropy", False)) and coeff != 0.0
    except Exception:
        return True  # unknown: treat as present (second passes are then not claimed exact)
