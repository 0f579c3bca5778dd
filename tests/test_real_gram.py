"""Exactness of :func:`real_model.gram.trajectory_gram` on tiny random float64 models.

Tiers: equivalence (exact mode == naive reference to 1e-9 relative, several architectures, padding
sides, float token weights, R=1), properties (hypothesis: random shapes/masks; scaling of the
weights), an independent identity (sum_ij K_ij = ||grad of the summed batch loss||^2 from plain
autograd), and the clear errors for unsupported parameters and malformed inputs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

pytest.importorskip("transformers")
from real_gram_helpers import batch, llama, nemotron, qwen2, rel_err  # noqa: E402

from real_model.gram import EngineOptions, token_logprobs, trajectory_gram  # noqa: E402

RTOL = 1e-9


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    return {
        "llama_tied_bias_gqa_pad": llama(tied=True, bias=True, kv_heads=2, pad=0),
        "llama_untied_mha": llama(tied=False, bias=False, kv_heads=4, seed=3),
        "qwen2_qkv_bias": qwen2(),
        "nemotron_ln1p_relu2_partial_rotary": nemotron(),
    }


@pytest.mark.parametrize("name", ["llama_tied_bias_gqa_pad", "llama_untied_mha", "qwen2_qkv_bias",
                                  "nemotron_ln1p_relu2_partial_rotary"])
@pytest.mark.parametrize("linear_method", ["auto", "measured", "identity", "per_sample"])
def test_exact_gram_equals_naive_reference(models, name, linear_method):
    model = models[name]
    ids, am, cm = batch(R=4, T=9, side="left")
    K = trajectory_gram(model, ids, am, cm, engine=EngineOptions(linear_method=linear_method))
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    assert K.dtype == torch.float64 and K.shape == (4, 4)
    assert rel_err(K, K_ref) <= RTOL


def test_tied_embedding_cross_terms_matter(models):
    """The tied case is a real test: dropping the head/embedding cross terms changes K."""
    model = models["llama_tied_bias_gqa_pad"]
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids, am, cm = batch(R=3, side="right")
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    emb = model.model.embed_tokens
    emb.weight.requires_grad_(False)  # keeps neither the head nor the embedding part
    try:
        K_no_tied = trajectory_gram(model, ids, am, cm, method="naive")
        # frozen embedding: the exact mode starts from the first norm's output instead
        K_no_tied_exact = trajectory_gram(model, ids, am, cm)
    finally:
        emb.weight.requires_grad_(True)
    assert rel_err(K_no_tied, K_ref) > 1e-3
    assert rel_err(K_no_tied_exact, K_no_tied) <= RTOL


@pytest.mark.parametrize("name", ["llama_tied_bias_gqa_pad", "nemotron_ln1p_relu2_partial_rotary"])
def test_left_and_right_padding_give_the_same_gram(models, name):
    model = models[name]
    ids_l, am_l, cm_l = batch(R=3, side="left", seed=5)
    # the same sequences, right padded
    ids_r, am_r, cm_r = ids_l.clone(), am_l.clone(), cm_l.clone()
    for i in range(3):
        n = int(am_l[i].sum())
        for dst, src in ((ids_r, ids_l), (am_r, am_l), (cm_r, cm_l)):
            dst[i] = torch.cat([src[i, -n:], src[i, :-n]]) if n < src.shape[1] else src[i]
    K_l = trajectory_gram(model, ids_l, am_l, cm_l)
    K_r = trajectory_gram(model, ids_r, am_r, cm_r)
    assert rel_err(K_l, K_r) <= RTOL


def test_single_rollout_gram_is_squared_gradient_norm(models):
    model = models["llama_untied_mha"]
    ids, am, cm = batch(R=1, T=7)
    K = trajectory_gram(model, ids, am, cm)
    model.zero_grad(set_to_none=True)
    loss = (token_logprobs(model, ids, am) * cm).sum()
    loss.backward()
    sq = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    assert K.shape == (1, 1)
    assert abs(float(K[0, 0]) - sq) <= RTOL * sq


def test_gram_sum_equals_squared_norm_of_summed_batch_gradient(models):
    """Independent of both modes: 1^T K 1 = ||sum_i psi_i||^2, with sum_i psi_i from .backward()."""
    model = models["llama_tied_bias_gqa_pad"]
    ids, am, cm = batch(R=4, side="right", seed=7)
    K = trajectory_gram(model, ids, am, cm)
    model.zero_grad(set_to_none=True)
    (token_logprobs(model, ids, am) * cm).sum().backward()
    sq = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    assert abs(float(K.sum()) - sq) <= RTOL * sq


def test_exact_gram_leaves_grad_fields_untouched(models):
    model = models["qwen2_qkv_bias"]
    model.zero_grad(set_to_none=True)
    trajectory_gram(model, *batch(R=2))
    assert all(p.grad is None for p in model.parameters())


def test_tiny_chunk_size_gives_the_same_gram(models):
    model = models["llama_tied_bias_gqa_pad"]
    ids, am, cm = batch(R=3)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    for lm in ("identity", "per_sample"):
        K = trajectory_gram(model, ids, am, cm, engine=EngineOptions(chunk_size=7,
                                                                     linear_method=lm))
        assert rel_err(K, K_ref) <= RTOL


def test_return_logprobs_matches_naive_per_token_logprobs(models):
    model = models["nemotron_ln1p_relu2_partial_rotary"]
    ids, am, cm = batch(R=3)
    K, lp = trajectory_gram(model, ids, am, cm, return_logprobs=True)
    _, lp_ref = trajectory_gram(model, ids, am, cm, method="naive", return_logprobs=True)
    assert lp.shape == ids.shape and lp.dtype == torch.float64
    assert torch.all(lp[:, 0] == 0)
    assert float((lp - lp_ref)[am.bool()].abs().max()) <= 1e-10


def test_gram_scales_quadratically_with_token_weights(models):
    # a power of two keeps every rounding identical (RMSNorm computes in float32 even here)
    model = models["llama_untied_mha"]
    ids, am, cm = batch(R=3)
    K1 = trajectory_gram(model, ids, am, cm)
    K4 = trajectory_gram(model, ids, am, 4.0 * cm)
    assert rel_err(K4, 16.0 * K1) <= RTOL


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(R=st.integers(1, 4), T=st.integers(4, 10), seed=st.integers(0, 10_000),
       side=st.sampled_from(["left", "right"]), floats=st.booleans())
def test_exact_equals_naive_on_random_batches(models, R, T, seed, side, floats):
    model = models["llama_tied_bias_gqa_pad"]
    ids, am, cm = batch(R=R, T=T, side=side, seed=seed, floats=floats)
    g = torch.Generator().manual_seed(seed)
    cm = cm * (torch.rand(cm.shape, generator=g, dtype=torch.float64) < 0.8)  # zero some weights
    K = trajectory_gram(model, ids, am, cm)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    scale = float(K_ref.abs().max())
    assert float((K - K_ref).abs().max()) <= RTOL * max(scale, 1e-300)


class _ScaledTanh(nn.Module):
    """A small leaf module with its own parameter: handled by the generic per-sample path."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, n, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale)


