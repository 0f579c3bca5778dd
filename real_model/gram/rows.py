"""A Linear's weight gradient formed from its per-row gradients, with their Grams.

With ``EngineOptions(weight_grads="rows")`` a captured ``nn.Linear`` hands autograd ``dW =
sum_i dW_i`` from the per-row gradients ``dW_i = delta_i^T a_i`` its Gram needs anyway
(:func:`linear_weight_grad_and_gram`), instead of the host forming ``delta^T a`` a second time.
Packed rows (remove-padding micro-batches) multiply each row on its own tokens
(:func:`packed_row_products`).
"""

from __future__ import annotations

import functools

import torch

from .kernels import LOW_PRECISION, Scratch, add_to_blocks, flat_gram

__all__ = [
    "linear_weight_grad_and_gram",
    "ROWS_LOW_PRECISION_DEVICE_TYPES",
    "rows_allowed",
    "float32_products",
    "GROUPED_DTYPES",
    "GROUPED_DEVICE_TYPES",
    "grouped_offsets",
    "packed_row_products",
    "consecutive_lengths",
]


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
    low = in_dtype in LOW_PRECISION
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
"""Devices on which a bf16/fp16 Linear takes ``weight_grads="rows"`` (float32 rows); CUDA not
yet measured (``benchmarks/bench_verl_geometry.py --bf16-rows``)."""


_F32_PRODUCTS_OK: dict[tuple[str, torch.dtype], bool] = {}


def rows_allowed(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a Linear call in ``dtype`` on ``device_type`` may take ``weight_grads="rows"``:
    any float32/float64 call; a bf16/fp16 call on :data:`ROWS_LOW_PRECISION_DEVICE_TYPES` only.

    >>> rows_allowed(torch.float32, "cuda"), rows_allowed(torch.bfloat16, "cpu")
    (True, True)
    >>> rows_allowed(torch.bfloat16, "cuda")  # until measured on a GPU
    False
    """
    return dtype not in LOW_PRECISION or device_type in ROWS_LOW_PRECISION_DEVICE_TYPES


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
"""Devices whose packed rows take one grouped product; none: slower than one product per row on
CPU, CUDA not yet measured (``benchmarks/bench_verl_geometry.py --grouped-rows``)."""


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
    Rows consecutive from token 0 (remove-padding micro-batches) take their operands as the views
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
