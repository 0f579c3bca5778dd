"""An LM head computed outside its module, in vocabulary tiles: its term added tile by tile.

The tiled head (:func:`real_model.gram.head.head_logprobs`) and a host's fused head
(:mod:`.fused_head`) never call the ``lm_head`` module; they hand the pass the
gradient ``dy`` of the raw projection one vocabulary tile at a time. :func:`head_begin` finds
the head's trainable weight/bias (and a tied embedding), :func:`head_tile` adds one tile's
``<dW_i, dW_j>`` (and keeps the tied rows), :func:`head_end` counts the head once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernels import bias_gram
from ..linear_gram import choose_linear_method, linear_weight_gram, linear_weight_rows
from ..state import GramCaptureError, Pass, check_rows, guard

__all__ = ["HeadState", "head_begin", "head_tile", "head_end"]


@dataclass
class HeadState:
    """The head's per-tile bookkeeping (weight/bias trainable, tied embedding, method)."""

    name: str
    h: torch.Tensor  # [R, T, d] in the compute dtype
    weight: bool
    bias: bool
    method: str
    tied: str | None = None
    tied_rows: torch.Tensor | None = None
    tied_values: list[torch.Tensor] = field(default_factory=list)


def head_begin(p: Pass, weight: torch.Tensor, bias: torch.Tensor | None,
               h: torch.Tensor) -> HeadState | None:
    """Start the head's contribution for hidden states ``h`` ``[n, T, d]``; ``None`` when
    neither the weight nor the bias is a trainable parameter of this model (or on failure)."""
    if p.failed:
        return None
    return guard(p, "LM head", lambda: _head_state(p, weight, bias, h))


def _head_state(p: Pass, weight: torch.Tensor, bias: torch.Tensor | None,
                h: torch.Tensor) -> HeadState | None:
    e = p.engine
    owners = [m for m, _, n in e.plan.uses.get(id(weight), []) if n == "weight"]
    lin = [m for m in owners if e.plan.modules[m][1] == "linear"]
    has_b = bias is not None and id(bias) in e.plan.uses
    if not lin and not has_b:
        if owners:
            raise GramCaptureError(f"the head weight belongs to {owners} but to no Linear")
        return None
    name = lin[0] if lin else e.plan.uses[id(bias)][0][0]
    check_rows(p, name, h)
    if p.packed is not None and p.packed.is_packed(h):
        h = p.packed.unpack(h)
    R, T, d = h.shape
    V = weight.shape[0]
    method = e.linear_method
    if method == "auto":  # the whole head's shape, not one tile's
        method = choose_linear_method(R=R, T=T, d_in=d, d_out=V) or "per_sample"
    st = HeadState(name=name, h=h, weight=bool(lin), bias=has_b, method=method)
    st.tied = e.embedding_of_head.get(name)
    if st.tied is not None:
        if st.tied not in p.tied_rows:
            raise GramCaptureError(f"tied embedding {st.tied!r} was not called before the "
                                   "head")
        st.tied_rows = p.tied_rows[st.tied]
        assert p.acc is not None
        st.tied_values = [torch.zeros(sel(h).shape[0], st.tied_rows.numel(), d,
                                      dtype=h.dtype, device=h.device)
                          for _, _, sel in p.acc.each()]
    return st


def head_tile(p: Pass, st: HeadState | None, v0: int, v1: int, dy: torch.Tensor) -> None:
    """Add one tile: ``dy`` ``[n, T, v1 - v0]`` = gradient of the raw projection there."""
    if st is None or p.failed:
        return
    p.busy = True
    try:
        guard(p, "LM head", lambda: _head_tile(p, st, v0, v1, dy))
    finally:
        p.busy = False


def _head_tile(p: Pass, st: HeadState, v0: int, v1: int, dy: torch.Tensor) -> None:
    assert p.acc is not None
    e = p.engine
    if p.packed is not None and dy.shape[:2] != st.h.shape[:2] and p.packed.is_packed(dy):
        dy = p.packed.unpack(dy)
    cols = None
    if st.tied_rows is not None:
        lo, hi = torch.searchsorted(st.tied_rows, torch.tensor([v0, v1],
                                                               device=st.tied_rows.device))
        cols = (int(lo), int(hi))
    for b, K, sel in p.acc.each():
        hb, gb = sel(st.h), sel(dy)
        if st.weight:
            linear_weight_gram(K, hb, gb, method=st.method, chunk_size=e.chunk,
                               scratch=e.scratch, product_dtype=e.product_dtype)
        if st.bias:
            bias_gram(K, gb)
        if cols is not None and cols[1] > cols[0]:
            ids = st.tied_rows[cols[0]:cols[1]] - v0
            st.tied_values[b][:, cols[0]:cols[1]] = linear_weight_rows(hb, gb, ids)


def head_end(p: Pass, st: HeadState | None) -> None:
    """Finish the head: count it once; hand its tied rows to the embedding."""
    if st is None or p.failed:
        return
    p.counts[st.name] += 1
    if st.tied is not None:
        p.tied_values[st.tied] = st.tied_values
