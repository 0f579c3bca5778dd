"""verl integration (real_model/integrations/verl) in one process: verl 0.9.1's own FSDP2
engine on CPU.

Needs the ``verl`` extra (its own environment: ``.ci/run`` builds it); skipped without verl. The
two-process tests are in ``tests/test_real_verl_distributed.py``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
import verl_harness as H  # noqa: E402

from real_model.integrations import config as gconfig  # noqa: E402
from real_model.integrations import verl as iverl  # noqa: E402
from real_model.integrations.verl import cpu as vc  # noqa: E402
from real_model.integrations.verl import plan as verl_plan  # noqa: E402
from real_model.integrations.verl import step as verl_step  # noqa: E402
from real_model.integrations.verl import tap as verl_tap  # noqa: E402

TOL = 1e-5  # relative (max-abs over max-abs), float32 engine vs float64 reference
ROWS_GRAD_RTOL = 1e-6  # weight_grads="rows": dW summed over rows in float32, another order


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    vc.init_process_group()
    vc.register_cpu_platform()
    path = vc.save_tiny_llama(tmp_path_factory.mktemp("verl") / "tiny")
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig())
    batch = vc.grpo_batch(H.REWARDS, seed=1, logp_noise=0.3, model_path=path)
    return {"path": path, "engine": engine, "batch": batch}


def _data(env, micro_batch_size=4, order=None):
    from verl.utils import tensordict_utils as tu

    td = env["batch"] if order is None else tu.index_select_tensor_dict(env["batch"], order)
    return vc.rank_slice(td, 0, 1, micro_batch_size=micro_batch_size)


def _fresh(env, **cfg):
    env["engine"].geometry = verl_step.VerlGeometry(gconfig.GeometryConfig(**cfg))
    return env["engine"]


def _assert_exact(res, path=None):
    assert "failed" not in res, res.get("failed")
    assert res["sum_err"] <= TOL, res["sum_err"]
    assert max(res["gram_err"].values()) <= TOL, res["gram_err"]
    if path is not None:
        assert set(res["paths"].values()) == {path}


@pytest.mark.parametrize("loss_mode", H.AUDITED_POLICY_LOSSES)
@pytest.mark.parametrize("agg", H.AGG_MODES)
def test_rows_sum_to_verl_gradient_and_gram_is_theirs_for_audited_losses(env, loss_mode, agg):
    _fresh(env)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_mode=loss_mode,
                              loss_agg_mode=agg)
    _assert_exact(H.check_step(env["engine"], env["path"], _data(env), loss_fn), "in_run")


POLICY_OPTIONS = {"dro": {"dro_beta": 0.1}, "clip_cov": {"clip_cov_ratio": 0.2},
                  "kl_cov": {"kl_cov_ratio": 0.2}}


def test_every_registered_policy_loss_is_exact(env):
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    for name in sorted(POLICY_LOSS_REGISTRY):
        _fresh(env)
        loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_mode=name,
                                  policy=POLICY_OPTIONS.get(name))
        res = H.check_step(env["engine"], env["path"], _data(env), loss_fn)
        _assert_exact(res, "in_run")


def test_norms_take_the_checked_closed_form(env):
    """The adapter's capture re-runs norms on an input that requires grad, so the core's closed
    form ``g_i = sum_t delta_it z_it`` applies (checked once per class against per-row vmap)."""
    engine = _fresh(env)
    H.measured_step(engine, _data(env), vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    for mb in engine.geometry.micro:
        verdicts = mb.capture.engine.norm_ok
        assert verdicts and all(verdicts.values()), verdicts


def test_kl_loss_is_in_the_rows(env):
    _fresh(env)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, use_kl_loss=True,
                              kl_loss_coef=0.5, kl_loss_type="low_var_kl")
    data = _data(env)
    data["ref_log_prob"] = data["old_log_probs"] * 0.9
    _assert_exact(H.check_step(env["engine"], env["path"], data, loss_fn), "in_run")


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo", "cispo"])
def test_groups_spread_over_micro_batches_go_through_the_exact_second_pass(env, loss_mode):
    _fresh(env)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=2, loss_mode=loss_mode)
    res = H.check_step(env["engine"], env["path"], _data(env, micro_batch_size=2), loss_fn)
    _assert_exact(res, "second_pass")


def test_in_run_and_second_pass_grams_agree(env):
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    _fresh(env)
    a = H.check_step(env["engine"], env["path"], _data(env), loss_fn)
    _fresh(env)
    b = H.check_step(env["engine"], env["path"], _data(env, order=H.INTERLEAVED), loss_fn)
    assert set(a["paths"].values()) == {"in_run"} and set(b["paths"].values()) == {"second_pass"}
    for uid in a["grams"]:
        assert H.rel_err(b["grams"][uid], a["grams"][uid]) <= 1e-6


def test_padded_micro_batches_are_exact(tmp_path):
    """``use_remove_padding=False``: verl's padded (batch-first) forward."""
    vc.init_process_group()
    path = vc.save_tiny_llama(tmp_path / "tiny")
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig(), use_remove_padding=False)
    td = vc.grpo_batch(H.REWARDS, seed=2, logp_noise=0.3, model_path=path)
    data = vc.rank_slice(td, 0, 1, micro_batch_size=4, use_remove_padding=False)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_agg_mode="seq-mean-token-mean")
    _assert_exact(H.check_step(engine, path, data, loss_fn), "in_run")