class _Wrapper(nn.Module):
    """A non-leaf module that owns a parameter directly: not attributable, must be refused."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.gain = nn.Parameter(torch.tensor(1.1, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.gain


def test_generic_leaf_module_parameters_are_exact():
    model = llama(tied=False, seed=11)
    model.model.layers[0].mlp.act_fn = _ScaledTanh(24)
    ids, am, cm = batch(R=3)
    K = trajectory_gram(model, ids, am, cm)
    assert rel_err(K, trajectory_gram(model, ids, am, cm, method="naive")) <= RTOL


def test_unsupported_parameter_raises_naming_the_module_type():
    model = llama(tied=False, seed=12)
    model.model.layers[1].mlp.act_fn = _Wrapper(nn.SiLU())
    with pytest.raises(ValueError, match=r"unsupported module type _Wrapper.*gain"):
        trajectory_gram(model, *batch(R=2))
    model.model.layers[1].mlp.act_fn.gain.requires_grad_(False)  # frozen: nothing to attribute
    ids, am, cm = batch(R=2)
    K = trajectory_gram(model, ids, am, cm)
    assert rel_err(K, trajectory_gram(model, ids, am, cm, method="naive")) <= RTOL


def test_parameter_used_outside_its_module_raises():
    model = llama(tied=False, seed=13)
    model.unused_head = nn.Linear(16, 4).double()  # never called by forward
    with pytest.raises(ValueError, match=r"'unused_head' \(Linear\).*never called"):
        trajectory_gram(model, *batch(R=2))


def test_module_called_twice_raises():
    model = llama(tied=False, seed=14)
    layer = model.model.layers[0]
    model.model.layers[1] = layer  # the same block twice in one forward
    with pytest.raises(ValueError, match=r"called 2 times"):
        trajectory_gram(model, *batch(R=2))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda ids, am, cm: (ids, am, cm.index_fill(1, torch.tensor([0]), 1.0)), r"\[:, 0\]"),
        (lambda ids, am, cm: (ids, am, cm.index_put((torch.tensor([2]), torch.tensor([1])),
                                                    torch.tensor(1.0, dtype=cm.dtype))),
         r"padding token"),
        (lambda ids, am, cm: (ids, am[:, 1:], cm), r"attention_mask shape"),
        (lambda ids, am, cm: (ids, am, cm.masked_fill(cm > 0.9, float("nan"))), r"non-finite"),
        (lambda ids, am, cm: (ids.double(), am, cm), r"integer token ids"),
        (lambda ids, am, cm: (ids, 2 * am, cm), r"only 0 and 1"),
    ],
)
def test_malformed_inputs_raise_clear_errors(models, mutate, match):
    with pytest.raises((ValueError, TypeError), match=match):
        trajectory_gram(models["llama_untied_mha"], *mutate(*batch(R=3, side="left")))


def test_bad_options_raise(models):
    m = models["llama_untied_mha"]
    with pytest.raises(ValueError, match="method"):
        trajectory_gram(m, *batch(R=2), method="fast")
    with pytest.raises(ValueError, match="linear_method"):
        trajectory_gram(m, *batch(R=2), engine=EngineOptions(linear_method="magic"))
    with pytest.raises(ValueError, match="gram_precision"):
        trajectory_gram(m, *batch(R=2), engine=EngineOptions(gram_precision="half"))
    frozen = llama(tied=False, seed=15).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter with requires_grad"):
        trajectory_gram(frozen, *batch(R=2))


def test_float32_products_and_low_precision_models_stay_close_to_reference(models):
    """float32 block products: ~1e-8 here; bf16 model vs its own naive reference: bf16 rounding of
    the per-sample gradients (unit roundoff 2^-8 = 3.9e-3), so a 2e-2 bound with margin."""
    ids, am, cm = batch(R=4)
    model = models["llama_tied_bias_gqa_pad"]
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    assert rel_err(trajectory_gram(model, ids, am, cm,
                                   engine=EngineOptions(gram_precision="float32")), K_ref) <= 1e-6
    m32 = llama(tied=True, bias=True, kv_heads=2, pad=0).float()
    K32 = trajectory_gram(m32, ids, am, cm)
    assert rel_err(K32, trajectory_gram(m32, ids, am, cm, method="naive")) <= 1e-5
    mb = llama(tied=True, bias=True, kv_heads=2, pad=0).to(torch.bfloat16)
    Kb = trajectory_gram(mb, ids, am, cm)
    assert Kb.dtype == torch.float64
    assert rel_err(Kb, trajectory_gram(mb, ids, am, cm, method="naive")) <= 2e-2


def _norm_cases():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    return [LlamaRMSNorm(6), NemotronLayerNorm1P(6), nn.LayerNorm(6)]


@pytest.mark.parametrize("idx", [0, 1, 2])
def test_closed_form_norm_gradients_equal_per_sample_vjp(idx):
    from real_model.gram.layers.leaf import generic_per_sample_grads
    from real_model.gram.norms import fast_leaf_grads

    norm = _norm_cases()[idx].double()
    g = torch.Generator().manual_seed(idx)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(3, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    delta = torch.randn(3, 5, 6, generator=g, dtype=torch.float64)
    out = norm(x)
    names = [n for n, _ in norm.named_parameters()]
    fast = fast_leaf_grads(norm, names, (x.detach(),), delta, out.grad_fn, R=3)
    ref = generic_per_sample_grads(norm, names, (x.detach(),), delta, R=3)
    assert fast is not None
    assert float((fast - ref).abs().max()) <= 1e-12 * float(ref.abs().max())


class _WeightTwice(nn.Module):
    """out = w * (x * w): looks like ``weight * z`` to autograd, but z depends on w too."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, n, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * self.weight)


