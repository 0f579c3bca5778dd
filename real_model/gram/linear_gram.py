"""The Gram of a Linear weight's per-row gradients ``dW_i = delta_i^T a_i``, two exact ways.

* the token identity ``<dW_i, dW_j> = sum_{t,t'} (delta_it . delta_jt') (a_it . a_jt')``
  (cost ``(R T)^2 (d_in + d_out)``; :func:`linear_weight_gram_identity`, packed rows
  :func:`linear_weight_gram_identity_packed`);
* explicit per-sample gradients chunked over output rows (cost ``R T d_in d_out``;
  :func:`linear_weight_gram_per_sample`), or the fused Triton kernel (:mod:`.triton`).

:func:`linear_weight_gram` picks one (:func:`choose_linear_method`). Shapes: ``R`` rows, ``T``
positions per row, ``d_in``/``d_out`` features; ``K`` is a float64 ``[R, R]`` accumulator.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from . import triton as gram_triton
from .kernels import Scratch, flat_gram, identity_kernel, kernel_dtype, token_gram
from .options import LINEAR_METHODS

__all__ = [
    "linear_identity_cost",
    "linear_per_sample_cost",
    "linear_weight_gram_identity",
    "linear_weight_gram_identity_packed",
    "linear_token_kernel",
    "linear_weight_gram_per_sample",
    "CALIBRATION_BAND",
    "choose_linear_method",
    "linear_weight_gram",
    "linear_weight_rows",
]


def linear_identity_cost(*, R: int, T: int, d_in: int, d_out: int) -> float:
    """Multiply-adds of the activation/backprop identity: ``(R T)^2 (d_in + d_out)`` (float64)."""
    return 2.0 * float(R * T) ** 2 * (d_in + d_out)


def linear_per_sample_cost(*, R: int, T: int, d_in: int, d_out: int) -> float:
    """Multiply-adds of explicit per-sample gradients plus their float64 Gram."""
    return float(R * T) * d_in * d_out + 2.0 * float(R) ** 2 * d_in * d_out + 4.0 * R * d_in * d_out


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
    dt = kernel_dtype(product_dtype)
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


def linear_token_kernel(a: torch.Tensor, delta: torch.Tensor, *,
                        product_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The Linear identity's token kernel ``(a a^T) * (delta delta^T)``, float64: ``[..., N, N]``
    for ``a`` ``[..., N, d_in]`` and ``delta`` ``[..., N, d_out]`` (leading axes batched, e.g. the
    calls of one shape stacked); ``<dW_i, dW_j>`` is its sum over row ``i``'s and row ``j``'s
    tokens. Kernels in float64, or float32 for any lower ``product_dtype`` (as
    :func:`linear_weight_gram_identity_packed`)."""
    return identity_kernel(token_gram(a, product_dtype=product_dtype),
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
    * ``"triton"``: the fused Triton kernel (:mod:`real_model.gram.triton`; CUDA, or the CPU
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
