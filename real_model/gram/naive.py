"""The naive reference Gram: one backward per row, flat gradients stored and dotted in float64.

``K_ij = <psi_i, psi_j>`` from ``R`` single-row forward + backward passes over every trainable
parameter, at most ``stored`` flat gradients held at once (:func:`naive_gram`). Slow and
memory-hungry on purpose: the independent route the exact engine is tested against.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .model import token_logprobs, trainable_parameters

__all__ = ["naive_gram"]


def naive_gram(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    chunk: int,
    pos: Any,
    stored: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """R single-rollout backward passes; at most ``stored`` flat gradients held at once.

    With ``B = stored < R`` the rows are taken in blocks of ``B``: a block's gradients are stored,
    then every later rollout's gradient is recomputed once per block and dotted with them
    (about ``R + R^2 / (2B)`` backward passes instead of ``R``).
    """
    params = [p for _, p in trainable_parameters(model)]
    R = ids.shape[0]
    n = sum(p.numel() for p in params)
    dtype = params[0].dtype if all(p.dtype == params[0].dtype for p in params) else torch.float64
    B = R if stored is None else max(1, min(R, int(stored)))
    psi = torch.empty(B, n, dtype=dtype, device=ids.device)  # stored flat gradients
    cur = torch.empty(n, dtype=dtype, device=ids.device) if B < R else None
    step = max(1, chunk // (B + 1))
    buf = torch.empty(B + 1, min(step, n), dtype=torch.float64, device=ids.device)
    lps: list[torch.Tensor | None] = [None] * R

    def grad_into(i: int, dst: torch.Tensor) -> None:
        pos_i = pos[i : i + 1] if isinstance(pos, torch.Tensor) else pos
        with torch.enable_grad():
            tok = token_logprobs(model, ids[i : i + 1], am[i : i + 1], position_ids=pos_i)
            loss = (tok * w[i : i + 1].to(tok.dtype)).sum()
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        lps[i] = tok.detach().to(torch.float64)
        off = 0
        for g, p in zip(grads, params, strict=True):
            seg = dst[off : off + p.numel()]
            seg.zero_() if g is None else seg.copy_(g.reshape(-1))
            off += p.numel()

    def dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """float64 ``a b^T`` of flat gradients, in column chunks."""
        out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=ids.device)
        for c0 in range(0, n, step):
            c = min(step, n - c0)
            fa, fb = buf[: a.shape[0], :c], buf[a.shape[0] : a.shape[0] + b.shape[0], :c]
            fa.copy_(a[:, c0 : c0 + c])
            if b is a:
                out.addmm_(fa, fa.T)
            else:
                fb.copy_(b[:, c0 : c0 + c])
                out.addmm_(fa, fb.T)
        return out

    K = torch.zeros(R, R, dtype=torch.float64, device=ids.device)
    for i0 in range(0, R, B):
        i1 = min(R, i0 + B)
        for i in range(i0, i1):
            grad_into(i, psi[i - i0])
        blk = psi[: i1 - i0]
        K[i0:i1, i0:i1] = dots(blk, blk)
        for j in range(i1, R):  # only when B < R
            grad_into(j, cur)
            col = dots(blk, cur.unsqueeze(0))[:, 0]
            K[i0:i1, j] = col
            K[j, i0:i1] = col
    return K, torch.cat(lps)
