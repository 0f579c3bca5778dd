"""Batched rollouts across prompts (:func:`real_model.rollouts.sample_groups`) on CPU.

Tiers: exact (masks, stops and lengths on a scripted LM; tail-only stop detection equals the
full-text check on random token streams), equivalence (batched groups equal per-group sampling on
a tiny float32 model at these seeds; see the note in :func:`sample_groups` about why this is a
property of the inputs, not a guarantee), and reproducibility (resume of ``real rank`` with
batched blocks is bit-identical to the uninterrupted run).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from real_pipeline_helpers import ScriptedLM, odd_reward, tiny_loaded

from real_model.config import RankConfig
from real_model.loading import CharTokenizer, tiny_random_model
from real_model.rollouts import (
    _common_prefix,
    _prefill,
    _StopWatch,
    cached_forward,
    prompt_seed,
    sample_group,
    sample_groups,
    sample_prompts,
)

TOK = CharTokenizer()
PROMPTS = ["Question: 1+1?\nAnswer:", "Q: 22*3?\nA:", "Hello there, what is 5?"]


def test_batched_groups_stop_mask_and_assemble_like_single_groups():
    """Prompts of different lengths (left padding inside the batch), stop strings, EOS, length."""
    lm = ScriptedLM(TOK.encode("ab\n\ncd"), TOK.vocab_size)
    groups = sample_groups(lm, TOK, ["Q:", "Longer prompt:"], R=3, seeds=[0, 1],
                           max_new_tokens=10, temperature=0.0)
    for g, p in zip(groups, ["Q:", "Longer prompt:"], strict=True):
        assert g.texts == ["ab"] * 3 and g.stop_reasons == ["stop"] * 3
        assert g.lengths.tolist() == [4] * 3 and g.prompt_length == len(p)
        assert g.input_ids.shape == (3, len(p) + 4)
        assert g.input_ids[0, : len(p)].tolist() == TOK.encode(p)  # the prompt, unpadded
        assert g.completion_mask[:, : len(p)].sum() == 0 and g.completion_mask[:, len(p) :].all()
    eos_lm = ScriptedLM([*TOK.encode("xy"), TOK.eos_token_id, *TOK.encode("zz")], TOK.vocab_size)
    (g,) = sample_groups(eos_lm, TOK, ["Q:"], R=2, seeds=[0], max_new_tokens=10, temperature=0)
    assert g.texts == ["xy", "xy"] and g.stop_reasons == ["eos", "eos"]
    assert g.lengths.tolist() == [3, 3]
    (g,) = sample_groups(eos_lm, TOK, ["Q:"], R=1, seeds=[0], max_new_tokens=1, temperature=0)
    assert g.stop_reasons == ["length"] and g.lengths.tolist() == [1] and g.texts == ["x"]


def test_tail_stop_detection_equals_full_text_check():
    """On random character streams, the first step at which the tail-only watcher fires, and the
    text it returns, equal those of checking the whole decoded text after every token."""
    rng = random.Random(0)
    alphabet = TOK.encode("ab\nQuestion: ")
    stops = ["\n\n", "Question:", "ba"]
    watch = _StopWatch(TOK, stops, eos=None)
    for _ in range(300):
        ids: list[int] = []
        fired = full = None
        for t in range(40):
            ids.append(rng.choice(alphabet))
            if fired is None:
                res = watch.check(ids)
                fired = (t, res[1]) if res else None
            text = TOK.decode(ids)
            if full is None and any(s in text for s in stops):
                full = (t, text[: min(text.find(s) for s in stops if s in text)])
        assert fired == full


def test_batched_groups_equal_per_group_sampling_on_tiny_float32_model():
    """Same seeds, same tokens: batch composition changes the logits only in the last bits, and
    at these seeds no sampled token sits on a boundary (a property of the inputs, see
    ``sample_groups``)."""
    m = tiny_random_model(vocab_size=TOK.vocab_size, seed=1)
    kw = dict(R=4, max_new_tokens=12, stop_strings=("\n", "ab"))
    batched = sample_groups(m, TOK, PROMPTS, seeds=[3, 4, 5], **kw)
    for p, s, b in zip(PROMPTS, [3, 4, 5], batched, strict=True):
        one = sample_group(m, TOK, p, seed=s, **kw)
        assert torch.equal(b.input_ids, one.input_ids) and b.texts == one.texts
        assert b.stop_reasons == one.stop_reasons and np.array_equal(b.lengths, one.lengths)
    again = sample_groups(m, TOK, PROMPTS, seeds=[3, 4, 5], **kw)
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(again, batched, strict=True))


def test_common_prefix_leaves_every_prompt_one_own_token():
    assert _common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 9, 9]]) == 2
    assert _common_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # identical prompts: the last token is own
    assert _common_prefix([[7, 1], [8, 1]]) == 0
    assert _common_prefix([[5], [5, 6]]) == 0


def test_shared_prefix_prefill_equals_per_prompt_forward_in_float64():
    """Prefix prefilled once + own tokens left-padded behind it == each prompt's own forward:
    the last-token logits to 1e-12 (float64) and the next step's logits too (the cache layout
    ``[prefix | padding | own]`` with positions counted on real tokens)."""
    m = tiny_random_model(vocab_size=TOK.vocab_size, seed=2).double()
    shots = "Question: 2+2?\nAnswer: 4\n\n"
    prompts = [shots + q for q in ("Q: 1?", "Q: 333?\nA:", "Hi")]
    pids = [TOK.encode(p) for p in prompts]
    assert _common_prefix(pids) == len(TOK.encode(shots))  # "Hi" differs from "Q" at once
    R = 2
    with torch.no_grad():
        past, logits, attn = _prefill(m, pids, R=R, pad=0, device="cpu")
        assert attn.shape == (len(prompts) * R, max(len(p) for p in pids))
        nxt = torch.tensor([[5]] * (len(prompts) * R))
        lens = torch.tensor([len(p) for p in pids]).repeat_interleave(R)
        out, _ = cached_forward(m, past, input_ids=nxt, position_ids=lens[:, None],
                                attention_mask=torch.cat([attn, torch.ones_like(nxt)], 1))
        step = out.logits[:, -1]
        for g, p in enumerate(pids):
            ref = m(input_ids=torch.tensor([p + [5]])).logits[0]
            for i in range(g * R, (g + 1) * R):
                assert torch.allclose(logits[i], ref[-2].float(), rtol=0, atol=1e-7)  # float32 out
                assert torch.allclose(step[i], ref[-1], rtol=0, atol=1e-12)


def test_batched_groups_with_a_shared_few_shot_header_equal_per_group_sampling():
    m = tiny_random_model(vocab_size=TOK.vocab_size, seed=1)
    shots = "Question: 2+2?\nAnswer: 4\n\n"
    prompts = [shots + p for p in PROMPTS]
    kw = dict(R=3, max_new_tokens=10, stop_strings=("\n", "ab"))
    batched = sample_groups(m, TOK, prompts, seeds=[3, 4, 5], **kw)
    for p, s, b in zip(prompts, [3, 4, 5], batched, strict=True):
        one = sample_group(m, TOK, p, seed=s, **kw)
        assert torch.equal(b.input_ids, one.input_ids) and b.texts == one.texts


def test_sample_prompts_blocks_and_errors():

    m = tiny_random_model(vocab_size=TOK.vocab_size, seed=1)
    kw = dict(R=2, max_new_tokens=4)
    per_group = sample_prompts(m, TOK, PROMPTS, seeds=[1, 2, 3], batch_prompts=1, **kw)
    assert [b.input_ids.tolist() for b in per_group] == [
        sample_group(m, TOK, p, seed=s, **kw).input_ids.tolist()
        for p, s in zip(PROMPTS, [1, 2, 3], strict=True)
    ]
    blocks = sample_prompts(m, TOK, PROMPTS, seeds=[1, 2, 3], batch_prompts=2, **kw)
    tail = sample_groups(m, TOK, PROMPTS[2:], seeds=[3], **kw)
    assert torch.equal(blocks[2].input_ids, tail[0].input_ids)  # the second block is [prompt 2]
    with pytest.raises(ValueError, match="batch_prompts"):
        sample_prompts(m, TOK, PROMPTS, seeds=[1, 2, 3], batch_prompts=0, **kw)
    with pytest.raises(ValueError, match="one seed per prompt"):
        sample_groups(m, TOK, PROMPTS, seeds=[1], **kw)
    with pytest.raises(ValueError, match="temperature"):
        sample_groups(m, TOK, PROMPTS[:1], seeds=[1], R=2, temperature=-1.0)


def test_rank_resume_inside_a_batched_block_is_bit_identical(tmp_path: Path):
    """A run cut after the first record of a 3-prompt block resamples the whole block on resume,
    so its records equal the uninterrupted run's."""
    import matplotlib

    matplotlib.use("Agg")
    from real_model.rank import run_rank

    cfg = RankConfig(prompts=3, R_values=(2, 4), max_new_tokens=6, shots=1, stop_strings=("\n",),
                     rollout_batch=3)
    a, b = tmp_path / "a", tmp_path / "b"
    run_rank(a, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    run_rank(b, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    lines_b = (b / "results.jsonl").read_text().splitlines()
    (b / "results.jsonl").write_text(lines_b[0] + "\n")  # "interrupted" after one record
    run_rank(b, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)

    def strip(path: Path) -> list[dict]:
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        for r in recs:
            r.pop("time_s")
        return recs

    assert strip(a / "results.jsonl") == strip(b / "results.jsonl")


def test_prompt_seed_depends_on_seed_and_index_only():
    assert prompt_seed(0, 3) == int(np.random.SeedSequence([0, 3]).generate_state(1)[0])
    assert prompt_seed(0, 3) == prompt_seed(0, 3) != prompt_seed(0, 4) != prompt_seed(1, 4)


def test_per_group_sampling_keeps_the_old_resume_key():
    assert "rollout_batch" not in RankConfig(rollout_batch=1).resume_key()
    assert RankConfig().resume_key()["rollout_batch"] == 8


def test_finished_rows_leave_the_batch_without_changing_other_rows(monkeypatch):
    """Frequent stops end rows at different steps; once a quarter of the batch has finished, the
    batch is compacted (the KV cache keeps the live rows). Every group still equals per-group
    sampling (tiny float32 model; each row's draw depends on its own probabilities only)."""
    from transformers.cache_utils import DynamicCache

    calls: list[int] = []
    orig = DynamicCache.batch_select_indices

    def counted(self, indices):
        calls.append(int(indices.numel()))
        return orig(self, indices)

    monkeypatch.setattr(DynamicCache, "batch_select_indices", counted)
    m = tiny_random_model(vocab_size=TOK.vocab_size, seed=2)
    kw = dict(R=4, max_new_tokens=16, stop_strings=("a", "e", "o", "x", "1"), temperature=1.0)
    batched = sample_groups(m, TOK, PROMPTS, seeds=[7, 8, 9], **kw)
    assert calls, "no compaction happened: the test needs rows that finish early"
    for p, s, b in zip(PROMPTS, [7, 8, 9], batched, strict=True):
        one = sample_group(m, TOK, p, seed=s, **kw)
        assert torch.equal(b.input_ids, one.input_ids) and b.texts == one.texts
        assert b.stop_reasons == one.stop_reasons
    assert {r for b in batched for r in b.stop_reasons} >= {"stop"}
    assert len({int(x) for b in batched for x in b.lengths}) > 2  # ragged lengths
