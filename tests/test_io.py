"""grpo_io: the one JSON conversion, its non-finite policy, JSONL streaming and environment()."""

from __future__ import annotations

import json
import math
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


# --- output paths (grpo_io.paths) ----------------------------------------------------------------
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
