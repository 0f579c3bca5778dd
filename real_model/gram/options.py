"""The engine's internal choices, one record: defaults chosen by measurement, not a user's.

Every choice gives the same Gram up to float rounding; what changes is the cost. The defaults
are what the benchmarks measured fastest where it matters (``benchmarks/bench_gram.py``,
``benchmarks/bench_linear_gram.py``, ``benchmarks/bench_verl_geometry.py``); tests and
benchmarks pin the other paths through :class:`EngineOptions`. The one choice a host
integration exposes is :attr:`EngineOptions.weight_grads` (whether the host's own weight
gradient stays bit-identical).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from grpo_io.options import option, validate

__all__ = ["EngineOptions", "LINEAR_METHODS", "GRAM_PRECISIONS", "WEIGHT_GRADS",
           "product_dtype"]

LINEAR_METHODS = ("auto", "measured", "identity", "per_sample", "triton")
"""How a Linear weight's Gram is formed (:func:`real_model.gram.linear_gram.linear_weight_gram`)."""
GRAM_PRECISIONS = ("auto", "float64", "float32")
"""Dtype of the per-chunk products (:func:`product_dtype`)."""
WEIGHT_GRADS = ("host", "rows")
"""Who forms a captured Linear's weight gradient (:class:`real_model.gram.GramCapture`)."""


@dataclass(frozen=True)
class EngineOptions:
    """The engine's internal choices (defaults: measured; see the module docstring), checked
    by :func:`grpo_io.options.validate` (no command line: the help is the list below).

    Attributes:
        linear_method: ``"auto"`` (the cheaper of identity and per-sample by multiply-add
            count; deterministic), ``"measured"`` (a cached one-off timing where the counts are
            within a factor 4; may differ between processes), ``"identity"``, ``"per_sample"``,
            or ``"triton"`` (the fused kernel of :mod:`real_model.gram.triton`; CUDA, or
            ``TRITON_INTERPRET=1`` on CPU).
        gram_precision: ``"auto"``, ``"float64"`` or ``"float32"`` per-chunk products
            (:func:`product_dtype`; chunk results are summed in float64).
        chunk_size: entries of one temporary block (``None``: ``kernels.default_chunk_size``).
        vocab_tile: columns of one vocabulary tile of the head (``None``:
            ``head.default_vocab_tile``).
        weight_grads: ``"host"`` (the host's backward forms every weight gradient, bit for bit
            as without the capture) or ``"rows"`` (a plain float32/float64 ``nn.Linear``'s
            weight gradient is the sum of the per-row gradients the Gram forms anyway; equal to
            the host's up to float rounding, one product fewer per layer).
        batch_small_calls: add the terms of small module calls together after the backward
            (:mod:`real_model.gram.small_calls`); ``False``: each call in the backward.
    """

    linear_method: str = option("auto", choices=LINEAR_METHODS, help="", cli=False)
    gram_precision: str = option("auto", choices=GRAM_PRECISIONS, help="", cli=False)
    chunk_size: int | None = option(None, ge=1, help="", cli=False)
    vocab_tile: int | None = option(None, ge=1, help="", cli=False)
    weight_grads: str = option("host", choices=WEIGHT_GRADS, help="", cli=False)
    batch_small_calls: bool = option(True, help="", cli=False)

    def __post_init__(self) -> None:
        validate(self)


def product_dtype(model: nn.Module, gram_precision: str, *,
                  params: Sequence[nn.Parameter] | None = None) -> torch.dtype:
    """Dtype of the per-chunk products: ``float64``, or ``float32`` for ``"float32"`` and, under
    ``"auto"``, when every trainable parameter is bfloat16/float16 (~3 significant digits) or
    float32 on CPU (``kernels.flat_gram`` then sums float32 products over slabs of
    ``kernels.CPU_F32_SLAB`` columns in float64: error ~2e-8 relative, below the float32
    rounding of the rows, at a fifth of the float64 cost). ``params``:
    ``list(model.parameters())`` when the caller has it (one walk of the modules, not two)."""
    if gram_precision != "auto":
        return torch.float64 if gram_precision == "float64" else torch.float32
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not params:
        return torch.float64
    low = {torch.bfloat16, torch.float16}
    if all(p.dtype in low for p in params):
        return torch.float32
    cpu32 = all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)
    return torch.float32 if cpu32 else torch.float64
