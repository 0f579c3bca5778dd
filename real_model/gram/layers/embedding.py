"""``nn.Embedding``: ``<E_i, E_j> = sum_{t,t'} [id_it = id_jt'] (delta_it . delta_jt')``.

An embedding call's input is integer ids, so its term is added from its output gradient alone
(the capture's gradient hook, no input tap): :func:`add_embedding` by
:func:`embedding_rows_gram`. When the weight is tied to the LM head, the parameter's per-row
gradient is ``H_i + E_i``: the head's rows at the batch's ids (:mod:`.linear`, :mod:`.head`)
give the cross terms. A small untied call waits for the pass's flush
(:func:`real_model.gram.small_calls.defer_embedding`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ..kernels import Scratch, flat_gram, id_equality, identity_kernel, token_gram
from ..registry import register
from ..small_calls import defer_embedding
from ..state import Call, GramCaptureError, Pass, guarded_call

__all__ = ["Embedding", "add_embedding", "unpacked_ids", "embedding_rows_gram",
           "embedding_token_kernel"]


@register(nn.Embedding)
class Embedding:
    """The rule of ``nn.Embedding`` (without ``max_norm`` or ``scale_grad_by_freq``)."""

    kind = "embedding"

    @staticmethod
    def check(name: str, module: nn.Module, params: list[str]) -> None:
        if module.max_norm is not None or module.scale_grad_by_freq:
            raise ValueError(
                f"module {name!r} ({type(module).__name__}) uses max_norm/scale_grad_by_freq: "
                "not supported by the exact Gram"
            )

    @staticmethod
    def contribute(p: Pass, call: Call, mod: nn.Module, names: list[str], x: Any,
                   delta: torch.Tensor, host_fn: Any) -> None:
        """One call's term (deferred when small and untied; packed rows unpacked)."""
        if defer_embedding(p, call.name, mod, x, delta):
            return
        if p.packed is not None and p.packed.is_packed(delta):
            x, delta = unpacked_ids(p, x), p.packed.unpack(delta)
        guarded_call(p, call.name, mod, functools.partial(add_embedding, p, call.name, mod, x,
                                                          delta))


def unpacked_ids(p: Pass, ids: torch.Tensor) -> torch.Tensor:
    """Packed token ids laid out batch-first; padded slots repeat an id of the batch (their
    gradient is zero, and the tied head's rows then cover every id)."""
    if p.packed is None or not p.packed.is_packed(ids) or p.packed.tokens == 0:
        return ids
    return p.packed.unpack(ids, fill=ids[0, 0])


def add_embedding(p: Pass, name: str, mod: nn.Module, ids: torch.Tensor,
                  delta: torch.Tensor) -> None:
    """``<E_i, E_j> = sum_{t,t'} [id_it = id_jt'] (delta_it . delta_jt')`` (+ tied terms)."""
    assert p.acc is not None
    e = p.engine
    ids = ids.reshape(p.n, -1)
    g = delta.reshape(p.n, ids.shape[1], -1)
    tied = name in p.tied_rows
    values = p.tied_values.pop(name, None)
    if tied and values is None and _head_counted(p, name):
        raise GramCaptureError(f"tied head of {name!r} gave no gradient rows before the "
                               "embedding's gradient arrived")
    for b, K, sel in p.acc.each():
        embedding_rows_gram(
            K, sel(ids), sel(g), chunk_size=e.chunk, padding_idx=mod.padding_idx,
            tied_rows=p.tied_rows.get(name) if values is not None else None,
            tied_values=None if values is None else values[b],
            scratch=e.scratch, product_dtype=e.product_dtype,
        )


def _head_counted(p: Pass, emb: str) -> bool:
    """Whether the head tied to embedding ``emb`` has already added its contribution."""
    return any(p.counts.get(lin, 0) > 0 for e, lin in p.engine.plan.tied.values() if e == emb)


