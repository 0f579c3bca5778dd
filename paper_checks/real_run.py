"""A ``grpo-audit real rank`` run as the audit reads it (``grpo-audit audit --real FILE``).

:func:`read_real_rank` reads the run's ``results.json`` (written by
:func:`real_model.outputs.write_rank_results`) and checks, as it reads, every field the audit
uses, through the file's one schema (:func:`real_model.run_io.read_results`, which imports
nothing but :mod:`grpo_io`): a file that is missing, not JSON, of another experiment, or with a
missing key or a value of the wrong type gives one :class:`RealRunError` line naming the file and
the field. Nothing of torch is imported: the file is the interface.

A paper whose empirical claims a real run can decide names a module in its registration
(``Paper.real_checks``) that defines ``CLAIMS`` (the ids it decides) and ``decide(run) ->
{claim_id: RealVerdict}``. :func:`real_claims` and :func:`decide_on_run` call them; the audit
stores each result beside the claim's computed verdict (``ClaimResult.real_run``), never in place
of it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from real_model.run_io import read_results

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


def _float(v: float | None) -> float | None:
    return None if v is None else float(v)


def read_real_rank(path: str | Path) -> RealRankRun:
    """Read and check a ``grpo-audit real rank`` ``results.json``
    (:func:`real_model.run_io.read_results`: the one schema of that file).

    Raises:
        RealRunError: naming the file and what is wrong (missing, a folder, unreadable, not
            UTF-8, not JSON, not a ``real rank`` results file, a missing key or a wrong type).
    """
    try:
        res = read_results(Path(path), experiments=("real_rank",),
                           fix=f"--real takes the results.json of `{real_rank_command()}`")
    except ValueError as exc:
        raise RealRunError(str(exc)) from None
    rows = tuple(
        RankRow(R=r["R"], groups=r["groups"], mixed_groups=r["mixed_groups"],
                **{k: _float(r[k]) for k in ("effective_rank_mean", "effective_rank_sd",
                                             "top1_mean", "top1_sd")})
        for r in sorted(res["summary"], key=lambda r: r["R"])
    )
    return RealRankRun(
        path=str(path), model=res["model"]["name"],
        num_parameters=res["model"].get("num_parameters"), estimator=res["main_estimator"],
        num_groups=res["num_groups"], accuracy=_float(res.get("accuracy")), rows=rows,
    )


def real_claims(real_checks: str) -> tuple[str, ...]:
    """The claim ids a paper's ``real_checks`` module decides on a real run."""
    return tuple(importlib.import_module(real_checks).CLAIMS)


def decide_on_run(real_checks: str, run: RealRankRun, ids: list[str]) -> dict[str, RealVerdict]:
    """The verdicts a paper's ``real_checks`` module gives on ``run``, for the claims among
    ``ids``."""
    verdicts = importlib.import_module(real_checks).decide(run)
    return {cid: v for cid, v in verdicts.items() if cid in ids}