def hooks(engine):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in engine.module.modules())


@pytest.mark.parametrize(("weight_grads", "batched"),
                         [("host", False), ("rows", False), ("rows", True)])
def test_geometry_leaves_verl_loss_and_gradient_bit_identical(env, weight_grads, batched):
    """The loss and its per-token gradient are verl's own (the log-prob tap is an identity), and
    without gradient checkpointing the capture adds no node to verl's autograd graph (no input
    taps: only gradient hooks on module outputs), so with ``weight_grads="host"`` even float32
    ``.grad`` is bit for bit the same with and without the geometry. With ``"rows"`` each
    Linear's ``dW`` is the sum of the per-row gradients: equal to float32 rounding
    (``ROWS_GRAD_RTOL``), the loss still bit-identical. With the defaults (``"rows"`` and
    ``batch_small_calls``) every Linear of this tiny step is a small call, batched after the
    backward: verl forms its ``dW``, bit for bit."""
    engine = _fresh(env, every=2, weight_grads=weight_grads,  # step 0 measured, step 1 not
                    batch_small_calls=batched)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4, loss_mode="gspo")
    before = hooks(engine)
    g_on, out_on = H.measured_step(engine, _data(env), loss_fn)
    g_off, out_off = H.measured_step(engine, _data(env), loss_fn)
    assert "geometry/failed" in out_on["metrics"] and "geometry/failed" not in out_off["metrics"]
    assert out_on["metrics"]["geometry/failed"] == [0.0]
    assert all(not mb.capture.input_taps for mb in engine.geometry.micro)
    assert out_on["loss"] == out_off["loss"]
    cap = engine.geometry.micro[0].capture
    # one set of hooks for the step: each micro-batch's capture handed over to the next
    assert [mb.capture.pass_index for mb in engine.geometry.micro] == [0, 1, 2, 3]
    assert hooks(engine) == before  # and none left after the step
    assert bool(cap.from_rows) == (weight_grads == "rows" and not batched)
    assert bool(cap.batched) == batched
    for name in g_off:
        if weight_grads == "host" or batched:
            assert torch.equal(g_on[name], g_off[name]), name
        else:
            err = (g_on[name] - g_off[name]).abs().max() / g_off[name].abs().max()
            assert float(err) <= ROWS_GRAD_RTOL, (name, float(err))


def test_sum_of_gram_is_squared_gradient_norm_with_entropy_bonus(env):
    """One group of 12 in one micro-batch (in-run path): ``1^T K 1 = ||grad||^2`` for a loss with
    an entropy bonus (not on the log-probabilities: the capture still sees it)."""
    from verl.utils import tensordict_utils as tu

    engine = _fresh(env)
    td = vc.grpo_batch([[1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0]], seed=3, logp_noise=0.3,
                       model_path=env["path"])
    tu.assign_non_tensor(td, calculate_entropy=True)
    data = vc.rank_slice(td, 0, 1, micro_batch_size=12)
    loss_fn = vc.make_loss_fn(rollout_n=12, micro_batch_size=12, entropy_coeff=0.3)
    grads, out = H.measured_step(engine, data, loss_fn)
    (group,) = engine.geometry.last_record["groups"]
    assert group["path"] == "in_run"
    norm2 = sum(float((g * g).sum()) for g in grads.values())
    assert abs(float(np.sum(group["gram"])) - norm2) <= TOL * norm2