def embedding_token_kernel(ids: torch.Tensor, delta: torch.Tensor, *,
                           keep: torch.Tensor | None = None,
                           product_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The embedding's token kernel ``[id_t = id_t'] (delta_t . delta_t')``, float64 ``[..., N,
    N]`` for ``ids`` ``[..., N]`` and ``delta`` ``[..., N, d]`` (leading axes batched); tokens
    with ``keep`` False (e.g. at ``padding_idx``) left out. Summed over row ``i``'s and row
    ``j``'s tokens it is ``<E_i, E_j>`` of :func:`embedding_rows_gram` (which forms the same Gram
    by scattering)."""
    return identity_kernel(id_equality(ids, keep),
                           token_gram(delta, product_dtype=product_dtype))


def embedding_rows_gram(
    K: torch.Tensor,
    ids: torch.Tensor,
    delta: torch.Tensor,
    *,
    chunk_size: int,
    padding_idx: int | None,
    tied_rows: torch.Tensor | None = None,
    tied_values: torch.Tensor | None = None,
    scratch: Scratch | None = None,
    product_dtype: torch.dtype = torch.float64,
) -> None:
    """Add the Gram of per-sample embedding gradients ``E_i = sum_t onehot(id_it) delta_it^T``.

    Equivalent to ``<E_i, E_j> = sum_{t,t'} [id_it == id_jt'] (delta_it . delta_jt')``; computed by
    scattering each rollout's ``delta`` into the rows ``U`` of the distinct ids of the batch (chunks
    of rows), so the cost is ``R T d + R^2 |U| d``.

    Tied embeddings: when the same matrix also serves as a Linear weight (the LM head), its
    per-rollout gradient is ``H_i + E_i`` and the Gram needs the cross terms too. ``tied_rows``
    (sorted ids, ``[U]``) and ``tied_values`` (``H_i[U]``, ``[R, U, d]``) carry the head's
    per-sample gradient on those rows; this function then adds
    ``<E_i, E_j> + <H_i[U], E_j[U]> + <E_i[U], H_j[U]>`` (the ``<H_i, H_j>`` part is added by the
    Linear path), read from the ``[2R, 2R]`` Gram of the stacked rows ``[H[U]; E]``.

    The rows ``E_i`` are formed in float64 for ``product_dtype=float64`` and in float32 otherwise
    (each entry a sum of the few ``delta`` of one id in one row, as the host's own float32 embedding
    backward sums them); their Gram goes through :func:`flat_gram` with ``product_dtype``.

    Args:
        K: ``[R, R]`` float64 accumulator.
        ids: ``[R, T]`` token ids fed to the embedding.
        delta: ``[R, T, d]`` gradients w.r.t. the embedding output.
        chunk_size: bound on the entries of one ``[R, c, d]`` block (``[2R, c, d]`` when tied).
        padding_idx: the embedding's ``padding_idx`` (its row receives no gradient) or ``None``.
        tied_rows: sorted distinct ids at which ``tied_values`` is given, or ``None``.
        tied_values: ``[R, len(tied_rows), d]`` or ``None``.
        scratch: work buffers reused across calls (the rows block).
        product_dtype: dtype of the rows and their Gram products (see :func:`flat_gram`).
    """
    R, T = ids.shape
    d = delta.shape[-1]
    if tied_rows is not None:
        uniq = tied_rows
        inv = torch.searchsorted(uniq, ids.reshape(-1)).reshape(R, T)
        if not bool((uniq[inv.clamp(max=uniq.numel() - 1)] == ids).all()):
            raise RuntimeError("tied embedding rows do not cover the embedding input ids")
    else:
        uniq, inv = torch.unique(ids, sorted=True, return_inverse=True)
    work = torch.float64 if product_dtype == torch.float64 else torch.float32
    g = delta.reshape(R * T, d).to(work)
    inv = inv.reshape(-1)
    r_idx = torch.arange(R, device=ids.device).repeat_interleave(T)
    if padding_idx is not None:
        keep = ids.reshape(-1) != padding_idx
        g, inv, r_idx = g[keep], inv[keep], r_idx[keep]
    n_u = uniq.numel()
    stack = 2 if tied_values is not None else 1
    rows = max(1, chunk_size // max(1, stack * R * d))
    scratch = scratch if scratch is not None else Scratch()
    for u0 in range(0, n_u, rows):
        u1 = min(n_u, u0 + rows)
        n = u1 - u0
        X = scratch.get("embedding_rows", stack * R * n * d, work, delta.device)
        X = X.view(stack, R, n, d)
        E = X[-1]
        E.zero_()
        idx, vals = r_idx * n + (inv - u0), g
        if n < n_u:  # this chunk's ids only (one chunk: every kept token, no mask)
            sel = (inv >= u0) & (inv < u1)
            idx, vals = idx[sel], vals[sel]
        E.view(R * n, d).index_add_(0, idx, vals)
        if tied_values is None:
            flat_gram(K, E.view(R, -1), scratch, product_dtype=product_dtype)
            continue
        X[0].copy_(tied_values[:, u0:u1])
        G = torch.zeros(2 * R, 2 * R, dtype=torch.float64, device=K.device)
        flat_gram(G, X.view(2 * R, -1), scratch, product_dtype=product_dtype)
        K.add_(G[R:, R:] + G[:R, R:] + G[R:, :R])
