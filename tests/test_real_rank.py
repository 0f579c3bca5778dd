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
