"""The per-row gradient Gram of whatever loss a host backpropagates, from its own backward.

For rows ``i`` of a batch (rollouts; a causal LM never mixes rows) and any loss ``L = sum_i L_i``,
the per-row gradients are ``g_i = dL_i/dtheta`` over the trainable parameters, and the capture
computes ``K_ij = <g_i, g_j>`` (float64) from ONE forward and ONE backward, the host's own::

    with GramCapture(model, blocks=[[0, 1, 2, 3], [4, 5, 6, 7]]) as cap:
        loss = host_loss(model(**batch))       # any forward
        loss.backward()                        # or accelerator.backward / autograd.grad
    K_blocks = cap.result()                    # [K_0 (4x4), K_1 (4x4)], float64

Per module, the gradient ``delta`` of ``L`` w.r.t. the module output, restricted to row ``i``, is
row ``i``'s own (rows do not interact), so the per-layer identities of ``docs/real_model_gram.md``
give ``K`` exactly: each trainable module's call is handed to the rule registered for its type
(:mod:`real_model.gram.layers`). When ``L = sum_it u_it log p_it`` (``u = dL/d log p``, the
host's per-token loss gradient), ``g_i = sum_t u_it grad log p_it``: the Gram of rows weighted by
``u`` comes out without ever forming ``u``.

Mechanism (checkpoint-proof, ``.grad``-neutral):

* a forward pre-hook replaces each trainable module's floating input ``x`` by ``tap(x)``, an
  identity autograd node that saves ``x`` (so activation checkpointing drops and recomputes it
  like any saved activation) and holds a reference to a per-call record;
* a forward hook registers a gradient hook on the module output: it stores ``delta``;
* in the backward, the gradient reaches the output first (``delta`` stored), then the tap, whose
  backward adds the module's contribution from ``(x, delta)`` and passes the gradient through
  unchanged. The host's gradients are therefore bit-identical with and without the capture.
* An embedding (integer input) adds its contribution in its output's gradient hook.
* Calls whose output never receives a gradient (the first, no-grad forward of reentrant
  checkpointing; the recomputation of non-reentrant checkpointing) add nothing. So each module is
  counted once per backward under HF gradient checkpointing, reentrant or not; a module that is
  counted twice (weight reuse) or never is reported by name (:meth:`GramCapture.problems`).
* LM heads computed outside the ``lm_head`` module hand the head's logits gradient to the
  capture tile by tile: :func:`real_model.gram.head.head_logprobs` (``capture=``), and a host's
  fused head through :meth:`GramCapture.fused_head_hook` (:mod:`real_model.gram.layers.fused_head`).

State: what the passes on one set of hooks share is an :class:`~real_model.gram.state.Engine`;
each forward + backward is a :class:`~real_model.gram.state.Pass`; the rules, the small-call
deferral and the head are functions of the pass. Failures inside the capture never raise into
the host (unless ``strict=True``): they are recorded in :attr:`GramCapture.errors`, later work
is skipped, and :meth:`GramCapture.result` raises :class:`GramCaptureError` naming them.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from . import norms as norm_forms
from . import small_calls
from . import triton as gram_triton
from .layers import embedding, leaf, linear  # noqa: F401 - registers the rules by type
from .layers.embedding import unpacked_ids
from .layers.fused_head import watch_fused_head
from .layers.head import HeadState, head_begin, head_end, head_tile
from .options import EngineOptions, product_dtype
from .packed import PackedRows
from .plan import checkpointing_enabled, plan_of
from .registry import rule_of_kind
from .state import (
    Call,
    Engine,
    GramCaptureError,
    Pass,
    check_rows,
    fail,
    guard,
    in_backward,
    problems,
    validate_blocks,
)

__all__ = ["GramCapture", "GramCaptureError"]


def _routed(route: list, method: str, *args: Any) -> Any:
    """A hook or patched ``forward`` of a capture: ``route[0]`` (the capture that holds the
    hooks now, see :meth:`GramCapture.handover`) runs it."""
    return getattr(route[0], method)(*args)


class _InputTap(torch.autograd.Function):
    """Identity on a module input ``x`` that saves ``x``; its backward completes the call."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor, call: Call,  # type: ignore
                capture: GramCapture) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.call, ctx.capture = call, capture
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        cap = ctx.capture
        if not cap.p.failed:
            (x,) = ctx.saved_tensors
            cap.complete(ctx.call, x)
        return None, grad, None, None


