"""``nn.Linear``: ``<dW_i, dW_j>`` for ``dW_i = delta_i^T a_i``, and the bias's ``<db_i, db_j>``.

A call's term comes from its input ``a`` and output gradient ``delta`` (:func:`add_linear`,
by :func:`real_model.gram.linear_gram.linear_weight_gram`); on packed rows each block's token
identity runs on its own rows' tokens (:func:`linear_on_packed`); a small call waits for the
pass's flush (:func:`real_model.gram.small_calls.defer_linear`). With
``weight_grads="rows"`` a plain Linear runs its ``F.linear`` in :class:`LinearFromRows`, whose
backward hands autograd ``dW`` as the sum of the per-row gradients the Gram forms
(:func:`weight_grad_from_rows`). A tied LM head also keeps its gradient rows at the batch's ids
for the embedding's cross terms (:mod:`.embedding`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ..kernels import bias_gram, flat_gram
from ..linear_gram import (
    choose_linear_method,
    linear_weight_gram,
    linear_weight_gram_identity_packed,
    linear_weight_rows,
)
from ..registry import register
from ..rows import linear_weight_grad_and_gram, rows_allowed
from ..small_calls import defer_linear, small_linear_tokens
from ..state import Call, GramCaptureError, Pass, guard, guarded_call

__all__ = ["Linear", "add_linear", "linear_on_packed", "rows_module", "rows_call",
           "LinearFromRows", "linear_forward", "weight_grad_from_rows"]


@register(nn.Linear)
class Linear:
    """The rule of ``nn.Linear`` and its subclasses."""

    kind = "linear"

    @staticmethod
    def check(name: str, module: nn.Module, params: list[str]) -> None:
        """Every ``nn.Linear`` is attributable per row."""

    @staticmethod
    def contribute(p: Pass, call: Call, mod: nn.Module, names: list[str], x: Any,
                   delta: torch.Tensor, host_fn: Any) -> None:
        """One call's term (deferred when small; on packed rows without unpacking when it can)."""
        if defer_linear(p, call.name, x, delta):
            return
        if p.packed is not None and p.packed.is_packed(delta):
            if linear_on_packed(p, call, names, x, delta):
                return
            x, delta = p.packed.unpack_shared(x), p.packed.unpack(delta)
        guarded_call(p, call.name, mod, functools.partial(add_linear, p, call.name, names, x,
                                                          delta))


def add_linear(p: Pass, name: str, names: list[str], x: torch.Tensor,
               delta: torch.Tensor) -> None:
    """``<dW_i, dW_j>`` for ``dW_i = delta_i^T a_i``; ``<db_i, db_j>`` for ``sum_t delta_i``.

    A tied LM head also keeps its gradient rows ``H_i[U]`` at the batch's ids ``U`` for the
    embedding's cross terms (:func:`real_model.gram.layers.embedding.add_embedding`).
    """
    assert p.acc is not None
    e = p.engine
    n = p.n
    a = x.detach().reshape(n, -1, x.shape[-1])
    g = delta.reshape(n, -1, delta.shape[-1])
    emb = e.embedding_of_head.get(name)
    if emb is not None and emb not in p.tied_rows:
        raise GramCaptureError(f"tied embedding {emb!r} was not called before {name!r}")
    tied: list[torch.Tensor] = []
    for _, K, sel in p.acc.each():
        if "weight" in names:
            linear_weight_gram(K, sel(a), sel(g), method=e.linear_method, chunk_size=e.chunk,
                               scratch=e.scratch, product_dtype=e.product_dtype)
            if emb is not None:
                tied.append(linear_weight_rows(sel(a), sel(g).to(a.dtype), p.tied_rows[emb]))
        if "bias" in names:
            bias_gram(K, sel(g))
    if emb is not None:
        p.tied_values[emb] = tied


def linear_on_packed(p: Pass, call: Call, names: list[str], x: torch.Tensor,
                     delta: torch.Tensor) -> bool:
    """A Linear's identity on the packed tokens (``linear_weight_gram_identity_packed``, no
    unpacking; each block on its own rows' tokens) when the identity is the method
    (``"identity"``, or ``"auto"`` choosing it for the padded shape, as the unpacked path
    would), the head is not tied and each block's ``[N_b, N_b]`` token kernel fits in a chunk;
    ``False`` otherwise (the caller unpacks)."""
    assert p.packed is not None and p.acc is not None
    packed, e = p.packed, p.engine
    if call.name in e.embedding_of_head:
        return False
    if e.linear_method == "auto":  # per block, as the unpacked path chooses
        methods = {choose_linear_method(R=K.shape[0], T=packed.T, d_in=x.shape[-1],
                                        d_out=delta.shape[-1]) for K in p.acc.K}
        method = methods.pop() if len(methods) == 1 else None
    else:
        method = e.linear_method
    if method != "identity" or max(
            packed.block(idx, x.device)[1].shape[1] for idx in p.acc.index) ** 2 > e.chunk:
        return False
    p.busy = True
    try:
        guard(p, f"module {call.name!r}", functools.partial(
            _add_linear_packed, p, names, x.detach()[0, : packed.tokens],
            delta[0, : packed.tokens]))
        return True
    finally:
        p.busy = False


def _add_linear_packed(p: Pass, names: list[str], a: torch.Tensor, g: torch.Tensor) -> None:
    """Each block's identity on its own rows' tokens (``N_b^2`` token pairs, not ``N^2``)."""
    assert p.packed is not None and p.acc is not None
    sums = (p.packed.row_sums(g[None]).to(torch.float64) if "bias" in names else None)
    for b, K, sel in p.acc.each():
        tok, S = p.packed.block(p.acc.index[b], a.device)
        if "weight" in names:
            K.add_(linear_weight_gram_identity_packed(
                a[tok], g[tok].to(a.dtype), S, product_dtype=p.engine.product_dtype))
        if sums is not None:  # <db_i, db_j>, db_i the sum of row i's output gradients
            flat_gram(K, sel(sums))


