"""The terms of small module calls, added together: several passes, one batched product per shape.

A *small* call (:data:`real_model.gram_capture.SMALL_CALL_ELEMENTS`) costs more in the fixed
price of its ~10 tensor operations than in arithmetic. :class:`real_model.gram_capture.GramCapture`
(``batch_small_calls=True``) keeps each small call's tensors as :class:`PassCalls`, one per pass
(one forward + backward over ``n`` rows; a trainer's micro-batch), and :func:`add_small_calls`
adds the terms of several passes at once, each into its own Gram blocks.

The calls of a pass lie on token *layouts* (``N`` tokens, each a row's); each (pass, layout)
pair is a *part*, and all parts are padded with zeros to the longest one, ``N_max`` tokens and
``n_max`` rows, and batched. With ``S_j`` ``[n_max, N_max]`` part ``j``'s token-to-row indicator
(``S_it = 1`` when token ``t`` is row ``i``'s), the calls of one ``(d_in, d_out)`` shape stacked in
*slots* ``m`` (slot ``m`` holds each part's ``m``-th call of that shape, zeros where it has
fewer), the part's per-row Gram is::

    K_j = S_j (sum_m (a_mj a_mj^T) * (delta_mj delta_mj^T)
               + sum_e [id_t = id_t'] (delta_ej delta_ej^T)) S_j^T  +  R_j R_j^T

the Linear identity (``docs/real_model_gram.md``; calls of one pass on the same input, such
as the q, k and v projections, are one call whose ``delta`` is theirs side by side: ``(a a^T) *
sum_m (delta_m delta_m^T) = (a a^T) * ([delta_1 ... delta_k] [delta_1 ... delta_k]^T)``, one
input kernel for all of them), the untied embedding's id-equality kernel
(tokens at its ``padding_idx`` left out), and the Gram of the per-row gradients ``R_j`` of the
norms (``S_j (delta * z)``, per slot) and of other leaves. A pass's Gram is the sum of its parts'
``K_j``; its blocks ``K_b`` are added from it. Zero padding adds nothing: every term is the
per-call term.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from real_model import gram_layers as gm

__all__ = ["PassCalls", "add_small_calls"]


@dataclass
class PassCalls:
    """The small calls one pass kept, and where their terms go.

    ``K`` and ``index``: the pass's float64 Gram blocks ``K_b`` ``[n_b, n_b]`` and their rows
    (a ``slice`` or a ``LongTensor`` of row indices among the pass's ``n`` rows). Each call's
    tokens lie on a *layout*: an object with ``tokens`` (``N``), ``n`` (the pass's rows) and
    ``row`` (``[N]`` long, the row of each token), e.g. :class:`real_model.gram_capture.PackedRows`.

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

    def layouts(self) -> list[Any]:
        """The distinct token layouts of the calls, in order of first use."""
        seen: dict[int, Any] = {}
        for entries in (self.linear, self.embedding, self.norms):
            for e in entries:
                seen.setdefault(id(e[0]), e[0])
        return list(seen.values())


def add_small_calls(passes: Sequence[PassCalls], *, chunk_size: int,
                    product_dtype: torch.dtype = torch.float64,
                    scratch: gm.Scratch | None = None) -> None:
    """Add every pass's small-call terms to its blocks ``K_b`` (module doc), at most
    ``chunk_size`` token-kernel entries formed at once. Token kernels and the rows' Gram in
    float64, or float32 products for a lower ``product_dtype`` (as ``gm.linear_token_kernel``
    and ``gm.flat_gram`` of :mod:`real_model.gram_layers`), summed in float64.

    >>> import torch
    >>> class Rows:  # one row of two tokens
    ...     tokens, n, row = 2, 1, torch.tensor([0, 0])
    >>> K = torch.zeros(1, 1, dtype=torch.float64)
    >>> a = torch.tensor([[1.0], [2.0]], dtype=torch.float64)  # d_in = 1
    >>> g = torch.tensor([[3.0], [-1.0]], dtype=torch.float64)  # d_out = 1
    >>> add_small_calls([PassCalls(1, [K], [slice(0, 1)], linear=[(Rows, a, g)])],
    ...                 chunk_size=1 << 20)
    >>> float(K)  # dW = 1 * 3 + 2 * (-1) = 1
    1.0
    """
    passes = [p for p in passes if p]
    if passes:
        _add(passes, chunk_size=chunk_size, product_dtype=product_dtype, scratch=scratch)


class _Parts:
    """The (pass, layout) parts of a batch of passes: each part's pass, the padded sizes
    ``N_max`` and ``n_max``, and each padded token's row (``token_row`` ``[P, N_max]``, 0 where
    padded; ``valid`` marks the part's own tokens)."""

    def __init__(self, passes: Sequence[PassCalls], device: torch.device) -> None:
        self.of: dict[tuple[int, int], int] = {}
        self.pass_of: list[int] = []
        layouts: list[Any] = []
        for i, p in enumerate(passes):
            for lay in p.layouts():
                self.of[(i, id(lay))] = len(layouts)
                self.pass_of.append(i)
                layouts.append(lay)
        self.P = len(layouts)
        self.n = max(p.n for p in passes)
        self.device = device
        pad = torch.nn.utils.rnn.pad_sequence
        rows = [lay.row.to(device) for lay in layouts]
        self.token_row = pad(rows, batch_first=True) if rows else torch.zeros(0, 0)
        self.valid = pad([torch.ones_like(r, dtype=torch.bool) for r in rows],
                         batch_first=True) if rows else torch.zeros(0, 0, dtype=torch.bool)
        self.N = int(self.token_row.shape[1])

    def indicator(self, dtype: torch.dtype) -> torch.Tensor:
        """``S`` ``[P, n_max, N_max]``: ``S[j, i, t] = 1`` when token ``t`` of part ``j`` is row
        ``i``'s (each column holds at most one 1)."""
        S = torch.zeros(self.P, self.n, self.N, dtype=dtype, device=self.device)
        return S.scatter_(1, self.token_row[:, None, :], self.valid[:, None, :].to(dtype))

    def row_sums(self, t: torch.Tensor) -> torch.Tensor:
        """``[P, N_max, ...]`` -> ``[passes, n_max, ...]``: each pass's rows' sums over their
        tokens (all parts of a pass; padded tokens must hold zeros)."""
        P, N = self.P, self.N
        index = (torch.tensor(self.pass_of, device=t.device)[:, None] * self.n
                 + self.token_row.to(t.device)).reshape(P * N)
        out = t.new_zeros(((max(self.pass_of) + 1) * self.n, *t.shape[2:]))
        out.index_add_(0, index, t.reshape(P * N, *t.shape[2:]))
        return out.reshape(-1, self.n, *t.shape[2:])


def _slots(parts: _Parts, calls: dict[int, list[torch.Tensor]], fill: Any = 0) -> torch.Tensor:
    """``[M, P, N_max, ...]``: slot ``m`` of part ``j`` holds part ``j``'s ``m``-th tensor
    (``calls[j]``, each ``[N_j, ...]``), ``fill`` beyond its tokens and where it has fewer."""
    first = next(iter(calls.values()))[0]
    M = max(len(c) for c in calls.values())
    empty = first.new_zeros((0, *first.shape[1:]))
    flat = [calls[j][m] if j in calls and m < len(calls[j]) else empty
            for m in range(M) for j in range(parts.P)]
    out = torch.nn.utils.rnn.pad_sequence(flat, batch_first=True, padding_value=fill)
    if out.shape[1] < parts.N:  # every tensor of this kind is shorter than the longest part
        out = torch.cat([out, out.new_full((out.shape[0], parts.N - out.shape[1],
                                            *out.shape[2:]), fill)], dim=1)
    return out.reshape(M, parts.P, parts.N, *first.shape[1:])


def _by_key(parts: _Parts, entries: Sequence[list[tuple]],
            key: Callable[[tuple], Any]) -> dict[Any, dict[int, list[tuple]]]:
    """Per key, per part, its entries (``entries[i]``: pass ``i``'s) in call order."""
    out: dict[Any, dict[int, list[tuple]]] = {}
    for i, pass_entries in enumerate(entries):
        for e in pass_entries:
            out.setdefault(key(e), {}).setdefault(parts.of[(i, id(e[0]))], []).append(e)
    return out


def _field(calls: dict[int, list[tuple]], k: int) -> dict[int, list[Any]]:
    return {j: [e[k] for e in c] for j, c in calls.items()}


def _add(passes: Sequence[PassCalls], *, chunk_size: int, product_dtype: torch.dtype,
         scratch: gm.Scratch | None) -> None:
    dev = passes[0].K[0].device
    parts = _Parts(passes, dev)
    K = torch.zeros(len(passes), parts.n, parts.n, dtype=torch.float64, device=dev)
    if parts.P and parts.N:
        tok = torch.zeros(parts.P, parts.N, parts.N, dtype=torch.float64, device=dev)
        step = max(1, chunk_size // max(1, parts.P * parts.N * parts.N))
        linear = [_shared_inputs(p.linear) for p in passes]
        for calls in _by_key(parts, linear, lambda e: (e[1].shape[-1], e[2].shape[-1])).values():
            A, G = _slots(parts, _field(calls, 1)), _slots(parts, _field(calls, 2))
            for m0 in range(0, A.shape[0], step):
                tok += gm.linear_token_kernel(A[m0:m0 + step], G[m0:m0 + step],
                                              product_dtype=product_dtype).sum(dim=0)
        for calls in _by_key(parts, [p.embedding for p in passes],
                             lambda e: e[2].shape[-1]).values():
            keep = None  # padded tokens: zero delta, nothing to leave out
            if any(e[3] is not None for c in calls.values() for e in c):  # a padding_idx
                keep = _slots(parts, {j: [torch.ones_like(e[1], dtype=torch.bool)
                                          if e[3] is None else e[3] for e in c]
                                      for j, c in calls.items()}, fill=False)
            ids, G = _slots(parts, _field(calls, 1), fill=-1), _slots(parts, _field(calls, 2))
            tok += gm.embedding_token_kernel(ids, G, keep=keep,
                                             product_dtype=product_dtype).sum(dim=0)
        S = parts.indicator(torch.float64)
        K.index_add_(0, torch.tensor(parts.pass_of, device=dev), S @ tok @ S.mT)
    norms = _by_key(parts, [p.norms for p in passes],
                    lambda e: (e[1].shape[-1], e[1].dtype, e[2].dtype))
    rows = [_norm_rows(parts, calls) for calls in norms.values()]
    for i, p in enumerate(passes):
        own = [r[i, : p.n] for r in rows] + p.rows
        if own:
            dt = functools.reduce(torch.promote_types, (r.dtype for r in own))
            gm.flat_gram(K[i, : p.n, : p.n], torch.cat([r.to(dt) for r in own], dim=1),
                         scratch, product_dtype=product_dtype)
        Ki = K[i, : p.n, : p.n]
        for idx, Kb in zip(p.index, p.K, strict=True):
            Kb.add_(Ki[idx][:, idx] if isinstance(idx, torch.Tensor) else Ki[idx, idx])


def _shared_inputs(linear: list[tuple[Any, torch.Tensor, torch.Tensor]]
                   ) -> list[tuple[Any, torch.Tensor, torch.Tensor]]:
    """One pass's Linear calls, those on the same input (same memory, shape, strides and
    version: the same values) merged into one whose ``delta`` is theirs side by side."""
    groups: dict[tuple, list[tuple[Any, torch.Tensor, torch.Tensor]]] = {}
    for e in linear:
        a = e[1]
        key = (id(e[0]), a.data_ptr(), tuple(a.shape), a.stride(), a._version, a.dtype,
               e[2].dtype)
        groups.setdefault(key, []).append(e)
    return [c[0] if len(c) == 1 else (c[0][0], c[0][1], torch.cat([g for _, _, g in c], dim=-1))
            for c in groups.values()]


def _norm_rows(parts: _Parts, calls: dict[int, list[tuple]]) -> torch.Tensor:
    """``[passes, n_max, M d]``: each row's sum of ``delta * z`` over its tokens, per slot ``m``."""
    D, Z = _slots(parts, _field(calls, 1)), _slots(parts, _field(calls, 2))
    M, P, N, d = D.shape
    return parts.row_sums((D * Z.to(D.dtype)).permute(1, 2, 0, 3).reshape(P, N, M * d))