def test_entropy_bonus_with_spread_groups_is_reported_unsupported(env):
    from verl.utils import tensordict_utils as tu

    engine = _fresh(env, score_every=1)
    data = _data(env, micro_batch_size=2)
    tu.assign_non_tensor(data, calculate_entropy=True)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=2, entropy_coeff=0.1)
    H.measured_step(engine, data, loss_fn)
    rec = engine.geometry.last_record
    assert rec["failed"] is None
    assert {g["path"] for g in rec["groups"]} == {"unsupported"}
    assert all("entropy" in g["unsupported"] and g["gram"] is None for g in rec["groups"])
    assert rec["groups"][0]["score_gram"] is not None  # score geometry still measured


def test_metrics_reach_verl_trainer_through_its_worker(env):
    """verl's own ``TrainingWorker.train_mini_batch`` -> ``train_batch`` -> engine, then the
    trainer's ``rename_dict(..., "actor/")`` and ``reduce_metrics``: what its logger receives."""
    from verl.trainer.ppo.ray_trainer import rename_dict
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.utils.profiler import DistProfiler
    from verl.workers.engine_workers import TrainingWorker

    engine = _fresh(env, score_every=1)
    worker = object.__new__(TrainingWorker)  # the worker without Ray: its methods as verl runs them
    worker.engine, worker.engine_config = engine, engine.engine_config
    worker.model_config, worker.device_name = engine.model_config, "cpu"
    worker.loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    worker.flops_counter, worker.profiler = None, DistProfiler(rank=0)
    data = _data(env)
    tu.assign_non_tensor(data, mini_batch_size=16, epochs=1, seed=1,
                         dataloader_kwargs={"shuffle": False})
    out = TrainingWorker.train_mini_batch(worker, data)
    logged = reduce_metrics(rename_dict(tu.get(out, "metrics"), "actor/"))
    agg = engine.geometry.last_record["aggregate"]["metrics"]
    assert logged["actor/geometry/failed"] == 0.0
    for name in ("effective_rank", "cos_SF", "grad_norm"):
        assert logged[f"actor/geometry/{name}/mean"] == pytest.approx(agg[name]["mean"])
    assert logged["actor/geometry/in_run_groups"] == 4.0


def test_jsonl_has_one_record_per_measured_step(env, tmp_path):
    out = tmp_path / "geometry.jsonl"
    engine = _fresh(env, every=2, score_every=2, jsonl_path=str(out))
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    for _ in range(5):
        H.measured_step(engine, _data(env), loss_fn)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 2, 4]
    has_score = [r["groups"][0]["score_gram"] is not None for r in recs]
    assert has_score == [True, False, True]
    g = recs[0]["groups"][0]
    assert g["path"] == "in_run" and len(g["gram"]) == 4 and g["placement"] == [[0, 0]]
    assert recs[0]["aggregate"]["mixed_groups"] == 4


def test_failure_in_the_geometry_does_not_stop_verl_step(env, monkeypatch, caplog):
    engine = vc.make_engine(env["path"], micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig())  # its own: the optimizer steps
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    before = H.full_params(engine)

    def broken(*a, **k):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(verl_step, "row_meta", broken)
    data = _data(env)
    with caplog.at_level(logging.WARNING, logger="real_model.integrations.verl.step"):
        with engine.train_mode():
            out = engine.train_batch(data, loss_fn)  # verl's full step: backward + optimizer
    assert out["metrics"]["geometry/failed"] == [1.0]
    assert "injected failure" in caplog.text
    after = H.full_params(engine)
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the optimizer stepped


