"""The ``grpo-audit`` command line's errors: every command's --out problem is one line naming the
path, exit status 2; so is a bad option or value of ``grpo-audit tables``; the help texts say
that --out is required and state measured times."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

# commands that write into an output folder (argv before "--out")
FOLDER_COMMANDS: list[list[str]] = [
    ["sims", "moments", "--quick"],
    ["audit", "--quick", "--only", "def2_1_value_functions"],
    ["compare"],
    ["real", "rank"],
    ["real", "train"],
    ["real", "trl-train"],
]
# commands that write one output file (argv before "--out")
FILE_COMMANDS: list[list[str]] = [
    ["tables", "hoeffding", "--R", "2", "--eps", "0.3"],
    ["tables", "appendix-a2"],
]


def _main(argv: list[str]) -> int:
    from grpo_audit.cli import main

    return main(argv)


def _bad_folders(tmp_path: Path) -> dict[str, tuple[str, str]]:
    f = tmp_path / "a-file.txt"
    f.write_text("x")
    return {
        "file_where_folder": (str(f), "exists and is not a folder"),
        "component_is_file": (str(f / "sub"), f"{f} is a file, not a folder"),
        "dev_null": ("/dev/null", "exists and is not a folder"),
    }


@pytest.mark.parametrize("case", ["file_where_folder", "component_is_file", "dev_null"])
@pytest.mark.parametrize("cmd", FOLDER_COMMANDS, ids=lambda c: "-".join(c))
def test_out_folder_problem_is_one_line_exit_2(
    tmp_path: Path, capsys: Any, cmd: list[str], case: str
) -> None:
    path, reason = _bad_folders(tmp_path)[case]
    code = _main([*cmd, "--out", path])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and path in err and reason in err, err


def _unwritable_dir() -> str:
    """A folder root cannot create: under /sys (read-only or not permitted in containers)."""
    p = "/sys/grpo-audit-robust-test/out"
    try:
        os.makedirs(p)
    except OSError:
        return p
    os.removedirs(p)  # pragma: no cover - /sys writable here
    pytest.skip("/sys is writable on this machine; no unwritable folder to test with")


@pytest.mark.parametrize("cmd", FOLDER_COMMANDS, ids=lambda c: "-".join(c))
def test_out_folder_without_permission_is_one_line_exit_2(
    capsys: Any, monkeypatch: Any, cmd: list[str]
) -> None:
    if cmd == ["real", "trl-train"]:
        try:
            import trl  # noqa: F401
        except ImportError:
            # the folder is created (and found unwritable) after the check for the trl extra:
            # an empty stand-in lets this test reach it where the extra is not installed
            monkeypatch.setitem(sys.modules, "trl", types.ModuleType("trl"))
    path = _unwritable_dir()
    code = _main([*cmd, "--out", path])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and path in err
    assert "cannot create the folder" in err


@pytest.mark.parametrize("cmd", FILE_COMMANDS, ids=lambda c: "-".join(c[:2]))
@pytest.mark.parametrize("case", ["folder", "dev_full", "component_is_file"])
def test_out_file_problem_is_one_line_exit_2(
    tmp_path: Path, capsys: Any, cmd: list[str], case: str
) -> None:
    f = tmp_path / "a-file.txt"
    f.write_text("x")
    path, reason = {
        "folder": (str(tmp_path), "is a folder, not a file"),
        "dev_full": ("/dev/full", "no space left on the device"),
        "component_is_file": (str(f / "t.md"), f"{f} is a file, not a folder"),
    }[case]
    code = _main([*cmd, "--out", path])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and path in err and reason in err, err


def test_tables_out_dev_null_is_written_in_place(capsys: Any) -> None:
    assert _main(["tables", "hoeffding", "--R", "2", "--eps", "0.3", "--out", "/dev/null"]) == 0


def test_os_error_mid_run_is_one_line(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sims.experiments as ex

    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device", "/some/out/results.json")

    monkeypatch.setattr(ex, "run_experiment", full)
    code = _main(["sims", "moments", "--out", "/tmp", "--quick"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (
        "grpo-audit: error: /some/out/results.json: no space left on device"
    )


@pytest.mark.parametrize("cmd", [["audit"], ["sims", "moments"]], ids=lambda c: c[0])
def test_help_usage_shows_out_as_required(capsys: Any, cmd: list[str]) -> None:
    with pytest.raises(SystemExit):
        _main([*cmd, "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "--out DIR" in usage and "[--out" not in usage, usage


def test_tables_huge_R_is_one_line(capsys: Any) -> None:
    code = _main(["tables", "hoeffding", "--R", "9" * 400, "--eps", "0.3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "R values must be <= 2^53" in err


def test_tables_unknown_option_is_one_line(capsys: Any) -> None:
    code = _main(["tables", "exact-advantage-tail", "--p", "0.5", "--option", "bogus=1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "bogus" in err


def test_audit_quick_help_states_measured_times_not_a_guess(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        _main(["audit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "under 2 minutes" not in text and "measured" in text


# --- bad option values ---------------------------------------------------------------------------
def test_cli_reports_a_type_error_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_audit", "tables", "exact-advantage-tail", "--p", "0.5",
         "--estimator", "grpo_std", "--R", "4", "--eps", "0.3", "--option", "ddof=[1]"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("grpo-audit: error:") and "ddof" in proc.stderr


def test_console_entry_ignores_sigint_after_an_interrupt_only(monkeypatch) -> None:
    """``entry`` (the console script) ignores a second Ctrl-C once the first gave status 130,
    and touches no signal handler otherwise."""
    import signal

    from grpo_audit import cli

    calls: list[object] = []
    monkeypatch.setattr(signal, "signal", lambda sig, handler: calls.append((sig, handler)))
    monkeypatch.setattr(cli, "main", lambda: 0)
    assert cli.entry() == 0 and calls == []
    monkeypatch.setattr(cli, "main", lambda: 130)
    assert cli.entry() == 130 and calls == [(signal.SIGINT, signal.SIG_IGN)]
