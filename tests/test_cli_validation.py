"""Every command checks its options before it loads a model or writes a file: a bad value is one
line on stderr naming the option, exit status 2, nothing on disk; Ctrl-C is one line and status
130; a repeated value is refused. All in-process (``grpo_audit.cli.main``), with the model loader
patched to fail the test if it is called."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_audit.cli import main

#: (command, option, bad value): each must be refused before any model load or write.
BAD_OPTIONS: list[tuple[list[str], str, str]] = [
    *[(cmd, opt, val) for cmd in (["real", "rank"], ["real", "train"], ["real", "trl-train"])
      for opt, val in (
          ("--max-new-tokens", "0"), ("--max-new-tokens", "1.5"), ("--max-new-tokens", "nan"),
          ("--temperature", "0"), ("--temperature", "nan"), ("--temperature", "inf"),
          ("--temperature", "-1"), ("--top-p", "0"), ("--top-p", "1.5"), ("--top-p", "nan"),
          ("--seed", "-1"), ("--seed", "1e3"), ("--shots", "-1"), ("--difficulty", "4"),
          ("--difficulty", "1 1"), ("--operations", "mul"), ("--operations", "add add"),
          ("--dtype", "float8"), ("--source", "web"), ("--gram-method", "fast"),
          ("--device", "tpu"), ("--model", "/nonexistent/model"),
          ("--data", "/nonexistent/data.jsonl"),
      )],
    *[(cmd, opt, val) for cmd in (["real", "rank"], ["real", "train"])
      for opt, val in (
          ("--R", "1"), ("--R", "2 2"), ("--R", "2.5"), ("--rollout-batch", "0"),
          ("--estimators", "grpo grpo"), ("--estimators", "bogus"),
          ("--aggregation", "sum"),
      )],
    (["real", "rank"], "--prompts", "0"),
    (["real", "rank"], "--prompts", "-3"),
    *[(["real", "train"], opt, val) for opt, val in (
        ("--steps", "0"), ("--prompts-per-step", "0"), ("--train-R", "1"), ("--train-R", "2"),
        ("--lr", "inf"), ("--lr", "nan"), ("--lr", "0"), ("--lr", "-1e-5"),
        ("--weight-decay", "nan"), ("--weight-decay", "-1"), ("--checkpoint-every", "0"),
    )],
    *[(["real", "trl-train"], opt, val) for opt, val in (
        ("--steps", "0"), ("--prompts-per-step", "0"), ("--num-generations", "1"),
        ("--lr", "inf"), ("--lr", "nan"), ("--weight-decay", "nan"), ("--weight-decay", "inf"),
        ("--beta", "nan"), ("--beta", "-0.1"), ("--beta", "inf"),
        ("--geometry-memory-budget-mb", "nan"), ("--geometry-memory-budget-mb", "-1"),
        ("--num-iterations", "0"), ("--lora-r", "-1"), ("--geometry-every", "-1"),
        ("--loss-type", "ppo"), ("--scale-rewards", "yes"),
    )],
    *[(["compare"], opt, val) for opt, val in (
        ("--p", "0"), ("--p", "1"), ("--p", "nan"), ("--R", "1"), ("--R", "4 4"),
        ("--real", "/nonexistent/results.json"),
    )],
    (["audit", "--quick"], "--seed", "-1"),
    (["sims", "moments", "--quick"], "--seed", "-1"),
    (["sims", "moments", "--quick"], "--seed", "x"),
]


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model, training or auditing fails the test: the checks come first."""
    import real_model.loading

    def forbidden(*a: Any, **k: Any) -> None:
        pytest.fail("a model was loaded before the options were checked")

    monkeypatch.setattr(real_model.loading, "load_model", forbidden)


def _run(argv: list[str], capsys: Any) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage error (one line: grpo_audit.cli.Parser)
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip()


@pytest.mark.usefixtures("no_model_load")
@pytest.mark.parametrize(("cmd", "opt", "value"), BAD_OPTIONS,
                         ids=lambda x: "-".join(x) if isinstance(x, list) else str(x))