def test_strict_raises_on_failure(env, monkeypatch):
    engine = _fresh(env, strict=True)
    monkeypatch.setattr(verl_step, "row_meta", lambda *a, **k: 1 / 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        H.measured_step(engine, _data(env), vc.make_loss_fn(rollout_n=4, micro_batch_size=4))


SKIPPED = "model.layers.1.mlp.down_proj"


def test_a_layer_left_out_of_the_capture_fails_the_exactness_check(env):
    """The exactness tests above fail when one layer's contribution is missing: a capture whose
    plan leaves ``down_proj`` of layer 1 out (its weight frozen while the capture is built, trained
    by verl as usual) gives rows that still sum to verl's gradient but a Gram far off."""
    engine = _fresh(env)
    real = engine.geometry.capture_factory

    def leaving_out(module, **kw):  # noqa: D401
        p = dict(module.named_parameters())[f"{SKIPPED}.weight"]
        p.requires_grad_(False)
        try:
            return real(module, **kw)
        finally:
            p.requires_grad_(True)

    engine.geometry.capture_factory = leaving_out
    res = H.check_step(engine, env["path"], _data(env),
                       vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    assert res["sum_err"] <= TOL
    assert max(res["gram_err"].values()) > 100 * TOL


def test_a_layer_whose_hook_is_removed_is_reported_and_the_step_goes_on(env):
    engine = _fresh(env)
    real = engine.geometry.capture_factory
    target = dict(engine.module.named_modules())[SKIPPED]

    class HooksReset:  # e.g. a framework resetting the module's hooks mid-step
        def __init__(self, cap):
            self.cap = cap

        def __enter__(self):
            self.cap.__enter__()
            target._forward_hooks.clear()
            return self

        def __getattr__(self, name):
            return getattr(self.cap, name)

    engine.geometry.capture_factory = lambda module, **kw: HooksReset(real(module, **kw))
    grads, out = H.measured_step(engine, _data(env),
                                 vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    rec = engine.geometry.last_record
    assert out["metrics"]["geometry/failed"] == [1.0]
    assert SKIPPED in " ".join(rec["failed"])
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_wiring_through_verl_trainer_config(env):
    """verl's own Hydra config (``ppo_trainer.yaml``) with the documented overrides builds the
    geometry engine config; verl's ``EngineRegistry`` then hands out the geometry engine."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.config import CheckpointConfig
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    overrides = [
        "actor_rollout_ref.actor.fsdp_config._target_="
        "real_model.integrations.verl.GeometryFSDPEngineConfig",
        "+actor_rollout_ref.actor.fsdp_config.geometry={every:5,jsonl_path:/tmp/g.jsonl}",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]
    conf_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as verl's worker does
    assert type(actor.engine).__name__ == "GeometryFSDPEngineConfig"
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is iverl.GeometryFSDPEngine
    engine = EngineRegistry.new(
        model_type="language_model", backend="fsdp2", engine_config=actor.engine,
        model_config=HFModelConfig(path=str(env["path"]), load_tokenizer=False),
        optimizer_config=FSDPOptimizerConfig(lr=1e-3), checkpoint_config=CheckpointConfig())
    assert engine.geometry.config == gconfig.GeometryConfig(every=5, jsonl_path="/tmp/g.jsonl")
    plain = iverl.GeometryFSDPEngine(  # e.g. the reference model's engine: no geometry block
        model_config=engine.model_config, engine_config=env["engine"].engine_config,
        optimizer_config=FSDPOptimizerConfig(lr=1e-3), checkpoint_config=CheckpointConfig())
    assert plain.geometry is None


def test_config_from_verl_mapping():
    assert gconfig.from_mapping(None, host="verl") is None
    assert gconfig.from_mapping({"enable": False, "every": 3}, host="verl") is None
    cfg = gconfig.from_mapping({"every": 5, "score_every": 1, "jsonl_path": "g.jsonl"},
                               host="verl")
    assert cfg.every == 5 and cfg.measures(10) and not cfg.measures(11) and cfg.scores(5)
    with pytest.raises(ValueError, match="unknown geometry option"):
        gconfig.from_mapping({"evry": 5}, host="verl")
    with pytest.raises(ValueError, match="unknown geometry option"):
        gconfig.from_mapping({"mode": "auto"}, host="verl")  # TRL's option, not verl's
    with pytest.raises(ValueError, match="every"):
        gconfig.GeometryConfig(every=-1)


def test_tied_head_and_embedding_are_exact_packed_in_run_and_second_pass(tmp_path):
    """``tie_word_embeddings=True`` under FSDP2: the tie's cross terms in-run (packed micro-batch,
    padded slots filled with an id of the batch) and in the second pass (FSDP root unsharded for
    the pass, so head and embedding are one tensor)."""
    from verl.utils import tensordict_utils as tu

    vc.init_process_group()
    path = vc.save_tiny_llama(tmp_path / "tied", tie_word_embeddings=True)
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig())
    assert engine.module.lm_head.weight is engine.module.model.embed_tokens.weight
    td = vc.grpo_batch(H.REWARDS, seed=1, logp_noise=0.3, model_path=path)
    for mb, order, path_kind in ((4, None, "in_run"), (2, H.INTERLEAVED, "second_pass")):
        engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig())
        batch = td if order is None else tu.index_select_tensor_dict(td, order)
        data = vc.rank_slice(batch, 0, 1, micro_batch_size=mb)
        loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=mb)
        _assert_exact(H.check_step(engine, path, data, loss_fn), path_kind)


def test_gradient_checkpointing_takes_input_taps_and_stays_exact(tmp_path):
    """verl's ``enable_gradient_checkpointing=True``: the capture taps the module inputs
    (checkpoint-proof; ``input_taps=None`` follows the checkpointing) and the rows stay exact."""
    vc.init_process_group()
    path = vc.save_tiny_llama(tmp_path / "tiny")
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig(), gradient_checkpointing=True)
    td = vc.grpo_batch(H.REWARDS, seed=3, logp_noise=0.3, model_path=path)
    data = vc.rank_slice(td, 0, 1, micro_batch_size=4)
    res = H.check_step(engine, path, data, vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    _assert_exact(res, "in_run")
    assert all(mb.capture.input_taps for mb in engine.geometry.micro)


def test_gradient_checkpointing_leaves_every_micro_batch_its_rows_path(tmp_path, monkeypatch):
    """Under checkpointing verl still holds a micro-batch's graph when the next one starts: the
    capture's hooks and ``weight_grads="rows"`` forwards go when verl's backward of it is done
    (``GramCapture.backward_done``), not when the graph is freed, so that every micro-batch's
    Linears can take the rows path (before: every other micro-batch found the previous
    capture's forwards in place and took none), and the rows stay exact. The norms take their
    closed form on the packed tokens (before: unpacked, re-run per row block)."""
    vc.init_process_group()
    path = vc.save_tiny_llama(tmp_path / "tiny")
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig(), gradient_checkpointing=True)
    # in-run only (score_every=0: no second pass, whose padded rows take add_leaf anyway)
    engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig(batch_small_calls=False,
                                                                    score_every=0))
    td = vc.grpo_batch(H.REWARDS, seed=3, logp_noise=0.3, model_path=path)
    data = vc.rank_slice(td, 0, 1, micro_batch_size=4)
    from real_model.gram.layers import leaf

    leaves, add_leaf = [], leaf.add_leaf
    monkeypatch.setattr(leaf, "add_leaf", lambda p, mod, *a, **k: (
        leaves.append(type(mod).__name__), add_leaf(p, mod, *a, **k))[1])
    res = H.check_step(engine, path, data, vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    _assert_exact(res, "in_run")
    caps = [mb.capture for mb in engine.geometry.micro]
    assert len(caps) == 4 and all(c.input_taps and c.from_rows for c in caps)
    # the norms' closed form on the packed tokens, from a re-run of the norm (the host's node
    # is not held with taps), not unpacked: at most the once-per-class check takes add_leaf
    assert len(leaves) <= 1, leaves
    assert not any("forward" in vars(m) for m in engine.module.modules())  # all restored


@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_adapters_are_exact_in_run_and_second_pass(tmp_path, checkpointing):
    """verl's LoRA (``model.lora_rank > 0``: PEFT adapters on every Linear, the base frozen),
    started from a saved adapter whose ``B`` is not zero (``model.lora_adapter_path``), so that
    every ``A`` has a gradient too: the rows are the adapters' gradients (the frozen base adds
    none), exact in-run and through the second pass; with verl's gradient checkpointing too
    (input taps)."""
    from verl.utils import tensordict_utils as tu

    vc.init_process_group()
    path = vc.save_tiny_llama(tmp_path / "tiny")
    adapter = vc.save_lora_adapter(path, tmp_path / "lora", rank=4)
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            geometry=gconfig.GeometryConfig(), lora_rank=4,
                            lora_adapter_path=adapter, gradient_checkpointing=checkpointing)
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    td = vc.grpo_batch(H.REWARDS, seed=1, logp_noise=0.3, model_path=path)
    # in-run with the small calls batched (the test's narrow calls) and each on its own (as the
    # adapters' calls of a long micro-batch: their rows form dW, weight_grads="rows")
    for mb, order, path_kind, batched in ((4, None, "in_run", True), (4, None, "in_run", False),
                                          (2, H.INTERLEAVED, "second_pass", True)):
        engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig(batch_small_calls=batched))
        batch = td if order is None else tu.index_select_tensor_dict(td, order)
        data = vc.rank_slice(batch, 0, 1, micro_batch_size=mb)
        res = H.check_step(engine, path, data, vc.make_loss_fn(rollout_n=4, micro_batch_size=mb),
                           with_grad=True)
        _assert_exact(res, path_kind)
        assert sorted(res["names"]) == sorted(trainable)
        sizes = dict(engine.module.named_parameters())
        grad = iter(np.split(res["engine_grad"],
                             np.cumsum([sizes[n].numel() for n in res["names"]])[:-1]))
        assert all(np.abs(g).max() > 0 for g in grad)  # every A and B has a gradient
        if path_kind == "in_run":
            caps = [m.capture for m in engine.geometry.micro]
            assert all(c.input_taps is checkpointing for c in caps)
            assert all(bool(c.batched) is batched for c in caps)
            # unbatched: dW from the rows (weight_grads="rows") in every micro-batch
            assert all(bool(c.from_rows) is not batched for c in caps)
    # verl's adapter gradients with and without the geometry (step 0 measured, step 1 not):
    # bit for bit with weight_grads="host" and no input taps; to float32 rounding with the taps
    engine.geometry = verl_step.VerlGeometry(gconfig.GeometryConfig(every=2, weight_grads="host"))
    data = vc.rank_slice(td, 0, 1, micro_batch_size=4)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    g_on, out_on = H.measured_step(engine, data, loss_fn)
    g_off, out_off = H.measured_step(engine, data, loss_fn)
    assert out_on["metrics"]["geometry/failed"] == [0.0] and out_on["loss"] == out_off["loss"]
    assert sorted(g_on) == sorted(trainable)
    for name in g_off:
        if not checkpointing:
            assert torch.equal(g_on[name], g_off[name]), name
        else:
            err = (g_on[name] - g_off[name]).abs().max() / g_off[name].abs().max()
            assert float(err) <= ROWS_GRAD_RTOL, (name, float(err))


def test_make_engine_refuses_an_adapter_without_lora_rank(tmp_path):
    with pytest.raises(ValueError, match="lora_adapter_path needs lora_rank > 0"):
        vc.make_engine(tmp_path, micro_batch_size=4, lora_adapter_path=tmp_path)


@pytest.mark.parametrize("dynamic", [False, True])
def test_rows_are_matched_by_position_or_by_key_with_dynamic_micro_batches(env, monkeypatch,
                                                                           dynamic):
    """``use_dynamic_bsz=True``: verl rearranges the rows into token-balanced micro-batches, so
    the rows carry a key column for the step (gone after it) and every group is exact (spread
    over micro-batches here: second pass). Without dynamic batches verl cuts the batch in order:
    no column is added, the rows are matched by position, in-run."""
    from verl.utils import tensordict_utils as tu

    keyed, opened = [], verl_step._open

    def spy(st, geo, module, micro_batch):
        keyed.append(verl_plan.ROW_KEY in micro_batch.keys())
        return opened(st, geo, module, micro_batch)

    monkeypatch.setattr(verl_step, "_open", spy)
    engine = _fresh(env)
    data = _data(env)
    if dynamic:
        tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=40)
    res = H.check_step(engine, env["path"], data, vc.make_loss_fn(rollout_n=4,
                                                                   micro_batch_size=4))
    _assert_exact(res, "second_pass" if dynamic else "in_run")
    assert keyed and set(keyed) == {dynamic} and verl_plan.ROW_KEY not in data.keys()
    order = [k for mb in engine.geometry.micro for k in mb.keys]
    assert (order != sorted(order)) == dynamic  # rearranged only by the dynamic batches


def test_rows_out_of_order_without_dynamic_batches_fail_the_step_not_verl(env, monkeypatch):
    """Matched by position, a micro-batch whose row lengths are not the next rows' (here: the
    geometry reads the rows in reverse) is reported, the step's geometry skipped, verl's step
    done."""
    rows_of_batch = verl_plan.rows_of_batch
    monkeypatch.setattr(verl_step, "rows_of_batch", lambda *a: rows_of_batch(*a)[::-1])
    engine = _fresh(env)
    with engine.train_mode():
        out = engine.train_batch(_data(env), vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    assert out["metrics"]["geometry/failed"] == [1.0]
    assert any("not the batch's next rows in order" in r
               for r in engine.geometry.last_record["failed"])


def test_make_engine_names_an_unknown_compute_dtype(tmp_path):
    with pytest.raises(ValueError, match=r"compute_dtype must be one of \['bf16', 'fp32'\], "
                                         r"got 'fp16'"):
        vc.make_engine(tmp_path, micro_batch_size=4, compute_dtype="fp16")


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_bf16_mixed_precision_linears_take_the_rows_path_with_float32_rows(tmp_path,
                                                                          remove_padding):
    """verl's bf16 mixed precision (FSDP2 unshards bf16 weights, the forward under a bf16
    autocast that then casts nothing): the Linears take ``weight_grads="rows"``, their rows
    formed in float32. verl's gradient with the geometry is as close to the float64 sum of the
    rows as without it, and the Gram within the GPU test's bf16 bound of the float64 rows'."""
    vc.init_process_group()
    vc.register_cpu_platform()
    path = vc.save_tiny_llama(tmp_path / "tiny")
    engine = vc.make_engine(path, micro_batch_size=4, engine_cls=iverl.GeometryFSDPEngine,
                            compute_dtype="bf16", use_remove_padding=remove_padding)
    # per-sample for every Linear (by count, "auto" gives the tiny shape's wide ones the identity)
    def per_sample(module, *, engine, **kw):
        return verl_step.new_capture(module, engine=replace(engine, linear_method="per_sample"),
                                     **kw)

    engine.geometry = verl_step.VerlGeometry(
        gconfig.GeometryConfig(score_every=0, batch_small_calls=False), capture_factory=per_sample)
    td = vc.grpo_batch(H.REWARDS, seed=1, logp_noise=0.3, model_path=path)
    data = vc.rank_slice(td, 0, 1, micro_batch_size=4, use_remove_padding=remove_padding)
    loss_fn = vc.make_loss_fn(rollout_n=4, micro_batch_size=4)
    res = H.check_step(engine, path, data, loss_fn, with_grad=True)
    assert "failed" not in res, res.get("failed")
    assert set(res["paths"].values()) == {"in_run"}
    caps = [mb.capture for mb in engine.geometry.micro]
    linears = {n for n, (_, kind, _) in caps[0].plan.modules.items() if kind == "linear"
               and n not in caps[0].engine.embedding_of_head}
    assert all(c.from_rows == linears for c in caps), [sorted(linears - c.from_rows) for c in caps]
    # every Linear but a tied head, in each micro-batch
    engine.geometry = None
    grads, _ = H.measured_step(engine, data, loss_fn)
    e_engine, e_gram = res["sum_err"], max(res["gram_err"].values())
    e_off = H.rel_err(res["engine_grad"], H.flat_grad(grads, res["names"]))
    print(f"bf16 rows: engine vs float64 rows {e_engine:.2e}, with vs without geometry "
          f"{e_off:.2e}, Gram {e_gram:.2e}")
    assert e_engine <= H.BF16_ENGINE_RTOL and e_off <= H.BF16_ROWS_GRAD_RTOL, (e_engine, e_off)
    assert e_gram <= H.BF16_GRAM_FACTOR * e_engine + 1e-3, (e_engine, e_gram)


def _jagged_log_probs():
    """A jagged ``log_probs`` over two rows (2 and 3 tokens), a view of float32 values ``2 v``."""
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
    lp = torch.nested.nested_tensor_from_jagged(v * 2, offsets=torch.tensor([0, 2, 5]))
    return v, lp


def test_tap_log_probs_keeps_dloss_dlogp_per_packed_token_of_a_jagged_view():
    v, lp = _jagged_log_probs()
    sink = []
    verl_tap.tap_log_probs({"log_probs": lp}, sink)
    w = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0])
    (lp.values() * w).sum().backward()  # dL/dlogp = w, hand-checked
    assert len(sink) == 1 and torch.equal(sink[0], w)
    assert torch.equal(v.grad, 2 * w)  # verl's gradient unchanged by the tap


def test_tap_log_probs_on_a_plain_tensor_keeps_its_flat_gradient():
    x = torch.zeros(2, 3, requires_grad=True)
    lp = x + 1
    sink = []
    verl_tap.tap_log_probs({"log_probs": lp}, sink)
    (lp * torch.arange(6.0).reshape(2, 3)).sum().backward()
    assert torch.equal(sink[0], torch.arange(6.0))


def test_tap_log_probs_refuses_log_probs_without_gradient():
    lp = torch.nested.nested_tensor_from_jagged(torch.zeros(5), offsets=torch.tensor([0, 2, 5]))
    with pytest.raises(ValueError, match="need no gradient"):
        verl_tap.tap_log_probs({"log_probs": lp}, [])


# ----------------------------------------------------------------- training diagnostics
def _diag_definitions(rows_by_group, grad):
    """Each diagnostic by its definition from the reference rows and verl's gradient."""
    import math

    rows = [np.stack(r) for r in rows_by_group]
    n = len(rows)
    norms = np.concatenate([np.linalg.norm(r, axis=1) for r in rows])
    Gg = np.stack([r.sum(axis=0) for r in rows])
    gn = np.linalg.norm(Gg, axis=1)
    T, S = float(grad @ grad), float((gn**2).sum())
    mu, tr = n / (n - 1) * (T - S), n / (n - 1) * (n * S - T)
    return {"rollout_grad_norm/mean": norms.mean(), "rollout_grad_norm/max": norms.max(),
            "group_grad_norm/mean": gn.mean(), "group_grad_norm/rms": math.sqrt(S / n),
            "dead_groups/count": float(sum(not r.any() for r in rows)),
            "noise/mu_sq": mu, "noise/trace_sigma": tr, "noise/snr": mu / (tr / n)}, max(T, n * S)


