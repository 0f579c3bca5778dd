"""How many rows one exact pass can hold: the memory model of a forward + backward over rows.

:func:`pass_bytes_per_row` (activations a row adds to the pass's peak, from the model config),
:func:`pass_fixed_bytes` (head tiles and chunk buffers), :func:`default_memory_budget` and
:func:`plan_passes` (whole blocks per pass) size the passes of ``rows_gram``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .head import TILE_ENTRIES
from .kernels import default_chunk_size

__all__ = ["ACT_PER_D", "ACT_PER_F", "ACT_PER_KEY", "pass_bytes_per_row", "pass_fixed_bytes",
           "default_memory_budget", "plan_passes"]


# --------------------------------------------------------------------------- bounded memory
ACT_PER_D = 20
"""Activation values one token keeps per decoder layer and hidden feature during an exact pass
(what autograd saves for the backward: norm outputs, projections, rotary copies, residual sums;
the capture's input taps share that storage), calibrated on SmolLM2-135M (float32, CPU, sdpa):
see ``docs/real_model_gram.md``, "Memory model"."""


ACT_PER_F = 5
"""The same per MLP intermediate feature (gate, up, activation, product)."""


ACT_PER_KEY = 2
"""The same per attention head and key position, for ``eager`` attention only (it keeps the
scores and probabilities ``[heads, T, T]`` per row and layer; sdpa/flash kernels do not)."""


def _text_config(model: nn.Module) -> Any:
    lm = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    cfg = getattr(lm, "config", None)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def pass_bytes_per_row(model: nn.Module, T: int) -> int:
    """Estimated bytes one row of ``T`` tokens adds to the peak of an exact pass.

    ``L T (20 d + 5 f [+ 2 H T for eager attention]) s`` for ``L`` layers of width ``d``, MLP
    width ``f``, ``H`` attention heads and ``s`` bytes per element of the trainable parameters,
    read from the (text) config (``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``_attn_implementation``); without a config, ``64 d`` per token
    and group of 7 Linear layers. The head's vocabulary tiles and the Gram's chunk buffers do
    not grow with the rows (:func:`pass_fixed_bytes`).
    """
    cfg = _text_config(model)
    trainable = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    s = max((p.element_size() for p in trainable), default=4)
    d = getattr(cfg, "hidden_size", None)
    if d is None:
        lins = [m for m in model.modules() if isinstance(m, nn.Linear)]
        d = max((m.in_features for m in lins), default=1)
        return int(T * 64 * d * max(1, len(lins) // 7) * s)
    L = int(getattr(cfg, "num_hidden_layers", 1))
    f = int(getattr(cfg, "intermediate_size", None) or 4 * d)
    per_token = ACT_PER_D * d + ACT_PER_F * f
    if getattr(cfg, "_attn_implementation", None) == "eager":
        per_token += ACT_PER_KEY * int(getattr(cfg, "num_attention_heads", 1)) * T
    return int(L * T * per_token * s)


def pass_fixed_bytes(chunk_size: int | None, device: torch.device) -> int:
    """Bytes of an exact pass that do not grow with the rows: four vocabulary tiles of
    ``head.TILE_ENTRIES`` (logits, probabilities, their gradient, float64 at most) and three
    chunk buffers of the Gram (``chunk_size`` float64 entries each)."""
    chunk = default_chunk_size(device) if chunk_size is None else int(chunk_size)
    return 4 * TILE_ENTRIES * 8 + 3 * chunk * 8


def default_memory_budget(device: torch.device) -> int:
    """Half of the memory available now: ``MemAvailable`` of ``/proc/meminfo`` on CPU (8 GiB if
    unreadable), free plus cached-unused memory on CUDA."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free // 2)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 8 << 30


def plan_passes(sizes: list[int], max_rows: int) -> list[list[int]]:
    """Group consecutive blocks (by index) so that each group holds at most ``max_rows`` rows;
    a block larger than that is a group of its own (a block is never split)."""
    passes: list[list[int]] = []
    rows = 0
    for b, n in enumerate(sizes):
        if passes and rows + n <= max_rows:
            passes[-1].append(b)
            rows += n
        else:
            passes.append([b])
            rows = n
    return passes
