"""One writer per output folder (:mod:`grpo_io.locks`): a second writer of a folder is refused at
once with one line naming the folder and the holder, before it touches anything there; a writer
killed with SIGKILL leaves no lock behind; a clean rerun afterwards resumes without duplicates.

The first writer is a real command in a child process, paused with SIGSTOP as soon as it holds the
lock (its lock file names it), so the second writer meets it mid-run deterministically. The
default tier runs the helper's tests, one order for `sims` and the SIGKILL test; the slow tier
(each case starts a child that imports torch/transformers or runs the audit) `real rank` in both
orders (plain / --overwrite first), `audit` in both orders and the other `sims` order.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from grpo_audit.cli import main
from grpo_io import LOCK_NAME, FolderInUseError, lock_holder, lock_out_dir

ROOT = Path(__file__).resolve().parents[1]

# holds DIR's lock until stdin closes (or forever, for the SIGKILL test)
HOLD = (
    "import sys; from grpo_io import lock_out_dir\n"
    "with lock_out_dir(sys.argv[1], purpose='test holder'):\n"
    "    print('held', flush=True); sys.stdin.read()\n"
)

# a `real rank` run on a tiny random model (no download): python -c RANK OUT [--overwrite]
RANK = (
    "import sys\n"
    "import torch\n"
    "from real_model.loading import CharTokenizer, LoadedModel, ModelSpec, tiny_random_model\n"
    "from real_model.rank import RankConfig, run_rank\n"
    "torch.set_num_threads(1)\n"
    "tok = CharTokenizer()\n"
    "loaded = LoadedModel(tiny_random_model(vocab_size=tok.vocab_size), tok,\n"
    "                     ModelSpec('t', '-'), 'cpu', 'float32')\n"
    "cfg = RankConfig(prompts=3, R_values=(2,), max_new_tokens=4, shots=1, stop_strings=('\\n',))\n"
    "run_rank(sys.argv[1], cfg, loaded=loaded, progress=False,\n"
    "         overwrite='--overwrite' in sys.argv,\n"
    "         reward_fn=lambda text, gold: float(sum(map(ord, text)) % 2))\n"
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _wait_for_holder(folder: Path, proc: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    """Return once ``proc`` has written its pid into ``folder``'s lock file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = lock_holder(folder)
        if rec is not None and rec["pid"] == proc.pid:
            return
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"writer ended (rc {proc.returncode}) before it held {folder}: "
                                 f"{out}")
        time.sleep(0.005)
    raise AssertionError(f"writer did not take the lock of {folder} in {timeout} s")


@contextmanager
def _paused_writer(folder: Path, argv: list[str]) -> Iterator[subprocess.Popen[Any]]:
    """Start ``argv`` writing ``folder``, SIGSTOP it once it holds the lock; SIGCONT on exit."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_holder(folder, proc)
        proc.send_signal(signal.SIGSTOP)
        yield proc
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], folder: Path,
             holder: subprocess.Popen[Any]) -> str:
    """Run the CLI ``argv``: exit 2 with one stderr line naming the folder and the holder, at once
    (the command's modules are imported first: the clock measures the refusal, not imports)."""
    import importlib

    importlib.import_module({"real": "real_model.rank", "sims": "sims.experiments",
                             "audit": "paper_checks.report"}[argv[0]])
    capsys.readouterr()
    t0 = time.perf_counter()
    code = main(argv)
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert str(folder) in err and "is being written by another run" in err
    assert f"pid {holder.pid} on host {socket.gethostname()}" in err
    assert "started " in err
    assert took < 10.0  # at once: no model loaded, no experiment run (a shared, loaded machine)
    return err


# --- the helper itself --------------------------------------------------------------------------
def test_second_writer_gets_one_line_naming_folder_pid_host_start_and_command(
    tmp_path: Path,
) -> None:
    d = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(d), "--flag"], cwd=ROOT, env=_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError) as ei, lock_out_dir(d, purpose="second"):
            pass
        msg = str(ei.value)
        assert "\n" not in msg
        assert msg.startswith(f"--out {d} is being written by another run (pid {p.pid} on host ")
        assert "test holder: python -c" in msg and "--flag" in msg
        rec = lock_holder(d)
        assert rec is not None and rec["pid"] == p.pid
        assert msg.count(rec["started"]) == 1
    finally:
        p.communicate("", timeout=30)
    assert p.returncode == 0
    assert (d / LOCK_NAME).read_text() == ""  # a clean release leaves no holder text
    with lock_out_dir(d, purpose="third") as got:  # and the folder is free again
        assert got == d