# ------------------------------------------------------------- weight gradients from the rows
def rows_module(p: Pass, name: str) -> bool:
    """Whether ``weight_grads="rows"`` applies to module ``name``: a plain ``nn.Linear``
    (``forward`` not overridden, not a tied LM head) with float32/float64 weights whose
    per-sample method is chosen (``linear_method`` ``"auto"`` by count, or
    ``"per_sample"``), and not small at every call of packed rows."""
    e = p.engine
    mod, kind, names = e.plan.modules[name]
    if p.small.now is not None and name in p.small.now:
        return False  # every call of the packed rows is small: batched, the host's dW
    return (e.options.weight_grads == "rows" and kind == "linear"
            and e.linear_method in ("auto", "per_sample")
            and type(mod).forward is nn.Linear.forward and "forward" not in vars(mod)
            and "weight" in names and name not in e.embedding_of_head
            and mod.weight.dtype in (torch.float32, torch.float64))


def rows_call(p: Pass, name: str, x: torch.Tensor) -> bool:
    """Whether this call of a ``weight_grads="rows"`` Linear takes that path: input in the
    weight's dtype, autocast off or to that same dtype (so that it casts nothing: FSDP2 bf16
    mixed precision, which unshards bf16 weights), a bf16/fp16 call only on a device
    of ``rows.ROWS_LOW_PRECISION_DEVICE_TYPES`` (its rows in float32), not small, and
    (``linear_method="auto"``) per-sample chosen by count."""
    mod = p.engine.plan.modules[name][0]
    try:  # never raise into the host's forward: on any doubt the module keeps the tap path
        dev = x.device.type
        if x.dtype != mod.weight.dtype or (torch.is_autocast_enabled(dev)
                                           and torch.get_autocast_dtype(dev) != x.dtype):
            return False
        if not rows_allowed(x.dtype, dev):
            return False
        if small_linear_tokens(p, name, x) is not None:
            return False  # batched at flush, with the host's dW
        if p.engine.linear_method == "per_sample":
            return True
        packed = p.packed is not None and p.packed.is_packed(x)
        n = int(p.n or x.shape[0])
        T = p.packed.T if packed else x.numel() // max(1, n * x.shape[-1])
        d_out, d_in = mod.weight.shape
        return choose_linear_method(R=n, T=T, d_in=d_in, d_out=d_out) == "per_sample"
    except Exception:  # noqa: BLE001
        return False


class LinearFromRows(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose backward takes ``dW`` from the per-row gradients.

    The backward forms ``dx = grad W`` and ``db`` as autograd's linear does, and asks the pass
    for ``dW``: :func:`weight_grad_from_rows` forms the per-row gradients the Gram needs anyway
    and returns their sum, so the host's own ``grad^T x`` product is not formed a second time.
    If the pass has failed, ``dW`` is that product (the host's step never depends on the
    capture).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, call: Call, p: Pass) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.call, ctx.p, ctx.has_bias = call, p, bias is not None
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
            dw = weight_grad_from_rows(ctx.p, ctx.call, x, grad)
            if dw is None:
                dw = flat.T.mm(x.reshape(-1, x.shape[-1]))
        return dx, dw, db, None, None


def linear_forward(p: Pass, name: str, mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The capture's ``forward`` of a ``weight_grads="rows"`` Linear: :class:`LinearFromRows`
    for a call the pre-hook opened, ``nn.Linear.forward`` otherwise."""
    call = p.pending.pop(name, None)
    if call is None:
        return nn.Linear.forward(mod, x)  # type: ignore[arg-type]
    return LinearFromRows.apply(x, mod.weight, mod.bias, call, p)


def weight_grad_from_rows(p: Pass, call: Call, x: torch.Tensor,
                          grad: torch.Tensor) -> torch.Tensor | None:
    """Backward of :class:`LinearFromRows`: add the call's Grams, return ``dW`` (``None``
    when the pass has failed: the caller then forms the host's own product)."""
    if p.failed:
        return None
    p.counts[call.name] += 1
    p.busy = True
    try:
        mod = p.engine.plan.modules[call.name][0]
        dW = guard(p, f"module {call.name!r} ({type(mod).__name__})",
                   functools.partial(_rows_grad, p, call.name, x, grad))
        if dW is not None:
            p.from_rows.add(call.name)
        return dW
    finally:
        p.busy = False


def _rows_grad(p: Pass, name: str, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    assert p.acc is not None and p.n is not None
    e = p.engine
    segments = None
    if p.packed is not None and p.packed.is_packed(grad):
        # the rows' own tokens of the packed sequence: no padded copy
        a = x.detach()[0, : p.packed.tokens]
        g = grad[0, : p.packed.tokens]
        segments = p.packed.bounds
    else:
        a = x.detach().reshape(p.n, -1, x.shape[-1])
        g = grad.reshape(p.n, -1, grad.shape[-1])
    blocks = list(zip(p.acc.K, p.acc.index, strict=True))
    dW = linear_weight_grad_and_gram(blocks, a, g.to(a.dtype), chunk_size=e.chunk,
                                     scratch=e.scratch, product_dtype=e.product_dtype,
                                     segments=segments)
    if "bias" in e.plan.modules[name][2]:
        if segments is not None:
            g = torch.stack([g[t0:t1].sum(dim=0) for t0, t1 in segments])[:, None]
        for _, K, sel in p.acc.each():
            bias_gram(K, sel(g))
    return dW
