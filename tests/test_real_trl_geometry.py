"""TRL integration: the geometry's rows against the gradient of TRL's own optimizer steps.

Every test trains with ``trainer.train()`` and a callback that, before each optimizer update
(``on_pre_optimizer_step``, no clipping), checks the step's geometry against the gradient TRL
accumulated in ``.grad``:

* route 1 (any configuration): ``g_i = grad sum_t u_it log pi_it`` from the recorded per-token
  loss gradient ``u`` and TRL's own log-probabilities, row by row; ``sum_i g_i`` equals TRL's
  gradient, the recorded ``Kg`` equals ``[<g_i, g_j>]`` and ``K`` equals ``[<psi_i, psi_j>]``;
* route 2 (ratio 1, ``beta = 0``): ``u_it = -c_i A_i m_it`` with the hand-derived
  :func:`trl_row_weights` (``grpo_theory.aggregation``), independent of TRL's autograd;
* ``geometry/grad_norm`` logged through ``trainer.train()`` equals TRL's logged ``grad_norm``.

Tiny float64 Llama (config-built, character tokenizer, both offline) whose end-of-sequence logit
is raised so completion lengths vary (asserted). TRL's fused LM head returns float32
log-probabilities: TRL's own ``psi_i`` carry ~1e-7 relative error, hence 1e-5.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from trl_geometry_helpers import (  # noqa: E402
    LOSSES,
    PADDED_PROMPTS,
    RowChecker,
    loss_id,
    make_trainer,
    perturb_reference_model,
    simulated_vllm_trainer,
    tiny_model,
    tiny_model_with_hub_path,
    tiny_tokenizer,
)

from real_model.integrations import config as gconfig  # noqa: E402
from real_model.integrations import protocol  # noqa: E402
from real_model.integrations import trl as itrl  # noqa: E402
from real_model.integrations.trl import meter as trl_meter  # noqa: E402
from real_model.integrations.trl import rows as trl_rows  # noqa: E402
from real_model.integrations.trl import step as trl_step  # noqa: E402
from real_model.integrations.trl import trainer as trl_trainer  # noqa: E402
from real_model.integrations.trl import weights as trl_weights  # noqa: E402

RTOL = 1e-5


def run_checked(tmp_path, *, per_row=True, hand_route=False, **kw):
    chk = RowChecker(per_row=per_row, hand_route=hand_route)
    tr = make_trainer(tmp_path, callbacks=[chk.callback], **kw)
    chk.trainer = tr
    tr.train()
    return tr, chk


def assert_exact(tr, chk, *, steps):
    assert [r["step"] for r in chk.results] == list(range(steps))
    for r in chk.results:
        assert r["rel_err"] <= RTOL, r
        assert r["K_err"] <= RTOL and r["Kg_err"] <= RTOL, r
    lengths = [x for r in chk.results for x in r["lengths"]]
    assert len(set(lengths)) >= 3, f"completion lengths must vary, got {lengths}"
    # the geometry's gradient norm logged through trainer.train() is TRL's grad_norm
    logged = [h for h in tr.state.log_history if "grad_norm" in h and "loss" in h]
    assert len(logged) == steps
    for h in logged:
        assert h["geometry/grad_norm"] == pytest.approx(h["grad_norm"], rel=1e-4)
        assert h["geometry/skipped"] == 0.0 and h["geometry/exact"] == 1.0


@pytest.mark.parametrize("loss_type,extra", LOSSES, ids=[loss_id(p) for p in LOSSES])
def test_rows_sum_to_trl_gradient_on_first_and_second_inner_step(tmp_path, loss_type, extra):
    """num_iterations=2: step 0 at ratio 1 (both routes), step 1 the second inner step."""
    tr, chk = run_checked(tmp_path, loss_type=loss_type, num_iterations=2, max_steps=2,
                          per_row=loss_type == "grpo" and not extra, hand_route=True, **extra)
    assert_exact(tr, chk, steps=2)
    assert chk.results[0]["u_err"] <= 1e-6  # hand-derived c_i A_i at ratio 1
    # the second inner step is off ratio 1: the hand weights no longer describe TRL's loss
    assert chk.results[1]["u_err"] > 1e-6
    recs = tr.geometry_records
    assert [r["step"] for r in recs] == [0, 1] and all(r["exact"] for r in recs)
    assert recs[0]["mixed_groups"] >= 1


CONFIGS = {
    "beta": dict(beta=0.1),
    "steps_per_generation=2": dict(steps_per_generation=2, gradient_accumulation_steps=1,
                                   per_device_train_batch_size=8),
    "two_generations_per_step": dict(steps_per_generation=1, gradient_accumulation_steps=2),
    "entropy_mask": dict(top_entropy_quantile=0.5, loss_type="bnpo"),
    "delta_and_off_policy_mask": dict(delta=1.02, num_iterations=2,
                                      off_policy_mask_threshold=0.001, loss_type="grpo"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rows_exact_for_options_beyond_ratio_one(tmp_path, name):
    kw = dict(CONFIGS[name])
    steps = 2
    model = None
    if "beta" in kw:
        model = tiny_model_with_hub_path(tmp_path / "tiny")
    chk = RowChecker(per_row=name in ("beta", "steps_per_generation=2"))
    tr = make_trainer(tmp_path, callbacks=[chk.callback], model=model, max_steps=steps, **kw)
    chk.trainer = tr
    if "beta" in kw:  # a reference model that differs from the policy: the KL term is nonzero
        perturb_reference_model(tr)
    tr.train()
    assert_exact(tr, chk, steps=steps)
    segs = [len(tr.geometry_records)]
    assert segs == [steps]
    if name == "steps_per_generation=2":
        # each optimizer step holds half of every group: measured on the rows present
        for rec in tr.geometry_records:
            assert all(g["rows_present"] < g["R"] for g in rec["group_records"])
    if name == "beta":
        assert all(r["beta"] == 0.1 for r in tr.geometry_records)


def test_simulated_vllm_importance_sampling_correction_is_exact(tmp_path):
    """TRL's vLLM IS correction multiplies the per-token loss by sampler ratios (simulated)."""
    chk = RowChecker()
    tr = make_trainer(tmp_path, callbacks=[chk.callback], trainer_cls=simulated_vllm_trainer(),
                      max_steps=2)
    tr.vllm_importance_sampling_correction = True
    chk.trainer = tr
    tr.train()
    assert_exact(tr, chk, steps=2)
    last = tr.geometry_last
    assert not last["proportional"] and last["passes"] == 2  # u is not a multiple of the mask


