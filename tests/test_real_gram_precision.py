"""Low-precision and device-path pieces of the exact Gram engine (CPU; the CUDA twins are in
``tests/test_real_gram_gpu.py``).

Tiers: exact (the float32-output Gram of bf16 rows; the contiguous per-sample layout; the measured
choice of the Linear method), equivalence (bf16 and float32 models: exact vs naive), and a bf16
accuracy statement against the float64 truth of the same weights.

bf16 tolerance, stated: the per-sample products of a layer in bf16 round every entry of ``dW_i``
to 8 significant bits (unit roundoff 2^-9 ~ 2e-3); the Gram of those rows in float32 adds nothing
visible, so one layer's contribution is within 2e-3 relative of the float64 value. A whole bf16
model carries, in addition, the bf16 rounding of its own forward and backward, which the naive
reference shares but realises differently (another batch shape): there the exact Gram must be as
close to the float64 truth as the naive bf16 reference is (within a factor 1.5, plus 1e-3).
"""

from __future__ import annotations

import pytest
import torch

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

from real_model.gram import EngineOptions, kernels, linear_gram, trajectory_gram  # noqa: E402


def test_gram_f32_of_bf16_rows_matches_float64_products_to_float32_rounding():
    x = torch.randn(5, 3000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = x.double() @ x.double().T
    out = kernels.gram_f32(x)
    assert out.dtype == torch.float32
    # products of bf16 numbers are exact in float32; 3000-term float32 sums: ~sqrt(n) 2^-24 ~ 3e-6
    assert rel_err(out.double(), ref) <= 1e-5


def test_gram_f32_falls_back_when_out_dtype_is_unsupported(monkeypatch):
    """Force the ``torch.mm(..., out_dtype=float32)`` attempt on CPU: it is not implemented there,
    so the helper must fall back to a float32 copy, remember the verdict, and stay correct."""
    monkeypatch.setattr(kernels, "_OUT_DTYPE_OK", {("cpu", torch.bfloat16): True})
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    out = kernels.gram_f32(x, kernels.Scratch())
    assert kernels._OUT_DTYPE_OK[("cpu", torch.bfloat16)] is False
    assert rel_err(out.double(), x.double() @ x.double().T) <= 1e-5


@pytest.mark.parametrize("method", ["identity", "per_sample"])
def test_bf16_layer_gram_is_within_bf16_rounding_of_float64(method):
    a, d = random_layer(4, 12, 48, 40, torch.bfloat16)
    K = torch.zeros(4, 4, dtype=torch.float64)
    linear_gram.linear_weight_gram(K, a, d, method=method, chunk_size=1 << 12,
                          product_dtype=torch.float32)
    assert rel_err(K, layer_gram_truth(a, d)) <= BF16_LAYER_RTOL


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_per_sample_layouts_give_the_same_gram(contiguous, dtype):
    """The CUDA layout (``delta`` transposed once, contiguous) equals the strided one."""
    a, d = random_layer(3, 7, 10, 9, dtype, seed=3)
    K = torch.zeros(3, 3, dtype=torch.float64)
    linear_gram.linear_weight_gram_per_sample(K, a, d, chunk_size=25, contiguous=contiguous)
    assert rel_err(K, layer_gram_truth(a, d)) <= (1e-13 if dtype == torch.float64 else 1e-6)


def test_measured_linear_choice_is_cached_and_exact(monkeypatch):
    """In the ambiguous band the first layer of a shape times both methods, keeps the faster one's
    result and caches the verdict; later layers of that shape reuse it without timing."""
    monkeypatch.setattr(linear_gram, "_CALIBRATED", {})
    monkeypatch.setattr(linear_gram, "CALIBRATION_BAND", float("inf"))  # every shape is "ambiguous"
    a, d = random_layer(3, 5, 6, 7, torch.float64, seed=4)
    K = torch.zeros(3, 3, dtype=torch.float64)
    used = linear_gram.linear_weight_gram(K, a, d, method="measured", chunk_size=1 << 10)
    assert used in ("identity", "per_sample")
    assert list(linear_gram._CALIBRATED.values()) == [used]
    assert rel_err(K, layer_gram_truth(a, d)) <= 1e-13
    calls: list[str] = []
    monkeypatch.setattr(linear_gram.time, "perf_counter", lambda: calls.append("t") or 0.0)
    K2 = torch.zeros(3, 3, dtype=torch.float64)
    assert linear_gram.linear_weight_gram(K2, a, d, method="measured", chunk_size=1 << 10) == used
    assert calls == []  # cached: no timing
    assert torch.equal(K, K2)


def test_linear_choice_by_count_outside_the_band_and_for_auto(monkeypatch):
    monkeypatch.setattr(linear_gram, "_CALIBRATED", {})
    assert linear_gram.choose_linear_method(R=8, T=256, d_in=576, d_out=1536,
                                            key=("k",)) == "per_sample"
    assert linear_gram.choose_linear_method(R=4, T=2, d_in=512, d_out=512, key=("k",)) == "identity"
    # inside the band: "measured" (a key) has no verdict yet, "auto" (no key) counts
    assert linear_gram.choose_linear_method(R=8, T=100, d_in=576, d_out=1536, key=("k",)) is None
    assert linear_gram.choose_linear_method(R=8, T=100, d_in=576, d_out=1536) == "per_sample"


def test_default_chunk_size_on_cpu_is_the_documented_bound():
    assert kernels.default_chunk_size(torch.device("cpu")) == kernels.CPU_CHUNK_SIZE == 1 << 23


_MODELS = {
    "llama_tied": lambda: llama(tied=True, bias=True, kv_heads=2, pad=0),
    "qwen2": qwen2,
    "nemotron": nemotron,
}


@pytest.mark.parametrize("name", sorted(_MODELS))
@pytest.mark.parametrize("linear_method", ["identity", "per_sample"])
def test_float32_model_exact_equals_naive(name, linear_method):
    m = _MODELS[name]().float()
    ids, am, cm = batch(R=4, T=16)
    K = trajectory_gram(m, ids, am, cm, engine=EngineOptions(linear_method=linear_method))
    assert rel_err(K, trajectory_gram(m, ids, am, cm, method="naive")) <= 1e-6


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_bf16_model_exact_is_as_close_to_float64_truth_as_naive(name):
    mb = _MODELS[name]().to(torch.bfloat16)
    m64 = _MODELS[name]()
    m64.load_state_dict({k: v.double() for k, v in mb.state_dict().items()})
    ids, am, cm = batch(R=4, T=16)
    truth = trajectory_gram(m64, ids, am, cm, method="naive")
    err_exact = rel_err(trajectory_gram(mb, ids, am, cm), truth)
    err_naive = rel_err(trajectory_gram(mb, ids, am, cm, method="naive"), truth)
    assert err_exact <= 1.5 * err_naive + 1e-3


def test_flat_gram_slabs_and_single_block_agree(monkeypatch):
    """float32 rows widened to float64 in column slabs (13 slabs of 4096 columns, the last one
    ragged; 1 and 2 threads) or in one block: the same float64 products, summed in another order."""
    x = torch.randn(3, 50_000, generator=torch.Generator().manual_seed(5))
    ref = x.double() @ x.double().T
    threads = torch.get_num_threads()
    out = {}
    try:
        for slab_bytes in (8 * 3 * 4096, 1 << 30):
            monkeypatch.setattr(kernels, "CPU_SLAB_BYTES", slab_bytes)
            monkeypatch.setattr(kernels, "CPU_SLAB_BYTES_THREADED", slab_bytes)
            for n in (1, 2):
                torch.set_num_threads(n)
                K = torch.zeros(3, 3, dtype=torch.float64)
                kernels.flat_gram(K, x, kernels.Scratch())
                out[slab_bytes, n] = K
    finally:
        torch.set_num_threads(threads)
    for K in out.values():
        assert rel_err(K, ref) <= 1e-13
