"""In-run geometry: the Gram of the rows from TRL's own training forward and backward.

``geometry_mode="in_run"`` captures, around each micro-batch's ``compute_loss`` + backward, the
per-row Gram of the groups whose rows are all in that micro-batch; ``"auto"`` measures the other
groups by the second pass; ``"second_pass"`` (default) is the extra forward + backward.

Checks, on the tiny float64 Llama of ``trl_geometry_helpers`` through ``trainer.train()``:

* TRL's gradient (``.grad`` before the optimizer step) is bit-identical with the geometry off,
  by the second pass and in-run with ``geometry_weight_grads="host"``; with the default
  ``"rows"`` (each Linear's ``dW`` summed from the per-row gradients) equal to ``GRAD_RTOL``;
* the in-run Gram of the rows ``Kg = G G^T`` (and the score Gram ``K`` derived from it at ratio
  1) equals the second pass's to ``INRUN_RTOL`` for every TRL loss type (four families here,
  the rest in the slow tier), with and without gradient checkpointing;
* every trainable module is counted exactly once by the capture (coverage), and (slow tier) a
  module used twice in the forward makes the step's in-run capture fail with a reason naming it,
  while training goes on;
* groups split over micro-batches: ``auto`` measures them by the second pass (records exact
  against the same rows' explicit per-row gradients), ``in_run`` records them as skipped.

Tolerance, stated: TRL's fused LM head computes its statistics in float32 even for a float64
model, so the rows of the step itself carry float32 rounding that the second pass (float64 head)
does not share; ``1e-6`` relative to the largest entry (measured ~1e-7).
"""

from __future__ import annotations

import numpy as np
import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from trl_geometry_helpers import (  # noqa: E402
    LOSSES,
    PADDED_PROMPTS,
    RowChecker,
    make_trainer,
    perturb_reference_model,
    simulated_vllm_trainer,
    tiny_model,
    tiny_model_with_hub_path,
    tiny_tokenizer,
)

from real_model.integrations import config as gconfig  # noqa: E402
from real_model.integrations import trl as itrl  # noqa: E402
from real_model.integrations.trl import rows as trl_rows  # noqa: E402

INRUN_RTOL = 1e-6
# weight_grads="rows": dW summed over rows in another order than TRL's product (float64 model)
GRAD_RTOL = 1e-12
# Off ratio 1 (second inner step of num_iterations=2) the in-run head recomputation's normaliser
# (TRL's float32 log-probs: |log p| ~ 10 x 6e-8) weighs tokens unevenly: measured 1.1e-6.
INRUN_RTOL_OFF_RATIO = 2e-6