def test_peft_lora_with_gradient_checkpointing_rows_exact(tmp_path):
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                          lora_dropout=0.0, init_lora_weights=False)
    tok = tiny_tokenizer()
    tr, chk = run_checked(tmp_path, peft_config=cfg, gradient_checkpointing=True, max_steps=2,
                          loss_type="grpo", tokenizer=tok, prompts=PADDED_PROMPTS,
                          model=tiny_model(len(tok), eos_logit=1.0, attn="sdpa"))
    assert tr.args.gradient_checkpointing
    names = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert_exact(tr, chk, steps=2)


def test_dropout_is_named_in_the_record_and_strict_refuses(tmp_path):
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), eos_logit=1.0, dropout=0.1)
    tr = make_trainer(tmp_path, model=model, max_steps=1)
    tr.train()
    rec = tr.geometry_records[0]
    assert not rec["exact"] and any("config.attention_dropout=0.1" in i for i in rec["issues"])
    strict = make_trainer(tmp_path / "s", model=tiny_model(len(tok), dropout=0.1),
                          geometry_strict=True)
    with pytest.raises(trl_step.GeometryStrictError, match="attention_dropout"):
        strict.train()


def test_failure_skips_the_step_logs_the_reason_and_training_goes_on(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = trl_rows.measure_rows

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.cuda.OutOfMemoryError("simulated out of memory")
        return real(*a, **k)

    monkeypatch.setattr(trl_meter, "measure_rows", flaky)
    tr = make_trainer(tmp_path, max_steps=2, gradient_accumulation_steps=1,
                      per_device_train_batch_size=8)
    with pytest.warns(UserWarning, match="not measured"):
        tr.train()
    assert tr.state.global_step == 2
    lines = [json.loads(x) for x in (tmp_path / "geometry.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1]
    assert lines[0]["skipped"] and "simulated out of memory" in lines[0]["skipped_reason"]
    assert "skipped" not in lines[1] and lines[1]["groups"] == 2
    logs = [h for h in tr.state.log_history if "loss" in h]
    assert "simulated out of memory" in logs[0]["geometry/skipped_reason"]
    assert logs[0]["geometry/skipped"] == 1.0 and "geometry/skipped_reason" not in logs[1]
    calls["n"] = 0
    strict = make_trainer(tmp_path / "s", geometry_strict=True)
    with pytest.raises(trl_step.GeometryStrictError, match="simulated out of memory"):
        strict.train()


def test_geometry_every_zero_hooks_nothing_and_every_k_measures_steps_0_k(tmp_path):
    tr = make_trainer(tmp_path, max_steps=2, geometry_every=0)
    tr.train()
    assert tr.geometry_records == [] and not (tmp_path / "geometry.jsonl").exists()
    assert not any(k.startswith("geometry/") for h in tr.state.log_history for k in h)
    tr = make_trainer(tmp_path / "k", max_steps=3, geometry_every=2,
                      geometry_jsonl_path=str(tmp_path / "k.jsonl"))
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "k.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 2]
    logged = [h for h in tr.state.log_history if "geometry/groups" in h]
    assert len(logged) == 2
    for h, r in zip(logged, lines, strict=True):
        for key in ("mean", "min", "max", "count"):
            name = f"geometry/score_norm_mean/{key}"
            assert h[name] == pytest.approx(r["metrics"]["score_norm_mean"][key])


def test_geometry_grpo_config_through_trlparser_yaml_cli_and_checkpoints(tmp_path):
    yaml = tmp_path / "cfg.yaml"
    yaml.write_text(f"output_dir: {tmp_path / 'o'}\ngeometry_every: 5\ngeometry_strict: true\n"
                    "geometry_memory_budget_mb: 256\nuse_cpu: true\nreport_to: []\n")
    (args,) = trl.TrlParser((itrl.GeometryGRPOConfig,)).parse_args_and_config(
        ["--config", str(yaml), "--geometry_grad_norm", "false"])
    cfg = args.geometry_config()
    assert (cfg.every, cfg.strict, cfg.memory_budget_mb, cfg.grad_norm) == (
        5, True, 256.0, False)
    with pytest.raises(ValueError, match="geometry_every"):
        itrl.GeometryGRPOConfig(output_dir=str(tmp_path / "o"), geometry_every=-1, use_cpu=True)
    # checkpoints save the fields (training_args.bin) and the record of the run
    tr = make_trainer(tmp_path, max_steps=1, save_strategy="steps", save_steps=1,
                      geometry_every=1, geometry_rtol=1e-7)
    tr.train()
    saved = torch.load(tmp_path / "out" / "checkpoint-1" / "training_args.bin",
                       weights_only=False)
    assert type(saved).__name__ == "GeometryGRPOConfig" and saved.geometry_rtol == 1e-7


def test_mixin_composes_with_a_user_grpo_subclass(tmp_path):
    seen = []

    class UserTrainer(trl.GRPOTrainer):
        def _prepare_inputs(self, generation_batch):
            out = super()._prepare_inputs(generation_batch)
            seen.append(int(self.state.global_step))
            return out

    class Measured(trl_trainer.GeometryMixin, UserTrainer):
        pass

    tok = tiny_tokenizer()
    tr, chk = run_checked(tmp_path, trainer_cls=Measured, max_steps=2, tokenizer=tok,
                          model=tiny_model(len(tok), eos_logit=1.0, attn="sdpa"),
                          prompts=PADDED_PROMPTS)
    assert seen == [0, 0, 1, 1]  # the user's hook still runs, every micro-step
    assert_exact(tr, chk, steps=2)


def test_resume_from_a_trl_checkpoint_does_not_duplicate_records(tmp_path):
    kw = dict(max_steps=4, save_strategy="steps", save_steps=2, gradient_accumulation_steps=1,
              per_device_train_batch_size=8)
    make_trainer(tmp_path, **kw).train()
    path = tmp_path / "geometry.jsonl"
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
    tr = make_trainer(tmp_path, **kw)
    tr.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]


def test_measure_rows_without_trl_matches_per_row_gradients():
    """The module-level measuring step on plain tensors (two groups, token weights u)."""
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=2)
    g = torch.Generator().manual_seed(0)
    n, T, P = 6, 7, 3
    ids = torch.randint(2, len(tok), (n, T), generator=g)
    am = torch.ones(n, T, dtype=torch.long)
    am[4, -2:] = 0
    lm = torch.zeros(n, T, dtype=torch.float64)
    lm[:, P:] = am[:, P:].double()
    u = lm * torch.randn(n, T, generator=g, dtype=torch.float64)
    rows = trl_rows.GeometryRows(
        input_ids=ids, attention_mask=am, position_ids=torch.arange(T).expand(n, -1),
        loss_mask=lm, weights=u, rewards=np.array([1.0, 0, 0, 1, 1, 0]),
        advantages=np.ones(n), group=np.array([0, 0, 0, 1, 1, 1]),
        local=np.ones(n, dtype=bool), row=np.arange(n))
    model.eval()
    out = trl_rows.measure_rows(model, rows, config=gconfig.GeometryConfig(), group_size=3)
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(w):
        res = []
        for i in range(n):
            logits = model(input_ids=ids[i : i + 1], attention_mask=am[i : i + 1]).logits
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[i : i + 1, 1:, None])[..., 0]
            gi = torch.autograd.grad((lp * w[i : i + 1, 1:]).sum(), params)
            res.append(torch.cat([x.reshape(-1) for x in gi]))
        return torch.stack(res)

    Gu, Gm = grads(u), grads(lm)
    assert out.passes == 2 and not out.proportional
    for grp, rws in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        np.testing.assert_allclose(out.row_grams[grp], (Gu[rws] @ Gu[rws].T).numpy(),
                                   rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out.grams[grp], (Gm[rws] @ Gm[rws].T).numpy(),
                                   rtol=1e-9, atol=1e-12)
    tot = Gu.sum(dim=0)
    assert out.local_grad_sq == pytest.approx(float(tot @ tot), rel=1e-9)
    assert [r["mixed"] for r in out.groups] == [True, True]
    # blocks only, one group per pass (tiny budget): the same blocks, no cross-group norm
    blk = trl_rows.measure_rows(model, rows, config=gconfig.GeometryConfig(grad_norm=False,
                                                                memory_budget_mb=1e-3),
                          group_size=3)
    assert blk.local_grad_sq is None
    for grp in (0, 1):
        np.testing.assert_allclose(blk.row_grams[grp], out.row_grams[grp], rtol=1e-10)
        np.testing.assert_allclose(blk.grams[grp], out.grams[grp], rtol=1e-10)


