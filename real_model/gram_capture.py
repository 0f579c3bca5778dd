"""The per-row gradient Gram of whatever loss a host backpropagates, from its own backward.

For rows ``i`` of a batch (rollouts; a causal LM never mixes rows) and any loss ``L = sum_i L_i``,
the per-row gradients are ``g_i = dL_i/dtheta`` over the trainable parameters, and this module
computes ``K_ij = <g_i, g_j>`` (float64) from ONE forward and ONE backward, the host's own::

    with GramCapture(model, blocks=[[0, 1, 2, 3], [4, 5, 6, 7]]) as cap:
        loss = host_loss(model(**batch))       # any forward
        loss.backward()                        # or accelerator.backward / autograd.grad
    K_blocks = cap.result()                    # [K_0 (4x4), K_1 (4x4)], float64

Per module, the gradient ``delta`` of ``L`` w.r.t. the module output, restricted to row ``i``, is
row ``i``'s own (rows do not interact), so the per-layer identities of ``docs/real_model_gram.md``
(``<dW_i, dW_j>`` of ``nn.Linear`` from its inputs ``a`` and ``delta``; embeddings; a tied LM
head's cross terms; norms; small leaf modules) give ``K`` exactly. When ``L = sum_it u_it log p_it``
(``u = dL/d log p``, the host's per-token loss gradient), ``g_i = sum_t u_it grad log p_it``: the
Gram of rows weighted by ``u`` comes out without ever forming ``u``.

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
* LM heads computed outside the ``lm_head`` module: :func:`real_model.gram_head.head_logprobs`
  (``capture=``) and TRL 1.16's fused head (``model(..., labels=..., fused_lm_head=True)``; its
  ``_ChunkedLogProbFunction`` is intercepted while the capture is active) hand the head's logits
  gradient to the capture tile by tile: no ``[rows, T, V]`` tensor.

Failures inside the capture never raise into the host (unless ``strict=True``): they are recorded
in :attr:`GramCapture.errors`, later work is skipped, and :meth:`GramCapture.result` raises
:class:`GramCaptureError` naming them.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from real_model import gram_layers as gm
from real_model import gram_small_calls as gs
from real_model import gram_triton
from real_model.gram_head import (
    HeadTransform,
    default_vocab_tile,
    half_operand,
    logit_grad_tiles,
)
from real_model.gram_plan import plan_of

__all__ = [
    "GramCapture",
    "GramCaptureError",
    "PackedRows",
    "active_dropout_modules",
    "checkpointing_enabled",
    "product_dtype",
    "validate_blocks",
    "LINEAR_METHODS",
    "WEIGHT_GRADS",
]

LINEAR_METHODS = gm.LINEAR_METHODS
WEIGHT_GRADS = ("host", "rows")
"""``weight_grads`` values of :class:`GramCapture`."""

SMALL_CALL_ELEMENTS = 1 << 16
"""A call is *small* when what its contribution reads holds at most this many entries: a
weight-only ``nn.Linear`` call's ``N (d_in + d_out)`` (``N`` its tokens, at most
:data:`SMALL_CALL_TOKENS`), an untied embedding call's ``N d``, a leaf module's per-row
gradients ``n p``. With ``batch_small_calls=True`` (:class:`GramCapture`) a small call's inputs
are kept and its term is added at :meth:`GramCapture.flush` with the other small calls of the
capture: the Linear identity ``sum_m S ((a_m a_m^T) * (delta_m delta_m^T)) S^T`` as one batched
product per ``(d_in, d_out)`` shape (an embedding's ``a a^T`` is the id-equality kernel), the
leaves' rows as one Gram. Each such call otherwise costs ~10 tensor operations whose fixed cost
(tens of microseconds each on CPU), not their arithmetic, is its price."""

SMALL_CALL_TOKENS = 512
"""Most tokens ``N`` of a small Linear call (its ``[N, N]`` token kernels are formed whole)."""

SMALL_CALL_KERNEL_RATIO = 40
"""A weight-only Linear call of ``N`` tokens over ``n`` rows is also small when its token
kernels' multiply-adds are at most this many times its per-row gradients' entries:
``N^2 (d_in + d_out) <= SMALL_CALL_KERNEL_RATIO n d_in d_out`` (and ``N <=``
:data:`SMALL_CALL_TOKENS`, ``N (d_in + d_out) <=`` :data:`SMALL_CALL_KEPT`). Short rows make the
per-row path (``weight_grads="rows"``: ``n`` products of a few tokens each, their sum and their
Gram, memory-bound) dearer than the token kernels. Measured on CPU, float32, one thread
(``benchmarks/bench_linear_gram.py --packed``, 4 rows, a layer's four Linear shapes): the kernels
cost less than the per-row path's extra below a ratio of about 60 at width 256, 120 at width 576
and 130 at width 1024; 40 keeps a margin (there the kernels cost 0.75x, 0.35x and 0.3x of it)."""

SMALL_CALL_KEPT = 1 << 22
"""Most entries ``N (d_in + d_out)`` a batched Linear call keeps (its input and output gradient,
until :meth:`GramCapture.flush`): 16 MiB in float32."""


NORM_CLOSED_FORM_CHECKED: dict[type, bool] = {}
"""Verdict per norm class: does its closed-form per-row gradient (``gm.fast_leaf_grads``) match
the generic per-row VJP? Checked at the class's first use in this process (a property of the
class's ``forward`` code, not of one batch): a trainer builds one capture per micro-batch, and
re-checking with the generic path in each was a large part of a small step's overhead."""


def _in_backward() -> bool:
    """Whether autograd is running a backward on this thread (checkpoint recomputation)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _routed(route: list, method: str, *args: Any) -> Any:
    """A hook or patched ``forward`` of a capture: ``route[0]`` (the capture that holds the
    hooks now, see :meth:`GramCapture.handover`) runs it."""
    return getattr(route[0], method)(*args)


def _most_small_tokens(width: int) -> int:
    """The most tokens of a small call reading ``width`` entries per token: ``N <=
    SMALL_CALL_TOKENS`` and ``N width <= SMALL_CALL_ELEMENTS``."""
    return min(SMALL_CALL_TOKENS, SMALL_CALL_ELEMENTS // max(1, width))


def _most_small_linear_tokens(d_in: int, d_out: int, rows: int) -> int:
    """The most tokens ``N`` of a small call of a ``d_in -> d_out`` Linear over ``rows`` rows:
    ``N <= SMALL_CALL_TOKENS``, ``N (d_in + d_out) <= SMALL_CALL_KEPT``, and either ``N (d_in +
    d_out) <= SMALL_CALL_ELEMENTS`` or ``N^2 (d_in + d_out) <= SMALL_CALL_KERNEL_RATIO rows d_in
    d_out`` (:data:`SMALL_CALL_KERNEL_RATIO`).

    >>> _most_small_linear_tokens(64, 64, 4)  # 65536 // 128 = 512 tokens by size alone
    512
    >>> _most_small_linear_tokens(256, 512, 4)  # by size 85; by cost isqrt(40*4*256*512 // 768)
    165
    """
    width = max(1, d_in + d_out)
    by_cost = math.isqrt(SMALL_CALL_KERNEL_RATIO * max(0, rows) * d_in * d_out // width)
    return min(SMALL_CALL_TOKENS, SMALL_CALL_KEPT // width,
               max(SMALL_CALL_ELEMENTS // width, by_cost))


class GramCaptureError(ValueError):
    """The capture could not attribute the gradient per row (the message says why)."""


def product_dtype(model: nn.Module, gram_precision: str, *,
                  params: Sequence[nn.Parameter] | None = None) -> torch.dtype:
    """Dtype of the per-chunk products: ``float64``, or ``float32`` for ``"float32"`` and, under
    ``"auto"``, when every trainable parameter is bfloat16/float16 (~3 significant digits) or
    float32 on CPU (``gm.flat_gram`` then sums float32 products over slabs of
    ``gm.CPU_F32_SLAB`` columns in float64: error ~2e-8 relative, below the float32 rounding of
    the rows, at a fifth of the float64 cost). ``params``: ``list(model.parameters())`` when the
    caller has it (one walk of the modules, not two)."""
    if gram_precision not in ("auto", "float64", "float32"):
        raise ValueError(f"gram_precision must be auto, float64 or float32, got {gram_precision!r}")
    if gram_precision != "auto":
        return torch.float64 if gram_precision == "float64" else torch.float32
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not params:
        return torch.float64
    low = {torch.bfloat16, torch.float16}
    if all(p.dtype in low for p in params):
        return torch.float32
    cpu32 = all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)
    return torch.float32 if cpu32 else torch.float64


def checkpointing_enabled(model: nn.Module) -> bool:
    """Whether a module of ``model`` runs activation checkpointing: a Hugging Face layer with
    ``gradient_checkpointing=True`` (``gradient_checkpointing_enable``), or a module wrapped by
    ``torch.distributed.algorithms._checkpoint`` (``CheckpointWrapper``)."""
    return any(getattr(m, "gradient_checkpointing", False) is True
               or type(m).__name__ == "CheckpointWrapper" for m in model.modules())


def active_dropout_modules(model: nn.Module) -> list[str]:
    """Modules that drop activations at random in their current mode, as ``"name (Type, p=..)"``.

    A module counts when it is in training mode and either is a ``torch.nn`` dropout layer with
    ``p > 0`` or carries a float attribute whose name contains ``"dropout"`` with a value ``> 0``
    (Hugging Face attention modules pass ``attention_dropout`` to the attention kernel only in
    training mode). A capture around the host's own step measures the rows with the host's own
    masks; a second pass does not, and should name these modules.
    """
    drop = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)
    out = []
    for name, mod in model.named_modules():
        if not mod.training:
            continue
        if isinstance(mod, drop):
            if mod.p > 0:
                out.append(f"{name} ({type(mod).__name__}, p={mod.p})")
            continue
        for key, val in vars(mod).items():
            if "dropout" in key and isinstance(val, float) and val > 0:
                out.append(f"{name} ({type(mod).__name__}, {key}={val})")
    return out


@dataclass
class _Call:
    """One call of a trainable module whose output needs a gradient."""

    name: str
    kind: str
    held: Any = None  # embedding ids, or a generic module's arguments (tap slot = None)
    slot: int = 0  # position of the tapped input among the arguments
    delta: torch.Tensor | None = None
    x: torch.Tensor | None = None  # the input, held (input_taps off: no tap node)
    out_fn: Any = None  # a held generic call's output node, the host's (see add_leaf)


def _rerun_node(mod: nn.Module, args: tuple) -> Any:
    """The autograd node of a re-run of ``mod.forward(*args)`` (no hooks), for a norm's closed
    form where the host's own node of the call is not held; ``None`` when the output has none.
    The tensor inputs require grad in the re-run, as in the host's forward, so that autograd
    saves both factors of ``weight * z`` (the closed form reads them)."""
    rerun = tuple(a.detach().requires_grad_(a.is_floating_point())
                  if isinstance(a, torch.Tensor) else a for a in args)
    with torch.enable_grad():
        out = mod.forward(*rerun)
    return out.grad_fn if isinstance(out, torch.Tensor) else None


class _InputTap(torch.autograd.Function):
    """Identity on a module input ``x`` that saves ``x``; its backward completes the call."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor, call: _Call,  # type: ignore
                capture: GramCapture) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.call, ctx.capture = call, capture
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        cap = ctx.capture
        if not cap.failed:
            (x,) = ctx.saved_tensors
            cap.complete(ctx.call, x)
        return None, grad, None, None


class _LinearFromRows(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose backward takes ``dW`` from the per-row gradients.

    The backward forms ``dx = grad W`` and ``db`` as autograd's linear does, and asks the capture
    for ``dW``: :meth:`GramCapture.weight_grad_from_rows` forms the per-row gradients the Gram
    needs anyway and returns their sum, so the host's own ``grad^T x`` product is not formed a
    second time. If the capture has failed, ``dW`` is that product (the host's step never
    depends on the capture).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, call: _Call, capture: GramCapture) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.call, ctx.capture, ctx.has_bias = call, capture, bias is not None
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        flat = grad.reshape(-1, grad.shape[-1])
        dx = grad.matmul(weight) if need_x else None
        db = flat.sum(dim=0) if ctx.has_bias and need_b else None
        dw = None
        if need_w:
            dw = ctx.capture.weight_grad_from_rows(ctx.call, x, grad)
            if dw is None:
                dw = flat.T.mm(x.reshape(-1, x.shape[-1]))
        return dx, dw, db, None, None


class _Blocks:
    """float64 Gram blocks of the rows: ``K_b`` ``[n_b, n_b]`` for each row block ``b``."""

    def __init__(self, n: int, blocks: list[list[int]] | None, device: torch.device) -> None:
        self.n = n
        groups = [list(range(n))] if blocks is None else blocks
        self.index: list[slice | torch.Tensor] = []
        for rows in groups:
            bad = [r for r in rows if not 0 <= r < n]
            if bad:
                raise GramCaptureError(f"block rows {bad} are outside the batch's {n} rows")
            if rows == list(range(rows[0], rows[0] + len(rows))):
                self.index.append(slice(rows[0], rows[0] + len(rows)))
            else:
                self.index.append(torch.tensor(rows, dtype=torch.long, device=device))
        self.K = [torch.zeros(len(r), len(r), dtype=torch.float64, device=device) for r in groups]

    def each(self) -> Iterator[tuple[int, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]]:
        """``(b, K_b, sel)`` with ``sel(t)`` the rows of block ``b`` of a row-first tensor."""
        for b, (idx, K) in enumerate(zip(self.index, self.K, strict=True)):
            yield b, K, functools.partial(_select_rows, idx=idx)


def _select_rows(t: torch.Tensor, *, idx: slice | torch.Tensor) -> torch.Tensor:
    return t[idx] if isinstance(idx, slice) else t.index_select(0, idx.to(t.device))


class PackedRows:
    """Rows packed into one sequence (``segments``: cumulative lengths, as ``cu_seqlens``).

    Remove-padding trainers (verl's ``use_remove_padding=True``, flash-attention varlen) run a
    micro-batch of ``n`` rows as ONE sequence ``[1, N, ...]`` with ``N = segments[-1]`` tokens
    (possibly followed by padding), row ``i`` holding tokens ``segments[i]:segments[i + 1]``;
    attention stays within a row. :meth:`unpack` lays a packed tensor out batch-first,
    ``[n, T_max, ...]``, zeros where a row has no token: padded positions carry zero input and
    zero gradient, so the per-row identities add nothing there (exact).
    """

    def __init__(self, segments: Any, device: torch.device) -> None:
        seg = ([int(s) for s in segments] if isinstance(segments, (list, tuple)) else
               [int(s) for s in torch.as_tensor(segments).detach().reshape(-1).cpu().tolist()])
        lengths = [b - a for a, b in zip(seg[:-1], seg[1:], strict=True)]
        if len(seg) < 2 or seg[0] != 0 or min(lengths) < 0:
            raise ValueError("segments must be cumulative row lengths [0, l_0, l_0 + l_1, ...] "
                             f"(non-decreasing, from 0, at least one row), got {seg}")
        self.n = len(lengths)
        self.tokens = seg[-1]
        self.T = max(1, max(lengths))
        self.device = device
        self._row: torch.Tensor | None = None
        self.bounds = list(zip(seg[:-1], seg[1:], strict=True))
        self._index: torch.Tensor | None = None
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self._indicators: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._blocks: dict[tuple[Any, ...], tuple[slice | torch.Tensor, torch.Tensor]] = {}

    @property
    def row(self) -> torch.Tensor:
        """``[N]``: the row of each packed token (formed at first use)."""
        if self._row is None:
            lengths = torch.tensor([t1 - t0 for t0, t1 in self.bounds], dtype=torch.long)
            self._row = torch.repeat_interleave(torch.arange(self.n), lengths).to(self.device)
        return self._row

    @property
    def index(self) -> torch.Tensor:
        """Packed token ``p`` of row ``i`` -> its padded ``[n, T]`` position ``i T + (p -
        start_i)`` (formed at first use: batched small calls never unpack)."""
        if self._index is None:
            row = self.row.cpu()
            start = torch.tensor([a for a, _ in self.bounds], dtype=torch.long)
            self._index = (row * self.T + torch.arange(self.tokens) - start[row]).to(self.device)
        return self._index

    def is_packed(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is one packed sequence ``[1, >= N, ...]`` of these rows."""
        return x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] >= self.tokens

    def unpack_shared(self, t: torch.Tensor) -> torch.Tensor:
        """:meth:`unpack`, reusing the last result when ``t`` is the same memory (modules that
        share one input, e.g. the q/k/v projections, complete one after the other)."""
        last = self._last
        if last is not None:
            src, out = last
            if (src.data_ptr() == t.data_ptr() and src.shape == t.shape and src.dtype == t.dtype
                    and src.stride() == t.stride() and src._version == t._version):
                return out  # ``src`` is held: its memory cannot be another tensor's now
        out = self.unpack(t)
        self._last = (t, out)
        return out

    def indicator(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``S`` ``[n, N]``: ``S_it = 1`` when packed token ``t`` is row ``i``'s (kept per dtype
        and device)."""
        key = (dtype, device)
        S = self._indicators.get(key)
        if S is None:
            S = torch.zeros(self.n, self.tokens, dtype=dtype, device=device)
            for i, (t0, t1) in enumerate(self.bounds):
                S[i, t0:t1] = 1
            self._indicators[key] = S
        return S

    def block(self, rows: slice | torch.Tensor,
              device: torch.device) -> tuple[slice | torch.Tensor, torch.Tensor]:
        """The packed tokens of the rows ``rows`` and their indicator ``S_b`` (float64
        ``[n_b, N_b]``, :meth:`indicator` restricted to them), kept per block and device.

        ``rows``: a ``slice`` of consecutive rows (their tokens: one ``slice``) or a
        ``LongTensor`` of row indices (their tokens in that order: a ``LongTensor``; likewise
        a ``slice`` with a step).
        """
        key = ((rows.start, rows.stop, rows.step) if isinstance(rows, slice)
               else tuple(rows.tolist()), device)
        hit = self._blocks.get(key)
        if hit is not None:
            return hit
        ids = list(range(self.n))[rows] if isinstance(rows, slice) else list(key[0])
        spans = [self.bounds[r] for r in ids]
        tok: slice | torch.Tensor
        if isinstance(rows, slice) and rows.step in (None, 1) and ids:
            tok = slice(spans[0][0], spans[-1][1])
        else:
            tok = torch.cat([torch.arange(t0, t1) for t0, t1 in spans]
                            or [torch.zeros(0, dtype=torch.long)]).to(device)
        full = self.indicator(torch.float64, device)
        S = full[ids][:, tok].contiguous()  # the rows' own tokens: the rest of the row is 0
        self._blocks[key] = (tok, S)
        return tok, S

    def row_sums(self, t: torch.Tensor) -> torch.Tensor:
        """``[1, N(+pad), ...]`` -> ``[n, ...]``: each row's sum over its own tokens."""
        flat = t[0, : self.tokens]
        out = flat.new_zeros((self.n, *flat.shape[1:]))
        return out.index_add_(0, self.row.to(flat.device), flat)

    def unpack(self, t: torch.Tensor, fill: Any = 0) -> torch.Tensor:
        """``[1, N(+pad), ...]`` -> ``[n, T_max, ...]``, ``fill`` where a row has no token."""
        flat = t[0, : self.tokens]
        out = flat.new_full((self.n * self.T, *flat.shape[1:]), fill)
        out.index_copy_(0, self.index.to(flat.device), flat)
        return out.reshape(self.n, self.T, *flat.shape[1:])


@dataclass
class _HeadState:
    """The head's per-tile bookkeeping (weight/bias trainable, tied embedding, method)."""

    name: str
    h: torch.Tensor  # [R, T, d] in the compute dtype
    weight: bool
    bias: bool
    method: str
    tied: str | None = None
    tied_rows: torch.Tensor | None = None
    tied_values: list[torch.Tensor] = field(default_factory=list)


def validate_blocks(
    blocks: Sequence[Sequence[int]] | None, n: int | None = None
) -> list[list[int]] | None:
    """``blocks`` as lists of ints: each non-empty, without repeated rows (and within ``[0, n)``
    when ``n`` is given); ``None`` stays ``None`` (the full Gram)."""
    if blocks is None:
        return None
    out = []
    for b in blocks:
        rows = [int(r) for r in b]
        if not rows:
            raise ValueError("every block needs at least one row")
        if len(set(rows)) != len(rows):
            raise ValueError(f"block {rows} repeats a row")
        if n is not None and not all(0 <= r < n for r in rows):
            raise ValueError(f"block {rows} has rows outside [0, {n})")
        out.append(rows)
    if not out:
        raise ValueError("blocks must hold at least one block (or be None: the full Gram)")
    return out


class GramCapture:
    """Context manager: the per-row Gram ``K_ij = <g_i, g_j>`` of the backward run inside it.

    Args:
        model: the module whose trainable parameters (``requires_grad=True``) define ``g_i``.
        blocks: row-index lists; only those diagonal blocks ``K[b][:, b]`` are formed (cheaper);
            ``None`` (default): the full ``[n, n]``.
        linear_method: per-Linear identity (``"auto"``, ``"measured"``, ``"identity"``,
            ``"per_sample"``, ``"triton"``), as :func:`real_model.gram.trajectory_gram`.
        gram_precision: ``"auto"``, ``"float64"`` or ``"float32"`` per-chunk products.
        chunk_size: entries of one temporary block (default: ``gm.default_chunk_size``).
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
        weight_grads: who forms the weight gradient of an ``nn.Linear`` (default ``"host"``).
            ``"host"``: the host's backward, as without the capture. ``"rows"``: for plain
            ``nn.Linear`` modules (``forward`` not overridden, not a tied LM head) with float32
            or float64 weights, called with an input in the weight's dtype outside autocast or
            under an autocast to that dtype (FSDP2 mixed precision: bf16 weights unsharded for
            the forward; bf16/fp16 calls on ``gm.ROWS_LOW_PRECISION_DEVICE_TYPES`` only, their
            rows in float32), whose per-sample method is chosen
            (``linear_method`` ``"auto"`` by count, or ``"per_sample"``), the capture runs the
            module's ``F.linear`` in an autograd function whose backward forms the per-row
            gradients once (:func:`real_model.gram_layers.linear_weight_grad_and_gram`) and
            hands their sum to autograd as ``dW``: the Gram then costs the row sums and the
            Gram products, not a second ``grad^T x`` product. ``.grad`` equals the host's up
            to float rounding (the rows are summed in another order), not bit for bit.
            :attr:`from_rows` names the modules that took this path.
        batch_small_calls: keep the contributions of small calls (:data:`SMALL_CALL_ELEMENTS`)
            and add them together at :meth:`flush` (called by :meth:`result`), batched: the same
            Gram up to float rounding, at a fraction of the per-call cost; a small Linear takes
            the host's ``dW`` (not ``weight_grads="rows"``). :attr:`batched` names the modules
            that took this path. ``False``: every call adds its own contribution in the
            backward. Default ``True``.

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
        linear_method: str = "auto",
        gram_precision: str = "auto",
        chunk_size: int | None = None,
        strict: bool = False,
        segments: Any = None,
        input_taps: bool | None = True,
        weight_grads: str = "host",
        batch_small_calls: bool = True,
    ) -> None:
        if weight_grads not in WEIGHT_GRADS:
            raise ValueError(f"weight_grads must be one of {WEIGHT_GRADS}, got {weight_grads!r}")
        if linear_method not in LINEAR_METHODS:
            raise ValueError(
                f"linear_method must be one of {LINEAR_METHODS}, got {linear_method!r}"
            )
        if chunk_size is not None and int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        params = list(model.parameters())  # one walk of the modules for all three below
        self.plan = plan_of(model, params=params)
        if not self.plan.modules:
            raise ValueError("model has no parameter with requires_grad=True: the rows are empty")
        self.model = model
        self.blocks = validate_blocks(blocks)
        self.linear_method = linear_method
        self.product_dtype = product_dtype(model, gram_precision, params=params)
        self._chunk = None if chunk_size is None else int(chunk_size)
        self.strict = bool(strict)
        dev = next(p for p in params if p.requires_grad).device
        if linear_method == "triton":
            gram_triton.require(dev)  # clear, early errors (no triton; CPU without interpreter)
        self.anchor = torch.zeros((), device=dev, requires_grad=True)
        self.input_taps = checkpointing_enabled(model) if input_taps is None else bool(input_taps)
        self.scratch = gm.Scratch()
        self.tied_embeddings = {emb for emb, _ in self.plan.tied.values()}
        self.embedding_of_head = {lin: emb for emb, lin in self.plan.tied.values()}
        self.norm_closed_form_ok = NORM_CLOSED_FORM_CHECKED  # per process (see add_leaf)
        self.weight_grads = weight_grads
        self.batch_small_calls = bool(batch_small_calls)
        self._rows_modules: dict[str, nn.Module] = {}  # Linear modules with a capture forward
        self._handles: list[Any] = []
        self._route = [self]  # the hooks' capture (:meth:`handover` passes them on)
        self._limits: dict[int, dict[str, tuple[str, int]]] = {}  # :meth:`_small_token_limits`
        self._trl: tuple[Any, Any] | None = None
        self.pass_index = 0  # passes before this one on the same hooks (:meth:`handover`)
        self._new_pass(None if segments is None else PackedRows(segments, dev))

    def _new_pass(self, packed: PackedRows | None) -> None:
        """The state of one forward + backward (the rest is the capture's configuration)."""
        self.n: int | None = None
        self.acc: _Blocks | None = None
        self.packed = packed
        self.counts: dict[str, int] = defaultdict(int)
        self.called: dict[str, int] = defaultdict(int)
        self.errors: list[str] = []
        self.failed = False
        self.tied_rows: dict[str, torch.Tensor] = {}
        self.tied_values: dict[str, list[torch.Tensor]] = {}
        self._open: dict[str, list[_Call]] = defaultdict(list)
        self._pending: dict[str, _Call] = {}  # rows calls opened by the pre-hook
        self.from_rows: set[str] = set()  # modules whose dW came from the rows (weight_grads)
        self.batched: set[str] = set()  # modules whose small calls were batched (flush)
        self._small_linear: list[tuple[PackedRows, torch.Tensor, torch.Tensor]] = []
        self._small_embedding: list[tuple[PackedRows, torch.Tensor, torch.Tensor, Any]] = []
        self._small_rows: list[torch.Tensor] = []
        self._small_norms: list[tuple[PackedRows, torch.Tensor, torch.Tensor]] = []
        self._recorded: list[tuple] = []  # small calls whose output gradient is read at flush
        self._small_now: dict[str, str] | None = None  # packed: module -> kind, if small here
        if packed is not None and self.batch_small_calls:
            self._small_now = {name: kind for name, (kind, most)
                               in self._small_token_limits(packed.n).items()
                               if packed.tokens <= most}
        self._uniform_rows: dict[tuple[int, int, torch.device], PackedRows] = {}
        self._busy = False
        self._exited = False
        self._live = 0  # tapped calls whose graph is alive
        self._attr = f"_gram_capture_call_{id(self)}"
        self.roots: list[torch.Tensor] = []

    # ----------------------------------------------------------------- context
    def __enter__(self) -> GramCapture:
        if self._handles or self._exited:
            raise RuntimeError("a GramCapture serves one forward + backward: make a new one")
        self._install_trl_intercept()  # first: it may refuse (another capture around TRL)
        route = self._route
        for name, (mod, _, _) in self.plan.modules.items():
            rows = self._rows_module(name)
            if self.input_taps or rows:
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
        if not self._handles or self._exited or self.input_taps:
            raise RuntimeError("handover needs an entered capture without input taps")
        self.flush()
        self._exited = True
        new = copy.copy(self)  # configuration, plan, scratch and the route are shared
        new.blocks = validate_blocks(blocks)
        new._new_pass(None if segments is None else PackedRows(segments, self.anchor.device))
        new.pass_index = self.pass_index + 1
        new._handles, self._handles = self._handles, []
        new._rows_modules, self._rows_modules = self._rows_modules, {}
        new._trl, self._trl = self._trl, None
        if new._trl is not None:  # TRL's fused head now reports to the new capture
            new._trl[0]._ChunkedLogProbFunction.capture = new
        self._route[0] = new
        return new

    def _pre_and_post(self, name: str, mod: nn.Module, args: tuple, kwargs: dict,
                      out: Any) -> None:
        """Forward hook without input taps: a small call is recorded (:meth:`_record_small`);
        any other gets :meth:`_pre` (which then leaves the arguments as they are) and
        :meth:`_post`, one hook dispatch instead of two."""
        small = self._small_now
        if small is not None:  # packed rows: the small modules at this token count are known
            kind = small.get(name)
            if (kind is not None and not self._busy and not self._exited
                    and self._record_packed(name, kind, mod, args, kwargs, out)):
                return
        elif (self.batch_small_calls and not self._busy and not self._exited
              and torch.is_grad_enabled() and self._record_small(name, mod, args, kwargs, out)):
            return
        self._pre(name, mod, args, kwargs)
        self._post(name, mod, args, kwargs, out)

    def _rows_module(self, name: str) -> bool:
        """Whether ``weight_grads="rows"`` applies to module ``name`` (see the class doc)."""
        mod, kind, names = self.plan.modules[name]
        if self._small_now is not None and name in self._small_now:
            return False  # every call of the packed rows is small: batched, the host's dW
        return (self.weight_grads == "rows" and kind == "linear"
                and self.linear_method in ("auto", "per_sample")
                and type(mod).forward is nn.Linear.forward and "forward" not in vars(mod)
                and "weight" in names and name not in self.embedding_of_head
                and mod.weight.dtype in (torch.float32, torch.float64))

    def __exit__(self, *exc: Any) -> None:
        """Restore TRL's function; remove the hooks once no tapped graph is alive.

        A graph whose taps saved their inputs under non-reentrant checkpointing is recomputed in
        its backward, and the recomputation must tap the same inputs again (checkpointing checks
        that it saves what the forward saved). So while such a graph lives, the hooks stay,
        tapping only inside a backward; they go when its last tap is freed (weak finalizers).
        """
        self._exited = True
        if not self.input_taps:  # nothing to recompute: the tensor hooks carry the backward
            self._live = 0
        if self._trl is not None:
            utils, original = self._trl
            utils._ChunkedLogProbFunction = original
            self._trl = None
        if self._live == 0:
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._open.clear()
        for mod in self._rows_modules.values():
            vars(mod).pop("forward", None)
        self._rows_modules = {}
        self._pending.clear()

    def _release(self) -> None:
        """Finalizer of one tapped call: its graph is gone."""
        self._live = max(0, self._live - 1)  # 0 already: :meth:`backward_done` came first
        if self._exited and self._live == 0:
            self._remove_hooks()

    def backward_done(self) -> None:
        """The host has run the backward of every graph this capture saw and will not run one
        again (verl's micro-batch loop, before its next micro-batch): after :meth:`__exit__`,
        the hooks go now rather than when the host frees the graphs, so that the next capture
        finds the modules as they were (with input taps the previous graph is often still
        referenced then, and its ``weight_grads="rows"`` forwards would keep the next capture's
        Linears off that path). Idempotent; nothing before :meth:`__exit__`."""
        if self._exited:
            self._live = 0
            self._remove_hooks()

    @property
    def chunk(self) -> int:
        """Entries of one temporary block (sized at first use, see ``gm.default_chunk_size``)."""
        if self._chunk is None:
            self._chunk = gm.default_chunk_size(self.anchor.device)
        return self._chunk

    # ----------------------------------------------------------------- results
    def coverage(self) -> dict[str, int]:
        """Contributions added per trainable module (exactly 1 each for a valid result); the
        small calls kept so far are added first (:meth:`flush`)."""
        self.flush()
        return {name: self.counts.get(name, 0) for name in self.plan.modules}

    def problems(self) -> list[str]:
        """Recorded errors plus coverage problems (a module counted 0 or > 1 times)."""
        self.flush()
        if self.errors:  # later work was skipped: coverage would only echo the first failure
            return list(self.errors)
        out: list[str] = []
        if self.n is None:
            return ["no trainable module was called with gradients enabled inside the capture"]
        for name, count in self.coverage().items():
            mod, _, pnames = self.plan.modules[name]
            what = f"module {name!r} ({type(mod).__name__}) with trainable parameters {pnames}"
            if count == 0 and not self.called.get(name):
                out.append(f"{what} was never called in the forward inside the capture (with "
                           "gradients enabled): its parameters may be used outside its forward, "
                           "which the exact Gram cannot attribute (use method='naive', or set "
                           "requires_grad=False on them)")
            elif count == 0:
                out.append(f"{what} was called but added no contribution: its output never "
                           "received a gradient in the backward (not on the loss's path, or its "
                           "hook was removed); set requires_grad=False on parameters the loss "
                           "does not use")
            elif count > 1:
                out.append(f"{what} was counted {count} times: it was called {count} times in "
                           "one forward (weight reuse, or one capture around several forwards); "
                           "the exact Gram needs each trainable module once per row")
        return out

    @property
    def ok(self) -> bool:
        """True when :meth:`result` would succeed."""
        return not self.problems()

    def result(self) -> torch.Tensor | list[torch.Tensor]:
        """float64 ``K`` ``[n, n]`` (``blocks=None``), else one ``[n_b, n_b]`` per block.

        Raises:
            GramCaptureError: with every problem of :meth:`problems`, or on a non-finite ``K``.
        """
        self.roots = []  # the backward is over: drop the embedding outputs (and their hooks)
        probs = self.problems()  # flushes the small calls first
        if probs:
            raise GramCaptureError("; ".join(probs))
        assert self.acc is not None
        Ks = [0.5 * (K + K.T) for K in self.acc.K]
        if not all(bool(torch.isfinite(K).all()) for K in Ks):
            raise GramCaptureError("the Gram matrix holds non-finite values: the model's "
                                   "log-probabilities or gradients overflowed")
        return Ks[0] if self.blocks is None else Ks

    # ----------------------------------------------------------------- error handling
    def fail(self, message: str) -> None:
        """Record a problem; skip all later work (raise instead under ``strict``)."""
        self.errors.append(message)
        self.failed = True
        if self.strict:
            raise GramCaptureError(message)

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any,
               module: bool = False) -> Any:
        """Run ``fn(*args)``; any exception becomes a recorded problem (re-raised under
        ``strict``) named by ``what`` (``module=True``: the module ``what``; the message is
        formatted only on failure, so per-call guards cost no string)."""
        try:
            return fn(*args)
        except GramCaptureError as e:
            if self.strict:
                raise
            self.fail(str(e))
        except Exception as e:  # noqa: BLE001 - never stop the host's step (see module doc)
            label = f"module {what!r}" if module else what
            self.fail(f"{label}: {type(e).__name__}: {e}")
        return None

    # ----------------------------------------------------------------- forward side
    def _rows(self, name: str, x: torch.Tensor) -> None:
        """Check that ``x`` is batch-first over the ``n`` rows (fixing ``n`` at the first call),
        or, with ``segments``, one packed sequence of them."""
        if self.packed is not None and self.packed.is_packed(x):
            dim, rows = 2, self.packed.n
        else:
            dim, rows = x.dim(), (int(x.shape[0]) if x.dim() else 0)
        if self.n is None:
            if dim < 2:
                raise GramCaptureError(f"module {name!r} got an input of shape "
                                       f"{tuple(x.shape)}: the rows must be its first axis")
            self.n = rows
            self.acc = _Blocks(self.n, self.blocks, self.anchor.device)
        elif dim < 2 or rows != self.n:
            mod = self.plan.modules[name][0]
            raise GramCaptureError(
                f"module {name!r} ({type(mod).__name__}) was called with an input of shape "
                f"{tuple(x.shape)} whose first axis is not the n={self.n} rows; the capture "
                "needs batch-first per-row inputs (one capture per forward + backward)")

    def _pre(self, name: str, mod: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Forward pre-hook: open a call record; tap the floating input (see module doc)."""
        # the decision to tap must not depend on state that changes between a checkpointed
        # forward and its recomputation (e.g. ``failed``): both must save the same tensors
        if self._busy or not torch.is_grad_enabled() or (self._exited and not _in_backward()):
            return None
        kind = self.plan.modules[name][1]
        call = self._guard(name, self._open_call, name, kind, args, kwargs, module=True)
        if call is None:
            return None
        if name in self._rows_modules and self._rows_call(name, args[call.slot]):
            call.kind = "rows"
            self._pending[name] = call  # the module's capture forward takes it
            if self.input_taps:  # hooks stay while the graph may still be recomputed
                self._live += 1
                weakref.finalize(call, self._release)
            return None
        if kind == "embedding" or not self.input_taps:
            if kind != "embedding":
                call.x = args[call.slot]
            self._open[name].append(call)
            return None
        # outside the guard: checkpointing's early stop may raise through here, as it must
        tapped = _InputTap.apply(self.anchor, args[call.slot], call, self)
        setattr(tapped, self._attr, call)  # the forward hook finds its call on its input
        self._live += 1
        weakref.finalize(call, self._release)
        return (*args[: call.slot], tapped, *args[call.slot + 1:]), kwargs

    def _rows_call(self, name: str, x: torch.Tensor) -> bool:
        """Whether this call of a ``weight_grads="rows"`` Linear takes that path: input in the
        weight's dtype, autocast off or to that same dtype (so that it casts nothing: verl's bf16
        mixed precision, whose FSDP2 unshards bf16 weights), a bf16/fp16 call only on a device
        of ``gm.ROWS_LOW_PRECISION_DEVICE_TYPES`` (its rows in float32), and
        (``linear_method="auto"``) per-sample chosen by count."""
        mod = self._rows_modules[name]
        try:  # never raise into the host's forward: on any doubt the module keeps the tap path
            dev = x.device.type
            if x.dtype != mod.weight.dtype or (torch.is_autocast_enabled(dev)
                                               and torch.get_autocast_dtype(dev) != x.dtype):
                return False
            if not gm.rows_allowed(x.dtype, dev):
                return False
            if self._small_linear_tokens(name, x) is not None:
                return False  # batched at flush, with the host's dW
            if self.linear_method == "per_sample":
                return True
            packed = self.packed is not None and self.packed.is_packed(x)
            n = int(self.n or x.shape[0])
            T = self.packed.T if packed else x.numel() // max(1, n * x.shape[-1])
            d_out, d_in = mod.weight.shape
            return gm.choose_linear_method(R=n, T=T, d_in=d_in, d_out=d_out) == "per_sample"
        except Exception:  # noqa: BLE001
            return False

    def _linear_forward(self, name: str, mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The capture's ``forward`` of a ``weight_grads="rows"`` Linear: :class:`_LinearFromRows`
        for a call the pre-hook opened, ``nn.Linear.forward`` otherwise."""
        call = self._pending.pop(name, None)
        if call is None:
            return nn.Linear.forward(mod, x)  # type: ignore[arg-type]
        return _LinearFromRows.apply(x, mod.weight, mod.bias, call, self)

    def weight_grad_from_rows(self, call: _Call, x: torch.Tensor,
                              grad: torch.Tensor) -> torch.Tensor | None:
        """Backward of :class:`_LinearFromRows`: add the call's Grams, return ``dW`` (``None``
        when the capture has failed: the caller then forms the host's own product)."""
        if self.failed:
            return None
        self.counts[call.name] += 1
        self._busy = True
        try:
            mod = self._rows_modules.get(call.name) or self.plan.modules[call.name][0]
            dW = self._guard(f"module {call.name!r} ({type(mod).__name__})",
                             functools.partial(self._rows_grad, call.name, x, grad))
            if dW is not None:
                self.from_rows.add(call.name)
            return dW
        finally:
            self._busy = False

    def _rows_grad(self, name: str, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        assert self.acc is not None and self.n is not None
        segments = None
        if self.packed is not None and self.packed.is_packed(grad):
            # the rows' own tokens of the packed sequence: no padded copy
            a = x.detach()[0, : self.packed.tokens]
            g = grad[0, : self.packed.tokens]
            segments = self.packed.bounds
        else:
            a = x.detach().reshape(self.n, -1, x.shape[-1])
            g = grad.reshape(self.n, -1, grad.shape[-1])
        blocks = list(zip(self.acc.K, self.acc.index, strict=True))
        dW = gm.linear_weight_grad_and_gram(blocks, a, g.to(a.dtype), chunk_size=self.chunk,
                                            scratch=self.scratch,
                                            product_dtype=self.product_dtype, segments=segments)
        if "bias" in self.plan.modules[name][2]:
            if segments is not None:
                g = torch.stack([g[t0:t1].sum(dim=0) for t0, t1 in segments])[:, None]
            for _, K, sel in self.acc.each():
                gm.bias_gram(K, sel(g))
        return dW

    def _open_call(self, name: str, kind: str, args: tuple, kwargs: dict) -> _Call:
        mod = self.plan.modules[name][0]
        if kwargs and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise GramCaptureError(f"module {name!r} ({type(mod).__name__}) got tensor keyword "
                                   "arguments: unsupported by the capture")
        if kind == "embedding":
            ids = args[0]
            self._rows(name, ids)
            if name in self.tied_embeddings:
                self.tied_rows[name] = torch.unique(self._unpacked_ids(ids).reshape(-1),
                                                    sorted=True)
            return _Call(name, kind, held=ids.detach())
        slots = [i for i, v in enumerate(args)
                 if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if not slots or (kind == "linear" and slots[0] != 0):
            raise GramCaptureError(f"module {name!r} ({type(mod).__name__}) got no floating "
                                   "tensor as its first positional input to attribute per row")
        for i in slots:
            self._rows(name, args[i])
        if kind == "linear":
            return _Call(name, kind, slot=0)
        held = tuple(None if i == slots[0] else (v.detach() if isinstance(v, torch.Tensor) else v)
                     for i, v in enumerate(args))
        return _Call(name, kind, held=held, slot=slots[0])

    def _post(self, name: str, mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        """Forward hook: hook the output's gradient (calls whose output needs none end here)."""
        if self._busy or not torch.is_grad_enabled():
            return None
        if isinstance(out, torch.Tensor) and out.requires_grad:
            self.called[name] += 1
        call = None
        if self.input_taps:  # a tapped input carries its call
            call = next((c for v in args if (c := getattr(v, self._attr, None)) is not None),
                        None)
        if call is None:
            stack = self._open.get(name)
            if not stack or (self.input_taps and self.plan.modules[name][1] != "embedding"):
                return None
            call = stack.pop()
        if self.failed:
            return None
        if not isinstance(out, torch.Tensor):
            self._guard(name, lambda: self.fail(
                f"module {name!r} ({type(mod).__name__}) returned a {type(out).__name__}, not "
                "one tensor: unsupported by the capture"))
            return None
        if out.requires_grad:
            self._guard(name, self._rows, name, out, module=True)
            if call.kind == "generic" and call.x is not None:
                call.out_fn = out.grad_fn  # its saved tensors live until its backward
            out.register_hook(functools.partial(self._on_delta, call))
            if call.kind == "embedding":
                self.roots.append(out)
        return None

    def grad_inputs(self) -> list[torch.Tensor]:
        """What a backward by ``torch.autograd.grad`` must ask for so that every hook runs:
        the anchor of the input taps and the outputs of the embedding calls (whose gradient
        autograd would otherwise skip, as nothing upstream of them needs one)."""
        return [self.anchor, *self.roots]

    def _on_delta(self, call: _Call, delta: torch.Tensor) -> None:
        """Gradient hook on a module output: keep ``delta`` (embeddings: add the term now)."""
        if self.failed:
            return None
        if call.kind == "embedding":
            self.counts[call.name] += 1
            self._contribute(call, call.held, delta)
        elif call.x is not None:  # no tap: the input was held by the forward hook
            x, call.x = call.x, None
            self.counts[call.name] += 1
            self._contribute(call, x, delta)
        else:
            call.delta = delta
        return None

    def complete(self, call: _Call, x: torch.Tensor) -> None:
        """Backward of the input tap: ``x`` and the stored ``delta`` give the call's term."""
        delta, call.delta = call.delta, None
        if delta is None:  # the gradient reached the input but the output's hook never ran
            mod = self.plan.modules[call.name][0]
            self._guard(call.name, lambda: self.fail(
                f"module {call.name!r} ({type(mod).__name__}): the gradient reached its input "
                "but its output's gradient hook never ran (hook removed?): its contribution "
                "cannot be formed"))
            return
        self.counts[call.name] += 1
        self._contribute(call, x, delta)

    def _unpacked_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Packed token ids laid out batch-first; padded slots repeat an id of the batch (their
        gradient is zero, and the tied head's rows then cover every id)."""
        if self.packed is None or not self.packed.is_packed(ids) or self.packed.tokens == 0:
            return ids
        return self.packed.unpack(ids, fill=ids[0, 0])

    def _contribute(self, call: _Call, x: Any, delta: torch.Tensor) -> None:
        mod, kind, names = self.plan.modules[call.name]
        host_fn, call.out_fn = call.out_fn, None
        if kind == "linear" and self._defer_linear(call.name, x, delta):
            return
        if kind == "embedding" and self._defer_embedding(call.name, mod, x, delta):
            return
        if self.packed is not None and self.packed.is_packed(delta):
            if kind == "generic" and any(isinstance(v, torch.Tensor) for v in call.held or ()):
                self._guard(call.name, lambda: self.fail(
                    f"module {call.name!r} ({type(mod).__name__}): extra tensor arguments in a "
                    "packed micro-batch (segments): unsupported by the capture"))
                return
            if kind == "generic" and self.norm_closed_form_ok.get(type(mod)) is True:
                if host_fn is None:  # input taps: no node of the host's held; one of a re-run
                    try:  # on failure the rows get unpacked, below
                        host_fn = _rerun_node(mod, tuple(
                            x if i == call.slot else v for i, v in enumerate(call.held)))
                    except Exception:  # noqa: BLE001
                        host_fn = None
                if host_fn is not None and self._norm_on_packed(call, mod, names, x, delta,
                                                                host_fn):
                    return
            if kind == "linear" and self._linear_on_packed(call, names, x, delta):
                return
            host_fn = None  # the norm's node holds packed tensors; the rows get unpacked
            x = self._unpacked_ids(x) if kind == "embedding" else self.packed.unpack_shared(x)
            delta = self.packed.unpack(delta)
        self._busy = True
        try:
            if kind == "linear":
                fn = functools.partial(self.add_linear, call.name, names, x, delta)
            elif kind == "embedding":
                fn = functools.partial(self.add_embedding, call.name, mod, x, delta)
            else:
                args = tuple(x.detach() if i == call.slot else v for i, v in enumerate(call.held))
                fn = functools.partial(self.add_leaf, mod, names, args, delta, host_fn=host_fn,
                                       name=call.name)
            self._guard(f"module {call.name!r} ({type(mod).__name__})", fn)
        finally:
            self._busy = False

    def _linear_on_packed(self, call: _Call, names: list[str], x: torch.Tensor,
                          delta: torch.Tensor) -> bool:
        """A Linear's identity on the packed tokens (``gm.linear_weight_gram_identity_packed``,
        no unpacking; each block on its own rows' tokens) when the identity is the method
        (``"identity"``, or ``"auto"`` choosing it for the padded shape, as the unpacked path
        would), the head is not tied and each block's ``[N_b, N_b]`` token kernel fits in
        :attr:`chunk`; ``False`` otherwise (the caller unpacks)."""
        assert self.packed is not None and self.acc is not None
        p = self.packed
        if call.name in self.embedding_of_head:
            return False
        if self.linear_method == "auto":  # per block, as the unpacked path chooses
            methods = {gm.choose_linear_method(R=K.shape[0], T=p.T, d_in=x.shape[-1],
                                               d_out=delta.shape[-1]) for K in self.acc.K}
            method = methods.pop() if len(methods) == 1 else None
        else:
            method = self.linear_method
        if method != "identity" or max(
                p.block(idx, x.device)[1].shape[1] for idx in self.acc.index) ** 2 > self.chunk:
            return False
        self._busy = True
        try:
            self._guard(f"module {call.name!r}", functools.partial(
                self._add_linear_packed, names, x.detach()[0, : p.tokens],
                delta[0, : p.tokens]))
            return True
        finally:
            self._busy = False

    def _add_linear_packed(self, names: list[str], a: torch.Tensor, g: torch.Tensor) -> None:
        """Each block's identity on its own rows' tokens (``N_b^2`` token pairs, not ``N^2``)."""
        assert self.packed is not None and self.acc is not None
        sums = (self.packed.row_sums(g[None]).to(torch.float64) if "bias" in names else None)
        for b, K, sel in self.acc.each():
            tok, S = self.packed.block(self.acc.index[b], a.device)
            if "weight" in names:
                K.add_(gm.linear_weight_gram_identity_packed(
                    a[tok], g[tok].to(a.dtype), S, product_dtype=self.product_dtype))
            if sums is not None:  # <db_i, db_j>, db_i the sum of row i's output gradients
                gm.flat_gram(K, sel(sums))

    def _norm_on_packed(self, call: _Call, mod: nn.Module, names: list[str], x: torch.Tensor,
                        delta: torch.Tensor, host_fn: Any) -> bool:
        """A norm's closed form on the packed tokens, its rows summed per segment (no unpacking
        of ``x``, ``delta`` or ``z``); ``False`` when it does not apply (the caller unpacks)."""
        assert self.packed is not None
        packed = self.packed
        args = tuple(x.detach() if i == call.slot else v for i, v in enumerate(call.held))

        def add() -> bool:
            if self._defer_norm(call.name, mod, names, delta, host_fn):
                return True
            grads = gm.fast_leaf_grads(mod, names, args, delta, host_fn, R=packed.n,
                                       row_sums=packed.row_sums)
            if grads is not None:
                self._add_rows_gram(grads, call.name)
            return grads is not None

        self._busy = True
        try:  # a recorded failure (None from the guard) ends the call too
            return bool(self._guard(f"module {call.name!r} ({type(mod).__name__})", add)
                        or self.failed)
        finally:
            self._busy = False

    def _add_rows_gram(self, grads: torch.Tensor, name: str | None = None) -> None:
        """Each block's Gram of per-row gradients ``grads`` ``[n, p]`` (small ones: at
        :meth:`flush`, concatenated with the others)."""
        assert self.acc is not None
        if self.batch_small_calls and grads.numel() <= SMALL_CALL_ELEMENTS:
            self._small_rows.append(grads.detach())
            if name is not None:
                self.batched.add(name)
            return
        for _, K, sel in self.acc.each():
            gm.flat_gram(K, sel(grads), self.scratch, product_dtype=self.product_dtype)

    # ----------------------------------------------------------------- small calls, batched
    def _small_layout(self, t: torch.Tensor, width: int, *, features: bool = True,
                      linear: tuple[int, int] | None = None) -> PackedRows | None:
        """The token layout of a small call whose tokens are ``t``'s leading axes (one trailing
        feature axis, or none: ``features=False``, token ids) and that reads ``width`` entries
        per token: the packed rows, or batch-first rows of ``T`` tokens each as segments;
        ``None`` when the call is not small (:data:`SMALL_CALL_ELEMENTS`,
        :data:`SMALL_CALL_TOKENS`; a Linear's ``linear = (d_in, d_out)`` also by
        :data:`SMALL_CALL_KERNEL_RATIO`) or not on the capture's rows."""
        if not self.batch_small_calls or self.n is None:
            return None
        if self.packed is not None and self.packed.is_packed(t):
            layout = self.packed
        else:
            if t.dim() < 1 + features or t.shape[0] != self.n:
                return None
            T = t.numel() // max(1, self.n * (t.shape[-1] if features else 1))
            if T < 1:
                return None
            key = (self.n, T, t.device)
            layout = self._uniform_rows.get(key)  # type: ignore[assignment]
            if layout is None:  # batch-first rows of T tokens each, as packed segments
                layout = PackedRows(torch.arange(0, self.n * T + 1, T), t.device)
                self._uniform_rows[key] = layout
        most = (_most_small_tokens(width) if linear is None
                else _most_small_linear_tokens(*linear, layout.n))
        return layout if layout.tokens <= most else None

    @staticmethod
    def _small(tokens: int, width: int) -> bool:
        """A call of ``tokens`` tokens reading ``width`` entries per token is small."""
        return tokens <= _most_small_tokens(width)

    def _small_linear_dims(self, name: str) -> tuple[int, int] | None:
        """``(d_in, d_out)`` of module ``name`` when its calls may be batched (a weight-only
        ``nn.Linear``-kind module, not a tied head), else ``None``."""
        mod, kind, names = self.plan.modules[name]
        if kind != "linear" or names != ["weight"] or name in self.embedding_of_head:
            return None
        d_out, d_in = mod.weight.shape
        return int(d_in), int(d_out)

    def _small_linear_tokens(self, name: str, x: torch.Tensor) -> PackedRows | None:
        """:meth:`_small_layout` of a call on input ``x`` of a Linear that may be batched."""
        dims = self._small_linear_dims(name)
        if dims is None or x.dim() < 2:
            return None
        return self._small_layout(x, sum(dims), linear=dims)

    def _defer_norm(self, name: str, mod: nn.Module, names: list[str], delta: torch.Tensor,
                    host_fn: Any) -> bool:
        """Keep a small packed ``weight * z`` norm call's ``delta`` and ``z`` (read from the
        host's node now: autograd frees it after its backward) for :meth:`flush`."""
        p = self._small_norm_layout(mod, names, delta)
        z = None if p is None else gm.scaled_norm_factor(mod, delta, host_fn)
        if p is None or z is None:
            return False
        self._small_norms.append((p, delta[0, : p.tokens], z[0, : p.tokens]))
        self.batched.add(name)
        return True

    def _small_norm_layout(self, mod: nn.Module, names: list[str],
                           t: torch.Tensor) -> PackedRows | None:
        """The packed rows, when a norm call whose output (gradient) is ``t`` may be batched: a
        1-d weight only, packed rows, ``t`` packed, ``N 2 d`` small."""
        p = self.packed
        if (not self.batch_small_calls or p is None or names != ["weight"]
                or mod.weight.dim() != 1 or not p.is_packed(t)
                or not self._small(p.tokens, 2 * t.shape[-1])):
            return None
        return p

    def _defer_embedding(self, name: str, mod: nn.Module, ids: torch.Tensor,
                         delta: torch.Tensor) -> bool:
        """Keep a small (untied) embedding call's ids and ``delta`` for :meth:`flush`: its term
        ``S ([id_t = id_t'] * (delta delta^T)) S^T`` (tokens at ``padding_idx`` left out)."""
        if name in self.tied_embeddings or not isinstance(ids, torch.Tensor):
            return False
        layout = self._small_layout(ids, delta.shape[-1], features=False)
        if layout is None:
            return False
        N = layout.tokens
        flat = ids[0, :N] if layout is self.packed else ids.reshape(N)
        g = delta[0, :N] if layout is self.packed else delta.reshape(N, -1)
        pad = getattr(mod, "padding_idx", None)
        keep = None if pad is None else (flat != pad)
        self._small_embedding.append((layout, flat, g, keep))
        self.batched.add(name)
        return True

    def _defer_linear(self, name: str, x: torch.Tensor, delta: torch.Tensor) -> bool:
        """Keep a small Linear call's ``(a, delta)`` on its tokens for :meth:`flush`."""
        layout = self._small_linear_tokens(name, x)
        if layout is None:
            return False
        N = layout.tokens
        if layout is self.packed:
            a, g = x.detach()[0, :N], delta[0, :N]
        else:
            a, g = x.detach().reshape(N, -1), delta.reshape(N, -1)
        self._small_linear.append((layout, a, g))
        self.batched.add(name)
        return True

    def _record_small(self, name: str, mod: nn.Module, args: tuple, kwargs: dict,
                      out: Any) -> bool:
        """Forward hook of a small call on batch-first rows (no input taps; packed rows:
        :meth:`_record_packed`): keep its input and output, and have autograd keep the output's
        gradient (``retain_grad``: no Python hook in the backward); :meth:`flush` reads it.
        Small: a Linear or untied embedding call as :meth:`_small_layout` (a norm is batched on
        packed rows only). ``False`` (nothing done): the usual per-call path, which also
        reports any problem of the call."""
        if (kwargs or len(args) != 1 or not isinstance(out, torch.Tensor)
                or not out.requires_grad or not isinstance(args[0], torch.Tensor)
                or self.failed):
            return False
        x = args[0]
        kind = self.plan.modules[name][1]
        try:  # on any doubt, the usual path (which reports what is wrong)
            self._rows(name, x)
            if kind == "linear":
                layout = self._small_linear_tokens(name, x) if x.is_floating_point() else None
            elif kind == "embedding":
                layout = None if name in self.tied_embeddings else self._small_layout(
                    x, out.shape[-1], features=False)
            else:
                layout = None
            if layout is None:
                return False
            self._rows(name, out)
        except Exception:  # noqa: BLE001
            return False
        self._keep_recorded(name, kind, layout, x, out, None)
        return True

    def _record_packed(self, name: str, kind: str, mod: nn.Module, args: tuple, kwargs: dict,
                       out: Any) -> bool:
        """:meth:`_record_small` on packed rows, for a module of ``kind`` whose calls are small
        at this pass's token count (:attr:`_small_now`)."""
        if (kwargs or len(args) != 1 or self.failed or not torch.is_grad_enabled()
                or not isinstance(out, torch.Tensor) or not out.requires_grad):
            return False
        x = args[0]
        N = self.packed.tokens  # type: ignore[union-attr]
        if (not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[0] != 1
                or x.shape[1] < N or out.dim() < 2 or out.shape[0] != 1 or out.shape[1] < N):
            return False
        z = None
        if kind == "generic":
            if (self.norm_closed_form_ok.get(type(mod)) is not True or not x.is_floating_point()
                    or out.shape[-1] != mod.weight.shape[0]):
                return False
            z = gm.scaled_norm_factor(mod, out, out.grad_fn)
            if z is None:
                return False
        elif kind == "linear" and not x.is_floating_point():
            return False
        if self.n is None:
            try:
                self._rows(name, x)
            except Exception:  # noqa: BLE001 - the usual path reports it
                return False
        self._keep_recorded(name, kind, self.packed, x, out, z)
        return True

    def _keep_recorded(self, name: str, kind: str, layout: Any, x: torch.Tensor,
                       out: torch.Tensor, z: torch.Tensor | None) -> None:
        """Keep a small call's input and output, and have autograd keep the output's gradient
        (``retain_grad``: no Python hook in the backward); :meth:`_read_recorded` reads it."""
        out.retain_grad()
        self._recorded.append((name, kind, layout, x.detach(), out, out._version, z))
        self.called[name] += 1
        self.batched.add(name)

    def _small_token_limits(self, rows: int) -> dict[str, tuple[str, int]]:
        """Module -> (kind, the most packed tokens of ``rows`` rows at which its calls are
        small), for the modules whose calls may be batched: a weight-only Linear (not a tied
        head), an untied embedding, a module with one 1-d ``weight`` (a norm:
        :meth:`_record_packed` checks its ``weight * z`` form). Formed once per row count for
        the captures that share these hooks."""
        limits = self._limits.get(rows)
        if limits is not None:
            return limits
        limits = {}
        for name, (mod, kind, names) in self.plan.modules.items():
            w = getattr(mod, "weight", None)
            if kind == "linear":
                dims = self._small_linear_dims(name)
                if dims is not None:
                    limits[name] = (kind, _most_small_linear_tokens(*dims, rows))
                continue
            if kind == "embedding" and name not in self.tied_embeddings:
                width = int(w.shape[-1]) if isinstance(w, torch.Tensor) else None
            elif kind == "generic" and names == ["weight"] and w.dim() == 1:
                width = 2 * int(w.shape[0])
            else:
                width = None
            if width is not None:
                limits[name] = (kind, _most_small_tokens(width))
        self._limits[rows] = limits
        return limits

    def _read_recorded(self) -> None:
        """The recorded small calls' output gradients, kept as their terms' inputs (a call whose
        output got no gradient is not counted: :meth:`problems` names it)."""
        recorded, self._recorded = self._recorded, []
        for name, kind, layout, x, out, version, z in recorded:
            delta = out.grad
            if delta is None or self.failed:
                continue
            out.grad = None
            if out._version != version:
                mod = self.plan.modules[name][0]
                self._guard(name, self.fail, f"module {name!r} ({type(mod).__name__}): its output "
                            "was modified in place after its forward, so the gradient kept for "
                            "it is not its own; use batch_small_calls=False (a hook per call)")
                continue
            self.counts[name] += 1
            N = layout.tokens
            if layout is not self.packed:  # batch-first rows: tokens are the leading axes
                x, delta = x.reshape(N, -1), delta.reshape(N, -1)
            elif x.shape[1] == N and delta.shape[1] == N:  # packed, no padding after the rows
                x, delta, z = x[0], delta[0], None if z is None else z[0]
            else:
                x, delta, z = x[0, :N], delta[0, :N], None if z is None else z[0, :N]
            if kind == "linear":
                self._small_linear.append((layout, x, delta))
            elif kind == "embedding":
                ids = x.reshape(N)
                pad = getattr(self.plan.modules[name][0], "padding_idx", None)
                self._small_embedding.append((layout, ids, delta,
                                              None if pad is None else ids != pad))
            else:
                self._small_norms.append((layout, delta, z))

    def _small_pending(self) -> bool:
        return bool(self._recorded or self._small_linear or self._small_embedding
                    or self._small_rows or self._small_norms)

    def _take_small(self) -> gs.PassCalls | None:
        """This pass's kept small calls (emptied here), ``None`` when it has failed."""
        calls = gs.PassCalls(n=int(self.n or 0), K=self.acc.K if self.acc else [],
                             index=self.acc.index if self.acc else [],
                             linear=self._small_linear, embedding=self._small_embedding,
                             norms=self._small_norms, rows=self._small_rows)
        self._small_linear, self._small_embedding, self._small_rows, self._small_norms = (
            [], [], [], [])
        return None if self.failed or self.acc is None else calls

    def flush(self) -> None:
        """Add the terms of the small calls kept so far (``batch_small_calls``), batched
        (:func:`real_model.gram_small_calls.add_small_calls`); called by :meth:`result`,
        :meth:`problems`, :meth:`coverage` and :meth:`handover`, or by the host after its
        backward to free the kept tensors early. Idempotent; failures are recorded like any
        other."""
        if not self._small_pending():
            return
        self._read_recorded()
        calls = self._take_small()
        if calls:
            self._guard("small calls, batched", functools.partial(
                gs.add_small_calls, [calls], chunk_size=self.chunk,
                product_dtype=self.product_dtype, scratch=self.scratch))

    # ----------------------------------------------------------------- per-layer identities
    def add_linear(
        self, name: str, names: list[str], x: torch.Tensor, delta: torch.Tensor
    ) -> None:
        """``<dW_i, dW_j>`` for ``dW_i = delta_i^T a_i``; ``<db_i, db_j>`` for ``sum_t delta_i``.

        A tied LM head also keeps its gradient rows ``H_i[U]`` at the batch's ids ``U`` for the
        embedding's cross terms (:meth:`add_embedding`).
        """
        assert self.acc is not None
        n = self.n
        a = x.detach().reshape(n, -1, x.shape[-1])
        g = delta.reshape(n, -1, delta.shape[-1])
        emb = self.embedding_of_head.get(name)
        if emb is not None and emb not in self.tied_rows:
            raise GramCaptureError(f"tied embedding {emb!r} was not called before {name!r}")
        tied: list[torch.Tensor] = []
        for _, K, sel in self.acc.each():
            if "weight" in names:
                gm.linear_weight_gram(K, sel(a), sel(g), method=self.linear_method,
                                      chunk_size=self.chunk, scratch=self.scratch,
                                      product_dtype=self.product_dtype)
                if emb is not None:
                    tied.append(gm.linear_weight_rows(sel(a), sel(g).to(a.dtype),
                                                      self.tied_rows[emb]))
            if "bias" in names:
                gm.bias_gram(K, sel(g))
        if emb is not None:
            self.tied_values[emb] = tied

    def add_embedding(
        self, name: str, mod: nn.Module, ids: torch.Tensor, delta: torch.Tensor
    ) -> None:
        """``<E_i, E_j> = sum_{t,t'} [id_it = id_jt'] (delta_it . delta_jt')`` (+ tied terms)."""
        assert self.acc is not None
        ids = ids.reshape(self.n, -1)
        g = delta.reshape(self.n, ids.shape[1], -1)
        tied = name in self.tied_rows
        values = self.tied_values.pop(name, None)
        if tied and values is None and self.plan_head_counted(name):
            raise GramCaptureError(f"tied head of {name!r} gave no gradient rows before the "
                                   "embedding's gradient arrived")
        for b, K, sel in self.acc.each():
            gm.embedding_rows_gram(
                K, sel(ids), sel(g), chunk_size=self.chunk, padding_idx=mod.padding_idx,
                tied_rows=self.tied_rows.get(name) if values is not None else None,
                tied_values=None if values is None else values[b],
                scratch=self.scratch, product_dtype=self.product_dtype,
            )

    def plan_head_counted(self, emb: str) -> bool:
        """Whether the head tied to embedding ``emb`` has already added its contribution."""
        return any(self.counts.get(lin, 0) > 0 for e, lin in self.plan.tied.values() if e == emb)

    def add_leaf(
        self, mod: nn.Module, names: list[str], args: tuple, delta: torch.Tensor, *,
        host_fn: Any = None, name: str | None = None,
    ) -> None:
        """Per-row gradients of a small leaf module: closed-form norms, else per-row VJPs
        (``gm.generic_per_sample_grads``). The closed form reads the ``z`` of ``weight * z``
        from the host's own autograd node of the call (``host_fn``: held inputs, no input taps)
        or, without it, from a re-run of the module's ``forward`` on the saved input; it is
        checked once per class and process against the generic path
        (:data:`NORM_CLOSED_FORM_CHECKED`)."""
        assert self.acc is not None
        n, cls = self.n, type(mod)
        grads = None
        if host_fn is not None and self.norm_closed_form_ok.get(cls, True):
            grads = gm.fast_leaf_grads(mod, names, args, delta, host_fn, R=n)
        if grads is None and self.norm_closed_form_ok.get(cls, True):
            node = _rerun_node(mod, args)
            if node is not None:
                grads = gm.fast_leaf_grads(mod, names, args, delta, node, R=n)
        if grads is not None and cls not in self.norm_closed_form_ok:
            ref = gm.generic_per_sample_grads(mod, names, args, delta, R=n)
            tol = 64 * torch.finfo(ref.dtype).eps * float(ref.abs().max())
            ok = bool((grads.to(ref.dtype) - ref).abs().max() <= tol)
            self.norm_closed_form_ok[cls] = ok
            grads = grads if ok else ref
        if grads is None:
            grads = gm.generic_per_sample_grads(mod, names, args, delta, R=n)
        self._add_rows_gram(grads, name)

    # ----------------------------------------------------------------- LM head in tiles
    def head_begin(
        self, weight: torch.Tensor, bias: torch.Tensor | None, h: torch.Tensor
    ) -> _HeadState | None:
        """Start the head's contribution for hidden states ``h`` ``[n, T, d]``; ``None`` when
        neither the weight nor the bias is a trainable parameter of this model (or on failure)."""
        if self.failed:
            return None
        return self._guard("LM head", lambda: self._head_state(weight, bias, h))

    def _head_state(
        self, weight: torch.Tensor, bias: torch.Tensor | None, h: torch.Tensor
    ) -> _HeadState | None:
        owners = [m for m, _, n in self.plan.uses.get(id(weight), []) if n == "weight"]
        lin = [m for m in owners if self.plan.modules[m][1] == "linear"]
        has_b = bias is not None and id(bias) in self.plan.uses
        if not lin and not has_b:
            if owners:
                raise GramCaptureError(f"the head weight belongs to {owners} but to no Linear")
            return None
        name = lin[0] if lin else self.plan.uses[id(bias)][0][0]
        self._rows(name, h)
        if self.packed is not None and self.packed.is_packed(h):
            h = self.packed.unpack(h)
        R, T, d = h.shape
        V = weight.shape[0]
        method = self.linear_method
        if method == "auto":  # the whole head's shape, not one tile's
            method = gm.choose_linear_method(R=R, T=T, d_in=d, d_out=V) or "per_sample"
        st = _HeadState(name=name, h=h, weight=bool(lin), bias=has_b, method=method)
        st.tied = self.embedding_of_head.get(name)
        if st.tied is not None:
            if st.tied not in self.tied_rows:
                raise GramCaptureError(f"tied embedding {st.tied!r} was not called before the "
                                       "head")
            st.tied_rows = self.tied_rows[st.tied]
            assert self.acc is not None
            st.tied_values = [torch.zeros(sel(h).shape[0], st.tied_rows.numel(), d,
                                          dtype=h.dtype, device=h.device)
                              for _, _, sel in self.acc.each()]
        return st

    def head_tile(self, st: _HeadState | None, v0: int, v1: int, dy: torch.Tensor) -> None:
        """Add one tile: ``dy`` ``[n, T, v1 - v0]`` = gradient of the raw projection there."""
        if st is None or self.failed:
            return
        self._busy = True
        try:
            self._guard("LM head", lambda: self._head_tile(st, v0, v1, dy))
        finally:
            self._busy = False

    def _head_tile(self, st: _HeadState, v0: int, v1: int, dy: torch.Tensor) -> None:
        assert self.acc is not None
        if self.packed is not None and dy.shape[:2] != st.h.shape[:2] and self.packed.is_packed(dy):
            dy = self.packed.unpack(dy)
        cols = None
        if st.tied_rows is not None:
            lo, hi = torch.searchsorted(st.tied_rows, torch.tensor([v0, v1],
                                                                   device=st.tied_rows.device))
            cols = (int(lo), int(hi))
        for b, K, sel in self.acc.each():
            hb, gb = sel(st.h), sel(dy)
            if st.weight:
                gm.linear_weight_gram(K, hb, gb, method=st.method, chunk_size=self.chunk,
                                      scratch=self.scratch, product_dtype=self.product_dtype)
            if st.bias:
                gm.bias_gram(K, gb)
            if cols is not None and cols[1] > cols[0]:
                ids = st.tied_rows[cols[0]:cols[1]] - v0
                st.tied_values[b][:, cols[0]:cols[1]] = gm.linear_weight_rows(hb, gb, ids)

    def head_end(self, st: _HeadState | None) -> None:
        """Finish the head: count it once; hand its tied rows to the embedding."""
        if st is None or self.failed:
            return
        self.counts[st.name] += 1
        if st.tied is not None:
            self.tied_values[st.tied] = st.tied_values

    # ----------------------------------------------------------------- TRL's fused head
    def _install_trl_intercept(self) -> None:
        """While active, route ``trl.trainer.utils._ChunkedLogProbFunction`` (the kernel of
        TRL's ``add_fused_lm_head``) through :class:`_TrlFusedHead` (only if TRL is imported)."""
        utils = sys.modules.get("trl.trainer.utils")
        original = getattr(utils, "_ChunkedLogProbFunction", None)
        if original is None:
            return
        if isinstance(original, _TrlFusedHead):
            raise RuntimeError("another GramCapture is already active around TRL's fused head")
        self._trl = (utils, original)
        utils._ChunkedLogProbFunction = _TrlFusedHead(self, original)

    def watch_fused_head(self, outputs: tuple, hidden: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, targets: torch.Tensor,
                         transform: HeadTransform, mask: Any, tile: int) -> None:
        """After TRL's fused head ran: hook its backward node to add the head's contribution.

        ``mask`` ``[n, T']`` (TRL's ``labels != -100``) places the ``N`` scored tokens in rows:
        TRL scores either the masked tokens only (``N = mask.sum()``, its "compact" mode on
        Triton devices) or every position (``N = n T'``, row-major). ``tile``: vocabulary columns
        per tile, at most TRL's own chunk width.
        """
        logp = outputs[0]
        if self.failed or self._busy or not isinstance(logp, torch.Tensor) or \
                not logp.requires_grad or logp.grad_fn is None:
            return
        state = self._guard("TRL fused head", lambda: self._fused_rows(hidden, mask))
        if state is None:
            return
        ent = outputs[1] if len(outputs) > 1 and isinstance(outputs[1], torch.Tensor) else None
        saved = (hidden.detach(), weight, bias, targets, logp.detach(),
                 None if ent is None else ent.detach(), transform, state, tile)
        logp.grad_fn.register_prehook(functools.partial(self._fused_backward, saved))

    def _fused_rows(self, hidden: torch.Tensor, mask: Any) -> tuple:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
            raise GramCaptureError("TRL fused head: cannot find its token mask [rows, T] (the "
                                   "capture supports the add_fused_lm_head of TRL 1.16)")
        N = hidden.shape[0]
        if N == mask.numel():
            rr, cc = None, None
        elif N == int(mask.sum()):
            rr, cc = mask.nonzero(as_tuple=True)
        else:
            raise GramCaptureError(f"TRL fused head: {N} scored tokens match neither the mask's "
                                   f"{mask.numel()} positions nor its {int(mask.sum())} labels")
        return (mask.shape, rr, cc)

    def _fused_backward(self, saved: tuple, grad_outputs: tuple) -> None:
        """Pre-hook of TRL's backward node: per tile ``dy`` from ``u = dL/dlogp`` (and the
        entropy's gradient), scattered into rows ``[n, T', tile]`` for :meth:`head_tile`."""
        if self.failed:
            return None
        hidden, weight, bias, targets, logp, ent, transform, (shape, rr, cc), tile = saved
        g_lp = grad_outputs[0]
        g_ent = grad_outputs[1] if len(grad_outputs) > 1 else None
        if g_lp is None and g_ent is None:
            return None
        cd = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        wd = weight.detach()
        bd = None if bias is None else bias.detach()

        def run() -> None:
            keep, rows = self._fused_token_layout(shape, rr, cc, g_lp, g_ent, hidden.shape[0])
            h_kept = hidden[keep]
            h = h_kept.to(cd)
            tgt = targets[keep].long()
            zt = transform.apply((h * wd[tgt].to(cd)).sum(-1) + (0 if bd is None else bd[tgt]))
            log_z = zt.double() - logp[keep].double()  # TRL's own normaliser: z_target - log p
            st = self.head_begin(weight, bias, rows(h))
            if st is None:
                return
            tiles = logit_grad_tiles(
                h, wd, bd, tgt, log_z, transform=transform,
                tile=min(tile, default_vocab_tile(h.shape[0], wd.shape[0])),
                grad_logprobs=None if g_lp is None else g_lp.reshape(-1)[keep],
                grad_entropy=None if g_ent is None else g_ent.reshape(-1)[keep],
                entropy=None if ent is None else ent.reshape(-1)[keep],
                half=half_operand(h_kept, wd))
            for v0, v1, dy in tiles:
                self.head_tile(st, v0, v1, rows(dy))
            self.head_end(st)

        self._guard("TRL fused head", run)
        return None

    def _fused_token_layout(
        self, shape: tuple, rr: torch.Tensor | None, cc: torch.Tensor | None,
        g_lp: torch.Tensor | None, g_ent: torch.Tensor | None, N: int,
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """The scored tokens whose log-prob or entropy receives a nonzero gradient (``keep``,
        indices into TRL's ``N`` tokens) and ``rows(t)``: ``t [len(keep), k]`` laid out per row,
        ``[n, L, k]``, row ``i``'s kept tokens first (``L`` the most any row keeps), zeros after.

        Tokens with a zero upstream gradient have a zero logits gradient, so dropping them
        changes no row's gradient; TRL scores every position on CPU (prompt and padding too),
        so this skips the head's recomputation at the ~80-90% of positions outside the
        completions. Packed rows (``segments``) keep every position in TRL's layout.
        """
        n, Tp = shape
        dev = (g_lp if g_lp is not None else g_ent).device  # type: ignore[union-attr]
        active = torch.zeros(N, dtype=torch.bool, device=dev)
        for g in (g_lp, g_ent):
            if g is not None:
                active |= g.reshape(-1) != 0
        if self.packed is not None:
            active[:] = True
        keep = active.nonzero().squeeze(1)
        if rr is None:
            r, c = keep // Tp, keep % Tp
        else:
            r, c = rr.to(dev)[keep], cc.to(dev)[keep]  # type: ignore[union-attr]
        if self.packed is None:  # compact: row i's kept tokens at columns 0, 1, ...
            counts = torch.bincount(r, minlength=n)
            starts = torch.cumsum(counts, 0) - counts
            c = torch.arange(keep.numel(), device=dev) - starts[r]
            Tp = max(1, int(counts.max())) if keep.numel() else 1

        def rows(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros(n, Tp, t.shape[-1])
            out[r, c] = t
            return out

        return keep, rows


class _TrlFusedHead:
    """Stand-in for ``trl.trainer.utils._ChunkedLogProbFunction`` while a capture is active.

    ``apply`` calls TRL's own function unchanged (so the host's values and gradients are TRL's)
    and hands its inputs and outputs to :meth:`GramCapture.watch_fused_head`. The token mask is
    read from the caller, TRL's ``_fused_forward`` (its local ``mask``).
    """

    _ARGS = ("hidden", "weight", "bias", "targets", "temperature", "chunk_size",
             "final_logit_softcapping", "logit_scale", "outputs")

    def __init__(self, capture: GramCapture, original: Any) -> None:
        self.capture = capture
        self.original = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        out = self.original.apply(*args, **kwargs)
        caller = sys._getframe(1)
        mask = caller.f_locals.get("mask") if caller.f_code.co_name == "_fused_forward" else None
        bound = dict(zip(self._ARGS, args, strict=False)) | kwargs
        transform = HeadTransform(
            temperature=float(bound["temperature"]),
            logit_scale=float(bound.get("logit_scale", 1.0)),
            softcap=bound.get("final_logit_softcapping"),
        )
        self.capture.watch_fused_head(out, bound["hidden"], bound["weight"], bound["bias"],
                                      bound["targets"], transform, mask,
                                      int(bound["chunk_size"]))
        return out
