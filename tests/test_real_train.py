"""``real train``'s parts on their own: the GRPO step, the step record, the checkpoints.

Tiers: exact (a step's gradient norm is ``sqrt(w^T K w)`` with ``K`` the trajectory-score Gram at
the pre-update weights; the step record of hand-checked rewards; a checkpoint restores states
and records), and the rules for where checkpoints live. End-to-end resume of ``run_train`` is in
``test_real_pipeline.py``. Resume safety: a truncated last ``steps.jsonl`` line with a later
checkpoint keeps every step; checkpoints live outside ``--out`` by default; a checkpoint carrying a
pickled callable is refused by name and never run; an old or foreign one says how to proceed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from real_pipeline_helpers import SMALL_RUN, TOK, odd_reward, tiny_loaded

from real_model.checkpoint import (
    cache_folder,
    default_cache_dir,
    load_checkpoint,
    resume_from_checkpoint,
    save_checkpoint,
)
from real_model.data import load_problems
from real_model.geometry import group_gram, rollout_weights
from real_model.outputs import train_step_record
from real_model.rollouts import sample_problem_groups
from real_model.train import TrainConfig, grpo_step


def _odd_code_sum(text: str, gold: object) -> float:
    return float(sum(map(ord, text)) % 2)


def test_grpo_step_gradient_norm_is_sqrt_wKw_and_the_update_moves_the_weights() -> None:
    """One group (P = 1): ||grad loss||^2 = w^T K w, w = A c of the step's rewards, K at the
    weights the rollouts were sampled with; the AdamW step then changes the weights."""
    cfg = TrainConfig(steps=1, prompts_per_step=1, R_values=(2, 4), max_new_tokens=6, shots=1,
                      lr=1e-2, stop_strings=("\n",), seed=1)
    model = tiny_loaded(seed=3).model
    model.eval()
    problem_set = load_problems(cfg, 1)
    (b,) = sample_problem_groups(model, TOK, cfg, problem_set, [0], R=4,
                                 batch_prompts=cfg.rollout_batch)
    r = np.array([_odd_code_sum(t, None) for t in b.texts])
    assert 0 < r.sum() < 4, "the test needs a group with mixed rewards"
    K = group_gram(model, b, method=cfg.gram_method)
    w = rollout_weights(r, b.lengths, aggregation=cfg.aggregation, max_tokens=6)[1]
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    step = grpo_step(model, TOK, opt, cfg, problem_set, 0, reward=_odd_code_sum)

    assert step.rewards.tolist() == [r.tolist()]
    assert step.grad_norm**2 == pytest.approx(float(w @ K @ w), rel=1e-6)
    assert set(step.geometry[0]) == {2, 4}
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_train_step_record_hand_checked() -> None:
    rewards = np.array([[1.0, 0.0], [1.0, 1.0]])
    rec = train_step_record(3, rewards, [{}, {}], "grpo", grad_norm=2.0, loss=-0.5)
    assert rec["step"] == 3 and rec["grad_norm"] == 2.0 and rec["loss"] == -0.5
    assert rec["accuracy"] == 0.75
    assert rec["reward_std_within"] == 0.25  # (0.5 + 0) / 2, ddof 0
    assert rec["reward_std"] == pytest.approx(np.sqrt(3) / 4)  # std of 1, 0, 1, 1
    assert rec["zero_adv_fraction"] == 0.5


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = tiny_loaded(seed=seed).model
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_checkpoint_restores_states_and_fills_a_lost_record(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    recs = [{"step": 0, "x": 1}, {"step": 1, "x": 2}]
    key = {"seed": 0}
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, opt, steps_done=2, records=recs, config=key)
    assert not path.with_suffix(".tmp").exists()
    assert load_checkpoint(path)["steps_done"] == 2

    other, other_opt = _model_and_optimizer(1)
    start, kept = resume_from_checkpoint(path, other, other_opt, key=key, records=recs[:1],
                                         jsonl=tmp_path / "steps.jsonl")
    assert start == 2 and kept == recs  # step 1 from the checkpoint's copy
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="seed"):
        resume_from_checkpoint(path, other, other_opt, key={"seed": 1}, records=[],
                               jsonl=tmp_path / "steps.jsonl")


def test_no_checkpoint_resumes_at_step_zero(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    assert resume_from_checkpoint(tmp_path / "none.pt", model, opt, key={}, records=[],
                                  jsonl=tmp_path / "steps.jsonl") == (0, [])


def test_cache_folder_order_flag_then_pointer_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    out.mkdir()
    default = default_cache_dir(out)
    assert default.parent == tmp_path / "cache" / "train" and default.name.startswith("out-")
    assert cache_folder(out, None) == default
    (out / "checkpoint.json").write_text(json.dumps({"cache_dir": str(tmp_path / "there")}))
    assert cache_folder(out, None) == tmp_path / "there"
    assert cache_folder(out, tmp_path / "flag") == tmp_path / "flag"
    (out / "checkpoint.json").write_text("{}")
    with pytest.raises(ValueError, match="checkpoint pointer"):
        cache_folder(out, None)


@pytest.mark.usefixtures("user_cache")
def test_train_truncated_last_line_with_a_later_checkpoint_keeps_every_step(
    tmp_path: Path,
) -> None:
    from real_model.train import TrainConfig, run_train

    cfg = TrainConfig(steps=2, prompts_per_step=1, lr=1e-2, **SMALL_RUN)
    out = tmp_path / "t"
    run_train(out, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    lines = (out / "steps.jsonl").read_text().splitlines()
    full = [json.loads(x) for x in lines]
    (out / "steps.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    res = run_train(out, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    assert res["steps_done"] == 2
    again = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert again == full


@pytest.mark.usefixtures("user_cache")
def test_train_checkpoint_is_kept_outside_out_by_default(tmp_path: Path) -> None:
    from real_model.train import TrainConfig, default_cache_dir, run_train

    out = tmp_path / "repo" / "runs" / "train"
    cfg = TrainConfig(steps=1, prompts_per_step=1, **SMALL_RUN)
    res = run_train(out, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    ckpt = default_cache_dir(out) / "checkpoint.pt"
    assert ckpt.is_file() and res["checkpoint"] == str(ckpt)
    assert str(ckpt).startswith(str(tmp_path / "user-cache"))
    assert not any(p.suffix == ".pt" for p in out.rglob("*"))
    assert not (out / "cache").exists()
    assert json.loads((out / "checkpoint.json").read_text())["cache_dir"] == str(ckpt.parent)


class _Payload:
    """Unpickling this runs ``touch MARKER`` (what a tampered checkpoint could carry)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return os.system, (f"touch {self.marker}",)