def test_lock_is_reentrant_within_one_process_and_released_with_the_outermost(
    tmp_path: Path,
) -> None:
    d = tmp_path / "o"
    with lock_out_dir(d, purpose="outer"):
        with lock_out_dir(d / ".." / "o", purpose="inner"):
            assert lock_holder(d)["purpose"] == "outer"  # type: ignore[index]
        assert lock_holder(d)["pid"] == os.getpid()  # type: ignore[index]
    assert lock_holder(d) is None
    probe = [sys.executable, "-c", HOLD, str(d)]
    p = subprocess.run(probe, cwd=ROOT, env=_env(), input="", capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "held"


def test_sigkilled_writer_leaves_no_lock_and_its_stale_text_is_not_reported_as_holder(
    tmp_path: Path,
) -> None:
    d = tmp_path / "k"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], cwd=ROOT, env=_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    p.send_signal(signal.SIGKILL)
    p.wait()
    stale = lock_holder(d)
    assert stale is not None and stale["pid"] == p.pid  # the killed run's text is still there
    with lock_out_dir(d, purpose="next run"):  # ... but the kernel released its lock
        assert lock_holder(d)["pid"] == os.getpid()  # type: ignore[index]
    # a holder that has not written its text yet, behind a dead pid's text: never named as holder
    (d / LOCK_NAME).write_text(json.dumps({**stale, "purpose": "dead"}) + "\n")
    raw = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
           "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()\n")
    q = subprocess.Popen([sys.executable, "-c", raw, str(d / LOCK_NAME)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert q.stdout is not None and q.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError, match="is no longer running") as ei:
            with lock_out_dir(d, purpose="refused"):
                pass
        assert f"its last holder (pid {p.pid} " in str(ei.value)
    finally:
        q.communicate("", timeout=30)


# --- real rank, sims, audit: both orders, no duplicate, clean resume ---------------------------
def _rank_records(folder: Path) -> list[int]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return [json.loads(x)["prompt_index"] for x in lines if x.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("first_overwrites", [False, True], ids=["plain-first", "overwrite-first"])
def test_real_rank_second_writer_refused_no_duplicate_records_clean_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], first_overwrites: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "rank"
    first = [sys.executable, "-c", RANK, str(d)] + (["--overwrite"] if first_overwrites else [])
    second = ["real", "rank", "--out", str(d), "--R", "2", "--prompts", "3",
              "--max-new-tokens", "4", "--no-progress"] + ([] if first_overwrites
                                                            else ["--overwrite"])
    with _paused_writer(d, first) as holder:
        before = sorted(os.listdir(d))
        jsonl = (d / "results.jsonl").read_bytes() if (d / "results.jsonl").exists() else None
        _refused(capsys, second, d, holder)
        assert sorted(os.listdir(d)) == before  # the refused writer created nothing ...
        now = (d / "results.jsonl").read_bytes() if (d / "results.jsonl").exists() else None
        assert now == jsonl  # ... and deleted nothing, not even with --overwrite
    assert _rank_records(d) == [0, 1, 2]
    done = json.loads((d / "results.json").read_text())
    assert done["num_groups"] == 3
    # a clean resume: the same configuration reads the three records and samples nothing new
    ns: dict[str, Any] = {}
    exec(RANK.split("run_rank(sys.argv")[0], ns)  # the writer's model and configuration
    ns["run_rank"](d, ns["cfg"], loaded=ns["loaded"], progress=False,
                   reward_fn=lambda text, gold: 1 / 0)  # nothing left to sample or reward
    assert _rank_records(d) == [0, 1, 2]
    assert json.loads((d / "results.json").read_text())["num_groups"] == 3
    assert lock_holder(d) is None


SIMS = [sys.executable, "-m", "grpo_audit", "sims"]


@pytest.mark.parametrize("first,second", [
    pytest.param("tails", "moments", marks=pytest.mark.slow), ("moments", "tails")])
def test_sims_second_writer_refused_and_the_folder_holds_the_first_run_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str, second: str,
) -> None:
    d = tmp_path / "sims"
    with _paused_writer(d, [*SIMS, first, "--quick", "--out", str(d)]) as holder:
        _refused(capsys, ["sims", second, "--quick", "--out", str(d)], d, holder)
        assert not (d / "results.json").exists()
    res = json.loads((d / "results.json").read_text())
    assert res["experiment"] == first and res["n_passed"] == res["n_checks"]
    # the folder is free again: a clean rerun of the first experiment writes one results.json
    assert main(["sims", first, "--quick", "--out", str(d)]) == 0
    again = json.loads((d / "results.json").read_text())
    assert again["experiment"] == first and again["checks"] == res["checks"]
    assert sorted(p.name for p in d.iterdir()) == [
        LOCK_NAME, "figure.png", "results.json", "table.md"]


AUDIT = [sys.executable, "-m", "grpo_audit", "audit", "--quick"]


FADE = ["--paper", "fade", "--only", "fade_mass_decomposition"]
SEED = ["--only", "eq6_baseline_zero_expectation"]


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [(FADE, SEED), (SEED, FADE)],
                         ids=["fade-first", "seed-first"])
def test_audit_second_writer_refused_and_the_report_is_the_first_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], first: list[str], second: list[str],
) -> None:
    d = tmp_path / "audit"
    with _paused_writer(d, [*AUDIT, *first, "--out", str(d)]) as holder:
        _refused(capsys, ["audit", "--quick", *second, "--out", str(d)], d, holder)
    ids = [c["id"] for c in json.loads((d / "claims.json").read_text())]
    assert ids == [first[-1]]  # one record, the first writer's
    assert main(["audit", "--quick", *first, "--out", str(d)]) == 0  # clean rerun
    assert [c["id"] for c in json.loads((d / "claims.json").read_text())] == ids


def test_sims_writer_killed_with_sigkill_does_not_block_the_next_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    d = tmp_path / "killed"
    proc = subprocess.Popen([*SIMS, "tails", "--quick", "--out", str(d)], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_holder(d, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert lock_holder(d)["pid"] == proc.pid  # type: ignore[index]  # stale text left behind
    t0 = time.perf_counter()
    assert main(["sims", "tails", "--quick", "--out", str(d)]) == 0
    assert "wrote results.json" in capsys.readouterr().out
    assert json.loads((d / "results.json").read_text())["experiment"] == "tails"
    assert lock_holder(d) is None
    assert time.perf_counter() - t0 < 120
