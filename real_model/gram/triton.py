"""Fused Triton kernel for the Gram of per-sample Linear weight gradients (opt-in).

For one ``nn.Linear`` with captured inputs ``a`` ``[R, T, d_in]`` and output gradients ``delta``
``[R, T, d_out]`` (masked rows are zero), rollout ``r``'s weight gradient is
``dW_r = delta_r^T a_r`` (``d_out x d_in``) and this module computes::

    G_rs = <dW_r, dW_s>_F = sum_{o,k} dW_r[o, k] dW_s[o, k],        G in R^{R x R}

without ever materialising ``[R, d_out, d_in]``. One program of the kernel owns one tile of
``BLOCK_O`` output rows and, in turn, every ``n_splits``-th tile of ``BLOCK_K`` input columns:

1. for each of its column tiles, it forms the per-sample gradient tiles of ALL rows at once,
   ``P[r] = delta_r[:, o-tile]^T a_r[:, k-tile]`` (``[R_PAD, BLOCK_O, BLOCK_K]``), by a batched
   ``tl.dot`` ``[R_PAD, BLOCK_O, BLOCK_T] x [R_PAD, BLOCK_T, BLOCK_K]`` over chunks of ``BLOCK_T``
   positions (bf16/fp16 operands on tensor cores, float32 accumulation; float32 operands in
   IEEE float32 by default; float64 operands in float64);
2. adds that tile's Gram ``P P^T`` (``P`` flattened to ``[R_PAD, BLOCK_O * BLOCK_K]``, one more
   ``tl.dot``) to a ``[R_PAD, R_PAD]`` accumulator held in registers;
3. finally writes its accumulator, its partial Gram, to ``partials[program]``.

The partials (``n_programs x R x R``, float32; float64 for float64 inputs) are summed in float64
by the caller: no atomics, so the result is deterministic for a given shape, tile configuration
and device (the exact Gram's default path resumes bit-identically; an ``atomic_add`` into ``K``
would make the float32 summation order depend on scheduling), and the sum over tiles is float64.

Rows: ``R_PAD`` is ``R`` rounded up to a power of two (``tl.arange`` needs one); padded rows are
masked loads of zeros, so their ``P`` is zero and contributes nothing. One launch handles at most
:data:`MAX_ROWS` = 32 rows (the per-sample accumulator ``R_PAD x BLOCK_O x BLOCK_K`` lives in
registers, so the tiles shrink as ``R`` grows: for bf16, 64 x 64 up to 4 rows, 32 x 32 at 16,
16 x 16 at 32; :data:`TILES`). More rows are split into blocks of ``MAX_ROWS / 2``; each pair
of blocks is one launch on their union (the pair's cross block, and each diagonal block once), so
the per-sample work grows to ``(n_blocks - 1)`` times the minimum. Shapes not divisible by the
tiles are masked.

Triton is imported lazily: this module imports (and the library works) without it. On a CPU the
kernel runs only under Triton's interpreter, ``TRITON_INTERPRET=1``. Triton reads that variable
(``triton.knobs.runtime.interpret``) when ``@triton.jit`` wraps a function: for its own jitted
helpers (``tl.zeros``, ``tl.cdiv``, ``tl.sum``, ...) that is at ``import triton``. This module
wraps its kernel at the first call in each mode (one kernel object per mode) and the kernel uses
only ``triton.language`` builtins (``tl.full``, not ``tl.zeros``; integer division, not
``tl.cdiv``), so the variable may be set at any time before the call (tested: triton imported
first, the variable set later per test). Keep it that way when editing the kernel.
Interpreter note (triton 3.9): bf16 tiles are held as raw ``uint16`` bits and its ``tl.dot``
multiplies those bits (observed: errors of order 1e10), so under the interpreter bf16 tiles are
converted to float32 before each product (the products the tensor cores form: bf16 x bf16 is
exact in float32). Docs: ``docs/real_model_gram.md`` ("GPU design").
"""

from __future__ import annotations

import os
from typing import Any, Literal

import torch

__all__ = [
    "MAX_ROWS",
    "BLOCK_T",
    "TILES",
    "INSTALL_HINT",
    "available",
    "require",
    "interpreting",
    "tiles",
    "per_sample_weight_gram",
    "linear_weight_gram_triton",
]

MAX_ROWS = 32
"""Rows (rollouts) handled by one launch; more rows go through pairs of row blocks."""

BLOCK_T = 16
"""Positions per step of the per-sample products (their reduction axis; >= 16 for tensor cores).
16 rather than 32: the operand tiles ``R_PAD x BLOCK_O x BLOCK_T`` live in registers too."""

NUM_WARPS = 8