def test_diagnostics_equal_their_definitions_from_reference_rows(env):
    """Norms, dead groups and both noise parts against the float64 reference rows (one backward
    per rollout) and verl's gradient (float32 engine: ``TOL``); the metrics carry the record's
    values under ``geometry/<key>``; from the recorded Grams and verl's norm, exactly."""
    import math

    from grpo_theory.diagnostics import step_diagnostics

    engine = _fresh(env)
    grads, out = H.measured_step(engine, _data(env), vc.make_loss_fn(rollout_n=4,
                                                                     micro_batch_size=4))
    rec = engine.geometry.last_record
    d = rec["diagnostics"]
    ref = H.reference_rows(H.reference_model(env["path"], H.full_params(engine)),
                           engine.geometry.measured.rows)
    names = [n for n, _ in H.reference_model(env["path"], H.full_params(engine))
             .named_parameters()]
    grad = H.flat_grad(grads, names)
    by_uid: dict[str, list] = {}
    for k, r in engine.geometry.measured.rows.items():
        by_uid.setdefault(r.uid, []).append(ref[k])
    want, scale = _diag_definitions(list(by_uid.values()), grad)
    assert d["grad_norm"] == pytest.approx(float(np.linalg.norm(grad)), rel=TOL)
    for key, v in want.items():
        if key.startswith("noise/"):
            tol = TOL * scale / (1.0 if key != "noise/snr" else d["noise/step_noise_sq"])
            assert abs(d[key] - v) <= tol, (key, d[key], v)
        else:
            assert d[key] == pytest.approx(v, rel=TOL), key
    for key, v in d.items():
        if key not in ("groups", "grad_norm") and math.isfinite(v):
            assert out["metrics"][f"geometry/{key}"] == [v], key
    exact = step_diagnostics(np.stack([np.asarray(g["gram"]) for g in rec["groups"]]),
                             tokens=[g["lengths"] for g in rec["groups"]],
                             rewards=[g["rewards"] for g in rec["groups"]],
                             total_grad_norm=d["grad_norm"])
    for key, v in exact.items():
        assert (math.isnan(v) and math.isnan(d[key])) or d[key] == pytest.approx(v, rel=1e-10)


