"""A ``grpo-audit real rank`` run as the audit reads it (``grpo-audit audit --real FILE``).

:func:`read_real_rank` reads the run's ``results.json`` (written by
:func:`real_model.outputs.write_rank_results`) and checks, as it reads, every field the audit
uses: a file that is missing, not JSON, of another experiment, or with a missing key or a value of
the wrong type gives one :class:`RealRunError` line naming the file and the field. Nothing of
torch or ``real_model`` is imported: the file is the interface.

A paper whose empirical claims a real run can decide names a module in its registration
(``Paper.real_checks``) that defines ``CLAIMS`` (the ids it decides) and ``decide(run) ->
{claim_id: RealVerdict}``. :func:`real_claims` and :func:`decide_on_run` call them; the audit
stores each result beside the claim's computed verdict (``ClaimResult.real_run``), never in place
of it.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RealRunError", "RankRow", "RealRankRun", "RealVerdict", "read_real_rank",
           "real_claims", "decide_on_run", "real_rank_command"]


class RealRunError(ValueError):
    """A ``--real`` file that cannot be used (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class RankRow:
    """One ``summary`` row of a ``real rank`` run: group size ``R``, over its mixed groups.

    ``sd`` values are sample sds (ddof 1), ``None`` below two mixed groups; means are ``None``
    when no group of that size had mixed rewards."""

    R: int
    groups: int
    mixed_groups: int
    effective_rank_mean: float | None
    effective_rank_sd: float | None
    top1_mean: float | None
    top1_sd: float | None

    def se(self, what: str) -> float | None:
        """Standard error of the mean of ``what`` (``"effective_rank"`` or ``"top1"``):
        sd / sqrt(mixed groups); ``None`` below two mixed groups."""
        sd = getattr(self, f"{what}_sd")
        if sd is None or self.mixed_groups < 2:
            return None
        return sd / math.sqrt(self.mixed_groups)


@dataclass(frozen=True)
class RealRankRun:
    """What the audit uses of a ``real rank`` ``results.json``."""

    path: str
    model: str
    num_parameters: int | None
    estimator: str
    num_groups: int
    accuracy: float | None
    rows: tuple[RankRow, ...]

    def row(self, R: int) -> RankRow | None:
        """The summary row of group size ``R`` (``None`` if the run has no such ``R``)."""
        return next((r for r in self.rows if r.R == R), None)

    @property
    def size(self) -> str:
        """The model's parameter count in words (``"135M parameters"``), or ``"size unknown"``."""
        n = self.num_parameters
        if n is None:
            return "size unknown"
        for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if n >= scale:
                return f"{n / scale:.3g}{unit} parameters"
        return f"{n} parameters"

    @property
    def mixed(self) -> str:
        """Mixed groups per ``R`` in words: ``"R=2: 3/8, R=4: 5/8"``."""
        return ", ".join(f"R={r.R}: {r.mixed_groups}/{r.groups}" for r in self.rows)

    def describe(self) -> dict[str, Any]:
        """The ``run`` record stored with every verdict decided on it."""
        return {"file": self.path, "model": self.model, "num_parameters": self.num_parameters,
                "estimator": self.estimator, "num_groups": self.num_groups,
                "accuracy": self.accuracy,
                "mixed_groups": {str(r.R): r.mixed_groups for r in self.rows},
                "groups": {str(r.R): r.groups for r in self.rows}}


@dataclass
class RealVerdict:
    """A claim decided on a real run: the verdict, one line saying why (with the numbers), and
    the numbers themselves."""

    verdict: str
    finding: str
    evidence: dict[str, Any] = field(default_factory=dict)


def real_rank_command(out: str = "runs/rank") -> str:
    """The command that writes a ``results.json`` for ``--real``."""
    return f"grpo-audit real rank --out {out}"


def _number(path: str, where: str, v: Any, *, nullable: bool = True) -> float | None:
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise RealRunError(f"{path}: {where} must be a finite number"
                           + (" or null" if nullable else "") + f", got {v!r}")
    return float(v)


def _count(path: str, where: str, v: Any, *, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise RealRunError(f"{path}: {where} must be an integer >= {low}, got {v!r}")
    return v


def _get(path: str, obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise RealRunError(f"{path}: {where} has no key {key!r}")
    return obj[key]


def _row(path: str, i: int, raw: Any) -> RankRow:
    where = f"summary[{i}]"
    if not isinstance(raw, dict):
        raise RealRunError(f"{path}: {where} must be an object, got {type(raw).__name__}")
    g = {k: _get(path, raw, k, where) for k in ("R", "groups", "mixed_groups",
                                                "effective_rank_mean", "effective_rank_sd",
                                                "top1_mean", "top1_sd")}
    row = RankRow(
        R=_count(path, f"{where}.R", g["R"], low=1),
        groups=_count(path, f"{where}.groups", g["groups"]),
        mixed_groups=_count(path, f"{where}.mixed_groups", g["mixed_groups"]),
        **{k: _number(path, f"{where}.{k}", g[k]) for k in ("effective_rank_mean",
                                                           "effective_rank_sd", "top1_mean",
                                                           "top1_sd")},
    )
    if row.mixed_groups > row.groups:
        raise RealRunError(f"{path}: {where}.mixed_groups ({row.mixed_groups}) exceeds "
                           f"{where}.groups ({row.groups})")
    if row.mixed_groups > 0 and row.effective_rank_mean is None:
        raise RealRunError(f"{path}: {where} has {row.mixed_groups} mixed groups but "
                           "effective_rank_mean is null")
    return row


def read_real_rank(path: str | Path) -> RealRankRun:
    """Read and check a ``grpo-audit real rank`` ``results.json``.

    Raises:
        RealRunError: naming the file and what is wrong (missing, a folder, unreadable, not
            UTF-8, not JSON, not a ``real rank`` results file, a missing key or a wrong type).
    """
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise RealRunError(f"{name}: no such file (write one with `{real_rank_command()}`)")
    if not p.is_file():
        raise RealRunError(f"{name}: not a file (--real takes the results.json of "
                           f"`{real_rank_command()}`)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RealRunError(f"{name}: not UTF-8 text, so not a results.json") from None
    except OSError as exc:
        raise RealRunError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RealRunError(f"{name}: not JSON ({exc.msg} at line {exc.lineno}, column "
                           f"{exc.colno})") from None
    if not isinstance(data, dict):
        raise RealRunError(f"{name}: must hold a JSON object, got {type(data).__name__}")
    experiment = _get(name, data, "experiment", "the file")
    if experiment != "real_rank":
        raise RealRunError(f"{name}: experiment is {experiment!r}, not 'real_rank' (--real takes "
                           f"the results.json of `{real_rank_command()}`)")
    model = _get(name, data, "model", "the file")
    if not isinstance(model, dict):
        raise RealRunError(f"{name}: model must be an object, got {type(model).__name__}")
    model_name = _get(name, model, "name", "model")
    if not isinstance(model_name, str) or not model_name:
        raise RealRunError(f"{name}: model.name must be a non-empty string, got {model_name!r}")
    n_params = model.get("num_parameters")
    if n_params is not None:
        n_params = _count(name, "model.num_parameters", n_params, low=1)
    estimator = _get(name, data, "main_estimator", "the file")
    if not isinstance(estimator, str):
        raise RealRunError(f"{name}: main_estimator must be a string, got {estimator!r}")
    summary = _get(name, data, "summary", "the file")
    if not isinstance(summary, list) or not summary:
        raise RealRunError(f"{name}: summary must be a non-empty list of rows, got "
                           f"{summary!r:.60}")
    rows = tuple(_row(name, i, raw) for i, raw in enumerate(summary))
    Rs = [r.R for r in rows]
    if len(set(Rs)) != len(Rs):
        raise RealRunError(f"{name}: summary lists a group size twice ({Rs})")
    return RealRankRun(
        path=name, model=model_name, num_parameters=n_params, estimator=estimator,
        num_groups=_count(name, "num_groups", _get(name, data, "num_groups", "the file")),
        accuracy=_number(name, "accuracy", data.get("accuracy")),
        rows=tuple(sorted(rows, key=lambda r: r.R)),
    )


def real_claims(real_checks: str) -> tuple[str, ...]:
    """The claim ids a paper's ``real_checks`` module decides on a real run."""
    return tuple(importlib.import_module(real_checks).CLAIMS)


def decide_on_run(real_checks: str, run: RealRankRun, ids: list[str]) -> dict[str, RealVerdict]:
    """The verdicts a paper's ``real_checks`` module gives on ``run``, for the claims among
    ``ids``."""
    verdicts = importlib.import_module(real_checks).decide(run)
    return {cid: v for cid, v in verdicts.items() if cid in ids}
