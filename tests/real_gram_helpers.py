"""Shared helpers of the real_model Gram tests: tiny random float64 models (Llama, Qwen2,
Nemotron), rollout batches with padding and float token weights, the per-row autograd reference
``G G^T``, a recorder of the largest tensor an op returns, and random bf16/float32 layer inputs
with their float64 per-sample truth.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    NemotronConfig,
    NemotronForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

V = 40


def _jitter(model: nn.Module, seed: int) -> nn.Module:
    """float64, eval mode, and every parameter perturbed (norm weights are 1 / 0 at init)."""
    g = torch.Generator().manual_seed(seed)
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def llama(*, tied: bool, bias: bool = False, kv_heads: int = 2, pad: int | None = None,
          seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, attention_bias=bias,
                      mlp_bias=bias, tie_word_embeddings=tied, max_position_embeddings=64,
                      pad_token_id=pad)
    return _jitter(LlamaForCausalLM(cfg), seed)


def qwen2(seed: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      max_position_embeddings=64)
    return _jitter(Qwen2ForCausalLM(cfg), seed)


def nemotron(seed: int = 2) -> nn.Module:
    torch.manual_seed(seed)
    cfg = NemotronConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                         partial_rotary_factor=0.5, max_position_embeddings=64)
    return _jitter(NemotronForCausalLM(cfg), seed)


def batch(R: int = 3, T: int = 9, *, side: str = "left", seed: int = 0, floats: bool = True):
    """Rollouts of different lengths: prompt of 3 tokens, completion weights after it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (R, T), generator=g)  # 0 = padding_idx of one model
    am = torch.ones(R, T, dtype=torch.long)
    cm = torch.zeros(R, T, dtype=torch.float64)
    for i in range(R):
        n = T - (i % 3)  # real length of row i
        real = slice(T - n, T) if side == "left" else slice(0, n)
        pad = slice(0, T - n) if side == "left" else slice(n, T)
        am[i, pad] = 0
        ids[i, pad] = 0
        w = torch.rand(n, generator=g, dtype=torch.float64) + 0.5 if floats else torch.ones(n)
        w[:3] = 0.0  # prompt
        cm[i, real] = w
    return ids, am, cm


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def per_row_gram(model: nn.Module, terms) -> torch.Tensor:
    """``G G^T`` (float64) of ``g_i = d terms()[i] / d theta`` from ONE batched forward."""
    params = [p for p in model.parameters() if p.requires_grad]
    t = terms()
    rows = []
    for i in range(t.shape[0]):
        gs = torch.autograd.grad(t[i], params, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                               for g, p in zip(gs, params, strict=True)]))
    G = torch.stack(rows)
    return G @ G.T


class TensorSizeRecorder(TorchDispatchMode):
    """Records the number of entries of every tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


BF16_LAYER_RTOL = 2e-3


def random_layer(R: int, T: int, d_in: int, d_out: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(R, T, d_in, generator=g, dtype=torch.float64)
    d = torch.randn(R, T, d_out, generator=g, dtype=torch.float64)
    return a.to(dtype), d.to(dtype)


def layer_gram_truth(a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """float64 ``<dW_i, dW_j>`` from explicit per-sample gradients of the same (rounded) inputs."""
    dW = torch.einsum("rto,rti->roi", d.double(), a.double()).reshape(a.shape[0], -1)
    return dW @ dW.T