def test_closed_form_shortcut_is_checked_and_rejected_when_wrong():
    model = llama(tied=False, seed=16)
    model.model.layers[0].mlp.act_fn = _WeightTwice(24)
    ids, am, cm = batch(R=3)
    K = trajectory_gram(model, ids, am, cm)
    assert rel_err(K, trajectory_gram(model, ids, am, cm, method="naive")) <= RTOL


@pytest.mark.parametrize("stored", [1, 3])
def test_naive_with_few_stored_gradients_equals_full_naive(models, stored):
    model = models["qwen2_qkv_bias"]
    ids, am, cm = batch(R=4, side="right", seed=9)
    K_all, lp_all = trajectory_gram(model, ids, am, cm, method="naive", return_logprobs=True)
    K, lp = trajectory_gram(model, ids, am, cm, method="naive", naive_stored=stored,
                            return_logprobs=True)
    assert rel_err(K, K_all) <= 1e-12
    assert torch.equal(lp, lp_all)


# ------------------------------------------------------------------ token kernels (hand-checked)
def test_linear_token_kernel_of_two_tokens_by_hand():
    """``(a a^T) * (delta delta^T)``: tokens a = (1, 0), (1, 2); delta = (3), (-1):
    a a^T = [[1, 1], [1, 5]], delta delta^T = [[9, -3], [-3, 1]] -> [[9, -3], [-3, 5]]; batched
    over a leading axis; summed over all pairs it is ||dW||^2 of the one row holding both."""
    from real_model.gram.linear_gram import linear_token_kernel

    a = torch.tensor([[1.0, 0.0], [1.0, 2.0]])
    d = torch.tensor([[3.0], [-1.0]])
    want = torch.tensor([[9.0, -3.0], [-3.0, 5.0]], dtype=torch.float64)
    assert torch.equal(linear_token_kernel(a, d), want)
    assert torch.equal(linear_token_kernel(torch.stack([a, a]), torch.stack([d, d])),
                       torch.stack([want, want]))
    dW = d.T @ a  # [1, 2] = (2, -2)
    assert float(linear_token_kernel(a, d).sum()) == float((dW * dW).sum()) == 8.0


