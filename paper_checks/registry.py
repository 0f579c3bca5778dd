"""The claim registry: every checkable statement of arXiv 2606.29238, with a computed verdict.

A :class:`Claim` names one statement of the paper (``id``, ``location``, our paraphrase) and the
function that checks it. The check returns an :class:`Outcome`: a verdict computed from the
numbers it produced (never typed in), the evidence (named numbers, with standard errors for
Monte Carlo), the correction where the paper is wrong, and optionally a figure (a function that
draws on a matplotlib ``ax``).

Verdicts (:data:`VERDICTS`):

* ``holds``: the computation agrees with the statement as written.
* ``holds-with-conditions``: it agrees only under conditions the paper does not state; the
  conditions are given in ``Outcome.conditions``.
* ``refuted``: the computation contradicts the statement; ``correction`` gives the counterexample
  or the correct value.
* ``inconclusive``: the statement cannot be decided by the computation available here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grpo_io import to_jsonable

__all__ = [
    "VERDICTS",
    "Claim",
    "CheckContext",
    "ClaimResult",
    "Outcome",
    "REGISTRY",
    "claim",
    "get_claim",
    "run_claim",
    "run_claims",
    "ordered_ids",
    "SECTION_ORDER",
    "verdict_from",
]

VERDICTS: tuple[str, ...] = ("holds", "holds-with-conditions", "refuted", "inconclusive")

PlotFn = Callable[[Any], None]  # draws on a matplotlib Axes


@dataclass(frozen=True)
class CheckContext:
    """What a check may use: a seed (for its own ``np.random.Generator``) and the quick flag."""

    seed: int = 0
    quick: bool = True

    def rng(self, salt: int = 0) -> np.random.Generator:
        """A fresh generator seeded from ``(seed, salt)``: checks never share random state."""
        return np.random.default_rng([self.seed, salt])


@dataclass
class Outcome:
    """What a check computed."""

    verdict: str
    evidence: dict[str, Any]
    correction: str | None = None
    conditions: str | None = None
    plot: PlotFn | None = None
    plot_title: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.verdict == "refuted" and not self.correction:
            raise ValueError("a refuted claim needs a correction (counterexample or correct value)")
        if self.verdict == "holds-with-conditions" and not self.conditions:
            raise ValueError("holds-with-conditions needs the conditions stated")


@dataclass(frozen=True)
class Claim:
    """One registered statement of the paper."""

    id: str
    location: str
    claim: str
    check: str
    fn: Callable[[CheckContext], Outcome]
    variants: tuple[str, ...] = ()
    section: str = ""


@dataclass
class ClaimResult:
    """A claim together with the outcome of its check (the rows of ``claims.json``)."""

    id: str
    location: str
    claim: str
    check: str
    variants: list[str]
    verdict: str
    evidence: dict[str, Any]
    correction: str | None
    conditions: str | None
    seconds: float
    figure: str | None = None
    plot: PlotFn | None = field(default=None, repr=False, compare=False)
    plot_title: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the plot function is dropped; ``figure`` holds its file)."""
        return {
            "id": self.id,
            "location": self.location,
            "claim": self.claim,
            "check": self.check,
            "variants": list(self.variants),
            "verdict": self.verdict,
            "evidence": to_jsonable(self.evidence),
            "correction": self.correction,
            "conditions": self.conditions,
            "figure": self.figure,
            "seconds": round(self.seconds, 4),
        }


REGISTRY: dict[str, Claim] = {}


def claim(
    id: str,
    *,
    location: str,
    text: str,
    check: str,
    variants: Iterable[str] = (),
    section: str = "",
) -> Callable[[Callable[[CheckContext], Outcome]], Callable[[CheckContext], Outcome]]:
    """Decorator: register ``fn`` as the check of claim ``id``.

    Args:
        id: snake_case identifier, unique (also the pytest id: ``pytest -k <id>``).
        location: where the statement is (section, equation, table).
        text: our paraphrase of the statement.
        check: what the check computes, in which world, with which estimator variants.
        variants: estimator names used (``grpo`` mean-centred, ``grpo_std`` std-normalised, ...).
        section: report grouping.
    """

    def deco(fn: Callable[[CheckContext], Outcome]) -> Callable[[CheckContext], Outcome]:
        if id in REGISTRY:
            raise ValueError(f"claim id {id!r} registered twice")
        if not id.replace("_", "").isalnum() or id.lower() != id:
            raise ValueError(f"claim id must be snake_case, got {id!r}")
        REGISTRY[id] = Claim(id, location, text, check, fn, tuple(variants), section)
        return fn

    return deco


