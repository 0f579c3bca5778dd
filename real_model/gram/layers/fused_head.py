"""A generic fused-head hook: a host whose head computes log-probs itself feeds the capture here.

Some hosts never call the ``lm_head`` module: a fused kernel computes the per-token
log-probabilities (and entropies) over vocabulary chunks. The host's integration hands the
capture that kernel's inputs and outputs (``GramCapture.watch_fused_head``, or the
:meth:`GramCapture.fused_head_hook` that follows handovers); this module hooks the kernel's
backward node and, from ``u = dL/dlogp`` there, recomputes the head's logits gradient tile by
tile (:func:`real_model.gram.head.logit_grad_tiles`) into the pass
(:mod:`real_model.gram.layers.head`): no ``[rows, T, V]`` tensor, the host's values and
gradients untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..head import HeadTransform, default_vocab_tile, half_operand, logit_grad_tiles
from ..state import GramCaptureError, Pass, guard
from .head import head_begin, head_end, head_tile

__all__ = ["watch_fused_head"]


def watch_fused_head(p: Pass, outputs: tuple, hidden: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None, targets: torch.Tensor,
                     transform: HeadTransform, mask: Any, tile: int) -> None:
    """After a host's fused head ran: hook its backward node to add the head's contribution.

    ``outputs``: the head's ``(log p [N], entropy [N] or absent)``; ``hidden`` ``[N, d]``,
    ``targets`` ``[N]``: the ``N`` scored tokens. ``mask`` ``[n, T']`` (bool: the positions
    the host scores a label at) places them in rows: the host scores either the masked tokens
    only (``N = mask.sum()``) or every position (``N = n T'``, row-major). ``tile``: vocabulary
    columns per tile, at most the host's own chunk width.
    """
    logp = outputs[0]
    if p.failed or p.busy or not isinstance(logp, torch.Tensor) or \
            not logp.requires_grad or logp.grad_fn is None:
        return
    state = guard(p, "fused head", lambda: _fused_rows(hidden, mask))
    if state is None:
        return
    ent = outputs[1] if len(outputs) > 1 and isinstance(outputs[1], torch.Tensor) else None
    saved = (hidden.detach(), weight, bias, targets, logp.detach(),
             None if ent is None else ent.detach(), transform, state, tile)
    logp.grad_fn.register_prehook(functools.partial(_fused_backward, p, saved))


def _fused_rows(hidden: torch.Tensor, mask: Any) -> tuple:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise GramCaptureError("fused head: no token mask [rows, T] of bool was handed over "
                               "(the host's integration could not read it)")
    N = hidden.shape[0]
    if N == mask.numel():
        rr, cc = None, None
    elif N == int(mask.sum()):
        rr, cc = mask.nonzero(as_tuple=True)
    else:
        raise GramCaptureError(f"fused head: {N} scored tokens match neither the mask's "
                               f"{mask.numel()} positions nor its {int(mask.sum())} labels")
    return (mask.shape, rr, cc)


def _fused_backward(p: Pass, saved: tuple, grad_outputs: tuple) -> None:
    """Pre-hook of the host's backward node: per tile ``dy`` from ``u = dL/dlogp`` (and the
    entropy's gradient), scattered into rows ``[n, T', tile]`` for :func:`head_tile`."""
    if p.failed:
        return None
    hidden, weight, bias, targets, logp, ent, transform, (shape, rr, cc), tile = saved
    g_lp = grad_outputs[0]
    g_ent = grad_outputs[1] if len(grad_outputs) > 1 else None
    if g_lp is None and g_ent is None:
        return None
    cd = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    wd = weight.detach()
    bd = None if bias is None else bias.detach()

    def run() -> None:
        keep, rows = _fused_token_layout(p, shape, rr, cc, g_lp, g_ent, hidden.shape[0])
        h_kept = hidden[keep]
        h = h_kept.to(cd)
        tgt = targets[keep].long()
        zt = transform.apply((h * wd[tgt].to(cd)).sum(-1) + (0 if bd is None else bd[tgt]))
        log_z = zt.double() - logp[keep].double()  # the host's own normaliser: z_t - log p
        st = head_begin(p, weight, bias, rows(h))
        if st is None:
            return
        tiles = logit_grad_tiles(
            h, wd, bd, tgt, log_z, transform=transform,
            tile=min(tile, default_vocab_tile(h.shape[0], wd.shape[0])),
            grad_logprobs=None if g_lp is None else g_lp.reshape(-1)[keep],
            grad_entropy=None if g_ent is None else g_ent.reshape(-1)[keep],
            entropy=None if ent is None else ent.reshape(-1)[keep],
            half=half_operand(h_kept, wd))
        for v0, v1, dy in tiles:
            head_tile(p, st, v0, v1, rows(dy))
        head_end(p, st)

    guard(p, "fused head", run)
    return None


def _fused_token_layout(
    p: Pass, shape: tuple, rr: torch.Tensor | None, cc: torch.Tensor | None,
    g_lp: torch.Tensor | None, g_ent: torch.Tensor | None, N: int,
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The scored tokens whose log-prob or entropy receives a nonzero gradient (``keep``,
    indices into the host's ``N`` tokens) and ``rows(t)``: ``t [len(keep), k]`` laid out per row,
    ``[n, L, k]``, row ``i``'s kept tokens first (``L`` the most any row keeps), zeros after.

    Tokens with a zero upstream gradient have a zero logits gradient, so dropping them
    changes no row's gradient; a host that scores every position (prompt and padding too)
    then skips the head's recomputation outside the completions. Packed rows (``segments``)
    keep every position in the host's layout.
    """
    n, Tp = shape
    dev = (g_lp if g_lp is not None else g_ent).device  # type: ignore[union-attr]
    active = torch.zeros(N, dtype=torch.bool, device=dev)
    for g in (g_lp, g_ent):
        if g is not None:
            active |= g.reshape(-1) != 0
    if p.packed is not None:
        active[:] = True
    keep = active.nonzero().squeeze(1)
    if rr is None:
        r, c = keep // Tp, keep % Tp
    else:
        r, c = rr.to(dev)[keep], cc.to(dev)[keep]  # type: ignore[union-attr]
    if p.packed is None:  # compact: row i's kept tokens at columns 0, 1, ...
        counts = torch.bincount(r, minlength=n)
        starts = torch.cumsum(counts, 0) - counts
        c = torch.arange(keep.numel(), device=dev) - starts[r]
        Tp = max(1, int(counts.max())) if keep.numel() else 1

    def rows(t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros(n, Tp, t.shape[-1])
        out[r, c] = t
        return out

    return keep, rows