def test_embedding_token_kernel_by_hand():
    """ids (5, 7, 5), delta (1, 2, 3): equal ids at (0, 2): kernel [[1, 0, 3], [0, 4, 0],
    [3, 0, 9]]; with token 2 left out (padding) its row and column vanish; the sum is the
    squared norm of the one row's embedding gradient (id 5: 1 + 3 = 4, id 7: 2 -> 16 + 4)."""
    from real_model.gram.layers.embedding import embedding_token_kernel

    ids = torch.tensor([5, 7, 5])
    d = torch.tensor([[1.0], [2.0], [3.0]])
    K = embedding_token_kernel(ids, d)
    assert torch.equal(K, torch.tensor([[1.0, 0, 3], [0, 4, 0], [3, 0, 9]], dtype=torch.float64))
    assert float(K.sum()) == 20.0
    keep = torch.tensor([True, True, False])
    assert torch.equal(embedding_token_kernel(ids, d, keep=keep),
                       torch.tensor([[1.0, 0, 0], [0, 4, 0], [0, 0, 0]], dtype=torch.float64))


def test_embedding_rows_gram_of_two_rows_by_hand():
    """Row 0 ids (1, 1), delta (1, 2): E_0 = {1: 3}; row 1 ids (1, 2), delta (4, 5):
    E_1 = {1: 4, 2: 5}: K = [[9, 12], [12, 41]]; with id 2 as padding E_1 = {1: 4}:
    [[9, 12], [12, 16]]. The same in float32 products and with one id per chunk."""
    from real_model.gram.layers.embedding import embedding_rows_gram

    ids = torch.tensor([[1, 1], [1, 2]])
    d = torch.tensor([[[1.0], [2.0]], [[4.0], [5.0]]])
    for dtype in (torch.float64, torch.float32):
        for chunk in (1 << 20, 1):
            for pad, want in ((None, [[9.0, 12], [12, 41]]), (2, [[9.0, 12], [12, 16]])):
                K = torch.zeros(2, 2, dtype=torch.float64)
                embedding_rows_gram(K, ids, d, chunk_size=chunk, padding_idx=pad,
                                    product_dtype=dtype)
                assert torch.equal(K, torch.tensor(want, dtype=torch.float64)), (dtype, chunk)


