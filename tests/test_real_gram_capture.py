"""The in-run Gram capture (:class:`real_model.gram.GramCapture`) on tiny float64 models.

Reference throughout: explicit per-row autograd of the SAME batched forward (``g_i`` =
``autograd.grad(L_i, params)`` for each row's term ``L_i`` of the host's loss), ``K = G G^T`` in
float64; or, for the plain per-token-weighted loss, the naive reference of
:func:`real_model.gram.trajectory_gram`. Tolerance 1e-10 relative (measured ~1e-16).

Tiers: equivalence (capture == per-row reference: plain backward, autograd.grad, blocks, tied and
untied heads, HF gradient checkpointing reentrant and not); exact identities (host ``.grad``
bit-identical with and without the capture); coverage (a module whose hook is removed, a module
called twice, a parameter used outside its module); failure handling (errors recorded, not
raised; ``strict`` raises).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from real_gram_helpers import V, batch, llama, nemotron, per_row_gram, qwen2, rel_err  # noqa: E402

from real_model.gram import (  # noqa: E402
    EngineOptions,
    GramCapture,
    GramCaptureError,
    active_dropout_modules,
    kernels,
    linear_gram,
    rows,
    small_calls,
    token_logprobs,
    trajectory_gram,
)
from real_model.gram import norms as norm_forms  # noqa: E402
from real_model.gram.layers import leaf  # noqa: E402
from real_model.gram.layers import linear as linear_rule  # noqa: E402
from real_model.gram.packed import PackedRows  # noqa: E402
from real_model.gram.state import validate_blocks  # noqa: E402

RTOL = 1e-10


def checkpointed(model, *, reentrant):
    """``model`` in training mode (HF checkpoints only there; no dropout in these configs) with
    Hugging Face gradient checkpointing on, its warnings silenced; returns ``model``."""
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


def forward_hooks(model):
    """Forward (pre-)hooks installed on ``model``'s modules."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def weighted_terms(model, ids, am, cm):
    return lambda: (token_logprobs(model, ids, am) * cm).sum(dim=1)


@pytest.fixture(scope="module")
def tied():
    return llama(tied=True, bias=True, kv_heads=2, pad=0)


