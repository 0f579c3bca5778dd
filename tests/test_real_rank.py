"""``real rank``'s parts on their own: which prompts a rerun still owes, and block sampling.

Exact tier: a folder holding prompts 0 and 2 owes 1 and 3; the block sampler hands out, for
every prompt, the group that sampling its whole block at once gives. End-to-end runs and resume
are in ``test_real_pipeline.py`` and ``test_real_rollouts.py``. Resume safety: records written
under other settings or without their configuration, and a corrupt ``config.json``, are refused
with the option or the file named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from real_pipeline_helpers import SMALL_RUN, TOK, odd_reward, tiny_loaded

from real_model.config import RankConfig
from real_model.data import load_problems
from real_model.rank import BlockSampler, pending_prompts
from real_model.rollouts import sample_problem_groups

CFG = RankConfig(prompts=4, R_values=(2,), max_new_tokens=4, shots=1, stop_strings=("\n",),
                 rollout_batch=3)


def test_pending_prompts_skips_those_on_disk_and_overwrite_clears_them(tmp_path: Path) -> None:
    out = tmp_path / "rank"
    assert pending_prompts(out, CFG, overwrite=False) == [0, 1, 2, 3]
    key = CFG.resume_key()
    lines = [json.dumps({"prompt_index": i, "rewards": [0.0, 1.0], "by_R": {}, "config": key})
             for i in (0, 2)]
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert pending_prompts(out, CFG, overwrite=False) == [1, 3]
    assert pending_prompts(out, CFG, overwrite=True) == [0, 1, 2, 3]
    (out / "results.jsonl").write_text(lines[0] + "\n")
    with pytest.raises(ValueError, match="max_new_tokens"):
        pending_prompts(out, RankConfig(**{**CFG.__dict__, "max_new_tokens": 5}),
                        overwrite=False)


def test_block_sampler_gives_each_prompt_its_blocks_group() -> None:
    loaded = tiny_loaded()
    problem_set = load_problems(CFG, CFG.prompts)
    blocks = BlockSampler(loaded, CFG, problem_set)
    got = [blocks.group(i)[0] for i in (1, 0, 2, 3)]  # prompt 1 first: its block is 0..2
    first = sample_problem_groups(loaded.model, TOK, CFG, problem_set, [0, 1, 2], R=2,
                                  batch_prompts=3)
    last = sample_problem_groups(loaded.model, TOK, CFG, problem_set, [3], R=2, batch_prompts=3)
    want = [first[1], first[0], first[2], last[0]]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.input_ids, w.input_ids) and g.texts == w.texts
    assert blocks.sampled == {}  # every group handed out once


@pytest.mark.usefixtures("user_cache")
def test_rank_refuses_old_records_under_new_settings_without_config_json(tmp_path: Path) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    run_rank(out, RankConfig(prompts=1, **SMALL_RUN), loaded=tiny_loaded(), progress=False,
             reward_fn=odd_reward)
    (out / "config.json").unlink()
    new = {**SMALL_RUN, "max_new_tokens": 6}
    with pytest.raises(ValueError, match=r"record 1 .*max_new_tokens: recorded 4, now 6"):
        run_rank(out, RankConfig(prompts=2, **new), loaded=tiny_loaded(), progress=False)
    assert not (out / "config.json").exists()  # nothing adopted


@pytest.mark.usefixtures("user_cache")
def test_rank_refuses_records_without_configuration_when_config_json_is_gone(
    tmp_path: Path,
) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    run_rank(out, RankConfig(prompts=1, **SMALL_RUN), loaded=tiny_loaded(), progress=False,
             reward_fn=odd_reward)
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("config", None)  # as written by an older version
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (out / "config.json").unlink()
    with pytest.raises(ValueError, match="without their configuration"):
        run_rank(out, RankConfig(prompts=1, **SMALL_RUN), loaded=tiny_loaded(), progress=False)


@pytest.mark.usefixtures("user_cache")
def test_corrupt_config_json_error_names_the_file(tmp_path: Path) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON") as e:
        run_rank(out, RankConfig(prompts=1, **SMALL_RUN), loaded=tiny_loaded(), progress=False)
    assert str(out / "config.json") in str(e.value)


# --- an R without a mixed group: why, what to change, and a figure that says so -------------------
def _records(rewards: list[list[float]]) -> list[dict]:
    return [{"rewards": r} for r in rewards]


def test_no_mixed_group_note_counts_the_equal_groups_and_names_the_options() -> None:
    from real_model.outputs import no_mixed_group_notes

    cfg = RankConfig(prompts=4, R_values=(2, 4))
    recs = _records([[0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 1]])
    rows = [{"R": 2, "groups": 4, "mixed_groups": 0}, {"R": 4, "groups": 4, "mixed_groups": 3}]
    (note,) = no_mixed_group_notes(cfg, recs, rows)
    assert note.startswith("R=2: no mixed group: all 4 groups had equal rewards "
                           "(3 all wrong, 1 all right), so every advantage is 0")
    assert "--prompts 16" in note and "--R 4 8" in note
    assert "easier problems (--difficulty 1 --operations add sub)" in note


def test_no_mixed_group_note_asks_for_harder_problems_when_the_groups_are_all_right() -> None:
    from real_model.outputs import no_mixed_group_notes

    cfg = RankConfig(prompts=2, R_values=(2,), difficulty=(1,), operations=("add",))
    (note,) = no_mixed_group_notes(cfg, _records([[1, 1], [1, 1]]),
                                   [{"R": 2, "groups": 2, "mixed_groups": 0}])
    assert "(2 all right)" in note and "harder problems (--difficulty 2)" in note
    # the easiest generated problems already: not proposed again when all are wrong
    (note,) = no_mixed_group_notes(cfg, _records([[0, 0], [0, 0]]),
                                   [{"R": 2, "groups": 2, "mixed_groups": 0}])
    assert "easier" not in note and note.endswith("or larger groups (--R 4).")


def test_no_mixed_group_note_asks_for_longer_completions_when_some_were_cut() -> None:
    from real_model.outputs import no_mixed_group_notes

    cfg = RankConfig(prompts=1, R_values=(2,), max_new_tokens=32)
    recs = [{"rewards": [0, 0], "stop_reasons": ["length", "stop"]}]
    (note,) = no_mixed_group_notes(cfg, recs, [{"R": 2, "groups": 1, "mixed_groups": 0}])
    assert note.startswith("R=2: no mixed group: the one group had equal rewards (1 all wrong)")
    assert ("longer completions (--max-new-tokens 64: 1 of 2 stopped at the limit, perhaps "
            "before their answer)") in note


def test_no_note_when_every_R_has_a_mixed_group() -> None:
    from real_model.outputs import no_mixed_group_notes

    rows = [{"R": 2, "groups": 1, "mixed_groups": 1}]
    assert no_mixed_group_notes(RankConfig(R_values=(2,)), _records([[0, 1]]), rows) == []


@pytest.mark.usefixtures("user_cache")
def test_rank_run_without_mixed_groups_says_why_in_table_results_and_figure(
    tmp_path: Path,
) -> None:
    from real_model.rank import run_rank

    out = tmp_path / "r"
    res = run_rank(out, RankConfig(prompts=2, **SMALL_RUN), loaded=tiny_loaded(),
                   progress=False, reward_fn=lambda text, gold: 0.0)
    (note,) = res["notes"]
    assert note.startswith("R=2: no mixed group: all 2 groups had equal rewards (2 all wrong)")
    assert f"Note: {note}" in (out / "table.md").read_text()
    assert json.loads((out / "results.json").read_text())["notes"] == [note]
    assert (out / "rank.png").stat().st_size > 0


def _fake_record(rewards: list[float], values: dict[int, tuple[float, float]]) -> dict:
    """A rank record whose group at each R has the given (effective rank, top-1), mixed or not
    as its first R rewards say."""
    by_R = {}
    for R, (er, t1) in values.items():
        mixed = min(rewards[:R]) != max(rewards[:R])
        by_R[str(R)] = {"mixed": mixed, "estimators": {"grpo": {
            "effective_rank": er if mixed else None, "top1_fraction": t1 if mixed else None}}}
    return {"rewards": rewards, "by_R": by_R}


def test_rank_figure_draws_the_papers_table1_beside_ours_and_labels_the_missing_R() -> None:
    from matplotlib.figure import Figure

    from paper_values import PAPER_TABLE1
    from real_model.outputs import plot_rank_metric

    recs = [_fake_record([0, 0, 1, 0], {2: (1.5, 0.6), 4: (2.5, 0.7)}),
            _fake_record([1, 0, 1, 1], {2: (1.9, 0.55), 4: (3.0, 0.65)})]
    ax_er, ax_t1 = Figure().subplots(1, 2)
    plot_rank_metric(ax_er, recs, metric="effective_rank", R_values=(2, 4))
    plot_rank_metric(ax_t1, recs, metric="top1_fraction", R_values=(2, 4))
    star = next(c for c in ax_er.collections if c.get_label().startswith("paper Table 1"))
    assert [y for _, y in star.get_offsets()] == [PAPER_TABLE1[R]["eff_rank"]
                                                  for R in sorted(PAPER_TABLE1)]
    bars = next(c for c in ax_t1.collections if c.get_label().startswith("paper Table 1"))
    assert [tuple(seg[:, 1]) for seg in bars.get_segments()] == [
        PAPER_TABLE1[R]["top1"] for R in sorted(PAPER_TABLE1)]
    # R=2: only the second group is mixed; R=4: both; nothing is labelled missing
    assert not [t for t in ax_er.texts if "no mixed" in t.get_text()]


def test_rank_figure_panel_without_any_mixed_group_says_so_in_words() -> None:
    from matplotlib.figure import Figure

    from real_model.outputs import plot_rank_metric

    recs = [_fake_record([0, 0, 0, 0], {2: (0, 0), 4: (0, 0)}),
            _fake_record([1, 1, 0, 1], {2: (0, 0), 4: (2.0, 0.7)})]
    ax = Figure().subplots()
    plot_rank_metric(ax, recs[:1], metric="top1_fraction", R_values=(2, 4))
    assert "no mixed group at any R" in ax.get_title()
    assert sum("no mixed" in t.get_text() for t in ax.texts) == 2  # at R=2 and at R=4
    ax = Figure().subplots()
    plot_rank_metric(ax, recs, metric="top1_fraction", R_values=(2, 4))
    assert ax.get_title() == "" and [t.get_position()[0] for t in ax.texts] == [2]