def test_embedding_rows_gram_tied_adds_the_cross_terms_of_head_and_embedding_rows():
    """Tied head rows H_i on the batch's ids: the added Gram is <H+E, H+E> - <H, H> (float64,
    from the explicit rows), in float64 and within float32 rounding in float32 products;
    ids missing from the tied rows are refused."""
    from real_model.gram.layers.embedding import embedding_rows_gram

    gen = torch.Generator().manual_seed(0)
    R, T, d = 3, 5, 4
    ids = torch.randint(0, 6, (R, T), generator=gen)
    delta = torch.randn(R, T, d, generator=gen, dtype=torch.float64)
    rows = torch.unique(ids)
    H = torch.randn(R, rows.numel(), d, generator=gen, dtype=torch.float64)
    E = torch.zeros(R, rows.numel(), d, dtype=torch.float64)
    for i in range(R):
        for t in range(T):
            E[i, int(torch.searchsorted(rows, ids[i, t]))] += delta[i, t]
    S, Hf = (H + E).reshape(R, -1), H.reshape(R, -1)
    want = S @ S.T - Hf @ Hf.T
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        K = torch.zeros(R, R, dtype=torch.float64)
        embedding_rows_gram(K, ids, delta.to(dtype), chunk_size=2 * R * d, padding_idx=None,
                            tied_rows=rows, tied_values=H.to(dtype), product_dtype=dtype)
        assert rel_err(K, want) < tol, dtype
    with pytest.raises(RuntimeError, match="tied embedding rows do not cover"):
        embedding_rows_gram(torch.zeros(R, R, dtype=torch.float64), ids, delta, chunk_size=64,
                            padding_idx=None, tied_rows=rows[1:], tied_values=H[:, 1:])


def test_scaled_norm_factor_reads_z_of_weight_times_z():
    """``out = weight * z`` with the module's own weight: the node's ``z``; any other product
    (a weight that is not the module's, or a sum): ``None``."""
    from real_model.gram.norms import scaled_norm_factor

    norm = nn.Module()
    norm.weight = nn.Parameter(torch.tensor([2.0, 3.0]))
    z = torch.tensor([[1.0, -1.0]], requires_grad=True)
    out = norm.weight * z
    assert torch.equal(scaled_norm_factor(norm, torch.ones(1, 2), out.grad_fn), z.detach())
    other = torch.tensor([2.0, 3.0], requires_grad=True) * z
    assert scaled_norm_factor(norm, torch.ones(1, 2), other.grad_fn) is None
    assert scaled_norm_factor(norm, torch.ones(1, 2), (norm.weight + z).grad_fn) is None


def test_model_device_is_the_first_parameters_device():
    from real_model.gram import model_device

    assert model_device(torch.nn.Linear(2, 3)) == torch.device("cpu")
    with pytest.raises(ValueError, match="ReLU has no parameters"):
        model_device(torch.nn.ReLU())