VERL_ESTIMATORS = [("grpo", {}), ("grpo", {"norm_adv_by_std_in_grpo": False}), ("rloo", {}),
                   ("rloo_vectorized", {}), ("grpo_vectorized", {}), ("opo", {}),
                   ("reinforce_plus_plus_baseline", {}), ("gpg", {}), ("grpo_passk", {}),
                   ("gdpo", {}), ("reinforce_plus_plus", {})]


@pytest.mark.slow
@pytest.mark.parametrize("name,kw", VERL_ESTIMATORS,
                         ids=[n + ("-no_std" if k else "") for n, k in VERL_ESTIMATORS])
def test_dead_groups_from_the_rows_under_every_verl_estimator(env, monkeypatch, name, kw):
    """verl's own advantage estimator on rewards with one constant group: the dead groups
    counted from the rows are the groups whose verl advantages are all exactly zero (0 for
    reinforce_plus_plus, whose batch whitening leaves no group at zero; 3 for grpo_passk,
    which gives a group with two or more best rollouts no advantage)."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards = [[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 0]]

    def verl_advantages(r):
        t = torch.as_tensor(np.asarray(r, dtype=np.float32).reshape(-1, 1))
        out = get_adv_estimator_fn(name)(token_level_rewards=t, response_mask=torch.ones_like(t),
                                         index=np.repeat(np.arange(len(r)), len(r[0])),
                                         config=AlgoConfig(), **kw)
        return out[0][:, 0].reshape(len(r), len(r[0]))

    A = verl_advantages(rewards)
    zero = int((A == 0).all(dim=1).sum())
    monkeypatch.setattr(vc, "_grpo_advantages", verl_advantages)
    batch = vc.grpo_batch(rewards, seed=1, logp_noise=0.3, model_path=env["path"])
    engine = _fresh(env)
    H.measured_step(engine, vc.rank_slice(batch, 0, 1, micro_batch_size=4),
                    vc.make_loss_fn(rollout_n=4, micro_batch_size=4))
    d = engine.geometry.last_record["diagnostics"]
    assert d["dead_groups/count"] == zero and d["dead_groups/group_share"] == zero / 4
    assert zero == {"reinforce_plus_plus": 0, "grpo_passk": 3}.get(name, 1)