class GramCapture:
    """Context manager: the per-row Gram ``K_ij = <g_i, g_j>`` of the backward run inside it.

    Args:
        model: the module whose trainable parameters (``requires_grad=True``) define ``g_i``.
        blocks: row-index lists; only those diagonal blocks ``K[b][:, b]`` are formed (cheaper);
            ``None`` (default): the full ``[n, n]``.
        strict: raise :class:`GramCaptureError` inside the host's forward/backward at the first
            problem instead of recording it.
        input_taps: how a module's input reaches its contribution. ``True``: an identity
            autograd node on the input saves it (activation checkpointing then drops and
            recomputes it like any saved activation; the extra nodes can change the order in
            which float32 gradient terms of a shared input are summed, ~1e-7 relative).
            ``False``: the forward hook holds the input and the output's gradient hook adds the
            contribution; the host's autograd graph is untouched (``.grad`` bit-identical in
            any dtype) and the per-call cost is lower, but under activation checkpointing the
            held inputs would stay in memory, and the host must backpropagate with
            ``.backward()`` (``torch.autograd.grad`` runs only the part of the graph it is asked
            for: modules off that part are reported as uncounted). ``None``: taps only when a
            module of the model has gradient checkpointing on (:func:`checkpointing_enabled`).
            Default ``True``.
        segments: packed rows (remove-padding micro-batches): cumulative row lengths
            ``[0, l_0, l_0 + l_1, ..., N]`` (``cu_seqlens``) of ``n`` rows packed into one
            sequence; modules then take ``[1, N(+pad), ...]`` inputs (:class:`PackedRows`).
            ``blocks`` index these ``n`` rows. Default ``None``: batch-first rows.
        engine: the engine's internal choices (:class:`~real_model.gram.options.EngineOptions`;
            defaults measured). ``weight_grads="rows"`` changes the host's ``.grad`` by float
            rounding (:attr:`from_rows` names the modules that took that path);
            :attr:`batched` names the modules whose small calls were added at :meth:`flush`.

    Usage: enter, run ONE forward + backward over ``n`` rows (batch-first inputs), exit; then
    :meth:`result` (float64 ``[n, n]``, or one matrix per block), :meth:`coverage` and
    :meth:`problems`. For the next forward + backward, :meth:`handover` gives a capture that
    keeps the installed hooks (no input taps). The rows count ``n`` is the first axis of the
    first trainable module's input. Calls under ``torch.no_grad()`` are ignored. ``.grad``
    fields are never touched.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        blocks: Sequence[Sequence[int]] | None = None,
        strict: bool = False,
        segments: Any = None,
        input_taps: bool | None = True,
        engine: EngineOptions | None = None,
    ) -> None:
        options = engine if engine is not None else EngineOptions()
        params = list(model.parameters())  # one walk of the modules for the plan and dtype
        plan = plan_of(model, params=params)
        if not plan.modules:
            raise ValueError("model has no parameter with requires_grad=True: the rows are empty")
        dev = next(p for p in params if p.requires_grad).device
        if options.linear_method == "triton":
            gram_triton.require(dev)  # clear, early errors (no triton; CPU without interpreter)
        self.engine = Engine(
            model=model, plan=plan, options=options,
            product_dtype=product_dtype(model, options.gram_precision, params=params),
            strict=bool(strict),
            input_taps=checkpointing_enabled(model) if input_taps is None else bool(input_taps),
            anchor=torch.zeros((), device=dev, requires_grad=True),
            norm_ok=norm_forms.NORM_CLOSED_FORM_CHECKED,  # per process (see layers.leaf)
            tied_embeddings={emb for emb, _ in plan.tied.values()},
            embedding_of_head={lin: emb for emb, lin in plan.tied.values()},
            chunk_size=options.chunk_size)
        self._route = [self]  # the hooks' capture (:meth:`handover` passes them on)
        self._handles: list[Any] = []
        self._rows_modules: dict[str, nn.Module] = {}  # Linear modules with a capture forward
        self.p = self._new_pass(validate_blocks(blocks), segments, index=0)

    def _new_pass(self, blocks: list[list[int]] | None, segments: Any, *, index: int) -> Pass:
        packed = None if segments is None else PackedRows(segments, self.engine.anchor.device)
        p = Pass(self.engine, blocks, packed, index=index, attr=f"_gram_capture_call_{id(self)}")
        small_calls.small_now(p)
        return p

    # ----------------------------------------------------------------- what the pass holds
    @property
    def model(self) -> nn.Module:
        return self.engine.model

    @property
    def plan(self) -> Any:
        return self.engine.plan

    @property
    def input_taps(self) -> bool:
        return self.engine.input_taps

    @property
    def n(self) -> int | None:
        """Rows of this pass (``None`` until the first trainable module's call)."""
        return self.p.n

    @property
    def errors(self) -> list[str]:
        return self.p.errors

    @property
    def failed(self) -> bool:
        return self.p.failed

    @property
    def from_rows(self) -> set[str]:
        """Modules whose weight gradient came from the rows (``weight_grads="rows"``)."""
        return self.p.from_rows

    @property
    def batched(self) -> set[str]:
        """Modules whose small calls were added together at :meth:`flush`."""
        return self.p.batched

    @property
    def exited(self) -> bool:
        """This pass is over (``__exit__`` or :meth:`handover`)."""
        return self.p.exited

    @property
    def pass_index(self) -> int:
        """Passes before this one on the same hooks (:meth:`handover`)."""
        return self.p.index

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> GramCapture:
        if self._handles or self.p.exited:
            raise RuntimeError("a GramCapture serves one forward + backward: make a new one")
        route = self._route
        for name, (mod, _, _) in self.engine.plan.modules.items():
            rows = linear.rows_module(self.p, name)
            if self.engine.input_taps or rows:
                self._handles.append(mod.register_forward_pre_hook(
                    functools.partial(_routed, route, "_pre", name), with_kwargs=True))
                self._handles.append(mod.register_forward_hook(
                    functools.partial(_routed, route, "_post", name), with_kwargs=True))
            else:  # nothing to change before the call: one hook opens the call and hooks it
                self._handles.append(mod.register_forward_hook(
                    functools.partial(_routed, route, "_pre_and_post", name), with_kwargs=True))
            if rows:
                mod.forward = functools.partial(_routed, route, "_linear_forward", name, mod)
                self._rows_modules[name] = mod
        return self

    def handover(self, *, blocks: Sequence[Sequence[int]] | None = None,
                 segments: Any = None) -> GramCapture:
        """The capture of the NEXT forward + backward (its rows: ``blocks``, ``segments`` as in
        the constructor), which takes over this entered capture's hooks instead of installing
        its own: a host that runs many small micro-batches saves the per-module hook
        registration. Call it after this capture's backward; this capture then keeps its
        result (its small calls are added now) and is exited. The new capture has the same
        model, plan and options, and is entered; leave it with ``__exit__`` as usual.

        Raises:
            RuntimeError: this capture is not entered, or has input taps (a tapped graph may
                still be recomputed by this capture's hooks).
        """
        if not self._handles or self.p.exited or self.engine.input_taps:
            raise RuntimeError("handover needs an entered capture without input taps")
        self.flush()
        self.p.exited = True
        new = object.__new__(GramCapture)
        new.engine, new._route = self.engine, self._route  # the hooks route to ``new`` below
        new.p = new._new_pass(validate_blocks(blocks), segments, index=self.p.index + 1)
        new._handles, self._handles = self._handles, []
        new._rows_modules, self._rows_modules = self._rows_modules, {}
        self._route[0] = new
        return new

    def __exit__(self, *exc: Any) -> None:
        """Remove the hooks once no tapped graph is alive.

        A graph whose taps saved their inputs under non-reentrant checkpointing is recomputed in
        its backward, and the recomputation must tap the same inputs again (checkpointing checks
        that it saves what the forward saved). So while such a graph lives, the hooks stay,
        tapping only inside a backward; they go when its last tap is freed (weak finalizers).
        """
        p = self.p
        p.exited = True
        if not self.engine.input_taps:  # nothing to recompute: the tensor hooks carry the backward
            p.live = 0
        if p.live == 0:
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.p.open.clear()
        for mod in self._rows_modules.values():
            vars(mod).pop("forward", None)
        self._rows_modules = {}
        self.p.pending.clear()

    def _release(self) -> None:
        """Finalizer of one tapped call: its graph is gone."""
        p = self.p
        p.live = max(0, p.live - 1)  # 0 already: :meth:`backward_done` came first
        if p.exited and p.live == 0:
            self._remove_hooks()

    def backward_done(self) -> None:
        """The host has run the backward of every graph this capture saw and will not run one
        again (a host's micro-batch loop, before its next micro-batch): after :meth:`__exit__`,
        the hooks go now rather than when the host frees the graphs, so that the next capture
        finds the modules as they were (with input taps the previous graph is often still
        referenced then, and its ``weight_grads="rows"`` forwards would keep the next capture's
        Linears off that path). Idempotent; nothing before :meth:`__exit__`."""
        if self.p.exited:
            self.p.live = 0
            self._remove_hooks()

    # ----------------------------------------------------------------- results
    def coverage(self) -> dict[str, int]:
        """Contributions added per trainable module (exactly 1 each for a valid result); the
        small calls kept so far are added first (:meth:`flush`)."""
        self.flush()
        return {name: self.p.counts.get(name, 0) for name in self.engine.plan.modules}

    def problems(self) -> list[str]:
        """Recorded errors plus coverage problems (a module counted 0 or > 1 times)."""
        return problems(self.p, self.coverage())

    @property
    def ok(self) -> bool:
        """True when :meth:`result` would succeed."""
        return not self.problems()

    def result(self) -> torch.Tensor | list[torch.Tensor]:
        """float64 ``K`` ``[n, n]`` (``blocks=None``), else one ``[n_b, n_b]`` per block.

        Raises:
            GramCaptureError: with every problem of :meth:`problems`, or on a non-finite ``K``.
        """
        self.p.roots = []  # the backward is over: drop the embedding outputs (and their hooks)
        probs = self.problems()  # flushes the small calls first
        if probs:
            raise GramCaptureError("; ".join(probs))
        assert self.p.acc is not None
        Ks = [0.5 * (K + K.T) for K in self.p.acc.K]
        if not all(bool(torch.isfinite(K).all()) for K in Ks):
            raise GramCaptureError("the Gram matrix holds non-finite values: the model's "
                                   "log-probabilities or gradients overflowed")
        return Ks[0] if self.p.blocks is None else Ks

    def flush(self) -> None:
        """Add the terms of the small calls kept so far, batched (:func:`small_calls.flush`);
        called by :meth:`result`, :meth:`problems`, :meth:`coverage` and :meth:`handover`, or
        by the host after its backward to free the kept tensors early. Idempotent."""
        small_calls.flush(self.p)

    def fail(self, message: str) -> None:
        """Record a problem; skip all later work (raise instead under ``strict``)."""
        fail(self.p, message)

    def grad_inputs(self) -> list[torch.Tensor]:
        """What a backward by ``torch.autograd.grad`` must ask for so that every hook runs:
        the anchor of the input taps and the outputs of the embedding calls (whose gradient
        autograd would otherwise skip, as nothing upstream of them needs one)."""
        return [self.engine.anchor, *self.p.roots]

    # ----------------------------------------------------------------- heads outside modules
    def head_begin(self, weight: torch.Tensor, bias: torch.Tensor | None,
                   h: torch.Tensor) -> HeadState | None:
        """Start a tiled head's contribution (:func:`real_model.gram.layers.head.head_begin`)."""
        return head_begin(self.p, weight, bias, h)

    def head_tile(self, st: HeadState | None, v0: int, v1: int, dy: torch.Tensor) -> None:
        """Add one vocabulary tile of the head's logits gradient ``dy`` ``[n, T, v1 - v0]``."""
        head_tile(self.p, st, v0, v1, dy)

    def head_end(self, st: HeadState | None) -> None:
        """Finish the head: count it once; hand its tied rows to the embedding."""
        head_end(self.p, st)

    def watch_fused_head(self, *args: Any) -> None:
        """A host's fused head ran: :func:`real_model.gram.layers.fused_head.watch_fused_head`."""
        watch_fused_head(self.p, *args)

    def fused_head_hook(self) -> Callable[..., None]:
        """:meth:`watch_fused_head` of the capture that holds these hooks when it is called
        (it follows :meth:`handover`): what a host's fused head reports to."""
        return functools.partial(_routed, self._route, "watch_fused_head")

    # ----------------------------------------------------------------- hooks (dispatch)
    def _pre_and_post(self, name: str, mod: nn.Module, args: tuple, kwargs: dict,
                      out: Any) -> None:
        """Forward hook without input taps: a small call is recorded
        (:func:`small_calls.record_small`); any other gets :meth:`_pre` (which then leaves the
        arguments as they are) and :meth:`_post`, one hook dispatch instead of two."""
        p = self.p
        small = p.small.now
        if small is not None:  # packed rows: the small modules at this token count are known
            kind = small.get(name)
            if (kind is not None and not p.busy and not p.exited
                    and small_calls.record_packed(p, name, kind, mod, args, kwargs, out)):
                return
        elif (self.engine.options.batch_small_calls and not p.busy and not p.exited
              and torch.is_grad_enabled()
              and small_calls.record_small(p, name, mod, args, kwargs, out)):
            return
        self._pre(name, mod, args, kwargs)
        self._post(name, mod, args, kwargs, out)

    def _pre(self, name: str, mod: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Forward pre-hook: open a call record; tap the floating input (see module doc)."""
        p, e = self.p, self.engine
        # the decision to tap must not depend on state that changes between a checkpointed
        # forward and its recomputation (e.g. ``failed``): both must save the same tensors
        if p.busy or not torch.is_grad_enabled() or (p.exited and not in_backward()):
            return None
        kind = e.plan.modules[name][1]
        call = guard(p, name, self._open_call, name, kind, args, kwargs, module=True)
        if call is None:
            return None
        if name in self._rows_modules and linear.rows_call(p, name, args[call.slot]):
            call.kind = "rows"
            p.pending[name] = call  # the module's capture forward takes it
            if e.input_taps:  # hooks stay while the graph may still be recomputed
                p.live += 1
                weakref.finalize(call, self._release)
            return None
        if kind == "embedding" or not e.input_taps:
            if kind != "embedding":
                call.x = args[call.slot]
            p.open[name].append(call)
            return None
        # outside the guard: checkpointing's early stop may raise through here, as it must
        tapped = _InputTap.apply(e.anchor, args[call.slot], call, self)
        setattr(tapped, p.attr, call)  # the forward hook finds its call on its input
        p.live += 1
        weakref.finalize(call, self._release)
        return (*args[: call.slot], tapped, *args[call.slot + 1:]), kwargs

    def _open_call(self, name: str, kind: str, args: tuple, kwargs: dict) -> Call:
        p, e = self.p, self.engine
        mod = e.plan.modules[name][0]
        if kwargs and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise GramCaptureError(f"module {name!r} ({type(mod).__name__}) got tensor keyword "
                                   "arguments: unsupported by the capture")
        if kind == "embedding":
            ids = args[0]
            check_rows(p, name, ids)
            if name in e.tied_embeddings:
                p.tied_rows[name] = torch.unique(unpacked_ids(p, ids).reshape(-1), sorted=True)
            return Call(name, kind, held=ids.detach())
        slots = [i for i, v in enumerate(args)
                 if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if not slots or (kind == "linear" and slots[0] != 0):
            raise GramCaptureError(f"module {name!r} ({type(mod).__name__}) got no floating "
                                   "tensor as its first positional input to attribute per row")
        for i in slots:
            check_rows(p, name, args[i])
        if kind == "linear":
            return Call(name, kind, slot=0)
        held = tuple(None if i == slots[0] else (v.detach() if isinstance(v, torch.Tensor) else v)
                     for i, v in enumerate(args))
        return Call(name, kind, held=held, slot=slots[0])

    def _post(self, name: str, mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        """Forward hook: hook the output's gradient (calls whose output needs none end here)."""
        p, e = self.p, self.engine
        if p.busy or not torch.is_grad_enabled():
            return None
        if isinstance(out, torch.Tensor) and out.requires_grad:
            p.called[name] += 1
        call = None
        if e.input_taps:  # a tapped input carries its call
            call = next((c for v in args if (c := getattr(v, p.attr, None)) is not None), None)
        if call is None:
            stack = p.open.get(name)
            if not stack or (e.input_taps and e.plan.modules[name][1] != "embedding"):
                return None
            call = stack.pop()
        if p.failed:
            return None
        if not isinstance(out, torch.Tensor):
            guard(p, name, lambda: fail(
                p, f"module {name!r} ({type(mod).__name__}) returned a {type(out).__name__}, "
                "not one tensor: unsupported by the capture"))
            return None
        if out.requires_grad:
            guard(p, name, check_rows, p, name, out, module=True)
            if call.kind == "generic" and call.x is not None:
                call.out_fn = out.grad_fn  # its saved tensors live until its backward
            out.register_hook(functools.partial(self._on_delta, call))
            if call.kind == "embedding":
                p.roots.append(out)
        return None

    def _linear_forward(self, name: str, mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The ``forward`` of a ``weight_grads="rows"`` Linear (:func:`linear.linear_forward`)."""
        return linear.linear_forward(self.p, name, mod, x)

    def _on_delta(self, call: Call, delta: torch.Tensor) -> None:
        """Gradient hook on a module output: keep ``delta`` (embeddings: add the term now)."""
        p = self.p
        if p.failed:
            return None
        if call.kind == "embedding":
            p.counts[call.name] += 1
            self._contribute(call, call.held, delta)
        elif call.x is not None:  # no tap: the input was held by the forward hook
            x, call.x = call.x, None
            p.counts[call.name] += 1
            self._contribute(call, x, delta)
        else:
            call.delta = delta
        return None

    def complete(self, call: Call, x: torch.Tensor) -> None:
        """Backward of the input tap: ``x`` and the stored ``delta`` give the call's term."""
        p = self.p
        delta, call.delta = call.delta, None
        if delta is None:  # the gradient reached the input but the output's hook never ran
            mod = self.engine.plan.modules[call.name][0]
            guard(p, call.name, lambda: fail(
                p, f"module {call.name!r} ({type(mod).__name__}): the gradient reached its "
                "input but its output's gradient hook never ran (hook removed?): its "
                "contribution cannot be formed"))
            return
        p.counts[call.name] += 1
        self._contribute(call, x, delta)

    def _contribute(self, call: Call, x: Any, delta: torch.Tensor) -> None:
        """Hand the call to the rule of its module's kind (:mod:`real_model.gram.layers`)."""
        mod, kind, names = self.engine.plan.modules[call.name]
        host_fn, call.out_fn = call.out_fn, None
        rule_of_kind(kind).contribute(self.p, call, mod, names, x, delta, host_fn)
