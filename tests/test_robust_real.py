"""Issue 13, real_model: resume safety, early validation, file-named errors, quiet loading,
checkpoints outside --out (tiny models; each test failed before its fix)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from real_model.loading import CharTokenizer, LoadedModel, ModelSpec, tiny_random_model

torch.set_num_threads(1)
TOK = CharTokenizer()
KW: dict[str, Any] = dict(R_values=(2,), max_new_tokens=4, shots=1, stop_strings=("\n",))


def _tiny() -> LoadedModel:
    return LoadedModel(tiny_random_model(vocab_size=TOK.vocab_size), TOK, ModelSpec("t", "-"),
                       "cpu", "float32")


def _reward(text: str, gold: Any) -> float:
    return float(sum(map(ord, text)) % 2)


@pytest.fixture(autouse=True)
def _agg_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "user-cache"))


def test_rank_refuses_old_records_under_new_settings_without_config_json(tmp_path: Path) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    run_rank(out, RankConfig(prompts=1, **KW), loaded=_tiny(), progress=False, reward_fn=_reward)
    (out / "config.json").unlink()
    new = {**KW, "max_new_tokens": 6}
    with pytest.raises(ValueError, match=r"record 1 .*max_new_tokens: recorded 4, now 6"):
        run_rank(out, RankConfig(prompts=2, **new), loaded=_tiny(), progress=False)
    assert not (out / "config.json").exists()  # nothing adopted


def test_rank_refuses_records_without_configuration_when_config_json_is_gone(
    tmp_path: Path,
) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    run_rank(out, RankConfig(prompts=1, **KW), loaded=_tiny(), progress=False, reward_fn=_reward)
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("config", None)  # as written by an older version
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (out / "config.json").unlink()
    with pytest.raises(ValueError, match="without their configuration"):
        run_rank(out, RankConfig(prompts=1, **KW), loaded=_tiny(), progress=False)


def test_train_truncated_last_line_with_a_later_checkpoint_keeps_every_step(
    tmp_path: Path,
) -> None:
    from real_model.train import TrainConfig, run_train

    cfg = TrainConfig(steps=2, prompts_per_step=1, lr=1e-2, **KW)
    out = tmp_path / "t"
    run_train(out, cfg, loaded=_tiny(), progress=False, reward_fn=_reward)
    lines = (out / "steps.jsonl").read_text().splitlines()
    full = [json.loads(x) for x in lines]
    (out / "steps.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    res = run_train(out, cfg, loaded=_tiny(), progress=False, reward_fn=_reward)
    assert res["steps_done"] == 2
    again = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert again == full


def test_train_checkpoint_is_kept_outside_out_by_default(tmp_path: Path) -> None:
    from real_model.train import TrainConfig, default_cache_dir, run_train

    out = tmp_path / "repo" / "runs" / "train"
    cfg = TrainConfig(steps=1, prompts_per_step=1, **KW)
    res = run_train(out, cfg, loaded=_tiny(), progress=False, reward_fn=_reward)
    ckpt = default_cache_dir(out) / "checkpoint.pt"
    assert ckpt.is_file() and res["checkpoint"] == str(ckpt)
    assert str(ckpt).startswith(str(tmp_path / "user-cache"))
    assert not any(p.suffix == ".pt" for p in out.rglob("*"))
    assert not (out / "cache").exists()
    assert json.loads((out / "checkpoint.json").read_text())["cache_dir"] == str(ckpt.parent)


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
            run_rank(out, RankConfig(estimators=("bogus",), **KW), progress=False)
        else:
            run_train(out, TrainConfig(estimators=("bogus",), **KW), progress=False)
    assert not (out / "config.json").exists()


def test_cli_bogus_estimator_one_line_exit_2(tmp_path: Path, capsys: Any) -> None:
    from grpo_audit.cli import main

    code = main(["real", "rank", "--out", str(tmp_path / "o"), "--estimators", "bogus"])
    err = capsys.readouterr().err
    assert code == 2 and "estimator 'bogus'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "config.json").exists()


def test_gsm8k_without_data_names_the_data_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from real_model.data import load_gsm8k

    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(FileNotFoundError, match=r"pass --data PATH") as e:
        load_gsm8k(None, limit=1)
    assert "--gsm8k" not in str(e.value)


def test_corrupt_config_json_error_names_the_file(tmp_path: Path) -> None:
    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON") as e:
        run_rank(out, RankConfig(prompts=1, **KW), loaded=_tiny(), progress=False)
    assert str(out / "config.json") in str(e.value)


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


def test_no_progress_silences_transformers_loading_bars(tmp_path: Path, capfd: Any) -> None:
    from real_model.loading import load_model

    folder = _tiny_hf_folder(tmp_path / "m")
    capfd.readouterr()
    load_model(str(folder), device="cpu", progress=False)
    quiet = capfd.readouterr()
    assert "Loading weights" not in quiet.err + quiet.out
    load_model(str(folder), device="cpu", progress=True)
    assert "Loading weights" in capfd.readouterr().err  # the bar the option hides


def test_quiet_loading_also_silences_the_gguf_dequantisation_bar(capfd: Any) -> None:
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from real_model.loading import quiet_loading

    with quiet_loading(True):
        list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "de-quantizing" not in capfd.readouterr().err
    list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "de-quantizing" in capfd.readouterr().err  # restored afterwards


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
    cfg = TrainConfig(steps=1, prompts_per_step=1, lr=1e-2, **KW)
    run_train(out, cfg, loaded=_tiny(), progress=False, reward_fn=_reward)
    ckpt = default_cache_dir(out) / "checkpoint.pt"
    assert ckpt.is_file()
    return out, TrainConfig(steps=2, prompts_per_step=1, lr=1e-2, **KW), ckpt


def test_train_checkpoint_with_a_pickled_callable_is_refused_by_name_and_never_run(
    tmp_path: Path,
) -> None:
    from real_model.train import run_train

    out, cfg2, ckpt = _trained_once(tmp_path)
    good = torch.load(ckpt, weights_only=True)  # what run_train writes loads as weights only
    marker = tmp_path / "payload-ran"
    torch.save({**good, "model": _Payload(marker)}, ckpt)
    with pytest.raises(ValueError) as ei:
        run_train(out, cfg2, loaded=_tiny(), progress=False, reward_fn=_reward)
    msg = str(ei.value)
    assert str(ckpt) in msg and "weights_only=True refused it" in msg
    assert "system" in msg and "nothing in it was run" in msg and "new --out" in msg
    assert not marker.exists()
    assert len((out / "steps.jsonl").read_text().splitlines()) == 1  # nothing rewritten


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
        run_train(out, cfg2, loaded=_tiny(), progress=False, reward_fn=_reward)
    torch.save(good, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # cut short (a full disk, a killed copy)
    with pytest.raises(ValueError, match="is not a readable torch checkpoint"):
        load_checkpoint(ckpt)