def _run(tmp_path, mode, *, steps=1, model_fn=None, prepare=None, **kw):
    """Train ``steps`` steps with ``geometry_mode=mode`` (None: geometry off); return the
    trainer, TRL's flattened gradient before each update and the last step's Grams.
    ``prepare(trainer)`` runs before training (e.g. to move the reference model)."""
    from transformers import TrainerCallback

    grads, last = [], []

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **k):
            grads.append(torch.cat([p.grad.reshape(-1) for p in tr.model.parameters()
                                    if p.grad is not None]).clone())
            last.append(tr.geometry_last)

    cfg = dict(max_steps=steps, gradient_accumulation_steps=1, per_device_train_batch_size=8)
    cfg.update(kw)
    if model_fn is not None:  # a fresh model per run (training changes it)
        cfg["model"] = model_fn()
    tr = make_trainer(tmp_path / str(mode), callbacks=[Grads()],
                      geometry_every=0 if mode is None else 1,
                      geometry_mode=mode or "second_pass",
                      geometry_jsonl_path=str(tmp_path / f"{mode}.jsonl"), **cfg)
    if prepare is not None:
        prepare(tr)
    tr.train()
    return tr, grads, last


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _assert_in_run_equals_second_pass(tmp_path, *, steps=1, score=True, rtol=INRUN_RTOL, **kw):
    """Same seed, same rollouts: in-run Grams equal the second pass's, ``.grad`` identical."""
    ref, ref_grads, ref_last = _run(tmp_path, "second_pass", steps=steps, **kw)
    run, run_grads, run_last = _run(tmp_path, "in_run", steps=steps, **kw)
    assert len(run_grads) == steps
    for a, b in zip(run_grads, ref_grads, strict=True):
        if kw.get("geometry_weight_grads") == "host":
            assert torch.equal(a, b)  # the capture leaves TRL's gradient bit-identical
        else:  # "rows": the capture formed dW from the rows
            assert float((a - b).abs().max() / b.abs().max()) <= GRAD_RTOL
    for a, b in zip(run_last, ref_last, strict=True):
        rec = a["record"]
        assert rec["in_run_groups"] == rec["groups"] >= 1 and rec["second_pass_groups"] == 0
        assert rec["geometry_mode"] == "in_run" and not rec["skipped_groups"]
        assert a["row_grams"].keys() == b["row_grams"].keys()
        for g, Kg in a["row_grams"].items():
            assert _rel(Kg, b["row_grams"][g]) <= rtol, (g, _rel(Kg, b["row_grams"][g]))
        if score:  # ratio 1, beta 0: u_i = a_i m_i, K = diag(1/a) Kg diag(1/a)
            assert a["grams"].keys() == b["grams"].keys()
            for g, K in a["grams"].items():
                assert _rel(K, b["grams"][g]) <= INRUN_RTOL
        for micro in a["in_run"]:  # coverage: every trainable module exactly once
            cov = micro.coverage
            names = {n for n, m in run.model.named_modules()
                     if any(p.requires_grad for p in m.parameters(recurse=False))}
            assert set(cov) == names and set(cov.values()) == {1}, cov
    run.test_grads = run_grads
    return run, ref


def test_whole_groups_in_chunk_hand_checked():
    # rows 0..7 of process 1 (first row 8) in a shuffled micro-batch, groups of 4
    assert trl_rows.whole_groups_in_chunk([3, 1, 0, 2, 7], first_row=8, group_size=4) == {
        2: [0, 1, 2, 3]}
    # a group's rows on two processes (first row 6): never whole
    assert trl_rows.whole_groups_in_chunk([0, 1, 2, 3], first_row=6, group_size=4) == {}


def test_geometry_mode_is_a_validated_grpo_config_field(tmp_path):
    args = itrl.GeometryGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                 geometry_mode="auto", geometry_score_every=5)
    cfg = args.geometry_config()
    assert (cfg.mode, cfg.score_every) == ("auto", 5)
    assert gconfig.GeometryConfig().mode == "second_pass"
    with pytest.raises(ValueError, match="mode: must be one of"):
        gconfig.GeometryConfig(mode="inrun")
    with pytest.raises(ValueError, match="score_every"):
        gconfig.GeometryConfig(score_every=-1)


@pytest.mark.parametrize(("weight_grads", "batched"),
                         [("rows", False), ("rows", True),
                          pytest.param("host", False, marks=pytest.mark.slow)])
