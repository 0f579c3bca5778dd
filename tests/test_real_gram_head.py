"""The LM head in vocabulary tiles (:mod:`real_model.gram.head`) and the bounded-memory second
pass (:func:`real_model.gram.rows_gram`), on tiny float64 models.

Tiers: equivalence (tiled log-probs, entropies and their gradients == the full-logits autograd
to 1e-12; rows_gram == per-row reference to 1e-10 for tied/untied heads, biases, temperature,
logit scale and soft-cap, blocks, several passes); a memory property (no tensor with
``rows * T * V`` entries is created during a pass: every allocation's shape is recorded by a
``TorchDispatchMode``); hand-checked cases of the pass planner and the memory estimate.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from real_gram_helpers import TensorSizeRecorder, batch, llama, per_row_gram, rel_err  # noqa: E402

from real_model.gram import (  # noqa: E402
    EngineOptions,
    GramCapture,
    HeadTransform,
    head_logprobs,
    head_transform,
    pass_bytes_per_row,
    pass_fixed_bytes,
    plan_passes,
    rows_gram,
    token_logprobs,
    trajectory_gram,
)
from real_model.gram import api as gram_api  # noqa: E402

RTOL = 1e-10


def _full(h, W, b, tgt, tr: HeadTransform):
    y = h @ W.T + (0 if b is None else b)
    z = tr.apply(y)
    lp = torch.log_softmax(z, -1)
    ent = -(lp.exp() * lp).sum(-1)
    return lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1), ent


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tr", [HeadTransform(), HeadTransform(0.7, 1.3, None),
                                HeadTransform(1.5, 0.8, 2.0)])
@pytest.mark.parametrize("tile", [7, 64])
def test_tiled_logprobs_entropy_and_gradients_equal_full_logits(bias, tr, tile):
    g = torch.Generator().manual_seed(0)
    R, T, d, V = 3, 5, 6, 45
    h = torch.randn(R, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(V, d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    tgt = torch.randint(0, V, (R, T), generator=g)
    u = torch.randn(R, T, generator=g, dtype=torch.float64)
    e = torch.randn(R, T, generator=g, dtype=torch.float64)
    lp, ent = head_logprobs(h, W, b, tgt, transform=tr, vocab_tile=tile, entropy=True)
    lp_ref, ent_ref = _full(h, W, b, tgt, tr)
    assert float((lp - lp_ref).detach().abs().max()) <= 1e-12
    assert float((ent - ent_ref).detach().abs().max()) <= 1e-12
    inputs = [h, W] + ([b] if bias else [])
    got = torch.autograd.grad((lp * u + ent * e).sum(), inputs)
    ref = torch.autograd.grad((lp_ref * u + ent_ref * e).sum(), inputs)
    for a, r in zip(got, ref, strict=True):
        assert rel_err(a, r) <= 1e-12


@pytest.mark.parametrize("bias", [False, True])
def test_bf16_head_projects_its_own_values_with_a_float32_result(bias):
    """bf16 hidden states and weight: the tiles multiply the bf16 values with a float32 result
    (``half_operand``; on CUDA ``mm(out_dtype=float32)``), so the log-probs, entropies and
    gradients are the float32 computation on the float32 upcast of the same values (1e-6: float32
    summation order; on CPU the upcast itself)."""
    from real_model.gram.head import half_operand

    g = torch.Generator().manual_seed(1)
    R, T, d, V = 2, 4, 8, 40
    h = torch.randn(R, T, d, generator=g).to(torch.bfloat16).requires_grad_()
    W = torch.randn(V, d, generator=g).to(torch.bfloat16).requires_grad_()
    b = torch.randn(V, generator=g).to(torch.bfloat16).requires_grad_() if bias else None
    tgt = torch.randint(0, V, (R, T), generator=g)
    assert half_operand(h, W) is not None and half_operand(h.float(), W) is None
    assert half_operand(h, W.float()) is None
    tr = HeadTransform(0.9, 1.1, 3.0)
    lp, ent = head_logprobs(h, W, b, tgt, transform=tr, vocab_tile=16, entropy=True)
    h32, W32 = h.detach().float().requires_grad_(), W.detach().float().requires_grad_()
    b32 = None if b is None else b.detach().float()
    lp_ref, ent_ref = _full(h32, W32, b32, tgt, tr)
    assert lp.dtype == torch.float32
    assert rel_err(lp.detach(), lp_ref.detach()) <= 1e-6
    assert rel_err(ent.detach(), ent_ref.detach()) <= 1e-6
    u = torch.randn(R, T, generator=g)
    (gh, gw) = torch.autograd.grad((lp * u + ent).sum(), [h, W])
    (rh, rw) = torch.autograd.grad((lp_ref * u + ent_ref).sum(), [h32, W32])
    # the gradients come back in bf16 (the inputs' dtype): bf16 rounding of the float32 result
    assert rel_err(gh.float(), rh) <= 2 ** -8 and rel_err(gw.float(), rw) <= 2 ** -8


def test_head_transform_reads_the_config_as_trl_does():
    class Cfg:
        logit_scale = None
        output_multiplier = None
        lm_head_multiplier = None
        logits_scaling = 4.0
        final_logit_softcapping = 30.0
        model_type = "granite"

    m = nn.Module()
    m.config = Cfg()
    assert head_transform(m, 0.5) == HeadTransform(0.5, 0.25, 30.0)
    Cfg.model_type = "hyperclovax"
    assert head_transform(m).logit_scale == 4.0
    Cfg.logit_scale = 2.0
    assert head_transform(m).logit_scale == 2.0


def test_bad_head_inputs_raise():
    h = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="token ids"):
        head_logprobs(h, torch.zeros(5, 4), None, torch.full((2, 3), 5))
    with pytest.raises(ValueError, match="do not match"):
        head_logprobs(h, torch.zeros(5, 3), None, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        HeadTransform(temperature=0.0)


def _terms_at(model, ids, am, u, temperature=1.0):
    return lambda: (token_logprobs(model, ids, am, temperature=temperature) * u).sum(dim=1)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_rows_gram_equals_per_row_reference(tied, temperature):
    model = llama(tied=tied, bias=True, kv_heads=2, pad=0, seed=4)
    ids, am, cm = batch(R=4, T=9)
    g = torch.Generator().manual_seed(3)
    u = torch.randn(cm.shape, generator=g, dtype=torch.float64) * (cm != 0)
    K_ref = per_row_gram(model, _terms_at(model, ids, am, u, temperature))
    K = rows_gram(model, ids, am, u, temperature=temperature, engine=EngineOptions(vocab_tile=7))
    assert rel_err(K, K_ref) <= RTOL


def test_rows_gram_with_logit_scale_and_softcap_equals_per_row_reference():
    """Gemma-style soft-cap and a logit scale, read from the config as TRL reads them."""
    model = llama(tied=False, seed=6)
    model.config.final_logit_softcapping = 3.0
    model.config.logit_scale = 1.7
    ids, am, cm = batch(R=3, T=8, side="right")
    tr = head_transform(model, 0.9)

    def terms():
        out = model.model(input_ids=ids, attention_mask=am,
                          position_ids=(am.cumsum(-1) - 1).clamp(min=0))
        z = tr.apply(model.lm_head(out.last_hidden_state[:, :-1]))
        lp = torch.log_softmax(z, -1).gather(-1, ids[:, 1:, None])[..., 0]
        return (lp * cm[:, 1:]).sum(1)

    K = rows_gram(model, ids, am, cm, temperature=0.9, engine=EngineOptions(vocab_tile=11))
    assert rel_err(K, per_row_gram(model, terms)) <= RTOL


def test_rows_gram_blocks_and_passes_under_a_small_budget_equal_one_pass(monkeypatch):
    model = llama(tied=True, bias=True, kv_heads=2, pad=0, seed=7)
    ids, am, cm = batch(R=6, T=9, seed=2)
    K_full = trajectory_gram(model, ids, am, cm, method="naive")
    blocks = [[0, 1], [2, 5], [3], [4]]
    made: list[GramCapture] = []

    class Recorded(GramCapture):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(gram_api, "GramCapture", Recorded)
    per_row = pass_bytes_per_row(model, 9)
    fixed = pass_fixed_bytes(None, ids.device)
    Ks, lp = rows_gram(model, ids, am, cm, blocks=blocks, return_logprobs=True,
                       memory_budget_bytes=fixed + 2 * per_row)
    assert [c.n for c in made] == [2, 2, 2]  # [0,1] | [2,5] | [3]+[4]
    for b, K in zip(blocks, Ks, strict=True):
        assert rel_err(K, K_full[b][:, b]) <= RTOL
    _, lp_ref = trajectory_gram(model, ids, am, cm, return_logprobs=True)
    on = cm != 0
    assert float((lp - lp_ref)[on].abs().max()) <= 1e-12


def test_plan_passes_hand_checked():
    assert plan_passes([2, 2, 1, 1], 2) == [[0], [1], [2, 3]]
    assert plan_passes([3, 1, 1], 4) == [[0, 1], [2]]
    assert plan_passes([5, 1], 2) == [[0], [1]]  # a block is never split


def test_pass_bytes_per_row_hand_checked():
    model = llama(tied=False, seed=8)  # L=2, d=16, f=24, H=4, float64
    model.config._attn_implementation = "sdpa"
    assert pass_bytes_per_row(model, 10) == 2 * 10 * (20 * 16 + 5 * 24) * 8
    model.config._attn_implementation = "eager"  # + the [H, T, T] scores and probabilities
    assert pass_bytes_per_row(model, 10) == 2 * 10 * (20 * 16 + 5 * 24 + 2 * 4 * 10) * 8


def test_rows_gram_rejects_bad_input():
    model = llama(tied=False, seed=9)
    ids, am, cm = batch(R=3)
    with pytest.raises(ValueError, match=r"token_weights\[:, 0\]"):
        rows_gram(model, ids, am, cm.index_fill(1, torch.tensor([0]), 1.0))
    with pytest.raises(ValueError, match="outside"):
        rows_gram(model, ids, am, cm, blocks=[[0, 3]])
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        rows_gram(model, ids, am, cm, memory_budget_bytes=0)


def test_no_rows_by_tokens_by_vocab_tensor_in_a_pass():
    from transformers import LlamaConfig, LlamaForCausalLM

    V = 3000
    cfg = LlamaConfig(vocab_size=V, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).double().eval()
    R, T = 3, 12
    ids = torch.randint(0, V, (R, T), generator=torch.Generator().manual_seed(1))
    am = torch.ones(R, T, dtype=torch.long)
    cm = torch.zeros(R, T, dtype=torch.float64)
    cm[:, 4:] = 1.0
    with TensorSizeRecorder() as mode:
        K = rows_gram(model, ids, am, cm, engine=EngineOptions(vocab_tile=256, chunk_size=1 << 12))
    assert mode.largest < R * (T - 1) * V  # the full logits would be R (T - 1) V entries
    with TensorSizeRecorder() as full:
        token_logprobs(model, ids, am)
    assert full.largest >= R * (T - 1) * V  # the recorder sees the full-logits route's tensor
    assert rel_err(K, trajectory_gram(model, ids, am, cm, method="naive")) <= RTOL


def test_rows_gram_under_reentrant_checkpointing_keeps_the_hosts_grads():
    """``autograd.grad`` cannot run through reentrant checkpointing: the pass then runs a full
    ``.backward()`` and restores every ``.grad`` the host had."""
    import warnings

    model = llama(tied=True, bias=True, kv_heads=2, pad=0, seed=10)
    ids, am, cm = batch(R=3, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": True})
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.5)
        K = rows_gram(model, ids, am, cm)
    assert rel_err(K, K_ref) <= RTOL
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in model.parameters())
