"""verl adapter in 1 and 2 processes (``torchrun``, gloo, CPU, FSDP2): exactness, identical Grams,
failure agreement. Slow tier (two ``torchrun`` launches, ~1 min each on 2 cores); the verl CI step
runs it. Needs the ``verl`` extra; skipped without verl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

import verl_harness as H  # noqa: E402

pytestmark = pytest.mark.slow
TOL = 1e-5
SCRIPT = Path(__file__).with_name("verl_dist_script.py")


def _launch(world: int, model: Path, out: Path) -> list[dict]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, str(SCRIPT.parent), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
           "--master_port", str(29400 + world + os.getpid() % 500), str(SCRIPT), str(model),
           str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("verl_dist")
    model = base / "tiny"
    return {w: _launch(w, model, base / f"w{w}") for w in (1, 2)}


def _configs(runs):
    return [k for k in runs[1][0] if "/" in k]


def test_rows_sum_to_verl_gradient_and_gram_is_theirs_in_1_and_2_processes(runs):
    for w, ranks in runs.items():
        for res in ranks:
            for cfg in _configs(runs):
                r = res[cfg]
                assert "failed" not in r, (w, cfg, r.get("failed"))
                assert r["sum_err"] <= TOL, (w, cfg, r["sum_err"])
                assert max(r["gram_err"].values()) <= TOL, (w, cfg, r["gram_err"])


def test_gram_identical_in_1_and_2_processes(runs):
    for cfg in _configs(runs):
        one = runs[1][0][cfg]["grams"]
        for res in runs[2]:
            two = res[cfg]["grams"]
            assert set(one) == set(two)
            for uid in one:
                assert H.rel_err(two[uid], one[uid]) <= 1e-6, (cfg, uid)
    # every audited aggregation mode and at least vanilla, GSPO and CISPO were compared
    for policy in ("vanilla", "gspo", "cispo"):
        for agg in H.AGG_MODES:
            assert f"contiguous/{policy}/{agg}" in runs[2][0]


def test_paths_in_2_processes(runs):
    contiguous = runs[2][0]["contiguous/vanilla/token-mean"]["paths"]
    assert set(contiguous.values()) == {"in_run"}  # whole groups per micro-batch and rank
    interleaved = runs[2][0]["interleaved/vanilla"]["paths"]
    assert set(interleaved.values()) == {"second_pass"}  # every group on both ranks
    for layout, path in (("contiguous", "in_run"), ("interleaved", "second_pass")):
        assert set(runs[2][0][f"lora/{layout}"]["paths"].values()) == {path}  # verl's LoRA


def test_both_ranks_send_the_same_metrics_with_and_without_second_passes(runs):
    """In-run only (no second pass: each rank builds the metrics from the one gathered summary)
    and with second passes (rank 0 builds them and broadcasts): the same values on both ranks;
    the in-run-only step exact."""
    r0, r1 = runs[2]
    for cfg in ("in_run_only", "contiguous/vanilla/token-mean", "interleaved/vanilla"):
        assert r0[cfg]["metrics"] and r0[cfg]["metrics"] == r1[cfg]["metrics"], cfg
    assert r0["in_run_only"]["metrics"]["geometry/second_passes"] == [0.0]
    assert r0["interleaved/vanilla"]["metrics"]["geometry/second_passes"][0] > 0
    assert set(r0["in_run_only"]["paths"].values()) == {"in_run"}
    for res in runs[2]:
        assert res["in_run_only"]["sum_err"] <= TOL
        assert max(res["in_run_only"]["gram_err"].values()) <= TOL


def test_diagnostics_equal_in_1_and_2_processes(runs):
    """The training diagnostics in verl's metrics (``geometry/<key>``: norms, dead groups, both
    noise parts, SNR) of every configuration: the same on both ranks, and equal to the
    1-process run's (float32 gradients reduced in another order: ``TOL``)."""
    for cfg in _configs(runs):
        one = {k: v[0] for k, v in runs[1][0][cfg]["metrics"].items()
               if k.startswith(("geometry/noise/", "geometry/dead_groups/",
                                "geometry/rollout_grad_norm/", "geometry/group_grad_norm/"))}
        assert "geometry/noise/mu_sq" in one and "geometry/dead_groups/count" in one, cfg
        scale = max(abs(one["geometry/noise/mu_sq"]), abs(one["geometry/noise/trace_sigma"]))
        for res in runs[2]:
            two = res[cfg]["metrics"]
            for key, v in one.items():
                if key in ("geometry/noise/status", "geometry/noise/b_simple"):
                    continue  # b_simple = trace / mu_sq: the two parts are checked
                tol = TOL * (scale if key.startswith("geometry/noise/") else max(abs(v), 1e-30))
                if key == "geometry/noise/snr":
                    tol /= one["geometry/noise/step_noise_sq"]
                assert abs(two[key][0] - v) <= tol, (cfg, key, two[key][0], v)


def test_failure_on_one_rank_is_agreed_and_both_ranks_finish(runs):
    ranks = runs[2]
    for res in ranks:
        s0, s1 = res["failure"]["steps"]
        assert s0["finished"] and s1["finished"]
        assert s0["failed"] == 1.0 and s1["failed"] == 0.0
        assert any("injected failure on rank 1" in r for r in s0["reasons"])
    # both ranks stepped the optimizer identically (same full weights)
    assert ranks[0]["failure"]["param_checksum"] == ranks[1]["failure"]["param_checksum"]


def test_failure_inside_a_second_pass_on_one_rank_is_agreed_and_both_ranks_finish(runs):
    """A failure inside the second pass's capture on rank 1 (a Linear's term, early in the
    pass's backward): the pass's backward runs to the end on every rank (no rank left waiting in
    FSDP's collectives), the step's geometry is skipped on both with the reason, the next step
    measures every group by the second pass, and the weights stay identical across ranks."""
    ranks = runs[2]
    for res in ranks:
        s0, s1 = res["pass_failure"]["steps"]
        assert s0["failed"] == 1.0 and s1["failed"] == 0.0
        assert any("injected second-pass failure on rank 1" in r for r in s0["reasons"])
        assert s1["paths"] and set(s1["paths"]) == {"second_pass"}
    assert ranks[0]["pass_failure"]["param_checksum"] == ranks[1]["pass_failure"]["param_checksum"]


def test_cpu_example_runs_in_two_processes(tmp_path):
    """``examples/verl_geometry_cpu.py`` under ``torchrun``: one line per step, one JSON line per
    measured step (an earlier run's file started afresh), every group measured in-run."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    out = tmp_path / "g.jsonl"
    out.write_text('{"step": 7, "an earlier run": true}\n')
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(29300 + os.getpid() % 500), str(root / "examples" /
           "verl_geometry_cpu.py"), "--steps", "2", "--jsonl", str(out),
           "--model-dir", str(tmp_path / "tiny")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("step ")]
    assert len(lines) == 2 and all("in_run_groups=4" in x for x in lines), proc.stdout
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1] and recs[0]["world_size"] == 2
