"""CUDA twins of the exact-Gram and rollout tests (marker ``gpu``; skipped without CUDA).

Run on a machine with a GPU: ``python -m pytest -m gpu`` (about a minute on an H100). They check
what the CPU suite cannot: the float32-output Gram of bf16 rows through
``torch.mm(..., out_dtype=torch.float32)``, the contiguous per-sample layout, the chunk size from
free memory, exact vs naive on tiny models in bf16/float32 on the GPU, CUDA vs CPU agreement in
float64, and seeded batched rollouts on the GPU. Tolerances as in ``test_real_gram_precision.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # before the heavier imports below
    pytest.skip("needs a CUDA GPU: run `python -m pytest -m gpu` on a machine with one",
                allow_module_level=True)

pytest.importorskip("transformers")

from real_gram_helpers import (  # noqa: E402
    BF16_LAYER_RTOL,
    batch,
    layer_gram_truth,
    llama,
    nemotron,
    qwen2,
    random_layer,
    rel_err,
)

from real_model.gram import EngineOptions, kernels, linear_gram, rows, trajectory_gram  # noqa: E402

DEV = torch.device("cuda")
CROSS_DEVICE_RTOL = 1e-6  # float64 Grams, CPU vs CUDA: the model's float32 rotary embedding
F32_FACTOR = 2.0  # float32 exact vs float64 truth, in units of the naive Gram's error
_MODELS = {
    "llama_tied": lambda: llama(tied=True, bias=True, kv_heads=2, pad=0),
    "qwen2": qwen2,
    "nemotron": nemotron,
}


def _on(dev: torch.device, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(x.to(dev) for x in xs)


def test_gram_f32_of_bf16_rows_uses_float32_output_on_cuda():
    x = torch.randn(6, 5000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = kernels.gram_f32(x.to(DEV))
    assert out.dtype == torch.float32
    assert rel_err(out.double().cpu(), x.double() @ x.double().T) <= 1e-5
    # the fast path (no float32 copy of the rows) is the one that ran
    assert kernels._OUT_DTYPE_OK[("cuda", torch.bfloat16)] is True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_row_products_grouped_on_cuda_equal_one_product_per_row(monkeypatch, dtype):
    """``bench_verl_geometry.py --grouped-rows``: the grouped product on CUDA (torch's grouped
    kernel for bf16 on Hopper, its fallback otherwise) against one ``torch.mm`` per row, each row
    of ~227 tokens at SmolLM2's width; a row of no tokens and trailing padding included."""
    monkeypatch.setattr(rows, "GROUPED_DEVICE_TYPES", ("cpu", "cuda"))
    lengths = [230, 0, 180, 301, 227, 199, 250, 210]
    ends = torch.tensor(lengths).cumsum(0).tolist()
    segments = list(zip([0, *ends[:-1]], ends, strict=True))
    g = torch.Generator().manual_seed(0)
    delta = torch.randn(ends[-1] + 5, 1152, generator=g).to(DEV, dtype)
    a = torch.randn(ends[-1] + 5, 576, generator=g).to(DEV, dtype)
    offsets = rows.grouped_offsets(segments, a)
    assert offsets is not None and offsets.device.type == "cuda"
    out = torch.empty(len(segments), 1152, 576, device=DEV, dtype=dtype)
    P = rows.packed_row_products(delta.T, a, segments, out=out, offsets=offsets)
    for i, (t0, t1) in enumerate(segments):
        ref = delta[t0:t1].double().T @ a[t0:t1].double()
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16 outputs: 2^-8 relative rounding
        assert (P[i].double() - ref).abs().max() <= tol * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_sample_layouts_on_cuda(contiguous, dtype):
    a, d = random_layer(4, 33, 64, 48, dtype, seed=1)
    K = torch.zeros(4, 4, dtype=torch.float64, device=DEV)
    prod = torch.float32 if dtype == torch.bfloat16 else torch.float64
    linear_gram.linear_weight_gram_per_sample(K, *_on(DEV, a, d), chunk_size=1000,
                                              contiguous=contiguous,
                                     product_dtype=prod)
    tol = BF16_LAYER_RTOL if dtype == torch.bfloat16 else 1e-6
    assert rel_err(K.cpu(), layer_gram_truth(a, d)) <= tol