def test_each_bad_option_is_one_line_before_any_load_or_write(
    tmp_path: Path, capsys: Any, cmd: list[str], opt: str, value: str
) -> None:
    out = tmp_path / "out"
    code, err = _run([*cmd, "--out", str(out), opt, *value.split()], capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and opt in err, err
    assert "Traceback" not in err
    assert not out.exists(), sorted(p.name for p in out.iterdir())


@pytest.mark.usefixtures("no_model_load")
def test_tables_bad_values_are_one_line(capsys: Any, tmp_path: Path) -> None:
    for argv, opt in (
        (["hoeffding", "--R", "2", "2", "--eps", "0.3"], "--R"),
        (["hoeffding", "--R", "2", "--eps", "nan"], "--eps"),
        (["hoeffding", "--R", "2", "--eps", "0.3", "--digits", "0"], "--digits"),
        (["hoeffding", "--R", "2", "--eps", "0.3", "--width", "inf"], "--width"),
        (["chebyshev", "--R", "2", "--eps", "0.3", "--p", "1.5"], "--p"),
        (["exact-advantage-tail", "--R", "4", "--eps", "0.3", "--p", "0.5",
          "--option", "ddof=0", "--option", "ddof=1"], "--option"),
        (["table1", "--seed", "-2"], "--seed"),
        (["hoeffding", "--R", "2", "--eps", "0.3", "--out", str(tmp_path / "t" / "x.md"),
          "--digits", "-1"], "--digits"),
    ):
        code, err = _run(["tables", *argv], capsys)
        assert code == 2 and len(err.splitlines()) == 1 and opt in err, err
    assert not (tmp_path / "t").exists()


def test_missing_model_leaves_nothing_and_the_corrected_run_proceeds(
    tmp_path: Path, capsys: Any
) -> None:
    from real_pipeline_helpers import SMALL_RUN, tiny_loaded

    from real_model.rank import RankConfig, run_rank

    out = tmp_path / "D"
    code, err = _run(["real", "rank", "--model", "/nonexistent", "--out", str(out)], capsys)
    assert code == 2 and err.startswith("grpo-audit: error: --model /nonexistent:"), err
    assert not out.exists()
    res = run_rank(out, RankConfig(prompts=1, **SMALL_RUN), loaded=tiny_loaded(),
                   progress=False)
    assert res["num_groups"] == 1 and (out / "config.json").is_file()


@pytest.mark.usefixtures("no_model_load")
@pytest.mark.parametrize("cmd", [["real", "rank"], ["real", "train"], ["real", "trl-train"],
                                 ["compare"], ["audit", "--quick"], ["sims", "moments"],
                                 ["frameworks"]], ids=lambda c: "-".join(c))
def test_an_out_name_that_is_not_utf8_is_one_line_and_nothing_is_created(
    tmp_path: Path, capsys: Any, cmd: list[str]
) -> None:
    bad = os.fsdecode(bytes(tmp_path) + b"/r\xffport")
    code, err = _run([*cmd, "--out", bad], capsys)
    assert code == 2, err
    assert err.count("\n") == 0 and "--out" in err and "r\\xffport" in err, err
    assert "not valid UTF-8" in err
    assert list(tmp_path.iterdir()) == []


#: command -> (module attribute whose call is interrupted, what the message must say)
INTERRUPTS = {
    "real rank": ("real_model.rank.run_rank", "rerun the same command to resume"),
    "real train": ("real_model.train.run_train", "rerun the same command to resume"),
    "real trl-train": ("real_model.integrations.trl.train.run_trl_train", "--overwrite"),
    "compare": ("real_model.compare.run_compare", "rerun the same command"),
    "sims moments": ("sims.experiments.run_experiment", "rerun the same command"),
    "audit": ("paper_checks.report.run_audit", "rerun the same command"),
}


@pytest.mark.parametrize("command", sorted(INTERRUPTS))
def test_ctrl_c_is_one_line_and_status_130(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    import importlib

    target, message = INTERRUPTS[command]
    module, name = target.rsplit(".", 1)

    def interrupted(*a: Any, **k: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), name, interrupted)
    monkeypatch.setattr("real_model.config.RunConfig.validate", lambda self, **k: None)
    code, err = _run([*command.split(), "--out", str(tmp_path / "o")], capsys)
    assert code == 130
    assert len(err.splitlines()) == 1 and err.startswith("grpo-audit: interrupted;"), err
    assert message in err


def test_a_folder_where_claims_json_belongs_is_one_line_and_leaves_no_tmp(
    tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "a5"
    (out / "claims.json").mkdir(parents=True)
    code, err = _run(["audit", "--quick", "--only", "def2_1_value_functions", "--out", str(out)],
                     capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "claims.json: is a folder, not a file" in err
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


#: The numeric options of the real-model commands (the CLI layer's property test).
NUMERIC = {
    ("real", "rank"): ("--max-new-tokens", "--temperature", "--top-p", "--seed", "--shots",
                       "--R", "--prompts", "--rollout-batch", "--difficulty"),
    ("real", "train"): ("--steps", "--prompts-per-step", "--train-R", "--lr", "--weight-decay",
                        "--checkpoint-every"),
    ("real", "trl-train"): ("--steps", "--num-generations", "--lr", "--weight-decay", "--beta",
                            "--num-iterations", "--lora-r", "--geometry-every",
                            "--geometry-memory-budget-mb"),
}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from([(c, o) for c, opts in NUMERIC.items() for o in opts]),
       text=st.one_of(
           st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e309", "1.5", "", " ", "0x10",
                            "1_0", "true", "None", "9" * 40, "-0"]),
           st.text(max_size=6)))
def test_garbage_in_a_numeric_option_is_one_line_never_a_traceback(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch,
    case: tuple[tuple[str, ...], str], text: str,
) -> None:
    """Any text: refused in one line with status 2, or a valid config reaches the run (which the
    test stops there, before any load or write)."""
    import real_model.integrations.trl.train
    import real_model.rank
    import real_model.train

    reached: list[Any] = []

    def stop(out: Any, cfg: Any, **k: Any) -> dict[str, Any]:
        reached.append(cfg)
        raise KeyboardInterrupt

    for mod, name in ((real_model.rank, "run_rank"), (real_model.train, "run_train"),
                      (real_model.integrations.trl.train, "run_trl_train")):
        monkeypatch.setattr(mod, name, stop)
    monkeypatch.setattr("real_model.config.RunConfig.validate", lambda self, **k: None)
    cmd, opt = case
    out = tmp_path / "o"
    code, err = _run([*cmd, "--out", str(out), f"{opt}={text}"], capsys)
    if reached:
        assert code == 130
    else:
        assert code == 2 and len(err.splitlines()) == 1 and opt in err, err
    assert not out.exists()


def test_a_real_sigint_mid_run_is_one_line_and_status_130(tmp_path: Path) -> None:
    """SIGINT to ``grpo-audit sims`` once it has started writing: one line, status 130."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "s"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_audit", "sims", "spectra", "--out",
                             str(out)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # pragma: no cover - finished before the signal
        pytest.skip("the run finished before the signal")
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "grpo-audit: interrupted; files already written are whole; rerun the same command"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
