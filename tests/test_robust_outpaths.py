"""Issue 13: every command's --out problem is one line naming the path, exit status 2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from grpo_io.paths import OutPathError, prepare_out_dir, write_out_file

# commands that write into an output folder (argv before "--out")
FOLDER_COMMANDS: list[list[str]] = [
    ["compare"],
    ["real", "rank"],
    ["real", "train"],
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
def test_out_folder_without_permission_is_one_line_exit_2(capsys: Any, cmd: list[str]) -> None:
    path = _unwritable_dir()
    code = _main([*cmd, "--out", path])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and path in err
    assert "cannot create the folder" in err


def test_prepare_out_dir_creates_missing_folders_and_rejects_files(tmp_path: Path) -> None:
    p = prepare_out_dir(tmp_path / "x" / "y")
    assert p.is_dir() and list(p.iterdir()) == []  # the write probe is removed
    with pytest.raises(OutPathError, match="--cache-dir .*: exists and is not a folder"):
        prepare_out_dir("/dev/null", option="--cache-dir")


def test_write_out_file_cases(tmp_path: Path) -> None:
    assert write_out_file(tmp_path / "d" / "t.md", "hi").read_text() == "hi"
    write_out_file("/dev/null", "ok")  # a device file: written in place
    with pytest.raises(OutPathError, match=r"is a folder, not a file"):
        write_out_file(tmp_path, "x")
    with pytest.raises(OutPathError, match=r"/dev/full: cannot write \(no space left"):
        write_out_file("/dev/full", "x" * 10)
    (tmp_path / "f").write_text("")
    with pytest.raises(OutPathError, match=r"is a file, not a folder"):
        write_out_file(tmp_path / "f" / "t.md", "x")