@pytest.fixture(scope="module")
def untied():
    return llama(tied=False, bias=False, kv_heads=4, seed=3)


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_capture_around_loss_backward_equals_naive_reference(request, which):
    model = request.getfixturevalue(which)
    ids, am, cm = batch(R=4, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    model.zero_grad(set_to_none=True)
    with GramCapture(model) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert cap.ok and set(cap.coverage().values()) == {1}
    assert cap.n == 4
    assert rel_err(cap.result(), K_ref) <= RTOL
    # the host's weight gradients were computed as usual
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", ["qwen2", "nemotron"])
def test_capture_on_other_architectures_equals_per_row_reference(name):
    model = {"qwen2": qwen2, "nemotron": nemotron}[name]()
    ids, am, cm = batch(R=3, T=8, side="right")
    u = torch.randn(cm.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    u = u * (cm != 0)  # any real token weights, e.g. a host's dL/dlogp (some negative)
    K_ref = per_row_gram(model, weighted_terms(model, ids, am, u))
    with GramCapture(model) as cap:
        loss = (token_logprobs(model, ids, am) * u).sum()
        torch.autograd.grad(loss, cap.grad_inputs(), allow_unused=True)
    assert rel_err(cap.result(), K_ref) <= RTOL


def test_blocks_are_the_diagonal_blocks_of_the_full_gram(untied):
    ids, am, cm = batch(R=5, T=8)
    K_ref = trajectory_gram(untied, ids, am, cm, method="naive")
    blocks = [[0, 3], [1, 2, 4]]
    with GramCapture(untied, blocks=blocks) as cap:
        loss = (token_logprobs(untied, ids, am) * cm).sum()
        torch.autograd.grad(loss, cap.grad_inputs(), allow_unused=True)
    Ks = cap.result()
    assert [K.shape for K in Ks] == [(2, 2), (3, 3)]
    for b, K in zip(blocks, Ks, strict=True):
        assert rel_err(K, K_ref[b][:, b]) <= RTOL


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_host_grads_are_bit_identical_with_and_without_capture(request, which):
    model = request.getfixturevalue(which)
    ids, am, cm = batch(R=3, T=9, seed=2)
    model.zero_grad(set_to_none=True)
    (token_logprobs(model, ids, am) * cm).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with GramCapture(model, blocks=[[0, 1], [2]]) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert cap.ok
    for g, p in zip(plain, model.parameters(), strict=True):
        assert torch.equal(g, p.grad)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_counts_each_module_once(reentrant):
    model = llama(tied=True, bias=True, kv_heads=2, pad=0)
    ids, am, cm = batch(R=4, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    model.zero_grad(set_to_none=True)
    (token_logprobs(model, ids, am) * cm).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    checkpointed(model, reentrant=reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GramCapture(model) as cap:
            (token_logprobs(model, ids, am) * cm).sum().backward()
    assert set(cap.coverage().values()) == {1}
    assert rel_err(cap.result(), K_ref) <= RTOL
    for g, p in zip(plain, model.parameters(), strict=True):
        assert torch.equal(g, p.grad)


@pytest.mark.parametrize("reentrant", [None, False])
def test_backward_after_leaving_the_context_still_works(reentrant):
    """The hooks stay while a tapped graph lives (a non-reentrant recomputation must save what
    the forward saved), tapping only inside a backward; they go when the graph is freed."""
    model = llama(tied=False, seed=17)
    ids, am, cm = batch(R=3, T=8)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    if reentrant is not None:
        checkpointed(model, reentrant=reentrant)
    before = forward_hooks(model)  # HF's checkpointing adds one (enable_input_require_grads)
    with GramCapture(model) as cap:
        loss = (token_logprobs(model, ids, am) * cm).sum()
    token_logprobs(model, ids[:1], am[:1])  # after the context: not tapped, not an error
    loss.backward()
    assert cap.ok and rel_err(cap.result(), K_ref) <= RTOL
    del loss
    import gc

    gc.collect()
    assert forward_hooks(model) == before


def test_backward_done_removes_the_hooks_of_a_graph_still_referenced():
    """``backward_done`` after the host's backward: the hooks and the rows forwards go although
    the host still holds the graph (checkpointing, input taps); nothing before ``__exit__``;
    idempotent, and the graph's later release removes nothing of a next capture."""
    model = llama(tied=False, seed=17)
    ids, am, cm = batch(R=3, T=8)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    checkpointed(model, reentrant=False)

    def forwards():
        return sum("forward" in vars(m) for m in model.modules())

    before = forward_hooks(model)
    cap = GramCapture(model, engine=EngineOptions(weight_grads="rows", batch_small_calls=False))
    with cap:
        loss = (token_logprobs(model, ids, am) * cm).sum()
        cap.backward_done()  # inside the context: nothing
        assert forward_hooks(model) > before
        loss.backward()
    assert forward_hooks(model) > before  # the graph is alive: the hooks stay
    cap.backward_done()
    assert forward_hooks(model) == before and forwards() == 0
    cap.backward_done()  # idempotent
    assert cap.ok and rel_err(cap.result(), K_ref) <= RTOL
    with GramCapture(model, engine=EngineOptions(weight_grads="rows",
                                                 batch_small_calls=False)) as nxt:
        n_forwards = forwards()
        del loss  # the first graph's release now: the next capture keeps its own
        import gc

        gc.collect()
        assert forwards() == n_forwards > 0
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert nxt.ok and rel_err(nxt.result(), K_ref) <= RTOL and nxt.from_rows


def test_calls_without_gradients_inside_the_capture_are_ignored(untied):
    ids, am, cm = batch(R=3)
    with GramCapture(untied) as cap:
        with torch.no_grad():
            token_logprobs(untied, ids, am)  # e.g. old/reference log-probs of the host
        loss = (token_logprobs(untied, ids, am) * cm).sum()
        torch.autograd.grad(loss, cap.grad_inputs(), allow_unused=True)
    assert rel_err(cap.result(), trajectory_gram(untied, ids, am, cm, method="naive")) <= RTOL


def test_norms_use_the_closed_form_checked_once_per_class(monkeypatch):
    """Each RMSNorm's per-row gradient comes from the closed form; the generic per-row VJP runs
    only once per module class and process (the check of that closed form), not per capture."""
    monkeypatch.setattr(norm_forms, "NORM_CLOSED_FORM_CHECKED", {})  # a fresh process
    model = llama(tied=True, bias=True, kv_heads=2, pad=0)
    calls = {"fast": 0, "generic": 0}
    fast, generic = norm_forms.fast_leaf_grads, leaf.generic_per_sample_grads

    def counted_fast(*a, **k):
        out = fast(*a, **k)
        calls["fast"] += out is not None
        return out

    def counted_generic(*a, **k):
        calls["generic"] += 1
        return generic(*a, **k)

    monkeypatch.setattr(norm_forms, "fast_leaf_grads", counted_fast)
    monkeypatch.setattr(leaf, "generic_per_sample_grads", counted_generic)
    ids, am, cm = batch(R=3)
    with GramCapture(model) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert cap.ok
    assert calls == {"fast": 5, "generic": 1}  # 2 layers x 2 norms + the final norm
    with GramCapture(model) as cap:  # the next capture (micro-batch) trusts the verdict
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert cap.ok and calls == {"fast": 10, "generic": 1}
    assert norm_forms.NORM_CLOSED_FORM_CHECKED == {type(model.model.norm): True}


# ----------------------------------------------------------------------------- coverage
@pytest.mark.parametrize("hooks", ["_forward_hooks", "_forward_pre_hooks"])
def test_a_module_whose_hook_is_removed_is_reported_by_name(hooks):
    model = llama(tied=False, seed=21)
    ids, am, cm = batch(R=2)
    target = model.model.layers[1].mlp.up_proj
    with GramCapture(model) as cap:
        getattr(target, hooks).clear()  # e.g. a framework resetting the module's hooks
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert not cap.ok
    assert any("model.layers.1.mlp.up_proj" in p for p in cap.problems())
    with pytest.raises(GramCaptureError, match=r"layers\.1\.mlp\.up_proj"):
        cap.result()


def test_a_module_called_twice_is_reported_as_counted_twice():
    model = llama(tied=False, seed=14)
    model.model.layers[1] = model.model.layers[0]  # the same block twice in one forward
    ids, am, cm = batch(R=2)
    with GramCapture(model) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert cap.coverage()["model.layers.0.mlp.up_proj"] == 2
    with pytest.raises(GramCaptureError, match=r"counted 2 times"):
        cap.result()


def test_a_parameter_outside_every_forward_is_reported():
    model = llama(tied=False, seed=13)
    model.unused_head = nn.Linear(16, 4).double()
    ids, am, cm = batch(R=2)
    with GramCapture(model) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    assert [p for p in cap.problems() if "'unused_head' (Linear)" in p and "never called" in p]


@pytest.mark.parametrize("batched", [False, True], ids=["per-call", "small-calls-batched"])
def test_errors_inside_the_capture_never_stop_the_host(monkeypatch, untied, batched):
    ids, am, cm = batch(R=3)
    untied.zero_grad(set_to_none=True)
    (token_logprobs(untied, ids, am) * cm).sum().backward()
    plain = [p.grad.clone() for p in untied.parameters()]
    untied.zero_grad(set_to_none=True)

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    if batched:  # the small calls' contributions fail when they are added, after the backward
        monkeypatch.setattr(small_calls, "add_small_calls", broken)
    else:
        monkeypatch.setattr(linear_rule, "linear_weight_gram", broken)
    with GramCapture(untied, engine=EngineOptions(batch_small_calls=batched)) as cap:
        (token_logprobs(untied, ids, am) * cm).sum().backward()  # does not raise
    assert bool(cap.batched) is batched
    cap.flush()
    assert any("injected failure" in e for e in cap.errors)
    for g, p in zip(plain, untied.parameters(), strict=True):
        assert torch.equal(g, p.grad)
    with pytest.raises(GramCaptureError, match="injected failure"):
        cap.result()
    untied.zero_grad(set_to_none=True)
    strict = GramCapture(untied, strict=True, engine=EngineOptions(batch_small_calls=batched))
    with pytest.raises(GramCaptureError, match="injected"):
        with strict:  # per call: raised inside the backward; batched: when they are added
            (token_logprobs(untied, ids, am) * cm).sum().backward()
        strict.result()
    untied.zero_grad(set_to_none=True)


def test_rows_of_another_batch_size_are_a_recorded_problem(untied):
    ids, am, cm = batch(R=3)
    with GramCapture(untied) as cap:
        token_logprobs(untied, ids, am)
        token_logprobs(untied, ids[:2], am[:2])  # a second forward over other rows
    assert any("not the n=3 rows" in e for e in cap.errors)


def test_bad_blocks_and_options_raise():
    with pytest.raises(ValueError, match="repeats a row"):
        validate_blocks([[0, 0]])
    with pytest.raises(ValueError, match="at least one row"):
        validate_blocks([[0], []])
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        validate_blocks([[0, 3]], 3)
    model = llama(tied=False, seed=15)
    with pytest.raises(ValueError, match="linear_method"):
        GramCapture(model, engine=EngineOptions(linear_method="magic"))
    with pytest.raises(ValueError, match="requires_grad"):
        GramCapture(model.requires_grad_(False))


def test_active_dropout_modules_names_every_active_dropout():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
    model = LlamaForCausalLM(cfg)
    model.model.layers[0].mlp.extra = nn.Dropout(0.2)
    model.model.layers[1].mlp.off = nn.Dropout(0.0)
    model.train()
    names = active_dropout_modules(model)
    assert "model.layers.0.mlp.extra (Dropout, p=0.2)" in names
    assert "model.layers.1.self_attn (LlamaAttention, attention_dropout=0.1)" in names
    assert not any("off" in n for n in names)
    assert len(names) == 3
    model.eval()
    assert active_dropout_modules(model) == []


# ------------------------------------------------------------------ packed rows (segments)
def packed_batch(lengths, seed=0):
    """Rows of ``lengths`` tokens packed into one sequence ``[1, N]`` (positions restart per
    row; a block-diagonal causal 4-D mask keeps attention within each row, as varlen attention
    does), per-token weights ``u`` (0 on each row's last token, which scores nothing)."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    N = int(cu[-1])
    ids = torch.randint(1, V, (1, N), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    u = torch.randn(N, generator=g, dtype=torch.float64)
    u[cu[1:] - 1] = 0.0
    return cu, ids, pos, u


def varlen_mask(cu):
    """``[1, 1, N, N]`` boolean mask: token ``t`` sees ``t' <= t`` of its own row."""
    N = int(cu[-1])
    row = torch.repeat_interleave(torch.arange(cu.numel() - 1), cu[1:] - cu[:-1])
    causal = torch.arange(N)[:, None] >= torch.arange(N)[None, :]
    return ((row[:, None] == row[None, :]) & causal)[None, None]


def packed_terms(model, ids, pos, u, cu):
    """Per-row terms ``L_i = sum_t u_t log pi(ids[t + 1] | row i up to t)``, one packed forward."""
    def terms():
        logits = model(input_ids=ids, position_ids=pos,
                       attention_mask=varlen_mask(cu)).logits[0].double()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        tok = torch.cat([lp, lp.new_zeros(1)]) * u  # position t scores token t + 1
        return torch.stack([tok[int(a):int(b)].sum() for a, b in zip(cu[:-1], cu[1:],
                                                                       strict=True)])
    return terms


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_packed_rows_equal_the_per_row_reference(request, which):
    """``segments`` (cu_seqlens): ``n`` rows packed into one ``[1, N]`` sequence give the same
    Gram as per-row autograd of the same packed forward (tied head and embedding included)."""
    model = request.getfixturevalue(which)
    cu, ids, pos, u = packed_batch([5, 3, 7, 4])
    terms = packed_terms(model, ids, pos, u, cu)
    K_ref = per_row_gram(model, terms)
    blocks = [[0, 2], [1, 3]]
    with GramCapture(model, segments=cu, blocks=blocks) as cap:
        terms().sum().backward()
    model.zero_grad(set_to_none=True)
    assert cap.ok, cap.problems()
    assert cap.n == 4 and set(cap.coverage().values()) == {1}
    for b, K in zip(blocks, cap.result(), strict=True):
        assert rel_err(K, K_ref[b][:, b]) <= RTOL


def test_packed_rows_with_trailing_padding_and_full_gram(untied):
    """Tokens after ``segments[-1]`` (a packed sequence padded to a fixed length) are not rows."""
    cu, ids, pos, u = packed_batch([4, 6, 2], seed=1)
    ids = torch.cat([ids, torch.zeros(1, 3, dtype=ids.dtype)], 1)
    pos = torch.cat([pos, torch.arange(3)[None]], 1)
    u = torch.cat([u, u.new_zeros(3)])
    cu_ext = torch.cat([cu, cu.new_tensor([int(cu[-1]) + 3])])  # the padding as a 4th row
    terms = packed_terms(untied, ids, pos, u, cu_ext)
    K_ref = per_row_gram(untied, terms)[:3, :3]
    with GramCapture(untied, segments=cu) as cap:
        terms().sum().backward()
    untied.zero_grad(set_to_none=True)
    assert rel_err(cap.result(), K_ref) <= RTOL


def test_packed_rows_unpack_by_hand():

    p = PackedRows([0, 2, 3], torch.device("cpu"))
    assert (p.n, p.tokens, p.T) == (2, 3, 2)
    x = torch.tensor([[[1.0], [2.0], [3.0], [9.0]]])  # [1, N + 1 padding, 1]
    assert p.is_packed(x) and not p.is_packed(x[:, :2])
    assert p.unpack(x)[..., 0].tolist() == [[1.0, 2.0], [3.0, 0.0]]
    assert p.unpack(x, fill=7.0)[..., 0].tolist() == [[1.0, 2.0], [3.0, 7.0]]
    assert p.row_sums(x).tolist() == [[3.0], [3.0]]  # 1 + 2, then 3; the padding is no row's
    for bad in ([], [0], [1, 3], [0, 3, 2]):
        with pytest.raises(ValueError, match="segments"):
            PackedRows(bad, torch.device("cpu"))


def test_a_failure_in_a_pass_is_raised_after_its_backward_ran_to_the_end(monkeypatch, untied):
    """``trajectory_gram``'s capture records problems and raises after the backward: under FSDP
    every process runs the whole forward and backward (the same collectives) whatever failed."""
    seen: list[str] = []
    spy = GramCapture._on_delta

    def on_delta(self, call, delta):
        seen.append(call.kind)
        return spy(self, call, delta)

    def boom(self, *args, **kwargs):
        raise RuntimeError("boom in a Linear")

    monkeypatch.setattr(GramCapture, "_on_delta", on_delta)
    monkeypatch.setattr(linear_rule, "add_linear", boom)
    monkeypatch.setattr(small_calls, "add_small_calls", boom)  # small calls, batched
    ids, am, cm = batch(R=2, T=6)
    with pytest.raises(GramCaptureError, match="boom in a Linear"):
        trajectory_gram(untied, ids, am, cm)
    assert seen[-1] == "embedding"  # the gradient reached the first module: backward complete


def test_the_module_plan_is_reused_until_the_parameters_change():
    from real_model.gram.plan import plan_of

    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    assert plan_of(model) is plan_of(model)
    first = plan_of(model)
    model[0].weight.requires_grad_(False)
    assert plan_of(model) is not first and "0" in plan_of(model).modules  # bias still trainable
    model[0].bias.requires_grad_(False)
    assert "0" not in plan_of(model).modules


# ------------------------------------------------------------------ without input taps
@pytest.mark.parametrize("which", ["tied", "untied"])
def test_without_input_taps_equals_naive_reference(request, which):
    model = request.getfixturevalue(which)
    ids, am, cm = batch(R=4, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    with GramCapture(model, input_taps=False, blocks=[[0, 1, 2, 3]]) as cap:
        (token_logprobs(model, ids, am) * cm).sum().backward()
    model.zero_grad(set_to_none=True)
    assert cap.ok and set(cap.coverage().values()) == {1}
    assert rel_err(cap.result()[0], K_ref) <= RTOL


def test_without_input_taps_packed_rows_equal_the_per_row_reference(tied):
    cu, ids, pos, u = packed_batch([4, 6, 3], seed=2)
    terms = packed_terms(tied, ids, pos, u, cu)
    K_ref = per_row_gram(tied, terms)
    with GramCapture(tied, segments=cu, input_taps=False) as cap:
        terms().sum().backward()
    tied.zero_grad(set_to_none=True)
    assert rel_err(cap.result(), K_ref) <= RTOL


@pytest.mark.parametrize("packed", [False, True])
def test_without_input_taps_norms_read_the_hosts_own_node_not_a_rerun(monkeypatch, tied, packed):
    """Held inputs: each RMSNorm's ``z`` comes from the host's own ``weight * z`` node, so the
    norm's ``forward`` runs only in the host's forward (5 calls), never again in the backward;
    packed rows are summed per segment on the packed tokens (no unpacking); the Gram still
    equals the per-row reference."""
    cls = type(tied.model.norm)
    monkeypatch.setattr(norm_forms, "NORM_CLOSED_FORM_CHECKED", {cls: True})
    forward, calls = cls.forward, []

    def counted(self, *a, **k):
        calls.append(torch.is_grad_enabled())
        return forward(self, *a, **k)

    monkeypatch.setattr(cls, "forward", counted)
    row_sums, summed = PackedRows.row_sums, []

    def counted_sums(self, t):
        summed.append(tuple(t.shape))
        return row_sums(self, t)

    monkeypatch.setattr(PackedRows, "row_sums", counted_sums)
    if packed:
        cu, ids, pos, u = packed_batch([4, 6, 3], seed=2)
        terms = packed_terms(tied, ids, pos, u, cu)
        K_ref = per_row_gram(tied, terms)
        calls.clear()
        with GramCapture(tied, segments=cu, input_taps=False,
                         engine=EngineOptions(batch_small_calls=False)) as cap:
            terms().sum().backward()
        K = cap.result()
    else:
        ids, am, cm = batch(R=3, T=9)
        K_ref = trajectory_gram(tied, ids, am, cm, method="naive")
        calls.clear()
        with GramCapture(tied, input_taps=False) as cap:
            (token_logprobs(tied, ids, am) * cm).sum().backward()
        K = cap.result()
    tied.zero_grad(set_to_none=True)
    assert cap.ok and len(calls) == 5  # 2 layers x 2 norms + the final norm, host forward only
    assert len(summed) == (5 if packed else 0)
    assert rel_err(K, K_ref) <= RTOL


@pytest.mark.parametrize("which, unpacked", [("tied", 1), ("untied", 0)])
def test_packed_identity_runs_on_the_packed_tokens(monkeypatch, request, which, unpacked):
    """``linear_method="identity"`` on packed rows: every Linear but a tied head takes its Gram
    from the packed tokens (``S (A * G) S^T``, no padded copy of its input); biases included,
    blocks of non-consecutive rows; equal to the per-row reference."""
    model = request.getfixturevalue(which)
    monkeypatch.setattr(norm_forms, "NORM_CLOSED_FORM_CHECKED", {type(model.model.norm): True})
    shared, seen = PackedRows.unpack_shared, []

    def counted(self, t):
        seen.append(tuple(t.shape))
        return shared(self, t)

    monkeypatch.setattr(PackedRows, "unpack_shared", counted)
    identity, tokens = linear_gram.linear_weight_gram_identity_packed, []

    def counted_identity(a, delta, S, **kw):
        tokens.append(a.shape[0])
        return identity(a, delta, S, **kw)

    monkeypatch.setattr(linear_rule, "linear_weight_gram_identity_packed", counted_identity)
    cu, ids, pos, u = packed_batch([5, 3, 7, 4], seed=4)
    terms = packed_terms(model, ids, pos, u, cu)
    K_ref = per_row_gram(model, terms)
    blocks = [[0, 2], [1, 3]]
    with GramCapture(model, segments=cu, blocks=blocks, input_taps=False,
                     engine=EngineOptions(linear_method="identity",
                                          batch_small_calls=False)) as cap:
        terms().sum().backward()
    model.zero_grad(set_to_none=True)
    assert cap.ok, cap.problems()
    assert set(cap.coverage().values()) == {1} and len(seen) == unpacked  # the tied head only
    # each block on its own rows' tokens: 5 + 7 and 3 + 4 of the 19, never all of them
    assert tokens and set(tokens[0::2]) == {12} and set(tokens[1::2]) == {7}
    for b, K in zip(blocks, cap.result(), strict=True):
        assert rel_err(K, K_ref[b][:, b]) <= RTOL


def test_packed_identity_by_hand():
    """Two rows packed as tokens [0, 1 | 2] of a 1 x 1 Linear: ``dW_i = sum_t delta_t a_t``."""
    a = torch.tensor([[1.0], [2.0], [3.0]])
    delta = torch.tensor([[1.0], [-1.0], [2.0]])
    S = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    K = linear_gram.linear_weight_gram_identity_packed(a, delta, S)
    dW = torch.tensor([1.0 * 1 - 1.0 * 2, 2.0 * 3], dtype=torch.float64)  # -1, 6
    assert torch.equal(K, torch.outer(dW, dW))


def test_packed_rows_block_by_hand():
    """Rows of lengths 2, 1, 3 (tokens 0-1 | 2 | 3-5): a slice of rows gives one token range,
    indices give their tokens in that order; ``S_b`` marks each row's tokens."""

    p = PackedRows([0, 2, 3, 6], torch.device("cpu"))
    tok, S = p.block(slice(1, 3), torch.device("cpu"))
    assert tok == slice(2, 6)
    assert S.tolist() == [[1, 0, 0, 0], [0, 1, 1, 1]] and S.dtype == torch.float64
    tok, S = p.block(torch.tensor([2, 0]), torch.device("cpu"))
    assert tok.tolist() == [3, 4, 5, 0, 1]
    assert S.tolist() == [[1, 1, 1, 0, 0], [0, 0, 0, 1, 1]]
    assert p.block(torch.tensor([2, 0]), torch.device("cpu"))[1] is S  # kept per block


@pytest.mark.parametrize("packed", [False, True])
def test_identity_float32_products_within_1e_6_of_float64(packed):
    """``product_dtype=float32``: float32 token kernels, float64 sums over token pairs; on
    correlated float32 rows the Gram is within 1e-6 of the float64 one, relative to its largest
    entry (measured ~5e-8; bfloat16 products would miss it by orders of magnitude)."""
    g = torch.Generator().manual_seed(0)
    R, T, d_in, d_out = 4, 30, 96, 160
    a = torch.randn(R * T, d_in, generator=g) + 3 * torch.randn(1, d_in, generator=g)
    delta = 1e-3 * torch.randn(R * T, d_out, generator=g)
    if packed:
        S = torch.repeat_interleave(torch.eye(R, dtype=torch.float64), T, dim=1)
        K64 = linear_gram.linear_weight_gram_identity_packed(a, delta, S)
        K32 = linear_gram.linear_weight_gram_identity_packed(a, delta, S,
                                                             product_dtype=torch.float32)
    else:
        K64, K32 = (torch.zeros(R, R, dtype=torch.float64) for _ in range(2))
        for K, dt in ((K64, torch.float64), (K32, torch.float32)):
            linear_gram.linear_weight_gram_identity(K, a.reshape(R, T, -1), delta.reshape(R, T, -1),
                                           chunk_size=1 << 12, product_dtype=dt)
    assert K32.dtype == torch.float64
    assert 0 < ((K32 - K64).abs().max() / K64.abs().max()).item() <= 1e-6


def test_add_to_blocks_by_hand():
    """Blocks of consecutive rows (a slice) and of scattered rows (indices) of a full Gram."""
    full = torch.arange(9.0, dtype=torch.float64).reshape(3, 3)
    K_slice, K_index = torch.ones(2, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
    kernels.add_to_blocks([(K_slice, slice(1, 3)), (K_index, torch.tensor([0, 2]))], full)
    assert K_slice.tolist() == [[5.0, 6.0], [8.0, 9.0]]  # 1 + [[4, 5], [7, 8]]
    assert K_index.tolist() == [[0.0, 2.0], [6.0, 8.0]]


def test_without_input_taps_float32_host_grads_are_bit_identical():
    """No tap node: the host's autograd graph is unchanged, so even float32 ``.grad`` (whose
    sums over a shared input's consumers depend on their order) is bit for bit the same."""
    model = llama(tied=True, bias=True, kv_heads=2, pad=0).float()
    ids, am, cm = batch(R=3, T=9)

    def step(**capture):
        model.zero_grad(set_to_none=True)
        if capture:
            with GramCapture(model, **capture) as cap:
                (token_logprobs(model, ids, am) * cm.float()).sum().backward()
            assert cap.ok
        else:
            (token_logprobs(model, ids, am) * cm.float()).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, direct = step(), step(input_taps=False)
    assert all(torch.equal(a, b) for a, b in zip(plain, direct, strict=True))


def test_input_taps_none_follows_gradient_checkpointing():
    from real_model.gram import checkpointing_enabled

    model = llama(tied=False, seed=8)
    assert not checkpointing_enabled(model)
    assert GramCapture(model, input_taps=None).input_taps is False
    model.activation_checkpointing_enable()
    assert checkpointing_enabled(model)
    assert GramCapture(model, input_taps=None).input_taps is True
    assert GramCapture(model).input_taps is True  # the default: taps


# ------------------------------------------------------------------ weight_grads="rows"
def rows_step(model, ids, am, cm, **capture):
    """``.grad`` of the plain backward, then ``(capture, .grad)`` with a capture around it."""
    model.zero_grad(set_to_none=True)
    (token_logprobs(model, ids, am) * cm.to(model.dtype)).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    capture.setdefault("batch_small_calls", False)  # these tiny calls would all be batched
    engine = EngineOptions(**{k: capture.pop(k) for k in list(capture)
                              if k in EngineOptions.__dataclass_fields__})
    with GramCapture(model, engine=engine, **capture) as cap:
        (token_logprobs(model, ids, am) * cm.to(model.dtype)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return plain, cap, grads


def linear_names(model):
    return {n for n, m in model.named_modules() if type(m) is nn.Linear}


@pytest.mark.parametrize(("taps", "blocks"), [(True, [[0, 2], [1, 3]]),
                                              (False, [[0, 1], [3, 2]])])
@pytest.mark.parametrize("which", ["tied", "untied"])
def test_rows_weight_grads_give_the_reference_gram_and_the_host_gradient(request, which, taps,
                                                                         blocks):
    """Blocks by index, and one of consecutive rows beside one by index (both layouts of
    ``linear_weight_grad_and_gram``'s full-Gram path); with and without input taps."""
    model = request.getfixturevalue(which)
    ids, am, cm = batch(R=4, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    plain, cap, grads = rows_step(model, ids, am, cm, blocks=blocks, weight_grads="rows",
                                  linear_method="per_sample", input_taps=taps)
    assert cap.ok and set(cap.coverage().values()) == {1}
    heads = {"lm_head"} if which == "tied" else set()  # a tied head keeps the host's product
    assert cap.from_rows == linear_names(model) - heads and cap.from_rows
    for b, K in zip(blocks, cap.result(), strict=True):
        assert rel_err(K, K_ref[b][:, b]) <= RTOL
    for g, h in zip(plain, grads, strict=True):
        assert rel_err(h, g) <= RTOL
    assert not any("forward" in vars(m) for m in model.modules())  # forwards restored


def test_rows_weight_grads_in_float32_match_the_host_to_float32_rounding():
    """Both float32 gradients (the host's plain backward and the one assembled from the rows) are
    set against the float64 gradient: the rows' error is at most twice the host's own rounding
    error plus 8 float32 ulps (eps = 2^-23), per parameter. A fixed bound between the two float32
    results would test the summation order of the installed PyTorch and transformers instead."""
    model = llama(tied=False, bias=True, kv_heads=2, seed=5).double()
    ids, am, cm = batch(R=3, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    model.zero_grad(set_to_none=True)
    (token_logprobs(model, ids, am) * cm.to(model.dtype)).sum().backward()
    exact = [p.grad.clone() for p in model.parameters()]
    model.float()
    plain, cap, grads = rows_step(model, ids, am, cm, weight_grads="rows",
                                  linear_method="per_sample")
    assert cap.from_rows == linear_names(model)
    assert rel_err(cap.result(), K_ref) <= 1e-5
    eps32 = float(torch.finfo(torch.float32).eps)
    for g, h, x in zip(plain, grads, exact, strict=True):
        assert rel_err(h.double(), x) <= 2 * rel_err(g.double(), x) + 8 * eps32


@pytest.mark.parametrize("reentrant", [True, False])
def test_rows_weight_grads_under_gradient_checkpointing_count_each_module_once(reentrant):
    model = llama(tied=False, bias=True, kv_heads=2, seed=6)
    ids, am, cm = batch(R=4, T=9)
    K_ref = trajectory_gram(model, ids, am, cm, method="naive")
    checkpointed(model, reentrant=reentrant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, cap, grads = rows_step(model, ids, am, cm, weight_grads="rows",
                                      linear_method="per_sample")
    assert set(cap.coverage().values()) == {1}
    assert cap.from_rows == linear_names(model)
    assert rel_err(cap.result(), K_ref) <= RTOL
    for g, h in zip(plain, grads, strict=True):
        assert rel_err(h, g) <= RTOL


@pytest.mark.parametrize("which", ["tied", "untied"])  # tied: Linear biases too
def test_rows_weight_grads_of_packed_rows_equal_the_per_row_reference(request, which):
    """Packed rows take each row's own tokens (no padded copy), biases included."""
    untied = request.getfixturevalue(which)
    cu, ids, pos, u = packed_batch([5, 3, 7, 4], seed=3)
    terms = packed_terms(untied, ids, pos, u, cu)
    K_ref = per_row_gram(untied, terms)
    untied.zero_grad(set_to_none=True)
    terms().sum().backward()
    plain = [p.grad.clone() for p in untied.parameters()]
    untied.zero_grad(set_to_none=True)
    with GramCapture(untied, segments=cu,
                     blocks=[[0, 3], [1, 2]],
                     engine=EngineOptions(weight_grads="rows", linear_method="per_sample",
                                          batch_small_calls=False)) as cap:
        terms().sum().backward()
    assert cap.from_rows == linear_names(untied) - ({"lm_head"} if which == "tied" else set())
    for b, K in zip([[0, 3], [1, 2]], cap.result(), strict=True):
        assert rel_err(K, K_ref[b][:, b]) <= RTOL
    for g, p in zip(plain, untied.parameters(), strict=True):
        assert rel_err(p.grad, g) <= RTOL
    untied.zero_grad(set_to_none=True)


def test_rows_weight_grads_fall_back_to_the_host_product_on_failure(monkeypatch, untied):
    ids, am, cm = batch(R=3)

    def broken(*args, **kwargs):
        raise RuntimeError("injected rows failure")

    monkeypatch.setattr(linear_rule, "linear_weight_grad_and_gram", broken)
    plain, cap, grads = rows_step(untied, ids, am, cm, weight_grads="rows",
                                  linear_method="per_sample")
    assert any("injected rows failure" in e for e in cap.errors) and not cap.from_rows
    for g, h in zip(plain, grads, strict=True):
        assert rel_err(h, g) <= RTOL
    with pytest.raises(GramCaptureError, match="injected rows failure"):
        cap.result()


def test_rows_weight_grads_leave_autocast_and_other_methods_to_the_host():
    model = llama(tied=False, seed=7).float()
    ids, am, cm = batch(R=2, T=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, cap, _ = rows_step(model, ids, am, cm, weight_grads="rows")
    assert cap.ok and not cap.from_rows
    _, cap, _ = rows_step(model, ids, am, cm, weight_grads="rows", linear_method="identity")
    assert cap.ok and not cap.from_rows
    with pytest.raises(ValueError, match="weight_grads"):
        GramCapture(model, engine=EngineOptions(weight_grads="fast"))


def test_linear_weight_grad_and_gram_by_hand():
    """Two rows, one token each: ``dW_i = delta_i^T a_i``; ``dW = dW_0 + dW_1``; block Grams."""
    a = torch.tensor([[[1.0, 2.0]], [[0.0, 1.0]]], dtype=torch.float64)  # [2, 1, 2]
    d = torch.tensor([[[3.0]], [[-1.0]]], dtype=torch.float64)  # [2, 1, 1]
    K = torch.zeros(2, 2, dtype=torch.float64)
    dW = rows.linear_weight_grad_and_gram([(K, slice(0, 2))], a, d, chunk_size=1)
    assert dW.tolist() == [[3.0, 5.0]]  # [3, 6] + [0, -1]
    assert K.tolist() == [[45.0, -6.0], [-6.0, 1.0]]  # <[3,6],[3,6]>, <[3,6],[0,-1]>, ...
    # rows given by index (not consecutive): the entries of the full Gram, in the block's order
    K10 = torch.zeros(2, 2, dtype=torch.float64)
    rows.linear_weight_grad_and_gram([(K10, torch.tensor([1, 0]))], a, d, chunk_size=1)
    assert K10.tolist() == [[1.0, -6.0], [-6.0, 45.0]]
    # one block of consecutive rows beside one by index: both from the full Gram
    K0, K1 = (torch.zeros(1, 1, dtype=torch.float64) for _ in range(2))
    rows.linear_weight_grad_and_gram([(K0, slice(0, 1)), (K1, torch.tensor([1]))], a, d,
                                   chunk_size=1)
    assert (K0.item(), K1.item()) == (45.0, 1.0)


def test_packed_row_products_by_hand():
    """Two packed rows of 1 and 2 tokens: ``P_i = gt[:, rows of i] a[rows of i]``."""
    gt = torch.tensor([[1.0, 2.0, 3.0]])  # [c=1, N=3]
    a = torch.tensor([[1.0], [10.0], [100.0]])  # [N=3, d_in=1]
    out = torch.empty(2, 1, 1)
    P = rows.packed_row_products(gt, a, [(0, 1), (1, 3)], out=out, offsets=None)
    assert P.flatten().tolist() == [1.0, 320.0]  # 1*1; 2*10 + 3*100


@pytest.mark.parametrize("segments", [
    [(0, 5), (5, 5), (5, 12), (12, 16)],  # consecutive from 0 (split views), trailing padding
    [(0, 5), (6, 12), (12, 16)],  # a gap: one slice per row
], ids=["consecutive", "gap"])
def test_packed_row_products_split_views_equal_one_product_per_row(segments):
    """Rows consecutive from token 0 take their operands from one ``split`` each: each row's
    product is bit for bit the product of its own slices (an empty row gives zeros), and the
    padding after the last row is never read into a row."""
    g = torch.Generator().manual_seed(1)
    delta, a = torch.randn(19, 8, generator=g), torch.randn(19, 6, generator=g)
    out = torch.full((len(segments), 8, 6), float("nan"))
    P = rows.packed_row_products(delta.T, a, segments, out=out, offsets=None)
    assert P.data_ptr() == out.data_ptr()
    for i, (t0, t1) in enumerate(segments):
        assert torch.equal(P[i], delta.T[:, t0:t1] @ a[t0:t1])
    assert rows.consecutive_lengths(segments, 19) == (
        [5, 0, 7, 4, 3] if segments[1] == (5, 5) else None)
    assert rows.consecutive_lengths([(0, 5), (5, 21)], 19) is None  # past the tokens


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "batch_first"])
def test_bf16_rows_are_float32_so_cancelling_rows_keep_dw_to_bf16_rounding(packed):
    """bf16 rows whose products cancel (advantages of both signs, as in a GRPO group): ``dW``
    is the float64 sum rounded to bf16 (within one bf16 ulp of it), where summing rows rounded
    to bf16 first is off by many times that; the Gram is the float64 rows' to float32 rounding."""
    g = torch.Generator().manual_seed(3)
    R, T, d_in, d_out = 4, 6, 5, 3
    a = torch.randn(R, T, d_in, generator=g).bfloat16()
    base = torch.randn(T, d_out, generator=g)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None, None]
    delta = (signs * base + 1e-3 * torch.randn(R, T, d_out, generator=g)).bfloat16()
    a = torch.cat([a[:1]] * R)  # the same tokens in every row: the products cancel
    rows64 = torch.einsum("rto,rti->roi", delta.double(), a.double())  # exact: bf16 products
    exact = rows64.sum(0)
    K = torch.zeros(R, R, dtype=torch.float64)
    if packed:
        segments = [(r * T, (r + 1) * T) for r in range(R)]
        dW = rows.linear_weight_grad_and_gram([(K, slice(0, R))], a.reshape(R * T, d_in),
                                            delta.reshape(R * T, d_out), chunk_size=1 << 10,
                                            segments=segments)
    else:
        dW = rows.linear_weight_grad_and_gram([(K, slice(0, R))], a, delta, chunk_size=1 << 10)
    assert dW.dtype == torch.bfloat16
    ulp = 2.0 ** -7 * exact.abs()  # rounding to bf16 (8 significant bits) moves x by <= 2^-8 |x|
    assert bool(((dW.double() - exact).abs() <= ulp + 1e-12).all())
    naive = torch.stack([(delta[r].T @ a[r]) for r in range(R)]).sum(0)  # bf16 rows summed
    assert float((naive.double() - exact).abs().max()) > 10 * float(
        (dW.double() - exact).abs().max())
    flat = rows64.reshape(R, -1)
    assert float((K - flat @ flat.T).abs().max() / (flat @ flat.T).abs().max()) <= 1e-6


@pytest.mark.parametrize("d_in", [12, 5])  # 5: a row stride of 20 bytes, which torch refuses
def test_packed_row_products_grouped_equal_one_product_per_row(monkeypatch, d_in):
    """Where enabled (``GROUPED_DEVICE_TYPES``), the grouped product (``torch._grouped_mm``)
    gives each row's product bit for bit, a row
    of no tokens and trailing padding included; operands it does not take go row by row."""
    segments = [(0, 5), (5, 5), (5, 12), (12, 16)]
    g = torch.Generator().manual_seed(0)
    delta, a = torch.randn(19, 8, generator=g), torch.randn(19, d_in, generator=g)
    gt = delta.T
    assert rows.grouped_offsets(segments, a) is None  # no device takes it by default
    monkeypatch.setattr(rows, "GROUPED_DEVICE_TYPES", ("cpu",))
    offsets = rows.grouped_offsets(segments, a)
    assert offsets is not None and offsets.tolist() == [5, 5, 12, 16]
    calls = []
    grouped = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *x, **k: calls.append(1) or grouped(*x, **k))
    P = rows.packed_row_products(gt, a, segments, out=torch.empty(4, 8, d_in), offsets=offsets)
    assert len(calls) == (1 if d_in == 12 else 0)
    for i, (t0, t1) in enumerate(segments):
        assert torch.equal(P[i], gt[:, t0:t1] @ a[t0:t1])
    assert rows.grouped_offsets(segments, a.double()) is None  # float64 goes row by row
    assert rows.grouped_offsets([(1, 5), (5, 16)], a) is None  # rows not from token 0
    monkeypatch.setattr(rows, "GROUPED_DEVICE_TYPES", ())
    assert rows.grouped_offsets(segments, a) is None  # a device not listed goes row by row


# ------------------------------------------------------------------ small calls, batched
def batchable(model):
    """Modules whose calls on these tiny batches are small: weight-only Linears and the
    embedding unless tied to the head, and the norms (their per-row gradients)."""
    tied = model.config.tie_word_embeddings
    return ({n for n, m in model.named_modules() if type(m) is nn.Linear and m.bias is None}
            - ({"lm_head"} if tied else set())
            | ({"model.embed_tokens"} if not tied else set())
            | {n for n, m in model.named_modules() if "Norm" in type(m).__name__})


@pytest.fixture(scope="module")
def untied_pad():
    return llama(tied=False, bias=False, kv_heads=2, pad=0, seed=5)  # ids 0: no gradient row


@pytest.mark.parametrize("packed", [False, "no taps", True],
                         ids=["batch-first", "batch-first-no-taps", "packed"])
@pytest.mark.parametrize("which", ["tied", "untied", "untied_pad"])
def test_small_calls_batched_give_the_per_call_gram_and_the_reference(request, which, packed):
    """``batch_small_calls`` (the default) adds the small calls' terms at ``flush``: the same Gram
    as each call adding its own (float64 model: to rounding) and as the per-row reference, blocks
    by index; an embedding with a ``padding_idx`` among the ids; with ``weight_grads="rows"`` a
    batched module keeps the host's ``dW``, bit for bit. Without input taps the small calls are
    recorded in the forward and their output gradients read after the backward."""
    model = request.getfixturevalue(which)
    blocks = [[0, 2], [3, 1]]
    if packed is True:
        cu, ids, pos, u = packed_batch([5, 3, 7, 4], seed=5)
        terms, opts = packed_terms(model, ids, pos, u, cu), {"segments": cu, "input_taps": False}
    else:
        ids, am, cm = batch(R=4, T=9)
        terms, opts = weighted_terms(model, ids, am, cm), {"input_taps": packed != "no taps"}
        assert which != "untied_pad" or bool((ids == 0).any())  # the padding id occurs
    K_ref = per_row_gram(model, terms)
    model.zero_grad(set_to_none=True)
    terms().sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    results = {}
    for batched in (False, True):
        model.zero_grad(set_to_none=True)
        with GramCapture(model, blocks=blocks, engine=EngineOptions(batch_small_calls=batched,
                                                                    weight_grads="rows"),
                         **opts) as cap:
            terms().sum().backward()
        results[batched] = cap.result()
        assert cap.batched == (batchable(model) if batched else set())
        assert not (cap.batched & cap.from_rows)
        for g, (name, p) in zip(plain, model.named_parameters(), strict=True):
            if name.rsplit(".", 1)[0] in cap.batched:  # the host's own product
                assert torch.equal(g, p.grad), name
            else:  # the rows' dW (the tied model's Linears with a bias), another sum order
                assert rel_err(p.grad, g) <= RTOL, name
    model.zero_grad(set_to_none=True)
    for b, K0, K1 in zip(blocks, results[False], results[True], strict=True):
        assert rel_err(K1, K0) <= 1e-12
        assert rel_err(K1, K_ref[b][:, b]) <= RTOL


def test_calls_above_the_small_bound_are_not_batched(monkeypatch, untied):
    """A Linear call holding more than ``SMALL_CALL_ELEMENTS`` entries adds its own term in the
    backward (the kernel-cost bound off), so does a call of more than ``SMALL_CALL_TOKENS``
    tokens; a flush with nothing kept does nothing."""
    ids, am, cm = batch(R=4, T=9)
    small = 4 * 9 * (16 + 16)  # the q projection's call: N (d_in + d_out)
    monkeypatch.setattr(small_calls, "SMALL_CALL_ELEMENTS", small)
    monkeypatch.setattr(small_calls, "SMALL_CALL_KERNEL_RATIO", 0)
    with GramCapture(untied) as cap:
        (token_logprobs(untied, ids, am) * cm).sum().backward()
    wide = {n for n, m in untied.named_modules()
            if type(m) is nn.Linear and m.in_features + m.out_features > 32}
    assert wide and not (cap.batched & wide) and "model.layers.0.self_attn.q_proj" in cap.batched
    K = cap.result()
    cap.flush()
    assert torch.equal(cap.result(), K)
    monkeypatch.setattr(small_calls, "SMALL_CALL_TOKENS", 4 * 9 - 1)
    with GramCapture(untied) as cap:
        (token_logprobs(untied, ids, am) * cm).sum().backward()
    assert not any(n in cap.batched for n in linear_names(untied))
    assert rel_err(cap.result(), K) <= RTOL
    untied.zero_grad(set_to_none=True)


def test_linear_calls_whose_token_kernels_cost_less_than_their_rows_are_batched(monkeypatch,
                                                                                untied):
    """Above ``SMALL_CALL_ELEMENTS`` a weight-only Linear call is still batched when ``N^2 (d_in +
    d_out) <= SMALL_CALL_KERNEL_RATIO n d_in d_out`` (here ``N = 36`` tokens over ``n = 4``
    rows), unless it keeps more than ``SMALL_CALL_KEPT`` entries; the Gram is the per-call
    one either way."""
    ids, am, cm = batch(R=4, T=9)
    N, n = 4 * 9, 4
    with GramCapture(untied, engine=EngineOptions(batch_small_calls=False)) as cap:
        (token_logprobs(untied, ids, am) * cm).sum().backward()
    K_per_call = cap.result()
    dims = {name: (m.in_features, m.out_features) for name, m in untied.named_modules()
            if type(m) is nn.Linear and m.bias is None}
    monkeypatch.setattr(small_calls, "SMALL_CALL_ELEMENTS", 1)  # by size: nothing is small
    for ratio in (0, 20, 40, 1000):
        monkeypatch.setattr(small_calls, "SMALL_CALL_KERNEL_RATIO", ratio)
        want = {name for name, (i, o) in dims.items() if N * N * (i + o) <= ratio * n * i * o}
        with GramCapture(untied) as cap:
            (token_logprobs(untied, ids, am) * cm).sum().backward()
        assert cap.batched & set(dims) == want
        assert rel_err(cap.result(), K_per_call) <= RTOL
    assert set() < {name for name, (i, o) in dims.items()
                    if N * N * (i + o) <= 40 * n * i * o} < set(dims)  # the cases differ
    monkeypatch.setattr(small_calls, "SMALL_CALL_KEPT", N * 32 - 1)  # below q's N (16 + 16)
    with GramCapture(untied) as cap:
        (token_logprobs(untied, ids, am) * cm).sum().backward()
    assert not cap.batched & set(dims)
    assert rel_err(cap.result(), K_per_call) <= RTOL
    untied.zero_grad(set_to_none=True)


def test_packed_linear_calls_cheaper_as_token_kernels_are_batched_beside_the_rows_path(
        monkeypatch, untied):
    """Packed rows (as verl runs them, ``weight_grads="rows"``, no input taps): the Linears
    batched by the kernel-cost bound are those the formula names for ``N = 19`` tokens over
    ``n = 4`` rows; the others take the rows path; the Gram is the per-row reference's."""
    cu, ids, pos, u = packed_batch([5, 3, 7, 4])
    terms = packed_terms(untied, ids, pos, u, cu)
    K_ref = per_row_gram(untied, terms)
    N, n = int(cu[-1]), 4
    dims = {name: (m.in_features, m.out_features) for name, m in untied.named_modules()
            if type(m) is nn.Linear and m.bias is None}
    monkeypatch.setattr(small_calls, "SMALL_CALL_ELEMENTS", 1)
    for ratio in (0, 10, 1000):
        monkeypatch.setattr(small_calls, "SMALL_CALL_KERNEL_RATIO", ratio)
        want = {name for name, (i, o) in dims.items() if N * N * (i + o) <= ratio * n * i * o}
        with GramCapture(untied, segments=cu, input_taps=False,
                         engine=EngineOptions(weight_grads="rows")) as cap:
            terms().sum().backward()
        untied.zero_grad(set_to_none=True)
        assert cap.ok, cap.problems()
        assert cap.batched & set(dims) == want
        assert cap.from_rows == set(dims) - want
        assert rel_err(cap.result(), K_ref) <= RTOL
    assert set() < {name for name, (i, o) in dims.items()
                    if N * N * (i + o) <= 10 * n * i * o} < set(dims)  # the cases differ


def hook_counts(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), "forward" in vars(m))
            for m in model.modules()]


@pytest.mark.parametrize(("weight_grads", "batched"), [("host", True), ("rows", False)])
def test_handover_gives_each_pass_its_own_gram_with_one_set_of_hooks(untied, weight_grads,
                                                                     batched):
    """``handover`` after a backward: the next pass (other rows, other blocks) gets the Gram a
    fresh capture gives, the first keeps its own, the hooks (and the rows path's ``forward``)
    are those installed once, all gone after the last exit; with input taps it refuses."""
    opts = {"input_taps": False,
            "engine": EngineOptions(weight_grads=weight_grads, batch_small_calls=batched)}
    first, second = packed_batch([5, 3, 7, 4], seed=6), packed_batch([2, 6, 4], seed=7)
    bare = hook_counts(untied)
    fresh = []
    for (cu, ids, pos, u), blocks in ((first, [[0, 2], [1, 3]]), (second, [[0, 1, 2]])):
        with GramCapture(untied, segments=cu, blocks=blocks, **opts) as cap:
            packed_terms(untied, ids, pos, u, cu)().sum().backward()
        fresh.append(cap.result())
    cap = GramCapture(untied, segments=first[0], blocks=[[0, 2], [1, 3]], **opts).__enter__()
    nxt = cap
    try:
        installed = hook_counts(untied)
        assert any(patched for _, _, patched in installed) == (weight_grads == "rows")
        packed_terms(untied, *first[1:], first[0])().sum().backward()
        nxt = cap.handover(segments=second[0], blocks=[[0, 1, 2]])
        assert hook_counts(untied) == installed and cap.exited and not nxt.exited
        assert (cap.pass_index, nxt.pass_index) == (0, 1)
        cap.__exit__(None, None, None)  # the first's exit leaves the hooks to the second
        assert hook_counts(untied) == installed
        packed_terms(untied, *second[1:], second[0])().sum().backward()
    finally:
        nxt.__exit__(None, None, None)
        cap.__exit__(None, None, None)
    assert hook_counts(untied) == bare
    untied.zero_grad(set_to_none=True)
    for got, want in zip(cap.result(), fresh[0], strict=True):
        assert rel_err(got, want) <= 1e-12
    (got,) = nxt.result()
    assert rel_err(got, fresh[1][0]) <= 1e-12 and set(nxt.coverage().values()) == {1}
    assert bool(nxt.from_rows) == (weight_grads == "rows") and bool(nxt.batched) == batched
    with GramCapture(untied, input_taps=True) as tapped, pytest.raises(RuntimeError,
                                                                       match="input taps"):
        tapped.handover()


def test_a_recorded_output_changed_in_place_is_a_named_problem_and_per_call_works():
    """A small call's output gradient is read after the backward (no hook): when the host
    modifies that output in place (``ReLU(inplace=True)``), the gradient kept is not the call's
    own, and the capture says so by name instead of adding it; ``batch_small_calls=False`` (a
    hook per call) gives the per-row reference."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.ReLU(inplace=True),
                          nn.Linear(3, 1, bias=False)).double()
    cu = torch.tensor([0, 2, 5])
    x = torch.randn(1, 5, 3, dtype=torch.float64)

    def row_grads():
        out = []
        for a, b in ((0, 2), (2, 5)):
            model.zero_grad(set_to_none=True)
            model(x[:, a:b].clone()).sum().backward()
            out.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        model.zero_grad(set_to_none=True)
        return torch.stack(out)

    G = row_grads()
    for batched in (True, False):
        with GramCapture(model, segments=cu, input_taps=False,
                         engine=EngineOptions(batch_small_calls=batched)) as cap:
            model(x.clone()).sum().backward()
        if batched:
            assert any("'0'" in p and "modified in place" in p for p in cap.problems())
        else:
            assert rel_err(cap.result(), G @ G.T) <= 1e-12
    model.zero_grad(set_to_none=True)


def test_handover_adds_each_pass_small_calls_before_the_next_pass(monkeypatch, untied):
    """A handed-over pass's small calls are added at the handover (their tensors go before the
    next forward), one batched addition per pass; each pass's Gram is a fresh capture's."""
    opts = {"input_taps": False}
    batches = [packed_batch([5, 3], seed=s) for s in (8, 9, 10)]
    fresh = []
    for cu, ids, pos, u in batches:
        with GramCapture(untied, segments=cu, **opts) as cap:
            packed_terms(untied, ids, pos, u, cu)().sum().backward()
        fresh.append(cap.result())
    added: list[int] = []
    real_add = small_calls.add_small_calls

    def add(passes, **kw):
        added.append(len(passes))
        return real_add(passes, **kw)

    monkeypatch.setattr(small_calls, "add_small_calls", add)
    caps = [GramCapture(untied, segments=batches[0][0], **opts).__enter__()]
    for k, (cu, ids, pos, u) in enumerate(batches):
        if k:
            caps.append(caps[-1].handover(segments=cu))
            assert added == [1] * k  # the previous pass, added at its handover
        packed_terms(untied, ids, pos, u, cu)().sum().backward()
    caps[-1].__exit__(None, None, None)
    for cap, want in zip(caps, fresh, strict=True):
        assert rel_err(cap.result(), want) <= 1e-12 and set(cap.coverage().values()) == {1}
    assert added == [1, 1, 1]
    untied.zero_grad(set_to_none=True)
