"""``real trl-train``'s parts that need no TRL: the reward TRL calls (exact, hand-checked)."""

from __future__ import annotations

from real_model.trl_train import StopCutReward, cut_at_stop


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