def test_in_run_gram_equals_second_pass_and_grad_is_unchanged(tmp_path, weight_grads, batched):
    """With ``batch_small_calls`` (the default) every Linear call of this tiny model is small:
    its term is added after the backward and TRL forms its ``dW``, bit for bit."""
    off, off_grads, _ = _run(tmp_path, None, loss_type="grpo")
    run, ref = _assert_in_run_equals_second_pass(tmp_path, loss_type="grpo",
                                                 geometry_weight_grads=weight_grads,
                                                 geometry_batch_small_calls=batched)
    if weight_grads == "host" or batched:  # geometry off: the same gradient, bit for bit
        assert torch.equal(off_grads[0], run.test_grads[0])
    else:
        a, b = run.test_grads[0], off_grads[0]
        assert float((a - b).abs().max() / b.abs().max()) <= GRAD_RTOL
    micro = run.geometry_last["in_run"][0]
    assert bool(micro.from_rows) == (weight_grads == "rows" and not batched)
    assert bool(micro.batched) == batched
    rec = run.geometry_records[0]
    assert rec["geometry_mode"] == "in_run" and rec["step_mode"] == "in_run"
    assert rec["grad_norm"] is None and ref.geometry_records[0]["grad_norm"] is not None
    assert all(g["path"] == "in_run" for g in rec["group_records"])
    logged = [h for h in run.state.log_history if "geometry/groups" in h]
    assert logged and logged[0]["geometry/skipped"] == 0.0


def test_split_groups_auto_uses_the_second_pass_in_run_skips_them(tmp_path):
    """GA = steps_per_generation = 2: TRL shuffles the 8 rows (4 groups of 2) into two
    micro-batches of 4, so some groups are split (asserted) and some stay whole."""
    kw = dict(gradient_accumulation_steps=2, per_device_train_batch_size=4, loss_type="dapo",
              num_generations=2)
    auto, chk = _checked(tmp_path, "auto", **kw)
    rec = auto.geometry_records[0]
    assert rec["in_run_groups"] >= 1 and rec["second_pass_groups"] >= 1, rec
    assert rec["in_run_groups"] + rec["second_pass_groups"] == rec["groups"] == 4
    assert chk.results[0]["rel_err"] <= 1e-5  # rows (u of both paths) sum to TRL's gradient
    only, _, _ = _run(tmp_path, "in_run", **kw)
    rec = only.geometry_records[0]
    assert rec["in_run_groups"] == auto.geometry_records[0]["in_run_groups"]
    assert len(rec["skipped_groups"]) == auto.geometry_records[0]["second_pass_groups"]
    assert "one micro-batch" in rec["skipped_groups"][0]["reason"]
    assert rec["groups_measured"] < rec["groups_with_gradient"]


def _checked(tmp_path, mode, **kw):
    chk = RowChecker(per_row=False)
    tr = make_trainer(tmp_path / f"chk-{mode}", callbacks=[chk.callback], geometry_mode=mode,
                      max_steps=1, geometry_jsonl_path=str(tmp_path / f"chk-{mode}.jsonl"), **kw)
    chk.trainer = tr
    tr.train()
    return tr, chk


@pytest.mark.slow
def test_a_module_used_twice_fails_the_capture_by_name_and_training_goes_on(tmp_path):
    """Weight reuse: the capture's coverage check counts ``down_proj`` twice and says so."""
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), eos_logit=1.0)
    mlp = model.model.layers[0].mlp
    plain = type(mlp).forward

    def twice(self, x):
        out = plain(self, x)
        return out + 0.0 * self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    mlp.forward = twice.__get__(mlp)
    tr, _, _ = _run(tmp_path, "in_run", model=model, tokenizer=tok, steps=2)
    assert tr.state.global_step == 2
    for rec in tr.geometry_records:
        assert rec["in_run_groups"] == 0 and rec["skipped_groups"]
        assert all("counted 2 times" in s["reason"] for s in rec["skipped_groups"])
        assert any("down_proj" in e for e in rec["in_run_errors"])


@pytest.mark.slow
@pytest.mark.parametrize("loss_type,extra", LOSSES, ids=lambda p: str(p))
def test_in_run_equals_second_pass_for_every_loss_type(tmp_path, loss_type, extra):
    _assert_in_run_equals_second_pass(tmp_path, steps=2, loss_type=loss_type, **extra)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_in_run_equals_second_pass_with_gradient_checkpointing(tmp_path, loss_type):
    tok = tiny_tokenizer()
    _assert_in_run_equals_second_pass(
        tmp_path, loss_type=loss_type, gradient_checkpointing=True, tokenizer=tok,
        prompts=PADDED_PROMPTS, model_fn=lambda: tiny_model(len(tok), eos_logit=1.0, attn="sdpa"))