def _trained_once(tmp_path: Path) -> tuple[Path, Any, Path]:
    from real_model.train import TrainConfig, default_cache_dir, run_train

    out = tmp_path / "t"
    cfg = TrainConfig(steps=1, prompts_per_step=1, lr=1e-2, **SMALL_RUN)
    run_train(out, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    ckpt = default_cache_dir(out) / "checkpoint.pt"
    assert ckpt.is_file()
    return out, TrainConfig(steps=2, prompts_per_step=1, lr=1e-2, **SMALL_RUN), ckpt


@pytest.mark.usefixtures("user_cache")
def test_train_checkpoint_with_a_pickled_callable_is_refused_by_name_and_never_run(
    tmp_path: Path,
) -> None:
    from real_model.train import run_train

    out, cfg2, ckpt = _trained_once(tmp_path)
    good = torch.load(ckpt, weights_only=True)  # what run_train writes loads as weights only
    marker = tmp_path / "payload-ran"
    torch.save({**good, "model": _Payload(marker)}, ckpt)
    with pytest.raises(ValueError) as ei:
        run_train(out, cfg2, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    msg = str(ei.value)
    assert str(ckpt) in msg and "weights_only=True refused it" in msg
    assert "system" in msg and "nothing in it was run" in msg and "new --out" in msg
    assert not marker.exists()
    assert len((out / "steps.jsonl").read_text().splitlines()) == 1  # nothing rewritten


@pytest.mark.usefixtures("user_cache")
def test_train_old_or_foreign_checkpoint_says_how_to_proceed(tmp_path: Path) -> None:
    import numpy as np

    from real_model.train import load_checkpoint, run_train

    out, cfg2, ckpt = _trained_once(tmp_path)
    good = torch.load(ckpt, weights_only=True)
    torch.save({**good, "rng": np.random.default_rng(0).random(3)}, ckpt)  # a numpy array
    with pytest.raises(ValueError, match=r"numpy.*new --out \(or pass --overwrite"):
        load_checkpoint(ckpt)
    torch.save({k: v for k, v in good.items() if k != "records"}, ckpt)  # an older layout
    with pytest.raises(ValueError, match=r"lacks \['records'\] .*new --out"):
        run_train(out, cfg2, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    torch.save(good, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # cut short (a full disk, a killed copy)
    with pytest.raises(ValueError, match="is not a readable torch checkpoint"):
        load_checkpoint(ckpt)


@pytest.mark.usefixtures("user_cache")
def test_train_checkpoint_that_does_not_fit_the_model_is_one_line_naming_it(
    tmp_path: Path,
) -> None:
    from real_model.loading import tiny_random_model
    from real_model.train import run_train

    out, cfg2, ckpt = _trained_once(tmp_path)
    good = torch.load(ckpt, weights_only=True)
    other = tiny_random_model(vocab_size=TOK.vocab_size, hidden_size=16, num_heads=2)
    for state, reason in (({}, r"\d+ tensors missing"),
                          (other.state_dict(), "of another shape")):
        torch.save({**good, "model": state}, ckpt)
        with pytest.raises(ValueError, match=reason) as ei:
            run_train(out, cfg2, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
        msg = str(ei.value)
        assert "\n" not in msg and str(ckpt) in msg and "does not fit the model" in msg
        assert "new --out" in msg
    torch.save({**good, "steps_done": -1}, ckpt)
    with pytest.raises(ValueError, match=r"steps_done must be >= 0, got -1"):
        run_train(out, cfg2, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)


def test_checkpoint_save_interrupted_leaves_the_previous_one_and_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_loaded().model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, opt, steps_done=1, records=[{"step": 0}], config={})
    before = path.read_bytes()

    def killed(obj: Any, f: Any) -> None:
        Path(f).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, model, opt, steps_done=2, records=[], config={})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.slow
def test_grpo_step_diagnostics_equal_their_definitions_from_per_row_gradients() -> None:
    """Two groups: every rollout's gradient row ``-(w_i / P) psi_i`` by its own backward; the
    step's diagnostics (norms, dead groups, both noise parts) equal their definitions from those
    rows and ``||grad loss||`` (float32 model: 1e-5 of the scale), and the record carries them."""
    from real_model.train import grpo_loss

    cfg = TrainConfig(steps=1, prompts_per_step=2, R_values=(4,), max_new_tokens=6, shots=1,
                      lr=1e-2, stop_strings=("\n",), seed=1)
    model = tiny_loaded(seed=3).model
    model.eval()
    problem_set = load_problems(cfg, 2)
    batches = sample_problem_groups(model, TOK, cfg, problem_set, [0, 1], R=4,
                                    batch_prompts=cfg.rollout_batch)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for b in batches:
        r = np.array([_odd_code_sum(t, None) for t in b.texts])
        w = rollout_weights(r, b.lengths, aggregation=cfg.aggregation, max_tokens=6)[1]
        rows = []
        for i in range(4):
            one = [0.0] * 4
            one[i] = float(w[i]) / 2  # the row's weight w_i / P in the step's loss
            for p in params:
                p.grad = None
            loss = grpo_loss(model, b, one)
            if loss.requires_grad:
                loss.backward()
            rows.append(torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad)
                                   .reshape(-1).double() for p in params]).numpy())
        groups.append(np.stack(rows))
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step = grpo_step(model, TOK, opt, cfg, problem_set, 0, reward=_odd_code_sum)
    d = step.diagnostics
    Gg = np.stack([g.sum(axis=0) for g in groups])
    T, S, n = step.grad_norm**2, float((Gg**2).sum()), 2
    scale = max(T, n * S)
    assert d["groups"] == 2.0 and d["grad_norm"] == step.grad_norm
    assert abs(d["noise/mu_sq"] - n / (n - 1) * (T - S)) <= 1e-5 * scale
    assert abs(d["noise/trace_sigma"] - n / (n - 1) * (n * S - T)) <= 1e-5 * scale
    assert d["dead_groups/count"] == sum(not g.any() for g in groups)
    norms = np.linalg.norm(np.concatenate(groups), axis=1)
    assert d["rollout_grad_norm/max"] == pytest.approx(norms.max(), rel=1e-5)
    assert d["group_grad_norm/mean"] == pytest.approx(np.linalg.norm(Gg, axis=1).mean(),
                                                      rel=1e-5, abs=1e-5 * np.sqrt(scale))
    rec = train_step_record(0, step.rewards, step.geometry, "grpo", grad_norm=step.grad_norm,
                            loss=step.loss, diagnostics=d)
    assert rec["diagnostics"] is d
    assert "diagnostics" not in train_step_record(0, step.rewards, step.geometry, "grpo",
                                                  grad_norm=1.0, loss=0.0)
