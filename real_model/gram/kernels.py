"""Shared kernels of the exact Gram: reusable buffers, chunk sizes, and Grams of rows and tokens.

Every function adds (in place) to, or returns, float64 Gram entries ``<g_i, g_j>`` from
per-row gradient rows ``[R, n]`` or from the two factors of a token kernel ``(a a^T) *
(delta delta^T)``; the per-layer rules (:mod:`real_model.gram.layers`) and the batched small
calls (:mod:`real_model.gram.small_terms`) build on them.
"""

from __future__ import annotations

import torch

__all__ = [
    "Scratch",
    "CPU_CHUNK_SIZE",
    "CPU_F32_SLAB",
    "default_chunk_size",
    "LOW_PRECISION",
    "gram_f32",
    "flat_gram",
    "kernel_dtype",
    "token_gram",
    "identity_kernel",
    "id_equality",
    "add_to_blocks",
    "bias_gram",
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
"""Entries of one temporary block on CPU (64 MiB float64): GEMM-sized blocks without the page
faults of re-allocating huge ones per layer (``benchmarks/bench_gram.py``)."""

_GPU_CHUNK_MIN, _GPU_CHUNK_MAX = 1 << 22, 1 << 28

CPU_SLAB_BYTES = 1 << 20
"""float64 column slab of :func:`flat_gram` on single-threaded CPU: cache-sized
(``benchmarks/bench_gram.py --threads 1``)."""

CPU_SLAB_BYTES_THREADED = 1 << 24
"""The slab with several threads: 16x fewer parallel regions, each a thread barrier
(``benchmarks/bench_gram.py``)."""


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


LOW_PRECISION = (torch.bfloat16, torch.float16)


_OUT_DTYPE_OK: dict[tuple[str, torch.dtype], bool] = {}


def gram_f32(x: torch.Tensor, scratch: Scratch | None = None) -> torch.Tensor:
    """``x x^T`` in float32 for ``x`` ``[R, n]`` (float32, bfloat16 or float16).

    Low-precision rows are multiplied straight from their storage with float32 accumulation and
    output (``torch.mm(..., out_dtype=torch.float32)``) where the backend has it (CUDA); elsewhere
    (CPU, older builds) the rows are copied to float32 first, which gives the same products up to
    the summation order. The products of two bf16/fp16 numbers are exact in float32, so the two
    paths differ only by float32 rounding of the sums.
    """
    if x.dtype in LOW_PRECISION:
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
"""Columns of one float32 product of :func:`flat_gram` on CPU, summed into ``K`` in float64:
error ~2e-8 relative, below the rows' float32 rounding (``tests/test_real_gram_precision.py``;
cost: ``benchmarks/bench_gram.py --gram-precision float32``)."""


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


def kernel_dtype(product_dtype: torch.dtype) -> torch.dtype:
    """Dtype of the identity's token kernels: float64 for float64 products, else float32 (as
    :func:`flat_gram`, any lower ``product_dtype`` multiplies in float32)."""
    return torch.float64 if product_dtype == torch.float64 else torch.float32


def token_gram(t: torch.Tensor, *, product_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``t t^T`` over the last two axes, ``[..., N, d] -> [..., N, N]``: one factor of a token
    kernel (:func:`identity_kernel`), in float64, or float32 for any lower ``product_dtype`` (as
    :func:`linear_weight_gram_identity_packed`: each entry a sum of ``d`` products)."""
    dt = kernel_dtype(product_dtype)
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


def id_equality(ids: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``[id_t = id_t']``, bool ``[..., N, N]`` for ``ids`` ``[..., N]``: the embedding's input
    kernel (its input is the one-hot of the id); tokens with ``keep`` False left out."""
    same = ids[..., :, None] == ids[..., None, :]
    if keep is not None:
        same &= keep[..., :, None] & keep[..., None, :]
    return same


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


def bias_gram(K: torch.Tensor, delta: torch.Tensor) -> None:
    """Add ``<db_i, db_j>`` with ``db_i = sum_t delta_it`` (``delta``: ``[R, T, d_out]``)."""
    flat_gram(K, delta.to(torch.float64).sum(dim=1))