def test_active_dropout_names_modules_and_config_fields():
    tok = tiny_tokenizer()
    assert trl_weights.active_dropout(tiny_model(len(tok))) == []
    m = tiny_model(len(tok), dropout=0.2)
    m.model.layers[0].mlp.extra = torch.nn.Dropout(0.3)
    names = trl_weights.active_dropout(m)
    assert "model.layers.0.mlp.extra (p=0.3)" in names and "config.attention_dropout=0.2" in names


def test_structure_issues_name_terms_outside_the_log_probs():
    args = trl.GRPOConfig(output_dir="/tmp/x", entropy_coef=0.01, use_cpu=True, report_to=[])
    assert "entropy bonus" in " ".join(trl_weights.structure_issues(args))
    ok = trl.GRPOConfig(output_dir="/tmp/x", use_cpu=True, report_to=[], beta=0.1,
                        num_iterations=2, top_entropy_quantile=0.5)
    assert trl_weights.structure_issues(ok) == []
    assert "every inner step" in " ".join(trl_weights.structure_notes(ok))
    assert "auxiliary" in " ".join(trl_weights.structure_issues(ok, aux_loss=True))


def test_every_trl_loss_type_is_known():
    """Every loss_type TRL's _compute_loss accepts has a hand-derived row-weight rule."""
    import inspect
    import re

    src = inspect.getsource(trl.GRPOTrainer._compute_loss)
    names = set()
    for m in re.finditer(r'loss_type (?:==|in) (\[[^\]]*\]|"[a-z_]+")', src):
        names |= set(re.findall(r'"([a-z_]+)"', m.group(1)))
    assert names == set(trl_weights.SUPPORTED_LOSS_TYPES)


