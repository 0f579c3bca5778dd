"""Log-probabilities of a causal LM's head in vocabulary tiles, never a ``[rows, T, V]`` tensor.

The head maps a final hidden state ``h`` (``d`` features) to logits over ``V`` tokens::

    y = h W^T + b                                   (raw projection, W [V, d], b [V] or None)
    z = softcap(s * y) / tau,   softcap(x) = c tanh(x / c)   (c = None: no cap)
    log p(v) = z_v - logsumexp(z),   H = -sum_v p(v) log p(v)

(``s`` = logit scale, ``c`` = final soft-cap, ``tau`` = temperature, read from the model config
as the trainers' fused heads read them; see :func:`head_transform`).

:func:`head_logprobs` computes ``log p(y_t)`` (and optionally ``H_t``) per token with an online
logsumexp over vocabulary tiles of ``vocab_tile`` columns. Its backward, given the per-token
gradients ``u_t = dL/d log p(y_t)`` and ``e_t = dL/dH_t``, recomputes each tile and forms the
gradient of the raw projection::

    dz_tv = u_t (1[v = y_t] - p_tv) - e_t p_tv (log p_tv + H_t)
    dy_tv = dz_tv / tau * (1 - tanh^2(s y_tv / c)) * s          (the chain through z(y))

from which ``dh_t = sum_v dy_tv W_v`` (and ``dW``, ``db`` when asked), one tile at a time. With a
:class:`real_model.gram.GramCapture` passed as ``capture``, each tile's ``dy`` is also
handed to it, which adds the head's per-row Gram contribution (weight, bias, tied-embedding cross
terms) tile by tile. Peak extra memory: one ``[N, vocab_tile]`` tile in the compute dtype (``N``
tokens), plus ``O(N)`` statistics.

Compute dtype: ``float64`` for float64 inputs, else ``float32`` (bf16/fp16 logits are upcast, as
:func:`real_model.gram.model.token_logprobs` does); statistics are accumulated in float64. With bf16
(fp16) hidden states and weight, each tile's projection multiplies them as they are with a float32
result (on CUDA ``torch.mm(..., out_dtype=torch.float32)``: tensor cores, the same products as
the float32 upcast; the float32 upcast at Nemotron's 256,000-token vocabulary would cost two
float32 GEMMs of 12.9 TFLOP per pass at R = 16 x 512 tokens). The backward's ``dh = dy W`` stays
in float32 (``dy`` is not rounded to half precision).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "HeadTransform",
    "head_transform",
    "head_logprobs",
    "logit_grad_tiles",
    "half_operand",
    "default_vocab_tile",
    "TILE_ENTRIES",
]

TILE_ENTRIES = 1 << 22
"""Default entries of one ``[N, vocab_tile]`` logits tile (32 MiB in float64, 16 MiB in float32)."""


@dataclass(frozen=True)
class HeadTransform:
    """``z = softcap(s y) / tau`` of the raw projection ``y`` (module docstring)."""

    temperature: float = 1.0
    logit_scale: float = 1.0
    softcap: float | None = None

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"temperature must be a positive finite number, got {self.temperature}"
            )
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap must be positive or None, got {self.softcap}")

    def apply(self, y: torch.Tensor) -> torch.Tensor:
        """``z = softcap(s y) / tau`` (a new tensor; differentiable)."""
        z = y * self.logit_scale
        if self.softcap is not None:
            z = self.softcap * torch.tanh(z / self.softcap)
        return z / self.temperature

    def apply_(self, y: torch.Tensor) -> torch.Tensor:
        """``z = softcap(s y) / tau``, in place on ``y`` (one tile: no temporary of its size)."""
        if self.logit_scale != 1.0:
            y.mul_(self.logit_scale)
        if self.softcap is not None:
            y.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.temperature != 1.0:
            y.div_(self.temperature)
        return y

    def chain(self, y: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
        """``dy = dz dz/dy = dz / tau * (1 - tanh^2(s y / c)) * s`` (in place on ``dz``)."""
        dz = dz.div_(self.temperature)
        if self.softcap is not None:
            t = torch.tanh(y * (self.logit_scale / self.softcap))
            dz = dz.mul_(1 - t * t)
        return dz.mul_(self.logit_scale)


def head_transform(model: nn.Module, temperature: float = 1.0) -> HeadTransform:
    """The head transform of a Hugging Face causal LM, read from its (text) config as the
    trainers' fused heads read it: ``logit_scale`` (else ``output_multiplier``, else
    ``lm_head_multiplier``, else ``1 / logits_scaling``, or ``logits_scaling`` for HyperCLOVA X),
    ``final_logit_softcapping``, and the given ``temperature``."""
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    scale = None
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        if scale is None:
            scale = getattr(cfg, name, None)
    if scale is None and getattr(cfg, "logits_scaling", None) is not None:
        ls = float(cfg.logits_scaling)
        scale = ls if getattr(cfg, "model_type", "") == "hyperclovax" else 1.0 / ls
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return HeadTransform(
        temperature=float(temperature),
        logit_scale=1.0 if scale is None else float(scale),
        softcap=None if softcap is None else float(softcap),
    )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_vocab_tile(n_tokens: int, vocab: int) -> int:
    """Columns of one tile: ``TILE_ENTRIES / n_tokens``, at least 128, at most ``vocab``."""
    return int(min(vocab, max(128, TILE_ENTRIES // max(1, n_tokens))))


def half_operand(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``hidden`` as ``[N, d]`` in its own dtype when it and ``weight`` are both bfloat16 (or both
    float16): the projection then multiplies these half-precision values with a float32 result
    (:func:`_mm_float32`), the same products as the float32 upcast. ``None`` otherwise."""
    if hidden.dtype in (torch.bfloat16, torch.float16) and weight.dtype == hidden.dtype:
        return hidden.detach().reshape(-1, hidden.shape[-1])
    return None