TILES: dict[tuple[int, int], tuple[int, int]] = {
    # (R_PAD, bytes per input element) -> (BLOCK_O, BLOCK_K), chosen so that the kernel compiles
    # for sm_90 (H100) with no or almost no register spills at BLOCK_T=16, 8 warps and the default
    # precisions (triton 3.9; compile-only check, `cuobjdump -res-usage` of the cubin; never run
    # on a GPU). Registers per thread, bf16: 64, 102, 198, 206, 252 at R_PAD 1, 2, 4, 8, 16;
    # float32 (IEEE): 76, 124, 178, 180 at R_PAD 1, 2, 4, 8. Spills (stack bytes per thread):
    # bf16 R_PAD 32: 8; float32 R_PAD 16: 8, R_PAD 32: 648 (with the smallest tile, 16 x 16).
    # float32 64 x 64 at R_PAD <= 2 spilled thousands of bytes, hence 32 x 64 there.
    (1, 2): (64, 64), (2, 2): (64, 64), (4, 2): (64, 64), (8, 2): (32, 64), (16, 2): (32, 32),
    (32, 2): (16, 16),
    (1, 4): (32, 64), (2, 4): (32, 64), (4, 4): (32, 64), (8, 4): (16, 32), (16, 4): (16, 16),
    (32, 4): (16, 16),
}
"""Default tiles; float64 inputs use the float32 row (they run on CUDA cores anyway)."""

INSTALL_HINT = (
    "linear_method='triton' needs the optional triton package: `pip install triton` "
    "(or `pip install -e '.[triton]'`)"
)

Precision = Literal["ieee", "tf32x3", "tf32"]
_PRECISIONS = ("ieee", "tf32x3", "tf32")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
_KERNELS: dict[bool, Any] = {}


