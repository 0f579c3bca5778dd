"""The Gram capture and the second pass on PEFT LoRA models (optional extra ``peft``).

The rows ``g_i`` are the gradients over the trainable parameters only: the adapters' ``lora_A`` /
``lora_B`` Linear layers (frozen base weights are not rows' parameters). Reference: explicit
per-row autograd of the same batched forward (``real_gram_helpers.per_row_gram``), 1e-10 relative.
With LoRA dropout in training mode the capture measures the rows of the loss actually
backpropagated, with its own dropout masks: the reference replays the same masks (same seed).
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from real_gram_helpers import (  # noqa: E402
    batch,
    llama,
    per_row_gram,
    rel_err,
)

from real_model.gram import (  # noqa: E402
    GramCapture,
    active_dropout_modules,
    rows_gram,
    token_logprobs,
    trajectory_gram,
)

RTOL = 1e-10
TARGETS = ["q_proj", "v_proj", "down_proj"]


def lora(*, dropout: float = 0.0, seed: int = 5):
    base = llama(tied=True, bias=False, kv_heads=2, seed=seed)
    model = peft.get_peft_model(base, peft.LoraConfig(r=3, lora_alpha=6, target_modules=TARGETS,
                                                      lora_dropout=dropout))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # lora_B starts at 0: perturb so that every adapter has a gradient
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _seeded_terms(model, ids, am, cm, seed=123):
    def terms():
        torch.manual_seed(seed)  # the same dropout masks in every forward
        return (token_logprobs(model, ids, am) * cm).sum(dim=1)
    return terms


def test_only_adapter_parameters_are_rows_parameters():
    model = lora()
    cap = GramCapture(model)
    assert cap.plan.modules and all(".lora_A." in n or ".lora_B." in n for n in cap.plan.modules)
    assert len(cap.plan.modules) == 2 * 2 * len(TARGETS)


def test_capture_and_second_pass_on_lora_equal_naive():
    model = lora().eval()
    ids, am, cm = batch(R=4, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    with GramCapture(model) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert rel_err(cap.result(), K_ref) <= RTOL
    assert rel_err(rows_gram(model, ids, am, cm, blocks=[[0, 1, 2, 3]])[0], K_ref) <= RTOL


@pytest.mark.parametrize("reentrant", [None, True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_lora_with_checkpointing_and_dropout_in_run_equals_same_mask_reference(reentrant,
                                                                               dropout):
    model = lora(dropout=dropout)
    ids, am, cm = batch(R=4, T=9)
    model.train()
    K_ref = per_row_gram(model, _seeded_terms(model, ids, am, cm))  # no checkpointing here
    if reentrant is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.enable_input_require_grads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GramCapture(model) as cap:
            _seeded_terms(model, ids, am, cm)().sum().backward()
    assert set(cap.coverage().values()) == {1}
    assert rel_err(cap.result(), K_ref) <= RTOL
    named = active_dropout_modules(model)
    assert len(named) == (2 * len(TARGETS) if dropout else 0)
    assert all("lora_dropout" in n for n in named)


def test_second_pass_with_dropout_does_not_see_the_step_masks():
    """Why adapters must log active dropout: a second pass draws new masks, so its Gram is not
    the Gram of the step's rows (which the in-run capture measures)."""
    model = lora(dropout=0.5).train()
    ids, am, cm = batch(R=3, T=9)
    K_step = per_row_gram(model, _seeded_terms(model, ids, am, cm, seed=1))
    torch.manual_seed(2)
    assert rel_err(rows_gram(model, ids, am, cm), K_step) > 1e-3


def test_dora_is_refused_by_name():
    base = llama(tied=False, seed=6)
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj"],
                                                      use_dora=True))
    with pytest.raises(ValueError, match="DoRA"):
        GramCapture(model)