def get_claim(claim_id: str) -> Claim:
    """Look a claim up by id (loading every claim module first)."""
    _load_all()
    try:
        return REGISTRY[claim_id]
    except KeyError:
        raise ValueError(f"unknown claim id {claim_id!r}; known: {sorted(REGISTRY)}") from None


def run_claim(claim_id: str, *, seed: int = 0, quick: bool = True) -> ClaimResult:
    """Run one claim's check and return its :class:`ClaimResult`."""
    c = get_claim(claim_id)
    t0 = time.perf_counter()
    out = c.fn(CheckContext(seed=seed, quick=quick))
    dt = time.perf_counter() - t0
    _check_evidence(c.id, out.evidence)
    ev = to_jsonable(out.evidence)
    return ClaimResult(
        id=c.id,
        location=c.location,
        claim=c.claim,
        check=c.check,
        variants=list(c.variants),
        verdict=out.verdict,
        evidence=ev,
        correction=out.correction,
        conditions=out.conditions,
        seconds=dt,
        plot=out.plot,
        plot_title=out.plot_title,
    )


#: Report order of the sections (the paper's order; the appendix after the body).
SECTION_ORDER: tuple[str, ...] = (
    "2. From policy gradients to GRPO",
    "3. Credit assignment",
    "4. Structural constraints on advantages",
    "5. Sparse updates",
    "6 / A.3 Multi-turn bias",
    "7. Experiments and Table 1",
    "8-9. Discussion and related work",
    "Cross-references",
    "A.1 Proof of Theorem 4.1",
    "A.2 Baseline concentration",
)


def ordered_ids() -> list[str]:
    """Every claim id in paper order (section, then registration)."""
    _load_all()
    rank = {s: i for i, s in enumerate(SECTION_ORDER)}
    mods = {f"{__package__}.{m}": i for i, m in enumerate(CLAIM_MODULES)}
    ids = list(REGISTRY)

    def key(c: str) -> tuple[int, int, int]:
        return (rank.get(REGISTRY[c].section, len(rank)),
                mods.get(REGISTRY[c].fn.__module__, len(mods)), ids.index(c))

    return sorted(ids, key=key)


def run_claims(
    ids: Iterable[str] | None = None, *, seed: int = 0, quick: bool = True
) -> list[ClaimResult]:
    """Run the given claims (default: all, in paper order)."""
    _load_all()
    chosen = ordered_ids() if ids is None else list(ids)
    return [run_claim(i, seed=seed, quick=quick) for i in chosen]


def verdict_from(ok: bool, *, otherwise: str = "refuted") -> str:
    """``"holds"`` if ``ok`` else ``otherwise``: verdicts follow from computed booleans."""
    return "holds" if ok else otherwise


#: Claim modules in paper order (this also orders claims that share a section).
CLAIM_MODULES: tuple[str, ...] = (
    "claims_derivation",
    "claims_grpo_gradient",
    "claims_structure",
    "claims_theorem41",
    "claims_rank",
    "claims_appendix",
)


def _load_all() -> None:
    import importlib

    for name in CLAIM_MODULES:
        importlib.import_module(f"{__package__}.{name}")


def _check_evidence(cid: str, ev: Any, path: str = "") -> None:
    """Evidence must not carry NaN (an undefined number) silently: raise naming the entry.

    Infinities are allowed (e.g. the ``z = inf`` of a failed deterministic check); they are written
    as ``"inf"``/``"-inf"`` (:data:`grpo_io.NONFINITE_POLICY`).
    """
    if isinstance(ev, dict):
        for k, v in ev.items():
            _check_evidence(cid, v, f"{path}.{k}" if path else str(k))
    elif isinstance(ev, list | tuple):
        for i, v in enumerate(ev):
            _check_evidence(cid, v, f"{path}[{i}]")
    elif hasattr(ev, "tolist") and hasattr(ev, "dtype"):  # numpy array or scalar
        _check_evidence(cid, ev.tolist(), path)
    elif isinstance(ev, float) and math.isnan(ev):
        raise ValueError(f"claim {cid}: evidence {path} is nan (an undefined number)")