def _mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of half-precision operands as float32: on CUDA ``torch.mm(..., out_dtype=
    torch.float32)`` (tensor cores, float32 accumulation, the output not rounded to the operands'
    dtype); elsewhere the float32 upcast (``out_dtype`` is CUDA-only in torch 2.13)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def _raw_tile(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, v0: int, v1: int,
    half: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = h W[v0:v1]^T + b[v0:v1]`` in ``h``'s dtype: ``[N, v1 - v0]``. ``half``: ``h`` in
    half precision (:func:`half_operand`; ``h`` is its float32 upcast), multiplied as such."""
    if half is None:
        y = h @ weight[v0:v1].to(h.dtype).T
    else:
        y = _mm_float32(half, weight[v0:v1].T)
    if bias is not None:
        y += bias[v0:v1].to(h.dtype)
    return y


def _tile_statistics(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    transform: HeadTransform,
    tile: int,
    entropy: bool,
    half: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Online logsumexp over tiles: ``(log Z [N], z_target [N], H [N] or None)``, float64.

    Per tile, ``m' = max(m, max z)``, ``S' = S e^{m - m'} + sum e^{z - m'}`` and, for the entropy,
    ``A' = A e^{m - m'} + sum z e^{z - m'}``; finally ``log Z = m + log S``, ``H = log Z - A / S``.
    """
    N, V = h.shape[0], weight.shape[0]
    f64 = torch.float64
    m = torch.full((N,), float("-inf"), dtype=f64, device=h.device)
    S = torch.zeros(N, dtype=f64, device=h.device)
    A = torch.zeros(N, dtype=f64, device=h.device) if entropy else None
    zt = torch.zeros(N, dtype=f64, device=h.device)
    for v0 in range(0, V, tile):
        v1 = min(V, v0 + tile)
        z = transform.apply_(_raw_tile(h, weight, bias, v0, v1, half))
        inside = (targets >= v0) & (targets < v1)
        local = (targets - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)
        zt = torch.where(inside, z.gather(1, local).squeeze(1).to(f64), zt)
        m_new = torch.maximum(m, z.amax(dim=1).to(f64))
        rescale = torch.exp(m - m_new)
        e = torch.sub(z, m_new.to(z.dtype).unsqueeze(1)).exp_()
        S = S * rescale + e.sum(dim=1, dtype=f64)
        if A is not None:
            A = A * rescale + e.mul_(z).sum(dim=1, dtype=f64)
        m = m_new
    log_z = m + torch.log(S)
    return log_z, zt, (None if A is None else log_z - A / S)


def logit_grad_tiles(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    log_z: torch.Tensor,
    *,
    transform: HeadTransform,
    tile: int,
    grad_logprobs: torch.Tensor | None,
    grad_entropy: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    half: torch.Tensor | None = None,
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield ``(v0, v1, dy)``: the gradient of the raw projection on columns ``[v0, v1)``.

    ``dy_tv = chain(dz_tv)``, ``dz_tv = u_t (1[v = y_t] - p_tv) - e_t p_tv (log p_tv + H_t)``
    (module docstring), ``p_tv = exp(z_tv - log Z_t)``. Shapes: ``h [N, d]`` (compute dtype),
    ``targets, log_z, grad_logprobs (u), grad_entropy (e), entropy (H)`` ``[N]``; ``dy`` is
    ``[N, v1 - v0]`` in ``h``'s dtype (the buffer is reused by the next tile). ``half``: ``h``
    in bfloat16/float16 (:func:`half_operand`) for the tiles' projections.
    """
    V = weight.shape[0]
    cd = h.dtype
    lz = log_z.to(cd).unsqueeze(1)
    u = None if grad_logprobs is None else grad_logprobs.to(cd).unsqueeze(1)
    e = None if grad_entropy is None else grad_entropy.to(cd).unsqueeze(1)
    H = None if entropy is None else entropy.to(cd).unsqueeze(1)
    if e is not None and H is None:
        raise ValueError("an entropy gradient needs the entropy of the forward")
    for v0 in range(0, V, tile):
        v1 = min(V, v0 + tile)
        y = _raw_tile(h, weight, bias, v0, v1, half)
        # the soft-cap's chain rule needs y; otherwise the tile is transformed in place
        logp = (transform.apply(y) if transform.softcap is not None else
                transform.apply_(y)).sub_(lz)
        dz = torch.exp(logp)  # p, turned into dz in place below
        ent = None if e is None else (logp.add_(H)).mul_(dz).mul_(e)  # e p (log p + H)
        if u is not None:
            dz.mul_(-u)
            inside = ((targets >= v0) & (targets < v1)).nonzero().squeeze(1)
            dz.index_put_((inside, targets[inside] - v0), u[inside, 0], accumulate=True)
        else:
            dz.zero_()
        if ent is not None:
            dz.sub_(ent)
        yield v0, v1, transform.chain(y, dz)


class _HeadLogProbs(torch.autograd.Function):
    """Tiled ``log p(y_t)`` (and ``H_t``); backward tile by tile (module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        transform: HeadTransform,
        tile: int,
        want_entropy: bool,
        capture: Any,
        param_grads: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx.set_materialize_grads(False)
        ctx.param_grads = param_grads
        lead, d = hidden.shape[:-1], hidden.shape[-1]
        h = hidden.detach().reshape(-1, d).to(_compute_dtype(hidden.dtype))
        tgt = targets.reshape(-1).long()
        log_z, zt, H = _tile_statistics(h, weight.detach(), None if bias is None else
                                        bias.detach(), tgt, transform, tile, want_entropy,
                                        half_operand(hidden, weight))
        cd = h.dtype
        ctx.save_for_backward(hidden, weight, bias, tgt, log_z, H)
        ctx.transform, ctx.tile, ctx.capture, ctx.lead = transform, tile, capture, lead
        lp = (zt - log_z).to(cd).reshape(lead)
        return lp, (None if H is None else H.to(cd).reshape(lead))

    @staticmethod
    def backward(ctx: Any, g_lp: torch.Tensor | None, g_h: torch.Tensor | None) -> tuple:
        if g_lp is None and g_h is None:
            return (None,) * 9
        hidden, weight, bias, tgt, log_z, H = ctx.saved_tensors
        d = hidden.shape[-1]
        h = hidden.detach().reshape(-1, d).to(_compute_dtype(hidden.dtype))
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need_w, need_b = need_w and ctx.param_grads, need_b and ctx.param_grads
        dh = torch.zeros_like(h) if need_h else None
        dw = torch.zeros(weight.shape, dtype=h.dtype, device=h.device) if need_w else None
        db = torch.zeros(bias.shape, dtype=h.dtype, device=h.device) if need_b else None
        capture = ctx.capture
        state = None if capture is None else capture.head_begin(weight, bias, h.view(
            *ctx.lead, d))
        tiles = logit_grad_tiles(
            h, weight.detach(), None if bias is None else bias.detach(), tgt, log_z,
            transform=ctx.transform, tile=ctx.tile,
            grad_logprobs=None if g_lp is None else g_lp.reshape(-1),
            grad_entropy=None if g_h is None else g_h.reshape(-1), entropy=H,
            half=half_operand(hidden, weight),
        )
        for v0, v1, dy in tiles:
            w_t = weight[v0:v1].detach().to(h.dtype)
            if dh is not None:
                dh.addmm_(dy, w_t)
            if dw is not None:
                dw[v0:v1].addmm_(dy.T, h)
            if db is not None:
                db[v0:v1] += dy.sum(dim=0)
            if state is not None:
                capture.head_tile(state, v0, v1, dy.view(*ctx.lead, v1 - v0))
        if state is not None:
            capture.head_end(state)
        return (
            None if dh is None else dh.to(hidden.dtype).view(hidden.shape),
            None if dw is None else dw.to(weight.dtype),
            None if db is None else db.to(bias.dtype),
            None, None, None, None, None, None,
        )


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    transform: HeadTransform | None = None,
    vocab_tile: int | None = None,
    entropy: bool = False,
    capture: Any = None,
    param_grads: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``log p(targets)`` (and entropy) of the head, in vocabulary tiles; autograd.

    Args:
        hidden: ``[..., d]`` final hidden states (e.g. ``[R, T, d]``).
        weight: ``[V, d]`` head weight (may be the tied input embedding).
        bias: ``[V]`` or ``None``.
        targets: ``[...]`` token ids in ``[0, V)`` scored at each position.
        transform: logit scale, soft-cap and temperature (default: identity).
        vocab_tile: columns per tile (default :func:`default_vocab_tile`).
        entropy: also return the per-token entropy ``H`` (differentiable).
        capture: a :class:`real_model.gram.GramCapture` that adds the head's per-row
            Gram contribution in the backward (``hidden`` must then be ``[R, T, d]``).
        param_grads: compute the gradients of ``weight`` and ``bias`` (default). ``False`` when
            the backward only wants ``dh`` and the Gram (a custom autograd function cannot tell
            which inputs a ``torch.autograd.grad`` call needs): saves the ``[V, d]`` gradient
            GEMM; ``weight``/``bias`` then receive no gradient from the head.

    Returns:
        ``(logp, H)``: ``[...]`` in float64 for float64 inputs, else float32; ``H`` is ``None``
        unless ``entropy``.
    """
    if hidden.shape[-1] != weight.shape[-1] or weight.dim() != 2:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do not "
                         "match: need hidden [..., d] and weight [V, d]")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} must be hidden's leading shape "
                         f"{tuple(hidden.shape[:-1])}")
    V = weight.shape[0]
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= V):
        raise ValueError(f"targets must be token ids in [0, {V}), got values in "
                         f"[{int(targets.min())}, {int(targets.max())}]")
    n_tok = max(1, targets.numel())
    tile = default_vocab_tile(n_tok, V) if vocab_tile is None else int(vocab_tile)
    if tile < 1:
        raise ValueError(f"vocab_tile must be a positive integer, got {vocab_tile!r}")
    return _HeadLogProbs.apply(hidden, weight, bias, targets, transform or HeadTransform(),
                               tile, bool(entropy), capture, bool(param_grads))
