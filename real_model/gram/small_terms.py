"""The terms of a pass's small module calls, added together after its backward.

A *small* call (:mod:`real_model.gram.small_calls`) costs more in the fixed price of its tensor
operations than in arithmetic. :class:`real_model.gram.GramCapture` (``batch_small_calls=True``)
keeps each small call's tensors as :class:`PassCalls`, one per pass
(one forward + backward over ``n`` rows; a trainer's micro-batch), and :func:`add_small_calls`
adds their terms with a few operations per distinct input rather than ten per call.

The calls of a pass lie on token *layouts* (``N`` tokens, each a row's). With ``S`` ``[n, N]``
a layout's token-to-row indicator (``S_it = 1`` when token ``t`` is row ``i``'s), every small
call's per-row gradient is ``sum_{t in i} delta_t a_t^T`` for some per-token ``a_t`` and
``delta_t``, so the layout's part of the pass's Gram is (``docs/real_model_gram.md``)::

    K = S (sum_c (a_c a_c^T) * (delta_c delta_c^T)) S^T  +  R R^T

with, per call ``c``: a Linear's input and output gradient; an untied embedding's one-hot ids
(``a a^T`` the id-equality kernel ``[id_t = id_t']``, tokens at its ``padding_idx`` left out) and
output gradient; a ``weight * z`` norm's ``a = 1`` and ``delta * z``; ``R`` the per-row
gradients of the other leaves. Calls on one input (the q, k and v projections; gate and up) share
their input kernel: ``(a a^T) * sum_m (delta_m delta_m^T) = (a a^T) * ([delta_1 ... delta_k]
[delta_1 ... delta_k]^T)``, one product for all of them; the norms likewise (``a = 1``). The
factors are :func:`real_model.gram.kernels.token_gram`, combined by
:func:`real_model.gram.kernels.identity_kernel`, at most ``chunk_size`` kernel entries at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .kernels import Scratch, flat_gram, id_equality, identity_kernel, token_gram

__all__ = ["PassCalls", "add_small_calls"]


@dataclass
class PassCalls:
    """The small calls one pass kept, and where their terms go.

    ``K`` and ``index``: the pass's float64 Gram blocks ``K_b`` ``[n_b, n_b]`` and their rows
    (a ``slice`` or a ``LongTensor`` of row indices among the pass's ``n`` rows). Each call's
    tokens lie on a *layout*: an object with ``tokens`` (``N``), ``n`` (the pass's rows) and
    ``indicator(dtype, device)`` (``S``, ``[n, N]``), e.g.
    :class:`real_model.gram.packed.PackedRows`.

    * ``linear``: ``(layout, a [N, d_in], delta [N, d_out])`` of a weight-only Linear call;
    * ``embedding``: ``(layout, ids [N], delta [N, d], keep [N] or None)`` of an untied embedding;
    * ``norms``: ``(layout, delta [N, d], z [N, d])`` of an ``out = weight * z`` norm call;
    * ``rows``: per-row gradients ``[n, p]`` of other leaves.
    """

    n: int
    K: list[torch.Tensor]
    index: list[slice | torch.Tensor]
    linear: list[tuple[Any, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    embedding: list[tuple[Any, torch.Tensor, torch.Tensor, Any]] = field(default_factory=list)
    norms: list[tuple[Any, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.linear or self.embedding or self.norms or self.rows)


def add_small_calls(passes: Sequence[PassCalls], *, chunk_size: int,
                    product_dtype: torch.dtype = torch.float64,
                    scratch: Scratch | None = None) -> None:
    """Add every pass's small-call terms to its blocks ``K_b`` (module doc), at most
    ``chunk_size`` token-kernel entries formed at once. Token kernels and the rows' Gram in
    float64, or float32 products for a lower ``product_dtype`` (as ``token_gram`` and
    ``flat_gram`` of :mod:`real_model.gram.kernels`), summed in float64.

    >>> import torch
    >>> class Rows:  # one row of two tokens
    ...     tokens, n = 2, 1
    ...     def indicator(dtype, device):
    ...         return torch.ones(1, 2, dtype=dtype)
    >>> K = torch.zeros(1, 1, dtype=torch.float64)
    >>> a = torch.tensor([[1.0], [2.0]], dtype=torch.float64)  # d_in = 1
    >>> g = torch.tensor([[3.0], [-1.0]], dtype=torch.float64)  # d_out = 1
    >>> add_small_calls([PassCalls(1, [K], [slice(0, 1)], linear=[(Rows, a, g)])],
    ...                 chunk_size=1 << 20)
    >>> float(K)  # dW = 1 * 3 + 2 * (-1) = 1
    1.0
    """
    for p in passes:
        if p:
            _add_pass(p, chunk_size=chunk_size, product_dtype=product_dtype, scratch=scratch)


def _add_pass(p: PassCalls, *, chunk_size: int, product_dtype: torch.dtype,
              scratch: Scratch | None) -> None:
    dev = p.K[0].device
    K = torch.zeros(p.n, p.n, dtype=torch.float64, device=dev)
    for layout, (inputs, grads) in _terms(p).items():
        N = int(layout.tokens)
        if not N:
            continue
        step = max(1, chunk_size // (N * N))
        tok = None
        for t0 in range(0, len(inputs), step):
            ka = torch.stack([_input_kernel(x, N, product_dtype, dev)
                              for x in inputs[t0:t0 + step]])
            kg = torch.stack([token_gram(g, product_dtype=product_dtype)
                              for g in grads[t0:t0 + step]])
            part = identity_kernel(ka, kg, sum_dim=0)
            tok = part if tok is None else tok.add_(part)
        S = layout.indicator(torch.float64, dev)
        K += S @ tok @ S.T
    if p.rows:
        dt = functools.reduce(torch.promote_types, (r.dtype for r in p.rows))
        flat_gram(K, torch.cat([r.to(dt) for r in p.rows], dim=1), scratch,
                     product_dtype=product_dtype)
    for idx, Kb in zip(p.index, p.K, strict=True):
        Kb.add_(K[idx][:, idx] if isinstance(idx, torch.Tensor) else K[idx, idx])


def _input_kernel(x: Any, N: int, product_dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """A term's input kernel ``a a^T``: of a Linear's input ``a`` (a tensor), of an embedding's
    one-hot ids (``(ids, keep)``: the id-equality kernel), of a norm's ``a = 1`` (``None``)."""
    if isinstance(x, torch.Tensor):
        return token_gram(x, product_dtype=product_dtype)
    if x is None:
        return torch.ones(N, N, dtype=torch.bool, device=device)
    return id_equality(*x)


def _terms(p: PassCalls) -> dict[Any, tuple[list[Any], list[torch.Tensor]]]:
    """Per layout, its terms as (inputs, output gradients): one per distinct Linear input (same
    memory, shape, strides and version: the same values) with the output gradients of its calls
    side by side, one per embedding call, one for all the norms (``a = 1``, ``delta * z`` side
    by side)."""
    terms: dict[Any, list[tuple[Any, list[torch.Tensor]]]] = {}
    shared: dict[tuple, list[torch.Tensor]] = {}
    for layout, a, g in p.linear:
        key = (id(layout), a.data_ptr(), a.shape, a.stride(), a._version, a.dtype, g.dtype)
        grads = shared.get(key)
        if grads is None:
            grads = shared[key] = []
            terms.setdefault(layout, []).append((a, grads))
        grads.append(g)
    for layout, ids, g, keep in p.embedding:
        terms.setdefault(layout, []).append(((ids, keep), [g]))
    norms: dict[tuple, list[torch.Tensor]] = {}
    for layout, d, z in p.norms:
        norms.setdefault((layout, d.dtype), []).append(d * z.to(d.dtype))
    for (layout, _), h in norms.items():
        terms.setdefault(layout, []).append((None, h))
    return {layout: ([x for x, _ in ts], [g[0] if len(g) == 1 else torch.cat(g, dim=-1)
                                           for _, g in ts])
            for layout, ts in terms.items()}
