"""grpo_io: the one JSON conversion, its non-finite policy, JSONL streaming, environment() and the
git commit it records, output paths, the user cache folder; and no library module writes an output
file but through grpo_io's atomic writers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_io import (
    NONFINITE_POLICY,
    OutPathError,
    append_jsonl,
    dumps,
    environment,
    from_jsonable,
    iter_jsonl,
    prepare_out_dir,
    read_json,
    read_jsonl,
    rewrite_jsonl,
    to_jsonable,
    user_cache_dir,
    write_json,
    write_out_file,
)


def test_to_jsonable_tiny_case_hand_checked() -> None:
    x = {
        "i": np.int64(3),
        "f": np.float32(0.5),
        "b": np.bool_(True),
        "arr": np.array([[1.0, np.nan], [np.inf, -np.inf]]),
        "t": torch.tensor([1.5, float("inf")]),
        "frac": Fraction(1, 4),
        (1, 2): "tuple key",
    }
    assert to_jsonable(x) == {
        "i": 3,
        "f": 0.5,
        "b": True,
        "arr": [[1.0, None], ["inf", "-inf"]],
        "t": [1.5, "inf"],
        "frac": 0.25,
        "(1, 2)": "tuple key",
    }
    assert "NaN -> null" in NONFINITE_POLICY


def test_dumps_is_strict_json_and_infinities_round_trip(tmp_path: Path) -> None:
    obj = {"z": math.inf, "w": [-math.inf, 1.0], "u": math.nan, "s": "text"}
    text = dumps(obj)
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)  # strict JSON
    path = tmp_path / "x.json"
    write_json(path, obj)
    back = read_json(path)
    assert back == {"z": math.inf, "w": [-math.inf, 1.0], "u": None, "s": "text"}
    assert from_jsonable(to_jsonable(obj))["z"] == math.inf
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write leaves no temporary file


def test_jsonl_drops_a_truncated_last_line_and_names_a_bad_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    assert read_jsonl(path) == []
    for i in range(3):
        append_jsonl(path, {"i": i, "z": math.inf if i == 2 else float(i)})
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"i": 3, "z": 0.')  # an interrupted append
    assert [r["i"] for r in iter_jsonl(path)] == [0, 1, 2]
    assert read_jsonl(path)[2]["z"] == math.inf
    rewrite_jsonl(path, read_jsonl(path))
    assert path.read_text(encoding="utf-8").splitlines()[-1] == '{"i": 2, "z": "inf"}'
    path.write_text('{"i": 0}\nnot json\n{"i": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_jsonl(path)


def test_environment_records_requested_libraries_and_device() -> None:
    env = environment(libraries=("numpy", "no-such-distribution-xyz"), device="cpu")
    assert env["numpy"] == np.__version__
    assert env["no-such-distribution-xyz"] is None
    assert env["device"] == "cpu" and env["python"].count(".") == 2
    assert "torch_threads" in env  # torch is imported by this test module


def test_git_commit_is_read_from_the_checkout_files(tmp_path: Path) -> None:
    from grpo_io.env import git_commit

    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "repo"
    (repo / ".git" / "refs" / "heads").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".git" / "refs" / "heads" / "main").write_text(sha + "\n")
    assert git_commit(repo) == sha
    packed = tmp_path / "packed"
    (packed / ".git").mkdir(parents=True)
    (packed / ".git" / "HEAD").write_text("ref: refs/heads/dev\n")
    (packed / ".git" / "packed-refs").write_text(f"# pack-refs\n{sha} refs/heads/dev\n")
    assert git_commit(packed) == sha
    wt = tmp_path / "worktree"  # a worktree: .git is a file; refs live in the common dir
    gitdir = repo / ".git" / "worktrees" / "wt"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    (gitdir / "commondir").write_text("../..\n")
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {gitdir}\n")
    assert git_commit(wt) == sha
    assert git_commit(tmp_path) is None  # not a checkout: None, no error
    (repo / ".git" / "HEAD").write_text("garbage")
    assert git_commit.__wrapped__(repo) is None


def test_environment_records_grpo_audits_version_and_commit_without_torch() -> None:
    code = ("import sys, grpo_io; e = grpo_io.environment(); "
            "assert e['grpo_audit'] and 'grpo_audit_commit' in e, e; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- output paths (grpo_io.paths) ----------------------------------------------------------------
def test_prepare_out_dir_creates_missing_folders_and_rejects_files(tmp_path: Path) -> None:
    p = prepare_out_dir(tmp_path / "x" / "y")
    assert p.is_dir() and list(p.iterdir()) == []  # the write probe is removed
    with pytest.raises(OutPathError, match="--cache-dir .*: exists and is not a folder"):
        prepare_out_dir("/dev/null", option="--cache-dir")


def test_user_cache_dir_is_grpo_audit_cache_else_the_xdg_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from framework_checks.fetch import wheel_cache
    from real_model.checkpoint import default_cache_dir

    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "c"))
    assert user_cache_dir("wheels") == tmp_path / "c" / "wheels" == wheel_cache()
    assert default_cache_dir(tmp_path / "out").parent == tmp_path / "c" / "train"
    monkeypatch.setenv("GRPO_AUDIT_CACHE", "")  # empty: unset
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "grpo-audit"
    assert wheel_cache() == tmp_path / "xdg" / "grpo-audit" / "wheels"
    monkeypatch.delenv("GRPO_AUDIT_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = tmp_path / "home"
    assert user_cache_dir("train", "x") == home / ".cache" / "grpo-audit" / "train" / "x"
    assert not home.exists()  # nothing is created


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


# --- every output file is written atomically, through grpo_io -----------------------------------
ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("grpo_theory", "sims", "paper_checks", "framework_checks", "grpo_audit", "real_model")
#: Calls that write a file in place: ``fig.savefig(p)``, ``p.write_text``, ``p.write_bytes``, and
#: ``open(p, "w" | "wb" | "x" ...)`` (an append, ``"a"``, streams records and may stay).
_PLAIN_WRITES = ("savefig", "write_text", "write_bytes")
#: ``"module:call"`` allowed to write in place, with the reason (none today: grpo_io's
#: ``save_figure``, ``atomic_write_text``, ``write_json`` and ``atomic_path`` cover every case).
PLAIN_WRITE_ALLOWED: dict[str, str] = {}


def _plain_writes(path: Path) -> list[str]:
    """The in-place writing calls in the module at ``path`` (by name, in source order)."""
    import ast

    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        at = 0 if isinstance(node.func, ast.Attribute) else 1  # Path.open(mode) / open(p, mode)
        mode = next((a.value for a in node.args[at:at + 1] if isinstance(a, ast.Constant)), None)
        mode = next((k.value.value for k in node.keywords
                     if k.arg == "mode" and isinstance(k.value, ast.Constant)), mode)
        if name in _PLAIN_WRITES or (name == "open" and isinstance(mode, str)
                                     and bool(set(mode) & set("wx"))):
            hits.append(name)
    return hits


def test_the_write_finder_sees_every_in_place_writer(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('fig.savefig(p)\np.write_text("x")\nopen(p, "w")\np.open(mode="wb")\n'
                   'p.write_bytes(b"")\nopen(p)\np.open("a")\nsave_figure(fig, p)\n'
                   'atomic_write_text(p, "x")\n', encoding="utf-8")
    assert sorted(_plain_writes(src)) == ["open", "open", "savefig", "write_bytes", "write_text"]


def test_no_library_module_writes_an_output_file_in_place() -> None:
    """A Ctrl-C or a full disk must not leave half a file: every figure goes through
    ``grpo_io.save_figure`` and every text through ``atomic_write_text`` / ``write_json``."""
    hits = {f"{f.relative_to(ROOT).with_suffix('')}:{name}"
            for pkg in LIBRARY for f in sorted((ROOT / pkg).rglob("*.py"))
            for name in _plain_writes(f)}
    assert sorted(hits - set(PLAIN_WRITE_ALLOWED)) == []
    assert set(PLAIN_WRITE_ALLOWED) <= hits, "an allowed write is gone: drop it from the list"
