"""Per-module Gram contributions for :mod:`real_model.gram` and :mod:`real_model.gram_capture`.

Every function adds, in place, one parameter tensor's contribution ``<g_i, g_j>`` to an ``[R, R]``
float64 accumulator ``K``, where ``g_i`` is rollout ``i``'s gradient of that parameter. The inputs
are the captured per-rollout module inputs ``a`` and output gradients ``delta`` of ONE batched
backward pass (batch axis first, one row per rollout).

Shapes: ``R`` rollouts, ``T`` flattened positions per rollout, ``d_in``/``d_out`` feature sizes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from real_model import gram_triton

__all__ = [
    "Scratch",
    "CPU_CHUNK_SIZE",
    "default_chunk_size",
    "gram_f32",
    "linear_weight_gram",
    "choose_linear_method",
    "LINEAR_METHODS",
    "linear_identity_cost",
    "linear_per_sample_cost",
    "linear_weight_gram_identity",
    "linear_weight_gram_identity_packed",
    "linear_weight_gram_per_sample",
    "linear_weight_grad_and_gram",
    "GROUPED_DTYPES",
    "GROUPED_DEVICE_TYPES",
    "grouped_offsets",
    "packed_row_products",
    "consecutive_lengths",
    "ROWS_LOW_PRECISION_DEVICE_TYPES",
    "float32_products",
    "rows_allowed",
    "linear_weight_rows",
    "add_to_blocks",
    "bias_gram",
    "embedding_rows_gram",
    "generic_per_sample_grads",
    "fast_leaf_grads",
    "flat_gram",
]


class Scratch:
    """Reusable flat work buffers (one per name, grown on demand).

    Re-allocating large blocks for every layer costs a page fault per page on CPU; reusing them
    keeps the per-layer work at the cost of the arithmetic.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat buffer of at least ``numel`` entries (contents undefined)."""
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            self._bufs.pop(name, None)
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._bufs[name] = buf
        return buf[:numel]


CPU_CHUNK_SIZE = 1 << 23
"""Entries of one temporary block on CPU (64 MiB in float64): large enough that the per-block
overhead is negligible against the GEMMs, small enough to stay out of the page-fault regime that
re-allocating huge blocks per layer costs (measured on the SmolLM2 benchmark)."""

_GPU_CHUNK_MIN, _GPU_CHUNK_MAX = 1 << 22, 1 << 28
CPU_SLAB_BYTES = 1 << 20
"""float64 column slab of :func:`flat_gram` on single-threaded CPU (cache-sized)."""
CPU_SLAB_BYTES_THREADED = 1 << 24
"""float64 column slab of :func:`flat_gram` on multi-threaded CPU: 16x fewer parallel regions
than :data:`CPU_SLAB_BYTES` (each costs a thread barrier, which a loaded machine makes expensive).
Measured on [8, 2^24] float32 rows, quiet 2-core machine, 2 threads: 0.155 s, against 0.165 s with
1 MiB slabs and 0.31 s for one float64 copy + one GEMM; in the SmolLM2 benchmark (R=8, T=256)
exact / plain went from 1.16x (one copy + GEMM) to 1.09x. Single-threaded, 1 MiB slabs measured
1.09x there and 16 MiB ones 1.13x."""


def default_chunk_size(device: torch.device) -> int:
    """Entries of one temporary block: :data:`CPU_CHUNK_SIZE` on CPU; on CUDA from free memory.

    On CUDA: a quarter of the free memory (driver-free plus the allocator's cached, unused
    bytes) in float64 entries, clamped to ``[2^22, 2^28]`` (2^28 was the fastest setting measured
    on an H100 at the Nemotron-Mini-4B shape, commit 5032bb7). Called during the backward, when the
    activations of the forward still occupy memory.
    """
    if device.type != "cuda":
        return CPU_CHUNK_SIZE
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(min(_GPU_CHUNK_MAX, max(_GPU_CHUNK_MIN, free // 4 // 8)))


_LOW = (torch.bfloat16, torch.float16)
_OUT_DTYPE_OK: dict[tuple[str, torch.dtype], bool] = {}


def gram_f32(x: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
    """``x x^T`` in float32 for ``x`` ``[R, n]`` (float32, bfloat16 or float16).

    Low-precision rows are multiplied straight from their storage with float32 accumulation and
    output (``torch.mm(..., out_dtype=torch.float32)``) where the backend has it (CUDA); elsewhere
    (CPU, older builds) the rows are copied to float32 first, which gives the same products up to
    the summation order. The products of two bf16/fp16 numbers are exact in float32, so the two
    paths differ only by float32 rounding of the sums.
    """
    if x.dtype in _LOW:
        key = (x.device.type, x.dtype)
        if _OUT_DTYPE_OK.get(key, x.device.type == "cuda"):
            try:
                out = torch.mm(x, x.T, out_dtype=torch.float32)
                _OUT_DTYPE_OK[key] = True
                return out
            except (RuntimeError, NotImplementedError, TypeError):
                _OUT_DTYPE_OK[key] = False
        if scratch is not None:
            f = scratch.get("prod_float32", x.numel(), torch.float32, x.device).view(x.shape)
            f.copy_(x)
        else:
            f = x.float()
        return f @ f.T
    return x.float() @ x.float().T


CPU_F32_SLAB = 1 << 14
"""Columns of one float32 product of :func:`flat_gram` on CPU, each slab's ``[R, R]`` summed into
the float64 ``K``: the float32 sums then run over at most 2^14 terms. Measured on correlated
``[4, 576 * 1536]`` float32 rows (quiet 2-core machine, 2 threads): largest error against float64
products ``2.1e-8 * |g_i| |g_j|`` (below the float32 rounding of the rows themselves, ``6e-8``),
2.9 ms per call as a loop over the slabs (0.9 ms as the one batched product used here), against
14.8 ms for float64 products; one float32 product over all columns: 1.3 ms but ``6.9e-6``; 2^16
columns: 2.0 ms, ``1.9e-7``."""


def flat_gram(
    K: torch.Tensor,
    flat: torch.Tensor,
    scratch: Scratch | None = None,
    *,
    product_dtype: torch.dtype = torch.float64,
) -> None:
    """``K += flat flat^T`` for ``flat`` shaped ``[R, n]``; ``K`` (float64) accumulates the blocks.

    The block product runs in ``product_dtype``: float64 (default), or float32, which is enough for
    gradients that are themselves bfloat16/float16 and much cheaper on a GPU; bfloat16/float16
    rows then go through :func:`gram_f32` without a float32 copy where the backend allows it. On
    CPU, float32 products of float32 rows run in slabs of :data:`CPU_F32_SLAB` columns, each summed
    into ``K`` in float64 (float32 accumulation error below the rows' own rounding).
    """
    if product_dtype != torch.float64:
        R, n = flat.shape
        m = n // CPU_F32_SLAB if flat.device.type == "cpu" and flat.dtype == torch.float32 else 0
        if m:  # one batched product over the slabs, [m, R, R], summed in float64
            x = flat[:, : m * CPU_F32_SLAB].reshape(R, m, CPU_F32_SLAB).transpose(0, 1)
            K.add_(torch.bmm(x, x.transpose(1, 2)).to(torch.float64).sum(dim=0))
        if m * CPU_F32_SLAB < n or not m:
            K.add_(gram_f32(flat[:, m * CPU_F32_SLAB :], scratch).to(torch.float64))
        return
    if flat.dtype == torch.float64:
        K.addmm_(flat, flat.T)
        return
    R, n = flat.shape
    # CPU: widen to float64 in column slabs, so the rows are read once from memory instead of
    # written and re-read as a full float64 copy (2x faster); cache-sized single-threaded, larger
    # with several threads (see CPU_SLAB_BYTES_THREADED). On a GPU fewer, larger kernels win: one
    # copy, one GEMM there.
    if flat.device.type == "cpu":
        slab_bytes = CPU_SLAB_BYTES if torch.get_num_threads() == 1 else CPU_SLAB_BYTES_THREADED
        slab = min(n, max(1024, slab_bytes // (8 * R)))
    else:
        slab = n
    if scratch is None:
        buf = torch.empty(R * slab, dtype=torch.float64, device=flat.device)
    else:
        buf = scratch.get("prod_float64", R * slab, torch.float64, flat.device)
    for c0 in range(0, n, slab):
        c = min(slab, n - c0)
        f = buf[: R * c].view(R, c)
        f.copy_(flat[:, c0 : c0 + c])
        K.addmm_(f, f.T)


def linear_identity_cost(*, R: int, T: int, d_in: int, d_out: int) -> float:
    """Multiply-adds of the activation/backprop identity: ``(R T)^2 (d_in + d_out)`` (float64)."""
    return 2.0 * float(R * T) ** 2 * (d_in + d_out)


def linear_per_sample_cost(*, R: int, T: int, d_in: int, d_out: int) -> float:
    """Multiply-adds of explicit per-sample gradients plus their float64 Gram."""
    return float(R * T) * d_in * d_out + 2.0 * float(R) ** 2 * d_in * d_out + 4.0 * R * d_in * d_out


def _kernel_dtype(product_dtype: torch.dtype) -> torch.dtype:
    """Dtype of the identity's token kernels: float64 for float64 products, else float32 (as
    :func:`flat_gram`, any lower ``product_dtype`` multiplies in float32)."""
    return torch.float64 if product_dtype == torch.float64 else torch.float32


def linear_weight_gram_identity(
    K: torch.Tensor, a: torch.Tensor, delta: torch.Tensor, *, chunk_size: int,
    product_dtype: torch.dtype = torch.float64,
) -> None:
    """Add ``<dW_i, dW_j> = sum_{t,t'} (delta_it . delta_jt') (a_it . a_jt')`` to ``K``.

    Args:
        K: ``[R, R]`` float64 accumulator.
        a: ``[R, T, d_in]`` layer inputs.
        delta: ``[R, T, d_out]`` gradients of the summed loss w.r.t. the layer outputs.
        chunk_size: at most about this many entries per temporary ``[c T, R T]`` block.
        product_dtype: dtype of the token kernels ``a a^T`` and ``delta delta^T`` (float64, or
            float32: each entry a float32 sum of ``d`` products, the two kernels multiplied in
            float32 and summed over token pairs in float64).
    """
    R, T, _ = a.shape
    dt = _kernel_dtype(product_dtype)
    ad = a.to(dt).reshape(R * T, -1)
    gd = delta.to(dt).reshape(R * T, -1)
    rows = max(1, chunk_size // max(1, R * T * T))
    for i0 in range(0, R, rows):
        i1 = min(R, i0 + rows)
        blk = (ad[i0 * T : i1 * T] @ ad.T).mul_(gd[i0 * T : i1 * T] @ gd.T)  # [(i1-i0) T, R T]
        K[i0:i1].add_(blk.to(torch.float64).reshape(i1 - i0, T, R, T).sum(dim=(1, 3)))


def linear_weight_gram_identity_packed(
    a: torch.Tensor, delta: torch.Tensor, indicator: torch.Tensor, *,
    product_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``<dW_i, dW_j> = sum_{t in i, t' in j} (delta_t . delta_t') (a_t . a_t')`` of packed rows.

    The identity of :func:`linear_weight_gram_identity` on the rows' own tokens, packed one after
    the other (no padded ``[n, T_max, ...]`` copy): ``S ((a a^T) * (delta delta^T)) S^T``.

    Args:
        a: ``[N, d_in]`` layer inputs of the ``N`` packed tokens; ``delta``: ``[N, d_out]``.
        indicator: ``S``, float64 ``[n, N]``: ``S_it = 1`` when token ``t`` is row ``i``'s.
        product_dtype: dtype of the token kernels ``a a^T`` and ``delta delta^T``: float64
            (default), or float32 (as :func:`flat_gram`'s float32 products: each kernel entry
            a float32 sum of ``d`` products, their product rounded to float32 once; the sums
            over tokens in float64).

    Returns:
        float64 ``[n, n]`` (memory ``N^2`` entries: the caller bounds ``N``).
    """
    return indicator @ linear_token_kernel(a, delta, product_dtype=product_dtype) @ indicator.T


def token_gram(t: torch.Tensor, *, product_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``t t^T`` over the last two axes, ``[..., N, d] -> [..., N, N]``: one factor of a token
    kernel (:func:`identity_kernel`), in float64, or float32 for any lower ``product_dtype`` (as
    :func:`linear_weight_gram_identity_packed`: each entry a sum of ``d`` products)."""
    dt = _kernel_dtype(product_dtype)
    td = t if t.dtype == dt else t.to(dt)
    return td @ td.mT


def identity_kernel(input_kernel: torch.Tensor, grad_kernel: torch.Tensor, *,
                    sum_dim: int | None = None) -> torch.Tensor:
    """The token kernel of a layer's weight gradient ``sum_t delta_t a_t^T``, float64
    ``[..., N, N]``: ``(a a^T) * (delta delta^T)`` from its two factors (``input_kernel`` ``a a^T``
    and ``grad_kernel`` ``delta delta^T``, e.g. :func:`token_gram`, rounded to their dtype once
    more by the product); ``sum_dim``: the kernels of several calls stacked on that axis, summed
    (in float64). Its sum over row ``i``'s and row ``j``'s tokens is ``<dW_i, dW_j>``.
    Any layer whose per-token gradient is such an outer product has one: a Linear (:func:`
    linear_token_kernel`), an embedding (``a`` the one-hot of the token id, ``a a^T`` the
    id-equality kernel: :func:`embedding_token_kernel`), a ``weight * z`` norm (``a = 1``,
    ``delta * z`` for ``delta``)."""
    product = input_kernel * grad_kernel
    if sum_dim is not None:
        return product.sum(dim=sum_dim, dtype=torch.float64)
    return product.to(torch.float64)


def linear_token_kernel(a: torch.Tensor, delta: torch.Tensor, *,
                        product_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The Linear identity's token kernel ``(a a^T) * (delta delta^T)``, float64: ``[..., N, N]``
    for ``a`` ``[..., N, d_in]`` and ``delta`` ``[..., N, d_out]`` (leading axes batched, e.g. the
    calls of one shape stacked); ``<dW_i, dW_j>`` is its sum over row ``i``'s and row ``j``'s
    tokens. Kernels in float64, or float32 for any lower ``product_dtype`` (as
    :func:`linear_weight_gram_identity_packed`)."""
    return identity_kernel(token_gram(a, product_dtype=product_dtype),
                           token_gram(delta, product_dtype=product_dtype))


def id_equality(ids: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``[id_t = id_t']``, bool ``[..., N, N]`` for ``ids`` ``[..., N]``: the embedding's input
    kernel (its input is the one-hot of the id); tokens with ``keep`` False left out."""
    same = ids[..., :, None] == ids[..., None, :]
    if keep is not None:
        same &= keep[..., :, None] & keep[..., None, :]
    return same


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


def linear_weight_gram_per_sample(
    K: torch.Tensor,
    a: torch.Tensor,
    delta: torch.Tensor,
    *,
    chunk_size: int,
    scratch: Scratch | None = None,
    product_dtype: torch.dtype = torch.float64,
    contiguous: bool | None = None,
) -> None:
    """Add the Gram of explicit per-sample gradients ``dW_i = delta_i^T a_i`` to ``K``.

    The ``d_out`` rows are processed in chunks of ``c`` rows so that only ``[R, c, d_in]`` is ever
    materialised (``R c d_in <= chunk_size``); the per-sample products run in the layer's dtype
    (as autograd's own weight gradient does) and the Gram is accumulated in float64. On CUDA,
    each chunk of ``delta^T`` is first copied into a contiguous ``[R, c, T]`` block, so that every
    chunk's batched product has two contiguous row-major operands (a strided, transposed operand
    made cuBLAS pick a slow legacy kernel at the Nemotron-Mini-4B shape on an H100).
    ``contiguous`` forces that layout on (``True``) or off (``False``); ``None``: on CUDA only.
    """
    R, T, d_in = a.shape
    d_out = delta.shape[-1]
    delta = delta.to(a.dtype)
    rows = max(1, chunk_size // max(1, R * d_in))
    rows = min(rows, d_out)
    scratch = scratch if scratch is not None else Scratch()
    buf = scratch.get("per_sample", R * rows * d_in, a.dtype, a.device)
    gt = delta.transpose(1, 2)  # [R, d_out, T], strided
    if contiguous if contiguous is not None else a.device.type == "cuda":
        # one chunk of delta^T at a time ([R, c, T], smaller than the [R, c, d_in] output when
        # T < d_in): no second copy of a large delta such as the LM head's stays allocated
        gbuf = scratch.get("delta_t", R * rows * T, a.dtype, a.device)
        a = a.contiguous()
    else:  # CPU BLAS takes the transposed operand at no cost; the copy would only add traffic
        gbuf = None
    for o0 in range(0, d_out, rows):
        c = min(rows, d_out - o0)
        g = gt[:, o0 : o0 + c]
        if gbuf is not None:
            g = gbuf[: R * c * T].view(R, c, T).copy_(g)
        blk = buf[: R * c * d_in].view(R, c, d_in)
        torch.bmm(g, a, out=blk)  # per-sample gradient rows [R, c, d_in]
        flat_gram(K, blk.view(R, -1), scratch, product_dtype=product_dtype)


def linear_weight_grad_and_gram(
    blocks: list[tuple[torch.Tensor, slice | torch.Tensor]],
    a: torch.Tensor,
    delta: torch.Tensor,
    *,
    chunk_size: int,
    scratch: Scratch | None = None,
    product_dtype: torch.dtype = torch.float64,
    segments: list[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """The weight gradient ``dW = sum_i delta_i^T a_i`` from the per-row gradients, and their Grams.

    Forms each chunk of rows ``dW_i[o0:o1] = delta_i[:, o0:o1]^T a_i`` once (``[R, c, d_in]``,
    ``R c d_in <= chunk_size``), sums it over the rows into ``dW[o0:o1]`` and adds, for each
    ``(K_b, rows_b)`` of ``blocks``, the Gram of the rows ``rows_b`` to ``K_b``. Blocks of
    consecutive rows (``slice``) take their Gram from views of the chunk; otherwise the chunk's
    full ``[R, R]`` Gram is formed (one read of the chunk, no row copies) and each block's
    entries are taken from it at the end. The batched
    products have the multiply-adds of the single product ``delta^T a`` that autograd would form
    for ``dW``, so a backward that takes ``dW`` from here forms the Grams at the cost of the
    row sums and the Gram products alone. ``dW`` equals autograd's up to float rounding (the
    sum over rows runs in a different order).

    bf16/fp16 rows are formed in float32 (their products are exact in float32) and summed there,
    ``dW`` rounded to the input dtype once at the end, as autograd's float32-accumulating product
    rounds it: rows summed in bf16 would each be rounded first, and where the rows' advantages
    cancel, ``dW``'s relative error would grow by the cancellation factor. With
    :func:`float32_products` the products come from the bf16 operands directly (a GPU's
    ``out_dtype``); otherwise ``a`` and ``delta`` are widened to float32 first.

    Args:
        blocks: ``(K_b, rows_b)``: float64 ``[n_b, n_b]`` accumulators and the block's rows
            (a ``slice`` of consecutive rows, or a ``LongTensor`` of row indices).
        a: ``[R, T, d_in]`` layer inputs; ``delta``: ``[R, T, d_out]`` output gradients (same
            dtype as ``a``).
        chunk_size: bound on the entries of one chunk ``[R, c, d_in]`` (at least one row ``c``).
        scratch, product_dtype: as :func:`linear_weight_gram_per_sample`.
        segments: packed rows: ``a`` ``[N, d_in]`` and ``delta`` ``[N, d_out]`` hold row ``i``
            at positions ``start_i:end_i`` of ``segments``; each row's product then runs on
            its own tokens (no padded ``[R, T_max, ...]`` copy, no products of padding).

    Returns:
        ``dW`` ``[d_out, d_in]`` in ``a``'s dtype.
    """
    R = a.shape[0] if segments is None else len(segments)
    d_in, d_out = a.shape[-1], delta.shape[-1]
    rows = min(d_out, max(1, chunk_size // max(1, R * d_in)))
    scratch = scratch if scratch is not None else Scratch()
    in_dtype = a.dtype
    low = in_dtype in _LOW
    out_dtype = torch.float32 if low and float32_products(a) else None
    if low and out_dtype is None:  # bf16/fp16 values are float32 values: widening is exact
        a, delta = a.float(), delta.float()
    work = torch.float32 if low else in_dtype
    buf = scratch.get("rows", R * rows * d_in, work, a.device)
    dW = torch.empty(d_out, d_in, dtype=work, device=a.device)
    gt = delta.transpose(-2, -1)  # [R, d_out, T] or [d_out, N], strided (CPU BLAS takes it)
    views = all(isinstance(idx, slice) for _, idx in blocks)
    full = None if views else torch.zeros(R, R, dtype=torch.float64, device=a.device)
    offsets = None if segments is None else grouped_offsets(segments, a)
    bmm = torch.bmm if out_dtype is None else functools.partial(torch.bmm, out_dtype=out_dtype)
    for o0 in range(0, d_out, rows):
        c = min(rows, d_out - o0)
        whole = c == d_out  # one chunk: the whole tensors, no slices (fewer host dispatches)
        blk = (buf if c == rows else buf[: R * c * d_in]).view(R, c, d_in)
        if segments is None:
            bmm(gt if whole else gt[:, o0 : o0 + c], a, out=blk)
        else:
            blk = packed_row_products(gt if whole else gt[o0 : o0 + c], a, segments, out=blk,
                                      offsets=offsets, out_dtype=out_dtype)
        torch.sum(blk, dim=0, out=dW if whole else dW[o0 : o0 + c])
        if full is not None:
            flat_gram(full, blk.view(R, -1), scratch, product_dtype=product_dtype)
            continue
        for K, idx in blocks:
            flat_gram(K, blk[idx].reshape(-1, c * d_in), scratch, product_dtype=product_dtype)
    if full is not None:
        add_to_blocks(blocks, full)
    return dW if dW.dtype == in_dtype else dW.to(in_dtype)


ROWS_LOW_PRECISION_DEVICE_TYPES: tuple[str, ...] = ("cpu",)
"""Devices on which a bf16/fp16 Linear takes ``weight_grads="rows"``
(:func:`linear_weight_grad_and_gram`, float32 rows): elsewhere its weight gradient stays the
host's and the capture forms the rows beside it. CPU: the operands are widened to float32
(tested against float64 rows). CUDA: not yet run on a GPU (float32 products straight from the
bf16 operands, :func:`float32_products`); ``bench_verl_geometry.py --bf16-rows`` turns it on to
measure it there."""

_F32_PRODUCTS_OK: dict[tuple[str, torch.dtype], bool] = {}


def rows_allowed(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a Linear call in ``dtype`` on ``device_type`` may take ``weight_grads="rows"``:
    any float32/float64 call; a bf16/fp16 call on :data:`ROWS_LOW_PRECISION_DEVICE_TYPES` only.

    >>> rows_allowed(torch.float32, "cuda"), rows_allowed(torch.bfloat16, "cpu")
    (True, True)
    >>> rows_allowed(torch.bfloat16, "cuda")  # until measured on a GPU
    False
    """
    return dtype not in _LOW or device_type in ROWS_LOW_PRECISION_DEVICE_TYPES


def float32_products(t: torch.Tensor) -> bool:
    """Whether ``torch.mm`` and ``torch.bmm`` give float32 products of ``t``'s bf16/fp16 operands
    directly (``out_dtype=torch.float32`` with ``out=``), on ``t``'s device type: tried once per
    device type and dtype (CUDA builds have it; CPU builds do not).

    >>> float32_products(torch.zeros(2, 2, dtype=torch.bfloat16))  # CPU torch: widen instead
    False
    """
    key = (t.device.type, t.dtype)
    ok = _F32_PRODUCTS_OK.get(key)
    if ok is None:
        try:
            x = torch.ones(1, 2, 2, dtype=t.dtype, device=t.device)
            out = torch.empty(1, 2, 2, dtype=torch.float32, device=t.device)
            torch.bmm(x, x, out_dtype=torch.float32, out=out)
            torch.mm(x[0], x[0], out_dtype=torch.float32, out=out[0])
            ok = bool((out == 2).all())
        except (RuntimeError, NotImplementedError, TypeError):
            ok = False
        _F32_PRODUCTS_OK[key] = ok
    return ok


GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Operand dtypes of ``torch._grouped_mm`` (float64 rows take one product per row)."""
GROUPED_DEVICE_TYPES: tuple[str, ...] = ()
"""Devices whose packed rows take the grouped product; none by default. CPU: bit-identical to
one product per row, but slower in verl's step at d=576 (4 rows of ~195 tokens per micro-batch,
1 thread, 2026-11-28, ``bench_verl_geometry.py --grouped-rows``: in-run 1.128x of the plain
step against 1.104x with one product per row into the reused scratch block), as
``torch._grouped_mm`` has no ``out=`` and allocates its ``[R, c, d_in]`` result per call.
CUDA: not measured yet; torch's grouped kernel covers bf16 on Hopper (one launch for the rows),
its fallback elsewhere reads the offsets on the host (a synchronisation per call). The
benchmark's ``--grouped-rows`` mode sets ``("cpu", "cuda")`` for its steps."""


def grouped_offsets(segments: list[tuple[int, int]], a: torch.Tensor) -> torch.Tensor | None:
    """The rows' end tokens as ``torch._grouped_mm``'s ``offs`` (int32, on ``a``'s device), or
    ``None`` where the grouped product does not apply: rows not consecutive from token 0, a
    dtype it does not take, a device not in :data:`GROUPED_DEVICE_TYPES`, or a torch without it.

    >>> grouped_offsets([(0, 2), (2, 5)], torch.zeros(5, 4)) is None  # no device by default
    True
    """
    if (a.dtype not in GROUPED_DTYPES or a.device.type not in GROUPED_DEVICE_TYPES
            or not hasattr(torch, "_grouped_mm")):
        return None
    if consecutive_lengths(segments, a.shape[0]) is None:
        return None
    return torch.tensor([t1 for _, t1 in segments], dtype=torch.int32).to(a.device)


def packed_row_products(gt: torch.Tensor, a: torch.Tensor, segments: list[tuple[int, int]], *,
                        out: torch.Tensor, offsets: torch.Tensor | None,
                        out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Each packed row's product ``P_i = gt[:, t0_i:t1_i] a[t0_i:t1_i]`` (``[R, c, d_in]``).

    ``gt``: ``[c, N]`` (a chunk of ``delta^T``), ``a``: ``[N, d_in]``, ``segments``: the rows'
    ``(t0, t1)``. With ``offsets`` (:func:`grouped_offsets`) one grouped product
    (``torch._grouped_mm``, the inner dimension jagged by ``offsets``): one dispatch for the R
    products, where one product per row costs R dispatches and, on a GPU, R kernel launches;
    where torch refuses the operands (its kernels need 16-byte strides), one ``torch.mm`` per
    row into ``out``, as without ``offsets``. The same products either way (on CPU bit for bit).
    Rows consecutive from token 0 (verl's packed micro-batches) take their operands as the views
    of one ``split`` each (three dispatches for the R rows' views, then one per product, where
    slicing each row costs four): the same views, the same products. ``out_dtype``: the
    products' dtype when it is not the operands' (float32 from bf16: ``torch.mm``'s
    ``out_dtype``, where :func:`float32_products` holds; no grouped product then).
    """
    mm = torch.mm if out_dtype is None else functools.partial(torch.mm, out_dtype=out_dtype)
    if offsets is not None and out_dtype is None and _grouped_layout(gt) and _grouped_layout(a):
        try:
            return torch._grouped_mm(gt, a, offs=offsets)
        except (RuntimeError, NotImplementedError):
            pass
    lengths = consecutive_lengths(segments, a.shape[0])
    if lengths is not None:
        for x, y, o in zip(gt.split(lengths, dim=1), a.split(lengths), out.unbind(0),
                           strict=False):
            mm(x, y, out=o)  # a trailing remainder (padding) has no ``out`` row: not formed
        return out
    for i, (t0, t1) in enumerate(segments):
        mm(gt[:, t0:t1], a[t0:t1], out=out[i])
    return out


def consecutive_lengths(segments: list[tuple[int, int]], tokens: int) -> list[int] | None:
    """The rows' token counts, with a last entry for the tokens after the last row, when the rows
    ``(t0, t1)`` are consecutive from token 0 within ``tokens``; otherwise ``None``.

    >>> consecutive_lengths([(0, 2), (2, 5)], 5), consecutive_lengths([(0, 2), (2, 5)], 7)
    ([2, 3], [2, 3, 2])
    >>> consecutive_lengths([(0, 2), (3, 5)], 5) is None
    True
    """
    end = 0
    lengths = []
    for t0, t1 in segments:
        if t0 != end or t1 < t0:
            return None
        lengths.append(t1 - t0)
        end = t1
    if end > tokens:
        return None
    return lengths + [tokens - end] if end < tokens else lengths


def _grouped_layout(t: torch.Tensor) -> bool:
    """A 2-D operand ``torch._grouped_mm`` takes: one unit stride, the other and the start
    address on 16 bytes."""
    size = t.element_size()
    return (t.dim() == 2 and 1 in t.stride() and t.data_ptr() % 16 == 0
            and all(st * size % 16 == 0 for st in t.stride() if st != 1))


def add_to_blocks(blocks: list[tuple[torch.Tensor, slice | torch.Tensor]],
                  full: torch.Tensor) -> None:
    """``K_b += full[rows_b][:, rows_b]`` for each ``(K_b, rows_b)`` (rows: a ``slice`` of
    consecutive rows or a ``LongTensor`` of indices) from a full ``[n, n]`` Gram."""
    for K, idx in blocks:
        if isinstance(idx, slice):
            K.add_(full[idx, idx])
        else:
            i = idx.to(full.device)
            K.add_(full.index_select(0, i).index_select(1, i))


_CALIBRATED: dict[tuple[Any, ...], str] = {}
CALIBRATION_BAND = 4.0
"""``linear_method="measured"`` times both Linear methods when their multiply-add counts are
within this factor of each other (otherwise the count decides)."""


def choose_linear_method(
    *, R: int, T: int, d_in: int, d_out: int, key: tuple[Any, ...] | None = None
) -> str | None:
    """``"identity"`` or ``"per_sample"`` for a Linear layer, or ``None``: measure it.

    Without ``key`` (``linear_method="auto"``): the cheaper by multiply-add count
    (:func:`linear_identity_cost`, :func:`linear_per_sample_cost`). With ``key``
    (``"measured"``): the count when one method is more than :data:`CALIBRATION_BAND` times
    cheaper; otherwise the cached verdict of an earlier measurement for the same ``key`` (device,
    dtypes and shape), or ``None`` when there is none yet.
    """
    ci = linear_identity_cost(R=R, T=T, d_in=d_in, d_out=d_out)
    cp = linear_per_sample_cost(R=R, T=T, d_in=d_in, d_out=d_out)
    if key is None or ci * CALIBRATION_BAND < cp or cp * CALIBRATION_BAND < ci:
        return "identity" if ci < cp else "per_sample"
    return _CALIBRATED.get(key)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


LINEAR_METHODS = ("auto", "measured", "identity", "per_sample", "triton")


def linear_weight_gram(
    K: torch.Tensor,
    a: torch.Tensor,
    delta: torch.Tensor,
    *,
    method: str = "auto",
    chunk_size: int,
    scratch: Scratch | None = None,
    product_dtype: torch.dtype = torch.float64,
) -> str:
    """Add ``<dW_i, dW_j>`` of a Linear weight to ``K`` by ``method``; returns the method used.

    * ``"auto"``: the cheaper method by multiply-add count (deterministic).
    * ``"measured"``: by count when the counts differ by more than :data:`CALIBRATION_BAND`;
      inside the band by measured time: the first layer of each
      ``(device, dtype, product dtype, R, T, d_in, d_out)`` in this process runs both methods
      (each into its own accumulator, timed; the faster one's result is kept) and later layers of
      the same key reuse the cached verdict. Both methods are exact, so the choice changes ``K``
      only by rounding, but a timing can differ between processes: runs that must resume
      bit-identically use ``"auto"`` or pin the method.
    * ``"identity"`` / ``"per_sample"``: that method.
    * ``"triton"``: the fused Triton kernel (:mod:`real_model.gram_triton`; CUDA, or the CPU
      interpreter with ``TRITON_INTERPRET=1``): per-sample gradient tiles and their Gram formed
      in registers, never written to memory; ``product_dtype`` does not apply (tile Grams in
      float32, float64 for float64 inputs; summed over tiles in float64).
    """
    R, T, d_in = a.shape
    d_out = delta.shape[-1]
    if method in ("auto", "measured"):
        key = (a.device.type, a.dtype, product_dtype, R, T, d_in, d_out)
        chosen = choose_linear_method(R=R, T=T, d_in=d_in, d_out=d_out,
                                      key=key if method == "measured" else None)
        if chosen is None:
            times, parts = {}, {}
            for m in ("per_sample", "identity"):
                Km = torch.zeros_like(K)
                _sync(a.device)
                t0 = time.perf_counter()
                linear_weight_gram(Km, a, delta, method=m, chunk_size=chunk_size,
                                   scratch=scratch, product_dtype=product_dtype)
                _sync(a.device)
                times[m], parts[m] = time.perf_counter() - t0, Km
            chosen = min(times, key=times.__getitem__)
            _CALIBRATED[key] = chosen
            K.add_(parts[chosen])
            return chosen
        method = chosen
    if method == "identity":
        linear_weight_gram_identity(K, a, delta, chunk_size=chunk_size,
                                    product_dtype=product_dtype)
    elif method == "per_sample":
        linear_weight_gram_per_sample(K, a, delta, chunk_size=chunk_size, scratch=scratch,
                                      product_dtype=product_dtype)
    elif method == "triton":
        gram_triton.linear_weight_gram_triton(K, a, delta)
    else:
        raise ValueError(f"linear method must be one of {LINEAR_METHODS}, got {method!r}")
    return method


def linear_weight_rows(a: torch.Tensor, delta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Per-sample gradient rows ``dW_i[rows] = delta_i[:, rows]^T a_i``: ``[R, n_rows, d_in]``."""
    return torch.bmm(delta.index_select(-1, rows).transpose(1, 2), a)


def bias_gram(K: torch.Tensor, delta: torch.Tensor) -> None:
    """Add ``<db_i, db_j>`` with ``db_i = sum_t delta_it`` (``delta``: ``[R, T, d_out]``)."""
    flat_gram(K, delta.to(torch.float64).sum(dim=1))


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


def scaled_norm_factor(module: torch.nn.Module, delta: torch.Tensor,
                       grad_fn: Any) -> torch.Tensor | None:
    """The ``z`` of ``out = weight * z`` (RMSNorm family), detached, read from the output's
    autograd node ``grad_fn`` (a ``MulBackward0`` that saved the module's weight itself and a
    ``z`` shaped as ``delta`` whose trailing axes are the weight's); ``None`` when the node is
    not that product. Per row, ``dL_i/dweight = sum_t delta_it * z_it``."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or type(grad_fn).__name__ != "MulBackward0":
        return None
    try:
        pair = (grad_fn._saved_self, grad_fn._saved_other)
    except (AttributeError, RuntimeError):
        return None
    for wv, z in (pair, pair[::-1]):
        if not (isinstance(wv, torch.Tensor) and isinstance(z, torch.Tensor)
                and wv.shape == w.shape and wv.data_ptr() == w.data_ptr()):
            continue
        k = w.dim()
        if k and z.shape == delta.shape and tuple(z.shape[delta.dim() - k:]) == tuple(w.shape):
            return z.detach()
    return None


def fast_leaf_grads(
    module: torch.nn.Module,
    names: list[str],
    args: tuple[Any, ...],
    delta: torch.Tensor,
    grad_fn: Any,
    *,
    R: int,
    row_sums: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Closed-form per-sample gradients of common norm layers, or ``None`` if not applicable.

    * ``out = weight * z`` (RMSNorm family; recognised from the autograd node of the output, a
      ``MulBackward0`` that saved the weight itself and a ``z`` of the output's shape):
      ``g_i = sum_t delta_it * z_it``, with the very ``z`` autograd saved (``grad_fn`` may be
      the host's own node of the call: no re-run of the module).
    * ``nn.LayerNorm`` and subclasses with an affine weight (and bias):
      ``g_i(weight) = sum_t delta_it * xhat_it``, ``g_i(bias) = sum_t delta_it``, with
      ``xhat = layer_norm(x)`` without affine terms (the ``+1`` of LayerNorm1P does not change it).

    ``row_sums`` maps a tensor laid out as ``delta`` to its per-row sums over positions,
    ``[R, ...]`` (packed rows: sums over each row's tokens); default: batch-first ``delta``,
    ``t.reshape(R, -1, n).sum(dim=1)``. The caller checks each module class once per call
    against :func:`generic_per_sample_grads`.
    """
    if row_sums is None:
        def row_sums(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(R, -1, t.shape[-1]).sum(dim=1)

    if names == ["weight"] and type(grad_fn).__name__ == "MulBackward0":
        z = scaled_norm_factor(module, delta, grad_fn)
        if z is None:
            return None
        return row_sums((delta * z).flatten(delta.dim() - module.weight.dim()))
    if (
        isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine
        and len(args) == 1 and isinstance(args[0], torch.Tensor)
        and set(names) <= {"weight", "bias"} and delta.shape == args[0].shape
    ):
        k = len(module.normalized_shape)
        xhat = torch.nn.functional.layer_norm(args[0], module.normalized_shape, None, None,
                                              module.eps)
        parts = {"weight": row_sums((delta * xhat.to(delta.dtype)).flatten(delta.dim() - k)),
                 "bias": row_sums(delta.flatten(delta.dim() - k))}
        return torch.cat([parts[k] for k in names], dim=1)
    return None


def generic_per_sample_grads(
    module: torch.nn.Module,
    names: list[str],
    args: tuple[Any, ...],
    delta: torch.Tensor,
    *,
    R: int,
) -> torch.Tensor:
    """Exact per-sample gradients of a small leaf module's parameters: ``[R, n_params]``.

    For each rollout ``i``, the vector-Jacobian product of ``module(x_i)`` (the captured input
    row, re-run as a batch of one) with ``delta_i``, w.r.t. the parameters ``names``; vectorised
    with :func:`torch.func.vmap` (a Python loop over rollouts is the fallback for modules that
    ``vmap`` cannot trace).
    """
    from torch.func import functional_call, vjp, vmap

    params = {n: p.detach() for n, p in module.named_parameters(recurse=False) if n in names}
    batched = [isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == R for x in args]

    def one(row_args: tuple[Any, ...], g_row: torch.Tensor) -> dict[str, torch.Tensor]:
        call_args = tuple(
            x.unsqueeze(0) if b else x for x, b in zip(row_args, batched, strict=True)
        )

        def fn(pd: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(module, pd, call_args)

        _, pull = vjp(fn, params)
        return pull(g_row.unsqueeze(0))[0]

    in_dims = (tuple(0 if b else None for b in batched), 0)
    try:
        out = vmap(one, in_dims=in_dims)(tuple(args), delta)
        flat = [out[n].reshape(R, -1) for n in names]
    except Exception:  # noqa: BLE001 - vmap cannot trace every module; loop instead
        rows = []
        for i in range(R):
            row_args = tuple(x[i] if b else x for x, b in zip(args, batched, strict=True))
            g = one(row_args, delta[i])
            rows.append(torch.cat([g[n].reshape(-1) for n in names]))
        return torch.stack(rows)
    return torch.cat(flat, dim=1)