def test_default_chunk_size_on_cuda_is_within_its_bounds():
    c = kernels.default_chunk_size(DEV)
    assert kernels._GPU_CHUNK_MIN <= c <= kernels._GPU_CHUNK_MAX


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_cuda_float64_exact_equals_naive_and_cpu_up_to_the_models_float32_rope(name):
    """On the GPU, float64: the exact Gram equals the naive one to 1e-10 (same device, same
    model). Against the CPU only to ``CROSS_DEVICE_RTOL``: transformers computes the rotary cos
    and sin in float32 even in a float64 model (``inv_freq.float()``), and CPU and CUDA round
    them differently, so the model itself differs between devices (its log-probs, printed on
    failure; the Grams differed by 1.8-3.4e-7 on an H200, 2026-11-28)."""
    m = _MODELS[name]()
    ids, am, cm = batch(R=4, T=12)
    K_cpu = trajectory_gram(m, ids, am, cm)
    lp_cpu = _log_probs(m, ids, am)
    m = m.to(DEV)
    on = _on(DEV, ids, am, cm)
    K_gpu = trajectory_gram(m, *on)
    assert rel_err(K_gpu, trajectory_gram(m, *on, method="naive")) <= 1e-10
    lp_err = rel_err(_log_probs(m, *on[:2]).cpu(), lp_cpu)
    assert rel_err(K_gpu.cpu(), K_cpu) <= CROSS_DEVICE_RTOL, f"log-probs differ by {lp_err:.2e}"


def _log_probs(m: torch.nn.Module, ids: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(m(input_ids=ids, attention_mask=am).logits, -1)


@pytest.mark.parametrize("name", sorted(_MODELS))
@pytest.mark.parametrize("linear_method", ["auto", "identity", "per_sample"])
def test_cuda_float32_exact_is_as_close_to_float64_truth_as_naive(name, linear_method):
    """float32 on the GPU: the exact Gram is within ``F32_FACTOR`` times the naive Gram's
    distance (R float32 backward passes) to the float64 Gram of the same weights on the same
    device, or 1e-6 (the CPU twin's fixed 1e-6 between exact and naive was exceeded on an H200:
    1.6e-6 for nemotron, 2026-11-28, cuBLAS' float32 reductions)."""
    m64 = _MODELS[name]().to(DEV)
    m = _MODELS[name]().float().to(DEV)
    ids, am, cm = _on(DEV, *batch(R=4, T=16))
    truth = trajectory_gram(m64, ids, am, cm)
    err_exact = rel_err(trajectory_gram(m, ids, am, cm,
                                        engine=EngineOptions(linear_method=linear_method)), truth)
    err_naive = rel_err(trajectory_gram(m, ids, am, cm, method="naive"), truth)
    assert err_exact <= max(F32_FACTOR * err_naive, 1e-6), (err_exact, err_naive)


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_cuda_bf16_exact_is_as_close_to_float64_truth_as_naive(name):
    mb = _MODELS[name]().to(torch.bfloat16)
    m64 = _MODELS[name]()
    m64.load_state_dict({k: v.double() for k, v in mb.state_dict().items()})
    ids, am, cm = batch(R=4, T=16)
    truth = trajectory_gram(m64, ids, am, cm, method="naive")
    mb = mb.to(DEV)
    ids, am, cm = _on(DEV, ids, am, cm)
    err_exact = rel_err(trajectory_gram(mb, ids, am, cm).cpu(), truth)
    err_naive = rel_err(trajectory_gram(mb, ids, am, cm, method="naive").cpu(), truth)
    assert err_exact <= 1.5 * err_naive + 1e-3


def test_cuda_batched_rollouts_are_seeded_and_well_formed():
    from real_model.loading import CharTokenizer, tiny_random_model
    from real_model.rollouts import sample_group, sample_groups

    tok = CharTokenizer()
    m = tiny_random_model(vocab_size=tok.vocab_size, seed=1).to(DEV)
    prompts = ["Question: 1+1?\nAnswer:", "Q: 22*3?\nA:", "Hello there, what is 5?"]
    kw = dict(R=4, max_new_tokens=12, stop_strings=("\n",))
    a = sample_groups(m, tok, prompts, seeds=[3, 4, 5], **kw)
    b = sample_groups(m, tok, prompts, seeds=[3, 4, 5], **kw)
    c = sample_groups(m, tok, prompts, seeds=[6, 7, 8], **kw)
    assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a, c, strict=True))
    for g, p in zip(a, prompts, strict=True):
        Lp = g.prompt_length
        assert g.input_ids.device.type == "cuda" and Lp == len(p)
        assert g.completion_mask[:, :Lp].sum() == 0
        assert g.completion_mask.sum(dim=1).tolist() == g.lengths.tolist()
        assert all("\n" not in t for t in g.texts)
    # per-group sampling draws from the same generators: most groups agree token for token in
    # float32 (exact agreement is not guaranteed: batch shape changes the last bits of logits)
    same = sum(torch.equal(x.input_ids, sample_group(m, tok, p, seed=s, **kw).input_ids)
               for x, p, s in zip(a, prompts, [3, 4, 5], strict=True))
    assert same >= 2