def test_trl_row_weights_hand_checked():
    # grpo: two micro-batches of 2 rows, GA=2, W=1: c = 1/(2*2*L)
    c = trl_weights.trl_row_weights([1, 2, 4, 4], [0, 1, 0, 1], loss_type="grpo", num_chunks=2,
                           gradient_accumulation_steps=2, num_processes=1)
    assert c.tolist() == [1 / 4, 1 / 8, 1 / 16, 1 / 16]
    # bnpo: tokens per micro-batch 5 and 6
    c = trl_weights.trl_row_weights([1, 2, 4, 4], [0, 1, 0, 1], loss_type="bnpo", num_chunks=2,
                           gradient_accumulation_steps=2, num_processes=1)
    assert c.tolist() == [1 / 10, 1 / 12, 1 / 10, 1 / 12]
    # dapo over 2 processes: S/(GA N) regardless of W
    c = trl_weights.trl_row_weights([1, 3], [0, 0], loss_type="dapo", num_chunks=1,
                           gradient_accumulation_steps=1, num_processes=2, num_items_in_batch=8)
    assert c.tolist() == [1 / 8, 1 / 8]
    with pytest.raises(ValueError, match="not supported"):
        trl_weights.trl_row_weights([1], [0], loss_type="ppo", num_chunks=1,
                           gradient_accumulation_steps=1, num_processes=1)


