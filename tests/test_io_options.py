"""grpo_io.options: a config dataclass as command-line options, with one set of checks."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_io.options import (
    OptionError,
    OptionTypeError,
    add_options,
    check_path,
    check_paths,
    defaults,
    from_args,
    from_mapping,
    option,
    option_fields,
    option_from,
    validate,
)


@dataclass(frozen=True)
class Demo:
    steps: int = option(4, help="optimizer steps", ge=1)
    lr: float = option(1e-5, help="learning rate", gt=0)
    top_p: float = option(1.0, help="nucleus mass", gt=0, le=1)
    budget: float | None = option(None, help="memory budget in MiB (None: one pass)", ge=0)
    method: str = option("exact", help="Gram engine", choices=("exact", "naive"))
    R_values: tuple[int, ...] = option((2, 4), help="group sizes", ge=2, flag="--R")
    stops: tuple[str, ...] = option(("\n\n",), help="stop strings", min_items=0)
    keep: bool = option(False, help="keep groups")
    quiet: bool = option(True, help="no progress bars")
    data: str | None = option(None, help="data file", path="file")
    out: str = option("out", help="output folder", path="out_folder")
    internal: int = option(3, help="not on the command line", cli=False, ge=0)

    def __post_init__(self) -> None:
        validate(self)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="demo")
    add_options(p, Demo)
    return p


def test_parser_flags_defaults_and_help_come_from_the_dataclass() -> None:
    p = _parser()
    help_text = " ".join(p.format_help().split())
    for flag in ("--steps", "--lr", "--top-p", "--budget", "--method", "--R", "--stops",
                 "--keep", "--quiet", "--no-quiet", "--data", "--out"):
        assert flag in help_text
    assert "--internal" not in help_text
    assert "optimizer steps (default 4)" in help_text
    assert from_args(Demo, p.parse_args([])) == Demo()
    got = from_args(Demo, p.parse_args(["--R", "2", "8", "--keep", "--no-quiet", "--stops"]))
    assert got == Demo(R_values=(2, 8), keep=True, quiet=False, stops=())


def test_defaults_and_option_from_keep_one_declaration() -> None:
    @dataclass(frozen=True)
    class Shorter(Demo):
        steps: int = option_from(Demo, "steps", default=2)

    assert defaults(Shorter)["steps"] == 2
    assert [f.spec for f in option_fields(Shorter)] == [f.spec for f in option_fields(Demo)]
    with pytest.raises(OptionError, match=r"steps \(--steps\): must be an integer >= 1, got 0"):
        Shorter(steps=0)


@pytest.mark.parametrize(
    ("kw", "err", "message"),
    [
        ({"steps": True}, OptionTypeError, r"steps \(--steps\): must be an integer, got True"),
        ({"steps": 1.5}, OptionTypeError, r"steps \(--steps\): must be an integer, got 1.5"),
        ({"steps": "2"}, OptionTypeError, r"steps \(--steps\): must be an integer, got '2'"),
        ({"lr": "1e-3"}, OptionTypeError, r"lr \(--lr\): must be a number, got '1e-3'"),
        ({"lr": math.inf}, OptionError, r"lr \(--lr\): must be a finite number > 0, got inf"),
        ({"lr": math.nan}, OptionError, r"lr \(--lr\): must be a finite number > 0, got nan"),
        ({"lr": 10**400}, OptionError, r"lr \(--lr\): must be a finite number"),
        ({"top_p": 1.5}, OptionError, r"top_p \(--top-p\): must be a finite number > 0 and "
                                      r"<= 1, got 1.5"),
        ({"budget": -1.0}, OptionError, r"budget \(--budget\): must be a finite number >= 0"),
        ({"method": "fast"}, OptionError, r"method \(--method\): must be one of exact, naive"),
        ({"R_values": (2, 2)}, OptionError, r"R_values \(--R\): 2 is given twice"),
        ({"R_values": ()}, OptionError, r"R_values \(--R\): needs at least 1 value"),
        ({"R_values": "24"}, OptionTypeError, r"R_values \(--R\): must be a tuple of integers"),
        ({"R_values": (2, 1)}, OptionError, r"R_values \(--R\): must be an integer >= 2, got 1"),
        ({"keep": 1}, OptionTypeError, r"keep \(--keep\): must be True or False, got 1"),
        ({"stops": ("a\udcff",)}, OptionError, r"stops \(--stops\): .* is not valid UTF-8"),
        ({"internal": -1}, OptionError, r"^internal: must be an integer >= 0"),
        ({"method": None}, OptionTypeError, r"method \(--method\): must be a string, got None"),
    ],
)
def test_each_bad_value_is_one_line_naming_the_field_and_option(
    kw: dict[str, Any], err: type[Exception], message: str
) -> None:
    with pytest.raises(err, match=message) as info:
        Demo(**kw)
    assert "\n" not in str(info.value)


def test_numpy_and_fraction_numbers_are_numbers() -> None:
    assert Demo(steps=np.int64(3), lr=np.float32(0.5), top_p=Fraction(1, 2)).steps == 3


#: Values of every type a careless caller may pass.
GARBAGE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.binary(max_size=3), st.lists(st.integers(-3, 10), max_size=3),
    st.tuples(st.integers(-3, 10), st.integers(-3, 10)), st.tuples(st.text(max_size=2)),
    st.fractions(), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from([f.name for f in option_fields(Demo)]), value=GARBAGE)
def test_garbage_in_any_field_is_a_clear_error_or_a_valid_value(name: str, value: Any) -> None:
    try:
        cfg = Demo(**{name: value})
    except (OptionError, OptionTypeError) as exc:
        assert str(exc).startswith(name) and "\n" not in str(exc)
        return
    got = getattr(cfg, name)
    f = next(f for f in option_fields(Demo) if f.name == name)
    items = got if f.kind.seq else [got]
    if got is None:
        assert f.kind.optional
        return
    for v in items:
        assert type(v) is bool if f.kind.base is bool else not isinstance(v, bool)
        if f.kind.base in (int, float):
            assert math.isfinite(float(v))
            assert f.spec.ge is None or v >= f.spec.ge
            assert f.spec.gt is None or v > f.spec.gt
            assert f.spec.le is None or v <= f.spec.le
        if f.kind.base is str:
            assert isinstance(v, str)


@settings(max_examples=200, deadline=None)
@given(flag=st.sampled_from(["--steps", "--lr", "--top-p", "--budget", "--R"]),
       text=st.text(alphabet="0123456789.-+eEinfa_x ", min_size=1, max_size=8))
def test_garbage_on_the_command_line_is_a_parse_error_or_a_clear_error(
    flag: str, text: str
) -> None:
    p = _parser()
    p.error = lambda message: (_ for _ in ()).throw(ValueError(message))  # type: ignore[method-assign]
    try:
        args = p.parse_args([flag, text])
    except ValueError as exc:  # argparse's own message: "argument --lr: invalid float value"
        assert flag in str(exc)
        return
    try:
        from_args(Demo, args)
    except (OptionError, OptionTypeError) as exc:
        assert f"({flag})" in str(exc)


def test_from_mapping_refuses_unknown_keys_by_name() -> None:
    assert from_mapping(Demo, {"steps": 2}).steps == 2
    with pytest.raises(OptionError, match=r"geometry block: unknown option stepz \(known: "):
        from_mapping(Demo, {"stepz": 2}, where="geometry block")


def test_check_paths_names_the_option_and_the_reason(tmp_path: Path) -> None:
    f = tmp_path / "data.jsonl"
    f.write_text("{}\n", encoding="utf-8")
    check_paths(Demo(data=str(f), out=str(tmp_path / "new" / "deeper")))
    assert not (tmp_path / "new").exists()  # nothing is created
    cases = [
        (Demo(data=str(tmp_path / "missing")), r"--data .*missing: no such file"),
        (Demo(data=str(tmp_path)), r"--data .*: is a folder, not a file"),
        (Demo(out=str(f)), r"--out .*data.jsonl: exists and is not a folder"),
        (Demo(out=str(f / "sub")), r"--out .*sub: .*data.jsonl is a file, not a folder"),
    ]
    for cfg, message in cases:
        with pytest.raises(OptionError, match=message):
            check_paths(cfg)


def test_a_path_with_bytes_that_are_not_utf8_is_refused_and_shown(tmp_path: Path) -> None:
    bad = os.fsdecode(bytes(tmp_path) + b"/r\xffport")
    with pytest.raises(OptionError, match=r"--out .*r\\xffport: the name is not valid UTF-8"):
        check_path(bad, "out_folder", option="--out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes everything")
def test_unreadable_and_unwritable_paths(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "f").write_text("x", encoding="utf-8")
    locked.chmod(0o500)
    try:
        with pytest.raises(OptionError, match="cannot write into .*locked"):
            check_path(locked / "out", "out_folder", option="--out")
    finally:
        locked.chmod(0o700)
    (locked / "f").chmod(0o000)
    with pytest.raises(OptionError, match="--data .*f: not readable"):
        check_path(locked / "f", "file", option="--data")
