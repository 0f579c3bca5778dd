"""The Gram capture around TRL 1.16's fused LM head (optional extra ``trl``).

``add_fused_lm_head`` makes ``model(..., labels=..., fused_lm_head=True)`` compute per-token
log-probs (and entropies) in vocabulary tiles through ``_ChunkedLogProbFunction``, never calling
the ``lm_head`` module. Inside a capture and the TRL integration's ``fused_head`` block that
function is intercepted and the head's Gram contribution (weight, tied-embedding cross terms) is
added tile by tile.

Reference: explicit per-row autograd of the same batched fused forward. Tolerance, stated: TRL
computes that head's statistics and gradient GEMMs in float32 even for a float64 model
(``_addmm_fp32``, float32 logsumexp), so the host's own rows carry float32 rounding (~1e-7
relative per entry) which the capture's float64 recomputation of the head does not share; ``K``
agrees to 1e-6 (measured 1e-9 to 2e-8). Both token layouts are tested: every position (TRL on
CPU) and the masked tokens only (TRL's "compact" mode on Triton devices, forced here).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("trl")

import trl.trainer.utils as trl_utils  # noqa: E402
from real_gram_helpers import (  # noqa: E402
    batch,
    llama,
    per_row_gram,
    rel_err,
)

from real_model.gram import GramCapture  # noqa: E402
from real_model.integrations.trl.private import fused_head  # noqa: E402

TRL_RTOL = 1e-6


def fused(tied: bool, seed: int = 4):
    model = llama(tied=tied, bias=False, kv_heads=2, seed=seed)
    trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model


def _inputs(R=4, T=9):
    ids, am, _ = batch(R=R, T=T)
    labels = ids.masked_fill(am == 0, -100)
    labels[:, :3] = -100  # prompt
    u = torch.randn(R, T - 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return ids, am, labels, u


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("entropy_bonus", [0.0, 0.1])
def test_capture_around_trl_fused_head_equals_per_row_reference(monkeypatch, tied, compact,
                                                                entropy_bonus):
    model = fused(tied)
    ids, am, labels, u = _inputs()
    if compact:
        monkeypatch.setattr(trl_utils, "_use_triton", lambda device: True)

    def terms():
        out = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
        return (out.log_probs * u).sum(1) + entropy_bonus * out.entropy.sum(1)

    K_ref = per_row_gram(model, terms)
    model.zero_grad(set_to_none=True)
    terms().sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with GramCapture(model) as cap, fused_head(cap):
        terms().sum().backward()
    assert set(cap.coverage().values()) == {1}  # lm_head counted once, though never called
    assert rel_err(cap.result(), K_ref) <= TRL_RTOL
    for g, p in zip(plain, model.parameters(), strict=True):
        assert torch.equal(g, p.grad)
    assert trl_utils._ChunkedLogProbFunction is not None
    assert type(trl_utils._ChunkedLogProbFunction).__name__ != "_TrlFusedHead"  # restored


def test_handover_passes_trls_fused_head_on_to_the_next_capture():
    """Two passes on one set of hooks (``handover``, no input taps): each equals its per-row
    reference, the fused head reporting to the capture of its own pass; TRL's function is
    restored after the last exit."""
    model = fused(tied=False)
    refs = []
    for ids, am, labels, u in (_inputs(R=4, T=9), _inputs(R=3, T=7)):
        def terms(ids=ids, am=am, labels=labels, u=u):
            out = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
            return (out.log_probs * u).sum(1)
        refs.append((terms, per_row_gram(model, terms)))
    model.zero_grad(set_to_none=True)
    first = GramCapture(model, input_taps=False).__enter__()
    head = fused_head(first).__enter__()
    second = first
    try:
        refs[0][0]().sum().backward()
        second = first.handover()
        assert trl_utils._ChunkedLogProbFunction.capture is second
        refs[1][0]().sum().backward()
    finally:
        second.__exit__(None, None, None)
        first.__exit__(None, None, None)
        head.__exit__(None, None, None)
    model.zero_grad(set_to_none=True)
    assert type(trl_utils._ChunkedLogProbFunction).__name__ != "_TrlFusedHead"  # restored
    for cap, (_, K_ref) in zip((first, second), refs, strict=True):
        assert set(cap.coverage().values()) == {1}
        assert rel_err(cap.result(), K_ref) <= TRL_RTOL


def test_trl_head_contribution_matters():
    """Removing the intercept (the head never counted) is reported, not silently wrong."""
    model = fused(tied=False)
    ids, am, labels, u = _inputs()
    original = trl_utils._ChunkedLogProbFunction
    with GramCapture(model) as cap, fused_head(cap):
        trl_utils._ChunkedLogProbFunction = original  # undo the intercept
        out = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
        (out.log_probs * u).sum().backward()
    assert any("'lm_head'" in p and "never called" in p for p in cap.problems())


def test_trl_fused_head_with_peft_adapters():
    peft = pytest.importorskip("peft")
    base = fused(tied=True, seed=8)
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "up_proj"]))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    ids, am, labels, u = _inputs(R=3)

    def terms():
        out = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
        return (out.log_probs * u).sum(1)

    K_ref = per_row_gram(model, terms)
    with GramCapture(model) as cap, fused_head(cap):
        terms().sum().backward()
    # the head is frozen: TRL's float32 head only shapes the adapters' delta, which the capture
    # takes from the host's own backward, so here the rows agree to float64 rounding
    assert rel_err(cap.result(), K_ref) <= 1e-10


def test_capture_around_trl_fused_head_creates_no_rows_by_tokens_by_vocab_tensor(monkeypatch):
    """With TRL's vocabulary chunk below V, neither TRL nor the capture's head tiles form the
    full logits: every tensor of the forward + backward has fewer than rows (T-1) V entries."""
    from real_gram_helpers import TensorSizeRecorder
    from transformers import LlamaConfig, LlamaForCausalLM

    V = 3000
    cfg = LlamaConfig(vocab_size=V, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).double()
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    monkeypatch.setattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 256)
    R, T = 3, 12
    ids = torch.randint(0, V, (R, T), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :4] = -100
    with TensorSizeRecorder() as mode, GramCapture(model) as cap, fused_head(cap):
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                    fused_lm_head=True)
        out.log_probs.sum().backward()
    assert cap.ok
    assert mode.largest < R * (T - 1) * V
