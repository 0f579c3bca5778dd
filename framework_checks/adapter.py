"""The one layout every framework adapter speaks, and the autograd read-out of a loss's weights.

Inputs are ``rewards [P, R]`` (NaN allowed where the framework accepts it) and ``lengths [P, R]``
(completion token counts); outputs are per-sequence values ``[P, R]``: the advantage on the
completion's tokens (NaN for an empty completion, which has none), or the per-sequence gradient
weight ``w_i`` of a loss at the on-policy point (ratio 1), read off
``d loss / d logp_it = -w_i A_i`` by autograd (:func:`loss_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .source import FrameworkCodeError

__all__ = ["FrameworkCode", "torch_dtype", "completion_masks", "per_sequence", "loss_weights"]


@dataclass
class FrameworkCode:
    """A framework's advantage settings and loss modes, each runnable on our layout."""

    framework: str
    version: str
    origin: str
    commit: str | None
    dtype: str
    advantages: dict[str, Callable[..., np.ndarray]] = field(default_factory=dict)
    losses: dict[str, Callable[..., np.ndarray]] = field(default_factory=dict)
    extras: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """Framework functions with inputs beyond rewards (verl: ``remax(rewards, lengths, greedy)``,
    ``optimal_token_baseline`` and ``grpo_outcome`` as verl defines them)."""


def torch_dtype(name: str) -> Any:
    """The torch dtype named ``float32``, ``float64`` or ``bfloat16``."""
    import torch

    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[name]


def completion_masks(lengths: np.ndarray, width: int | None = None) -> Any:
    """``[B, T]`` float mask of the completion tokens (``T`` = the longest, or ``width``)."""
    import torch

    L = np.asarray(lengths, dtype=np.int64).reshape(-1)
    T = max(int(L.max()) if L.size else 0, 1) if width is None else width
    return (torch.arange(T)[None, :] < torch.as_tensor(L)[:, None]).float()


def per_sequence(adv_tokens: Any, lengths: np.ndarray) -> np.ndarray:
    """First-token advantage of each completion (NaN when it has no token)."""
    a = adv_tokens.detach().double().cpu().numpy()
    L = np.asarray(lengths).reshape(-1)
    out = np.where(L > 0, a[:, 0], np.nan)
    return out.reshape(np.asarray(lengths).shape)


def loss_weights(
    loss_fn: Callable[[Any, Any, Any], Any], lengths: np.ndarray, advantages: np.ndarray, width: int
) -> np.ndarray:
    """``w_i`` from autograd: ``d loss / d logp_it = -w_i A_i`` (checked equal over tokens).

    ``loss_fn(logp [B, T], mask [B, T], A [B])`` is the framework's loss at ``logp = -1`` on every
    token (any constant: the ratio is 1).
    """
    import torch

    P, R = lengths.shape
    mask = completion_masks(lengths, width).double()
    A = torch.as_tensor(advantages.reshape(-1), dtype=torch.float64)
    logp = torch.full(mask.shape, -1.0, dtype=torch.float64, requires_grad=True)
    loss = loss_fn(logp, mask, A)
    (g,) = torch.autograd.grad(loss, logp, allow_unused=True)
    g = torch.zeros_like(logp) if g is None else g
    g = g.detach().numpy()
    L = lengths.reshape(-1)
    w = np.zeros(P * R)
    for i in range(P * R):
        if L[i] > 0:
            col = -g[i, : L[i]] / float(A[i])
            if not np.allclose(col, col[0], rtol=1e-9, atol=1e-15):
                raise FrameworkCodeError("the loss gradient is not uniform along a completion")
            w[i] = col[0]
    return w.reshape(P, R)