@pytest.mark.slow
def test_in_run_beyond_ratio_one_gives_the_row_gram_only(tmp_path):
    """num_iterations=2 (second inner step, ratio != 1): u_i is not a multiple of the mask, so
    in-run gives Kg (exact) but not K."""
    run, _ = _assert_in_run_equals_second_pass(tmp_path, steps=2, score=False,
                                               num_iterations=2, loss_type="grpo",
                                               rtol=INRUN_RTOL_OFF_RATIO)
    last = run.geometry_records[-1]["group_records"]
    assert all("score_geometry" in g for g in last if g["has_gradient"])


@pytest.mark.slow
def test_in_run_with_a_kl_term_equals_second_pass_row_gram(tmp_path):
    """beta > 0, the reference model moved away from the policy: TRL's per-token loss gradient
    carries the KL term, so u_i is not a multiple of the mask; the in-run Kg (TRL's own rows,
    KL included) equals the second pass's, and the records say K was not derived in-run."""
    run, _ = _assert_in_run_equals_second_pass(
        tmp_path, score=False, loss_type="grpo", beta=0.1,
        model_fn=lambda: tiny_model_with_hub_path(tmp_path / "tiny"),
        prepare=perturb_reference_model)
    assert run.geometry_records[0]["beta"] == 0.1
    groups = [g for g in run.geometry_records[0]["group_records"] if g["has_gradient"]]
    assert groups and all("score_geometry" in g for g in groups)


@pytest.mark.slow
def test_in_run_with_simulated_vllm_importance_sampling_equals_second_pass(tmp_path):
    """TRL's vLLM importance-sampling correction (sampler ratios simulated) weighs each token's
    loss: in-run takes those weights from TRL's own backward; Kg equals the second pass's."""
    run, _ = _assert_in_run_equals_second_pass(
        tmp_path, score=False, loss_type="grpo", trainer_cls=simulated_vllm_trainer(),
        prepare=lambda tr: setattr(tr, "vllm_importance_sampling_correction", True))
    assert run.vllm_importance_sampling_correction
    groups = [g for g in run.geometry_records[0]["group_records"] if g["has_gradient"]]
    assert groups and all("score_geometry" in g for g in groups)  # the ratios weigh the tokens


@pytest.mark.slow
def test_in_run_peft_lora_with_gradient_checkpointing(tmp_path):
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                          lora_dropout=0.0, init_lora_weights=False)
    tok = tiny_tokenizer()
    _assert_in_run_equals_second_pass(
        tmp_path, peft_config=cfg, gradient_checkpointing=True, loss_type="grpo", tokenizer=tok,
        prompts=PADDED_PROMPTS, model_fn=lambda: tiny_model(len(tok), eos_logit=1.0, attn="sdpa"))


@pytest.mark.slow
def test_group_order_keeps_every_group_in_one_micro_batch(tmp_path):
    """geometry_group_order: TRL's shuffle permutes whole groups, so with micro-batches of 4
    rows and groups of 4 every group is captured in-run, exactly as the second pass finds."""
    run, _ = _assert_in_run_equals_second_pass(
        tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=4,
        loss_type="dapo", geometry_group_order=True)
    rec = run.geometry_records[0]
    assert rec["in_run_groups"] == rec["groups"] == 2
    perm = trl_rows.group_permutation(10, first_row=2, group_size=4,
                                rng=torch.Generator().manual_seed(0))
    labels = ((2 + perm) // 4).tolist()  # rows of a group stay together, groups permuted
    assert sorted(perm.tolist()) == list(range(10))
    assert [labels[i] for i in range(10) if i == 0 or labels[i] != labels[i - 1]] == sorted(
        set(labels), key=labels.index)
