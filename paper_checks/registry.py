"""The claim registry: every checkable statement of an audited paper, with a computed verdict.

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
* ``inconclusive``: the statement cannot be decided by the computation available here, or a
  computation the verdict rests on failed or is missing (:func:`verdict_from` with
  ``computed=False``; a check that raises is recorded as ``inconclusive`` by :func:`run_claim`,
  with the error as its evidence). In the second case ``Outcome.undecided`` says so (and which
  verdict the computation alone points to), and the summary and the report give that reason,
  not the correction written for the refuted case.

Claims belong to a paper and a section, both taken from the module that registers them
(:mod:`paper_checks.papers`): the seed paper's section modules are :mod:`paper_checks.claims`, and
every other paper's (``"fade"``: arXiv 2607.01490, abstract only, ids prefixed ``fade_``) a
sub-package of it. :func:`ordered_ids` gives them in report order: the paper's section modules in
the order its registration lists them, then registration order within a module.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grpo_io import to_jsonable

from .papers import DEFAULT_PAPER, get_paper, paper_of_module, papers, section_of_module

__all__ = [
    "VERDICTS",
    "KINDS",
    "Verdict",
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
    "load_claims",
    "VERDICT_LEGEND",
    "verdict_from",
]

VERDICTS: tuple[str, ...] = ("holds", "holds-with-conditions", "refuted", "inconclusive")

#: What each verdict means (the legend at the top of every report).
VERDICT_LEGEND: dict[str, str] = {
    "holds": "the computation agrees with the statement as written (in the setting the paper "
    "states)",
    "holds-with-conditions": "it agrees only under conditions the paper does not state (the "
    "conditions are listed)",
    "refuted": "the computation contradicts the statement as written; the correction gives the "
    "counterexample or the right value",
    "inconclusive": "it cannot be decided here (e.g. measurements on a model we do not have, a "
    "statement too vague to test), or a computation the verdict rests on failed or is missing",
}

#: What a claim's verdict is about (``Claim.kind``; the report counts verdicts by kind and ranks
#: its key findings by it). Every registered claim names one (:func:`claim` raises otherwise).
KINDS: dict[str, str] = {
    "derivation": "a derivation, theorem, proof step, definition or mechanism: mathematics the "
    "paper states",
    "empirical": "a measurement on a model, a data set or code bases (the paper's experiments and "
    "the tables that print them)",
    "interpretation": "a qualitative reading the paper draws (discussion, interpretation, future "
    "work)",
    "as-practised": "the statement under a variant used in practice that the paper does not state "
    "(e.g. std-normalised GRPO, length-normalised aggregation)",
    "printed-value": "a number the paper prints (a table cell, a displayed value), recomputed",
    "reference": "a cross-reference, citation, name or notation, or typo",
}

PlotFn = Callable[[Any], None]  # draws on a matplotlib Axes


class Verdict(str):
    """A verdict string as :func:`verdict_from` returns it, carrying why it is what it is.

    Equal to (and JSON-encoded as) the plain string; :class:`Outcome` stores the plain string and
    reads the two attributes:

    Attributes:
        incomplete: True when the verdict is ``"inconclusive"`` because ``computed=False`` (a
            computation the verdict rests on did not complete, or a cross-check did not agree).
        indicated: the verdict the computation alone gives (``agrees`` or ``otherwise``), which
            ``computed=False`` withheld; equal to the verdict otherwise.
    """

    incomplete: bool
    indicated: str

    def __new__(cls, value: str, *, incomplete: bool = False, indicated: str | None = None
                ) -> Verdict:
        if value not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {value!r}")
        obj = super().__new__(cls, value)
        obj.incomplete = bool(incomplete)
        obj.indicated = value if indicated is None else indicated
        return obj


def _incomplete_reason(indicated: str) -> str:
    """The default ``Outcome.undecided`` of a verdict withheld by ``computed=False``."""
    return (
        "a computation the verdict rests on did not complete or its cross-check did not agree "
        f"(see the evidence), so no verdict is given; the computation alone points to "
        f"'{indicated}'"
    )


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
    short: str | None = None  # one-line form of the correction/conditions for summary tables
    #: Why the verdict is ``inconclusive`` when a computation it rests on did not complete or a
    #: cross-check did not agree. Filled in from a :class:`Verdict` of ``verdict_from(...,
    #: computed=False)`` unless the check writes its own; the summary and the report show it
    #: instead of ``short``/``correction`` (which describe the refuted case).
    undecided: str | None = None
    #: The check's one-line finding: what is true, with the computed numbers that show it
    #: (formatted from the evidence; a test holds every decimal number in it to the evidence).
    #: The report's key findings and bottom line quote it (else ``short``/``correction``).
    finding: str | None = None
    #: Evidence keys the report's short table shows first, where present (every value is in the
    #: per-claim CSV and claims.json).
    key_evidence: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if getattr(self.verdict, "incomplete", False) and not self.undecided:
            self.undecided = _incomplete_reason(self.verdict.indicated)  # type: ignore[attr-defined]
        self.verdict = str.__str__(self.verdict)  # the plain string from here on
        if self.undecided and self.verdict != "inconclusive":
            raise ValueError(f"undecided is the reason of an inconclusive verdict, not of "
                             f"{self.verdict!r}")
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
    paper: str = DEFAULT_PAPER
    kind: str = ""  # a key of KINDS; claim() requires it


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
    short: str | None = None
    paper: str = DEFAULT_PAPER
    undecided: str | None = None
    kind: str = ""  # a key of KINDS; claim() requires it
    finding: str | None = None
    key_evidence: tuple[str, ...] = ()
    #: The verdict on a real-model run (``grpo-audit audit --real``), beside the computed one:
    #: ``{"verdict", "finding", "evidence", "run"}``; ``None`` when none was given or it does not
    #: bear on this claim.
    real_run: dict[str, Any] | None = None
    #: The per-claim CSV of the full evidence, relative to the report (set when written).
    evidence_csv: str | None = None

    @property
    def summary(self) -> str | None:
        """The one-line form for summary tables: for a verdict withheld because a computation did
        not complete (``undecided``), that reason; else the check's ``short`` where it wrote one,
        else the full correction (refuted, inconclusive) or conditions (holds-with-conditions),
        never cut; ``None`` for a plain ``holds``."""
        if self.verdict == "inconclusive" and self.undecided:
            return f"undecided: {self.undecided}"
        if self.short:
            return self.short
        if self.verdict in ("refuted", "inconclusive"):
            return self.correction
        if self.verdict == "holds-with-conditions":
            return self.conditions
        return None

    @property
    def headline(self) -> str | None:
        """The one line the key findings quote: the check's ``finding`` where it wrote one, else
        :attr:`summary`; ``None`` for a plain ``holds`` without a finding."""
        if self.verdict == "inconclusive" and self.undecided:
            return self.summary
        return self.finding or self.summary

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the plot function is dropped; ``figure`` holds its file)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "location": self.location,
            "claim": self.claim,
            "check": self.check,
            "variants": list(self.variants),
            "verdict": self.verdict,
            "evidence": to_jsonable(self.evidence),
            "correction": self.correction,
            "conditions": self.conditions,
            "short": self.short,
            "undecided": self.undecided,
            "finding": self.finding,
            "real_run": to_jsonable(self.real_run),
            "paper": self.paper,
            "figure": self.figure,
            "evidence_csv": self.evidence_csv,
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
    kind: str | None = None,
) -> Callable[[Callable[[CheckContext], Outcome]], Callable[[CheckContext], Outcome]]:
    """Decorator: register ``fn`` as the check of claim ``id``.

    The paper and the section are those of the module ``fn`` is defined in: a section module
    listed in a paper's registration (:mod:`paper_checks.papers`), with its ``SECTION`` heading
    declared above its claims; anything else is an error.

    Args:
        id: snake_case identifier, unique, starting with the paper's claim prefix (also the
            pytest id: ``pytest -k <id>``).
        location: where the statement is (section, equation, table).
        text: our paraphrase of the statement.
        check: what the check computes, in which world, with which estimator variants.
        variants: estimator names used (``grpo`` mean-centred, ``grpo_std`` std-normalised, ...).
        kind: what the verdict is about, a key of :data:`KINDS` (required: a claim without one
            raises, naming the claim).
    """
    if not id.replace("_", "").isalnum() or id.lower() != id:
        raise ValueError(f"claim id must be snake_case, got {id!r}")
    if kind not in KINDS:
        raise ValueError(f"claim {id!r}: kind= is required, one of {list(KINDS)} (got {kind!r})")

    def deco(fn: Callable[[CheckContext], Outcome]) -> Callable[[CheckContext], Outcome]:
        paper = paper_of_module(fn.__module__)
        section = section_of_module(sys.modules[fn.__module__])
        _check_prefix(id, paper.key)
        if id in REGISTRY:
            raise ValueError(f"claim id {id!r} registered twice")
        REGISTRY[id] = Claim(id, location, text, check, fn, tuple(variants), section, paper.key,
                             kind)
        return fn

    return deco


def _check_prefix(cid: str, paper: str) -> None:
    """A claim id carries its paper's prefix and no other paper's."""
    prefix = get_paper(paper).claim_prefix
    if prefix and not cid.startswith(prefix):
        raise ValueError(f"claim {cid!r} of paper {paper!r} must start with {prefix!r}")
    others = [p.claim_prefix for p in papers().values() if p.key != paper and p.claim_prefix]
    if any(cid.startswith(p) for p in others if not prefix or len(p) > len(prefix)):
        raise ValueError(f"claim {cid!r} of paper {paper!r} uses another paper's prefix")


def get_claim(claim_id: str) -> Claim:
    """Look a claim up by id (loading every claim module first)."""
    load_claims()
    try:
        return REGISTRY[claim_id]
    except KeyError:
        raise ValueError(f"unknown claim id {claim_id!r}; known: {sorted(REGISTRY)}") from None


def run_claim(claim_id: str, *, seed: int = 0, quick: bool = True) -> ClaimResult:
    """Run one claim's check and return its :class:`ClaimResult`.

    A check that raises does not stop the audit: its claim is recorded as ``inconclusive``
    with the exception as its evidence (a failed computation decides nothing).
    """
    c = get_claim(claim_id)
    t0 = time.perf_counter()
    try:
        out = c.fn(CheckContext(seed=seed, quick=quick))
    except Exception as exc:  # noqa: BLE001 - any failure of a computation -> inconclusive
        out = Outcome("inconclusive", {"computation_failed": f"{type(exc).__name__}: {exc}"},
                      short=f"the check's computation failed ({type(exc).__name__})",
                      undecided=f"the check's computation failed ({type(exc).__name__}: {exc})")
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
        short=out.short,
        paper=c.paper,
        undecided=out.undecided,
        kind=c.kind,
        finding=out.finding,
        key_evidence=tuple(out.key_evidence),
    )


def ordered_ids(paper: str = DEFAULT_PAPER) -> list[str]:
    """Every claim id of ``paper`` in report order: its section modules in the order of its
    registration, then registration order within each module."""
    load_claims()
    spec = get_paper(paper)
    by_module: dict[str, list[str]] = {spec.section_module(s): [] for s in spec.sections}
    for cid, c in REGISTRY.items():
        if c.paper == paper:
            if c.fn.__module__ not in by_module:
                raise ValueError(f"claim {cid!r} of paper {paper!r} is not defined in one of its "
                                 f"section modules ({c.fn.__module__})")
            by_module[c.fn.__module__].append(cid)
    return [cid for ids in by_module.values() for cid in ids]


def run_claims(
    ids: Iterable[str] | None = None, *, seed: int = 0, quick: bool = True,
    paper: str = DEFAULT_PAPER, progress: Callable[[int, int, str], None] | None = None,
) -> list[ClaimResult]:
    """Run the given claims (default: all of ``paper``, in report order; a claim named twice is
    run once).

    ``progress(done, total, claim_id)`` is called before each claim, and ``progress(total, total,
    "")`` after the last.
    """
    load_claims()
    chosen = ordered_ids(paper) if ids is None else list(dict.fromkeys(ids))
    out = []
    for i, cid in enumerate(chosen):
        if progress is not None:
            progress(i, len(chosen), cid)
        out.append(run_claim(cid, seed=seed, quick=quick))
    if progress is not None:
        progress(len(chosen), len(chosen), "")
    return out


def verdict_from(
    ok: bool, *, computed: bool = True, otherwise: str = "refuted", agrees: str = "holds"
) -> Verdict:
    """The one rule from a computed boolean to a verdict.

    Returns a :class:`Verdict` (a ``str``): with ``computed=False`` it is ``"inconclusive"`` with
    ``incomplete=True`` and ``indicated`` the verdict ``ok`` gives, which :class:`Outcome` turns
    into its ``undecided`` reason.

    Args:
        ok: the computation agrees with the statement.
        computed: every computation the verdict rests on ran and is complete (e.g. a Monte
            Carlo cross-check ran and agreed with the exact route); ``False`` gives
            ``"inconclusive"`` whatever ``ok`` says.
        otherwise: the verdict when ``ok`` is false (``"refuted"``; ``"inconclusive"`` where a
            disagreement would not decide the statement).
        agrees: the verdict when ``ok`` is true (``"holds"``, or ``"holds-with-conditions"``
            where the agreement needs conditions the paper does not state).

    >>> verdict_from(True), verdict_from(False), verdict_from(True, computed=False)
    ('holds', 'refuted', 'inconclusive')
    """
    for name, v in (("otherwise", otherwise), ("agrees", agrees)):
        if v not in VERDICTS:
            raise ValueError(f"{name} must be one of {VERDICTS}, got {v!r}")
    indicated = agrees if ok else otherwise
    if not computed:
        return Verdict("inconclusive", incomplete=True, indicated=indicated)
    return Verdict(indicated)


def load_claims() -> None:
    """Import every section module of every registered paper (registering their claims)."""
    for spec in papers().values():
        for section in spec.sections:
            importlib.import_module(spec.section_module(section))


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
