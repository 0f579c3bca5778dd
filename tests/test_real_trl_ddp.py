"""Two processes (``accelerate launch``, CPU, gloo; slow tier): DDP, FSDP2, an injected failure.

``tests/trl_ddp_script.py`` trains the tiny model with 6 rows per process and groups of 4, so the
middle group has rows on both processes and is measured on process 0 with the rows process 1
sends. Checks (see the script): the rows of every process sum to the gradient the data-parallel
wrapper itself reduced (DDP: averaged ``.grad``; FSDP2: sharded ``.grad`` made full), every
recorded Gram equals the gathered per-row gradients' Gram, and a failure injected on one process
only makes both skip that step's geometry and finish training (no hang: a timeout bounds it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("accelerate")

HERE = Path(__file__).resolve().parent
RTOL = 1e-5  # see test_real_trl_geometry.RTOL


def launch(out: Path, mode: str, *extra: str, timeout: int = 600) -> list[dict]:
    """Run the script on 2 CPU processes; return both processes' reports."""
    launcher = shutil.which("accelerate")
    cmd = [launcher, "launch"] if launcher else [sys.executable, "-m",
                                                 "accelerate.commands.launch"]
    # --multi_gpu runs torchrun; without GPUs accelerate uses CPU processes and gloo
    # (``--cpu`` alone would start ONE process unless MPI is set up)
    cmd += ["--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no",
            str(HERE / "trl_ddp_script.py"), str(out), mode, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_exact(reports: list[dict]) -> None:
    owned = []
    for rep in reports:
        assert rep["world_size"] == 2 and rep["global_step"] == 2
        assert [c["step"] for c in rep["checks"]] == [0, 1]
        for c in rep["checks"]:
            assert c["rel_err"] <= RTOL, c
            assert c["K_err"] <= RTOL and c["Kg_err"] <= RTOL, c
        owned.append([c["groups"] for c in rep["checks"]])
        for rec in rep["records"]:
            # 12 rows, groups of 4: 3 groups, all measured (one of them across processes)
            assert rec["groups"] == 3 and rec["groups_measured"] == rec["groups_with_gradient"]
            assert rec["exact"] and rec["num_processes"] == 2
    # step 0: process 0 measures groups 0 and 1 (1 with rows sent by process 1), process 1 group 2
    assert owned[0][0] == [0, 1] and owned[1][0] == [2]
    _assert_diagnostics(reports)


def _assert_diagnostics(reports: list[dict]) -> None:
    """Both processes record the same diagnostics (sums merged as scalars, TRL's one norm),
    equal to their definitions from every process's per-row gradients."""
    one, two = ([r["diagnostics"] for r in rep["records"]] for rep in reports)
    assert all(d is not None for d in one) and [d.keys() for d in one] == [d.keys() for d in two]
    for a, b in zip(one, two, strict=True):
        assert all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a), (a, b)
    for d, check in zip(one, reports[0]["checks"], strict=True):
        ref = check["diagnostics_ref"]
        for key, v in ref.items():
            if key.startswith("noise/"):
                assert abs(d[key] - v) <= RTOL * ref["scale"], (key, d[key], v)
            elif key != "scale":
                assert d[key] == pytest.approx(v, rel=RTOL), key


@pytest.mark.slow
def test_ddp_rows_sum_to_the_gradient_ddp_reduced_and_split_groups_are_measured(tmp_path):
    reports = launch(tmp_path, "check")
    assert reports[0]["distributed_type"] == "DistributedType.MULTI_CPU"
    _assert_exact(reports)
    lines = [json.loads(x) for x in (tmp_path / "geometry.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1]  # written once (main process), per step
    for rec in lines:
        assert sorted(g["group"] % 4 for g in rec["group_records"]) == [0, 1, 2]
        split = [g for g in rec["group_records"] if g["rows_present"] == 4
                 and {r // 6 for r in g["rows"]} == {0, 1}]
        assert len(split) == 1  # the group with rows on both processes, measured whole


@pytest.mark.slow
def test_fsdp2_rows_sum_to_the_sharded_gradient(tmp_path):
    reports = launch(tmp_path, "fsdp")
    assert all(rep["fsdp2"] for rep in reports)  # parameters are DTensor shards
    _assert_exact(reports)


@pytest.mark.slow
def test_failure_on_one_process_skips_the_step_on_both_and_training_finishes(tmp_path):
    reports = launch(tmp_path, "fail", timeout=300)
    for rep in reports:
        assert rep["global_step"] == 2
        r0, r1 = rep["records"]
        assert r0["skipped"] and "injected failure on process 1" in r0["skipped_reason"]
        assert "skipped" not in r1 and r1["groups_measured"] == 3
        assert "injected failure" in rep["logs"][0]["geometry/skipped_reason"]
        assert "geometry/skipped_reason" not in rep["logs"][1]


@pytest.mark.slow
def test_ddp_auto_mode_in_run_groups_and_the_split_group_by_the_second_pass(tmp_path):
    """geometry_mode=auto: groups 0 and 2 (whole on one process) are captured from TRL's own
    DDP backward, the split group 1 by the second pass; all exact against the gathered rows."""
    reports = launch(tmp_path, "check", "grpo", "auto")
    _assert_exact(reports)
    for rep in reports:
        for rec in rep["records"]:
            assert rec["geometry_mode"] == "auto"
            assert (rec["in_run_groups"], rec["second_pass_groups"]) == (2, 1)
            assert not rec["in_run_errors"]


@pytest.mark.slow
def test_fsdp2_auto_mode_in_run_groups_exact_against_the_sharded_gradient(tmp_path):
    """geometry_mode=auto under FSDP2: the whole groups are captured from TRL's own sharded
    backward (each Linear's weight gradient from the per-row gradients, handed to FSDP2's
    reduce-scatter) and are exact against the gathered rows; the group split over the processes
    would need a second-pass forward on one process only (a sharded forward is collective), so
    every process drops the second pass and records that group as skipped with the reason,
    keeping the in-run groups (TRL's gradient itself is checked in full)."""
    reports = launch(tmp_path, "fsdp", "grpo", "auto")
    assert all(rep["fsdp2"] for rep in reports)
    for rep in reports:
        assert rep["world_size"] == 2 and rep["global_step"] == 2
        assert [c["step"] for c in rep["checks"]] == [0, 1]
        for c in rep["checks"]:  # TRL's sharded gradient, and the in-run Grams of its rows
            assert c["rel_err"] <= RTOL, c
            assert c["K_err"] <= RTOL and c["Kg_err"] <= RTOL, c
            assert len(c["groups"]) == 1  # each process's whole group (groups 0 and 2 of 3)
        for rec in rep["records"]:
            assert rec["geometry_mode"] == "auto" and rec["weight_grads"] == "rows"
            assert not rec.get("skipped") and not rec["in_run_errors"] and rec["exact"]
            assert rec["in_run_groups"] == 2
        # step 0: the split group's second pass would run on one process only: dropped on both,
        # the group skipped with the reason, the in-run groups kept; step 1 (the processes'
        # passes agree): the split group by the collective second pass
        r0, r1 = rep["records"]
        assert r0["second_pass_groups"] == 0 and r0["groups_measured"] == 2
        (split,) = r0["skipped_groups"]
        assert split["group"] == 1 and "no process ran the second pass" in split["reason"]
        assert r1["second_pass_groups"] == 1 and not r1["skipped_groups"]
