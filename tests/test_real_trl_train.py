"""real_model.trl_train: a missing ``trl`` extra and bad sampling options are messages, before
any work; the reward TRL calls scores the text before the first stop string (exact,
hand-checked, no TRL needed)."""

from __future__ import annotations

import sys

import pytest

from real_model.trl_train import StopCutReward, cut_at_stop


def test_trl_train_without_the_extra_is_a_message_naming_it(monkeypatch, tmp_path):
    from real_model.trl_train import TRLTrainConfig, run_trl_train

    monkeypatch.setitem(sys.modules, "trl", None)  # makes `import trl` raise ImportError
    with pytest.raises(ValueError, match=r"trl extra"):
        run_trl_train(tmp_path / "out", TRLTrainConfig())


def test_trl_train_checks_sampling_options_before_any_work(tmp_path):
    pytest.importorskip("trl")
    from real_model.trl_train import TRLTrainConfig, run_trl_train

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