def test_cos_success_failure_hand_checked():
    K = np.array([[1.0, 0.5], [0.5, 1.0]])
    assert protocol.cos_success_failure(K, [True, False]) == pytest.approx(0.5)
    assert protocol.cos_success_failure(K, [True, True]) is None


def test_trl_train_writes_real_train_outputs_and_compare_accepts_them(tmp_path):
    """``run_trl_train`` end to end on the tiny model (the command does the same with SmolLM2)."""
    from real_model.compare import run_compare
    from real_model.integrations.trl.train import TRLTrainConfig, run_trl_train
    from real_model.loading import LoadedModel, ModelSpec

    tok = tiny_tokenizer()
    loaded = LoadedModel(model=tiny_model(len(tok), eos_logit=1.0, attn="sdpa"), tokenizer=tok,
                         spec=ModelSpec(name="tiny", path="-"), device="cpu", dtype="float64")
    cfg = TRLTrainConfig(steps=2, prompts_per_step=2, num_generations=4, max_new_tokens=6,
                         shots=1, lr=1e-3, loss_type="grpo")
    res = run_trl_train(tmp_path / "run", cfg, loaded=loaded, progress=False,
                        reward_fn=lambda text, gold: float(len(text) % 2 == 0))
    out = tmp_path / "run"
    for name in ("steps.jsonl", "geometry.jsonl", "results.json", "table.md", "train.png"):
        assert (out / name).is_file(), name
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1] and res["steps_done"] == 2
    assert all("4" in s["spectra"] for s in steps)
    assert res["experiment"] == "real_trl_train" and res["summary"][0]["R"] == 4
    cmp_ = run_compare(tmp_path / "cmp", real=out / "results.json", R_values=(4,))
    assert any(r["source"] == "real:tiny" for r in cmp_["rows"])
    with pytest.raises(FileExistsError, match="overwrite"):
        run_trl_train(out, cfg, loaded=loaded, progress=False)


