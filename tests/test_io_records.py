"""grpo_io.records and the checked readers: every record the library reads back is checked as it
is read (one line naming the file, the line and the fault), and writes are whole or absent."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_io import atomic_path, atomic_write_text, read_json, read_jsonl, save_figure
from grpo_io.records import Each, Int, Num, RecordError, check_record

SCHEMA = {"i": Int(ge=0), "x": (float, None), "tags?": [str], "by": Each({"ok": bool}),
          "z?": Num(ge=0, le=1)}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
    | st.text(max_size=3),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                               max_size=3),
    max_leaves=8,
)
RECORDS = st.one_of(
    JSON,
    st.fixed_dictionaries({"i": JSON, "x": JSON, "by": JSON}, optional={"tags": JSON, "z": JSON}),
    st.fixed_dictionaries({"i": st.integers(-2, 5), "x": st.none() | st.floats(),
                           "by": st.dictionaries(st.text(max_size=2),
                                                 st.fixed_dictionaries({"ok": JSON}),
                                                 max_size=2)}),
)


@settings(max_examples=150, deadline=None)
@given(rec=RECORDS)
def test_garbage_records_give_a_record_error_or_pass_the_schema(rec: Any) -> None:
    try:
        check_record(rec, SCHEMA, where="f.jsonl: line 3")
    except RecordError as exc:
        assert str(exc).startswith("f.jsonl: line 3: ") and "\n" not in str(exc)
        return
    assert isinstance(rec["i"], int) and not isinstance(rec["i"], bool) and rec["i"] >= 0
    assert rec["x"] is None or isinstance(rec["x"], float | int)
    assert all(isinstance(v, dict) and type(v["ok"]) is bool for v in rec["by"].values())
    if "z" in rec:
        assert 0 <= rec["z"] <= 1


@pytest.mark.parametrize(("rec", "message"), [
    ({}, "key 'i' is missing"),
    ({"i": True, "x": 1.0, "by": {}}, "i must be an integer, got True"),
    ({"i": 1, "x": "0.5", "by": {}}, "x must be a number or null, got '0.5'"),
    ({"i": -1, "x": 1.0, "by": {}}, "i must be >= 0, got -1"),
    ({"i": 1, "x": 1.0, "by": {"4": {"ok": 1}}}, r"by\['4'\].ok must be true or false, got 1"),
    ({"i": 1, "x": 1.0, "by": [], "z": 2}, "by must be an object, got"),
])
def test_a_record_error_names_the_key_path(rec: Any, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        check_record(rec, SCHEMA, where="r")


def test_jsonl_reader_names_file_line_and_fault(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"i": 0}\n{"i": 1, "s": "\xff"}\n{"i": 2}\n')
    with pytest.raises(ValueError, match=r"r.jsonl: line 2 is not UTF-8 text \(byte 0xff"):
        read_jsonl(p)
    p.write_bytes(b'{"i": 0}\n{"i": 1, "i": 2}\n')
    with pytest.raises(ValueError, match="line 2: key 'i' appears twice in one object"):
        read_jsonl(p)
    p.write_text('{"i": 0}\n{"i": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2 repeats i 0 of line 1"):
        read_jsonl(p, unique="i")
    p.write_text('{"i": 0}\n{"i": "1"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: i must be an integer, got '1'"):
        read_jsonl(p, schema={"i": int})
    p.write_text('{"i": 0}\n{"i": 1, "x": 0.\n', encoding="utf-8")  # whole line: not a tail
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_jsonl(p)
    p.write_bytes(b'{"i": 0}\n{"i": 1, "s": "\xc3')  # cut inside a character: an interrupted append
    assert read_jsonl(p) == [{"i": 0}]
    p.unlink()
    p.mkdir()
    with pytest.raises(ValueError, match="r.jsonl: is a folder, not a file"):
        read_jsonl(p)


def test_json_reader_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "results.json"
    p.mkdir()
    with pytest.raises(ValueError, match="results.json: is a folder, not a file"):
        read_json(p)
    p.rmdir()
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match="results.json: line 1 is not UTF-8 text"):
        read_json(p)
    p.write_text('{"a": 1,\n "a": 2}', encoding="utf-8")
    with pytest.raises(ValueError, match="results.json: key 'a' appears twice"):
        read_json(p)
    p.write_text('{"a": "inf"}', encoding="utf-8")
    assert read_json(p, schema={"a": float}) == {"a": math.inf}


def test_atomic_writes_leave_the_old_file_and_no_tmp_on_error(tmp_path: Path) -> None:
    target = tmp_path / "table.md"
    atomic_write_text(target, "old")

    class Exploding:
        def savefig(self, path: Any, **kw: Any) -> None:
            Path(path).write_text("half", encoding="utf-8")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_figure(Exploding(), target)
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half", encoding="utf-8")
        raise RuntimeError("disk gone")
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]
    (tmp_path / "claims.json").mkdir()
    with pytest.raises(IsADirectoryError, match="is a folder, not a file"):
        atomic_write_text(tmp_path / "claims.json", json.dumps([]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.json", "table.md"]