def available() -> bool:
    """Whether ``triton`` can be imported."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET``, or ``triton.knobs`` set)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):  # older triton: no knobs module
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def require(device: torch.device) -> None:
    """Raise a clear error unless the kernel can run on ``device``.

    Raises:
        ImportError: triton is not installed (the message says how to install it).
        ValueError: ``device`` is not CUDA and the interpreter (``TRITON_INTERPRET=1``) is off.
    """
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"linear_method='triton' needs a CUDA device or Triton's CPU interpreter; the inputs "
            f"are on {device.type!r} and TRITON_INTERPRET is not set (set TRITON_INTERPRET=1 to "
            "run the kernel on CPU, slowly, for correctness checks)"
        )


def _kernel() -> Any:
    """The jitted kernel for the current mode (compiled or interpreted), built once per mode."""
    mode = interpreting()
    if mode not in _KERNELS:
        _KERNELS[mode] = _build_kernel()
    return _KERNELS[mode]


def _build_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def per_sample_gram_kernel(
        a_ptr, d_ptr, rows_ptr, out_ptr,
        n_rows, T, d_in, d_out, n_splits,
        s_ar, s_at, s_ak, s_dr, s_dt, s_do,
        R_PAD: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_T: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
        PREC: tl.constexpr, GRAM_PREC: tl.constexpr,
    ):
        """partials[pid] = sum over this program's tiles of P P^T, P = per-sample dW tiles."""
        pid_o = tl.program_id(0)
        pid_s = tl.program_id(1)
        r = tl.arange(0, R_PAD)
        r_ok = r < n_rows
        row = tl.load(rows_ptr + r, mask=r_ok, other=0).to(tl.int64)
        a_row = a_ptr + row * s_ar  # [R_PAD] row base pointers
        d_row = d_ptr + row * s_dr
        o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
        o_ok = o < d_out
        gram = tl.full((R_PAD, R_PAD), 0.0, dtype=ACC)
        for kt in range(pid_s, (d_in + BLOCK_K - 1) // BLOCK_K, n_splits):
            k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = k < d_in
            acc = tl.full((R_PAD, BLOCK_O, BLOCK_K), 0.0, dtype=ACC)
            for t0 in range(0, T, BLOCK_T):
                t = t0 + tl.arange(0, BLOCK_T)
                t_ok = t < T
                # delta_r^T tile [R_PAD, BLOCK_O, BLOCK_T] and a_r tile [R_PAD, BLOCK_T, BLOCK_K]
                g = tl.load(
                    d_row[:, None, None] + o[None, :, None] * s_do + t[None, None, :] * s_dt,
                    mask=r_ok[:, None, None] & o_ok[None, :, None] & t_ok[None, None, :],
                    other=0.0,
                )
                x = tl.load(
                    a_row[:, None, None] + t[None, :, None] * s_at + k[None, None, :] * s_ak,
                    mask=r_ok[:, None, None] & t_ok[None, :, None] & k_ok[None, None, :],
                    other=0.0,
                )
                if UPCAST:  # interpreter only: its bf16 dot multiplies raw bits
                    g = g.to(tl.float32)
                    x = x.to(tl.float32)
                acc = tl.dot(g, x, acc, input_precision=PREC)
            p = tl.reshape(acc, (R_PAD, BLOCK_O * BLOCK_K))
            gram = tl.dot(p, tl.trans(p), gram, input_precision=GRAM_PREC)
        out = out_ptr + (pid_o * n_splits + pid_s) * n_rows * n_rows
        tl.store(out + r[:, None] * n_rows + r[None, :], gram,
                 mask=r_ok[:, None] & r_ok[None, :])

    return per_sample_gram_kernel


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tiles(n_rows: int, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """Default ``(BLOCK_O, BLOCK_K)`` for ``n_rows <= MAX_ROWS`` rows of ``dtype`` (:data:`TILES`;
    a smaller accumulator ``R_PAD x BLOCK_O x BLOCK_K`` per program as the rows grow)."""
    if not 1 <= n_rows <= MAX_ROWS:
        raise ValueError(f"tiles are defined for 1 to {MAX_ROWS} rows, got {n_rows}")
    size = 2 if dtype in (torch.bfloat16, torch.float16) else 4
    return TILES[(_pow2(n_rows), size)]


def _check_block(name: str, v: int | None) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {v!r}")


def _launch(
    a: torch.Tensor,
    delta: torch.Tensor,
    rows: torch.Tensor,
    *,
    block_o: int | None,
    block_k: int | None,
    block_t: int | None,
    splits: int | None,
    precision: str,
    gram_precision: str,
) -> torch.Tensor:
    """One launch on the rows ``rows``: their float64 ``[n, n]`` Gram (partials summed)."""
    n = rows.numel()
    _, T, d_in = a.shape
    d_out = delta.shape[-1]
    bo_d, bk_d = tiles(n, a.dtype)
    bo, bk, bt = block_o or bo_d, block_k or bk_d, block_t or BLOCK_T
    n_o, n_k = -(-d_out // bo), -(-d_in // bk)
    if splits is None:
        target = 4 * torch.cuda.get_device_properties(a.device).multi_processor_count if (
            a.device.type == "cuda") else 1
        splits = -(-target // n_o)
    splits = max(1, min(int(splits), n_k))
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    partials = torch.empty(n_o * splits, n, n, dtype=acc, device=a.device)
    interp = interpreting()
    import triton.language as tl

    r_pad = _pow2(n)
    _kernel()[(n_o, splits)](
        a, delta, rows, partials,
        n, T, d_in, d_out, splits,
        a.stride(0), a.stride(1), a.stride(2), delta.stride(0), delta.stride(1), delta.stride(2),
        R_PAD=r_pad, BLOCK_O=bo, BLOCK_K=bk, BLOCK_T=bt,
        ACC=tl.float64 if acc == torch.float64 else tl.float32,
        UPCAST=interp and a.dtype == torch.bfloat16,
        PREC=precision, GRAM_PREC=gram_precision,
        num_warps=NUM_WARPS,
        num_stages=2,
    )
    return partials.sum(dim=0, dtype=torch.float64)


def per_sample_weight_gram(
    a: torch.Tensor,
    delta: torch.Tensor,
    *,
    precision: Precision | None = None,
    block_o: int | None = None,
    block_k: int | None = None,
    block_t: int | None = None,
    splits: int | None = None,
    max_rows: int = MAX_ROWS,
) -> torch.Tensor:
    """``G_rs = <delta_r^T a_r, delta_s^T a_s>_F`` by the fused kernel: float64 ``[R, R]``.

    Args:
        a: ``[R, T, d_in]`` layer inputs (bfloat16, float16, float32 or float64; any strides).
        delta: ``[R, T, d_out]`` output gradients; converted to ``a.dtype`` if it differs.
        precision: ``tl.dot`` input precision of float32 operands: ``"ieee"`` (float32 FMA),
            ``"tf32x3"`` (~float32 accuracy on tensor cores) or ``"tf32"`` (10-bit mantissa). It
            applies to the per-sample products of float32 inputs and to the tile Grams (whose
            operands are the float32 tiles ``P``). Default ``None``: ``"ieee"`` for float32
            inputs; ``"tf32"`` for the tile Grams of bf16/fp16 inputs (relative error
            <= 2^-10 of ``max |G|``, below the bf16 rounding of the inputs). Float64 inputs are
            multiplied in float64. The interpreter computes every product in the operands' own
            precision (float32 for the tf32 options).
        block_o, block_k: tile sizes over ``d_out`` / ``d_in`` (powers of two >= 16; default
            :func:`tiles`).
        block_t: positions per step of the per-sample products (power of two >= 16; default
            :data:`BLOCK_T`).
        splits: programs per output tile, each taking every ``splits``-th column tile (default:
            enough for 4 programs per SM on CUDA, 1 under the interpreter; at most the number of
            column tiles).
        max_rows: rows per launch (default :data:`MAX_ROWS`; smaller values exercise the row-block
            pairs in tests).

    Returns:
        float64 ``[R, R]``: each program's float32 (float64 for float64 inputs) partial Gram,
        summed over programs in float64.

    Raises:
        ImportError / ValueError: see :func:`require`; ValueError for malformed inputs.
    """
    _check_inputs(a, delta, precision=precision, blocks=(block_o, block_k, block_t),
                  splits=splits, max_rows=max_rows)
    require(a.device)
    delta = delta.to(a.dtype)
    R = a.shape[0]
    if R == 0 or a.shape[1] == 0 or a.shape[2] == 0 or delta.shape[2] == 0:
        return torch.zeros(R, R, dtype=torch.float64, device=a.device)
    low = a.dtype in (torch.bfloat16, torch.float16)
    kw: dict[str, Any] = dict(block_o=block_o, block_k=block_k, block_t=block_t, splits=splits,
                              precision=precision or "ieee",
                              gram_precision=precision or ("tf32" if low else "ieee"))
    idx = torch.arange(R, dtype=torch.int32, device=a.device)
    if R <= int(max_rows):
        return _launch(a, delta, idx, **kw)
    return _gram_by_row_block_pairs(a, delta, idx, size=int(max_rows) // 2, **kw)


def _check_inputs(a: torch.Tensor, delta: torch.Tensor, *, precision: Precision | None,
                  blocks: tuple[int | None, int | None, int | None], splits: int | None,
                  max_rows: int) -> None:
    """ValueError naming the problem for malformed inputs of :func:`per_sample_weight_gram`."""
    for name, x in (("a", a), ("delta", delta)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor [R, T, features], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x)}")
    if a.shape[:2] != delta.shape[:2]:
        raise ValueError(f"a {tuple(a.shape)} and delta {tuple(delta.shape)} must share [R, T]")
    if a.device != delta.device:
        raise ValueError(f"a is on {a.device} but delta is on {delta.device}")
    if a.dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {a.dtype}: expected one of {_DTYPES}")
    if precision is not None and precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS} or None, got {precision!r}")
    for name, v in zip(("block_o", "block_k", "block_t"), blocks, strict=True):
        _check_block(name, v)
    if splits is not None and (isinstance(splits, bool) or int(splits) < 1):
        raise ValueError(f"splits must be a positive integer or None, got {splits!r}")
    if isinstance(max_rows, bool) or not 2 <= int(max_rows) <= MAX_ROWS:
        raise ValueError(f"max_rows must be an integer in [2, {MAX_ROWS}], got {max_rows!r}")


def _gram_by_row_block_pairs(a: torch.Tensor, delta: torch.Tensor, idx: torch.Tensor, *,
                             size: int, **kw: Any) -> torch.Tensor:
    """``G`` ``[R, R]`` float64 from launches on pairs of row blocks of ``size`` rows.

    The launch on the union of blocks ``i < j`` gives their cross blocks ``G[i, j]``, ``G[j, i]``;
    each diagonal block is taken once (block ``i`` from the pair ``(i, i+1)``, the last block from
    ``(n-2, n-1)``).
    """
    R = idx.numel()
    K = torch.zeros(R, R, dtype=torch.float64, device=a.device)
    blocks = [idx[i : i + size] for i in range(0, R, size)]
    nb = len(blocks)
    for i in range(nb):
        for j in range(i + 1, nb):
            bi, bj = blocks[i], blocks[j]
            G = _launch(a, delta, torch.cat([bi, bj]), **kw)
            ni = bi.numel()
            si, sj = slice(int(bi[0]), int(bi[0]) + ni), slice(int(bj[0]), int(bj[-1]) + 1)
            K[si, sj] += G[:ni, ni:]
            K[sj, si] += G[ni:, :ni]
            if j == i + 1:
                K[si, si] += G[:ni, :ni]
            if (i, j) == (nb - 2, nb - 1):
                K[sj, sj] += G[ni:, ni:]
    return K


def linear_weight_gram_triton(K: torch.Tensor, a: torch.Tensor, delta: torch.Tensor,
                              **kw: Any) -> None:
    """``K += <dW_i, dW_j>`` for ``dW_i = delta_i^T a_i`` via :func:`per_sample_weight_gram`."""
    K.add_(per_sample_weight_gram(a, delta, **kw))