def test_group_records_from_the_row_gram_hand_checked():
    """Rows g = (1, 0), (0, 2): Kg = diag(1, 4), grad_norm = sqrt(5), rank 2, top-1 4/5."""
    from real_model.integrations.protocol import group_records

    K = np.array([[2.0, 0.0], [0.0, 3.0]])
    rec = group_records(K, [1.0, 0.0], [1.0, -1.0], None, [3, 4],
                        row_gram=np.diag([1.0, 4.0]))
    assert rec["grad_norm"] == pytest.approx(np.sqrt(5.0))
    assert rec["rank"] == 2 and rec["top1_fraction"] == pytest.approx(0.8)
    assert rec["norms"] == pytest.approx([np.sqrt(2.0), np.sqrt(3.0)])
    assert "weights" not in rec  # no row weights given: only the row Gram's metrics


def test_every_private_trl_name_the_integration_uses_exists_in_the_pinned_trl():
    """``integrations.trl.private`` lists each TRL-private name touched; each is in TRL 1.16."""
    from real_model.integrations.trl import private

    assert trl.__version__ == private.PINNED
    found = private.checked_names(trl)
    assert len(found) == len(private.TRAINER_PRIVATE) + len(private.MODULE_PRIVATE)
    assert all(found.values()), sorted(k for k, ok in found.items() if not ok)


def test_the_old_import_path_re_exports_the_trl_integration():
    import real_model.trl_geometry as old

    assert old.GeometryGRPOTrainer is itrl.GeometryGRPOTrainer
    assert old.GeometryGRPOConfig is itrl.GeometryGRPOConfig
    assert old.GeometryConfig is gconfig.GeometryConfig


@pytest.mark.parametrize(("field", "value", "error"), [
    ("geometry_every", "2", TypeError), ("geometry_every", 1.5, TypeError),
    ("geometry_every", -1, ValueError), ("geometry_rtol", 2.0, ValueError),
    ("geometry_mode", "inrun", ValueError), ("geometry_keep_groups", "yes", TypeError),
    ("geometry_success_threshold", float("nan"), ValueError), ("geometry_every", True, TypeError),
    ("geometry_rtol", float("inf"), ValueError), ("geometry_rtol", "1e-6", TypeError),
    ("geometry_success_threshold", "0.5", TypeError), ("geometry_strict", 0, TypeError),
    ("geometry_memory_budget_mb", float("nan"), ValueError)])
def test_geometry_grpo_config_refuses_a_bad_value_naming_its_field(tmp_path, field, value,
                                                                   error):
    with pytest.raises(error, match=f"^{field}: "):
        itrl.GeometryGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                **{field: value})


def test_geometry_grpo_config_names_the_field_its_type_and_the_value_given(tmp_path):
    with pytest.raises(TypeError, match=r"^geometry_every: must be an integer, got '2' \(str\)$"):
        itrl.GeometryGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                geometry_every="2")


def test_trl_config_fields_are_views_of_the_one_geometry_config():
    """One ``geometry_<name>`` field per option TRL reads, with that option's default and help."""
    import dataclasses

    trl_fields = {f.name: f for f in dataclasses.fields(itrl.GeometryGRPOConfig)
                  if f.name.startswith("geometry_")}
    options = gconfig.host_fields("trl")
    assert sorted(trl_fields) == sorted(f"geometry_{f.name}" for f in options)
    for f in options:
        view = trl_fields[f"geometry_{f.name}"]
        assert view.default == f.default and view.metadata["help"] == f.metadata["help"]
    assert "geometry_second_pass_rows" not in trl_fields  # verl's option only
