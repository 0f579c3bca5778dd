"""The audited papers: one registration per paper, found by looking in :mod:`paper_checks.claims`.

A paper is a package of claim modules with a :class:`Paper` named ``PAPER`` in its
``__init__.py``: the seed paper (arXiv 2606.29238) is :mod:`paper_checks.claims` itself, every other
paper a sub-package of it (``paper_checks/claims/fade/``). ``Paper.sections`` names the package's
section modules in report order; each of them declares its report heading once, as ``SECTION =
"..."``, and registers its claims with :func:`paper_checks.registry.claim`, which takes the paper
and the section from the module. There is no list of papers or sections anywhere else.

Errors instead of silent defaults: a claim registered outside a listed section module, a public
module of a paper package that neither its ``PAPER.sections`` nor its ``PAPER.support_modules``
(helpers the sections share, registering no claim) lists, a section module without ``SECTION``,
two papers with one key or one claim prefix, and an unknown ``--paper`` key all raise
:class:`PaperRegistrationError` (a ``ValueError``) naming the file to mend.

Cheap to import (the command line lists the papers for ``--paper``): no numpy, and discovery
imports only the packages' ``__init__.py``, never their claim modules.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, replace
from functools import cache
from types import ModuleType

__all__ = ["Paper", "PaperRegistrationError", "DEFAULT_PAPER", "CLAIMS_PACKAGE", "papers",
           "get_paper", "check_sections", "paper_of_module", "section_of_module"]

#: The package that holds the seed paper's section modules and, as sub-packages, the other papers.
CLAIMS_PACKAGE = "paper_checks.claims"
#: The paper ``grpo-audit audit`` audits when ``--paper`` is not given.
DEFAULT_PAPER = "seed"


class PaperRegistrationError(ValueError):
    """A paper's registration or a claim module does not fit the layout (the message says how)."""


@dataclass(frozen=True)
class Paper:
    """One audited paper: its identity and its section modules in report order.

    Attributes:
        key: the ``--paper`` value (``"seed"``, ``"fade"``).
        arxiv: the arXiv id (``"2606.29238"``).
        title: the title as the report heads it (a short form is fine).
        sections: names of the package's section modules, in report order (the paper's order).
        support_modules: names of the package's other public modules: what several sections
            share and register no claim (the paper's printed formulas, shared worlds); default
            none.
        claim_prefix: what every claim id of the paper starts with (``"fade_"``; ``""`` for one
            paper only, the seed).
        scope: what of the paper is audited when it is not the whole text (``"abstract only"``).
        provenance: the sentence of ``REPORT.md`` on where the paper's statements and printed
            values come from.
        report_tables: ``"module:function"`` writing the paper's regenerated tables
            (``function(out_dir, fig_dir, *, seed, quick) -> list[str]``, the Markdown lines of
            the report's "Regenerated tables"); ``""`` for none.
        real_checks: the module that decides the paper's empirical claims on a ``grpo-audit
            real rank`` run (``grpo-audit audit --real FILE``): it defines ``CLAIMS`` (the ids
            it decides) and ``decide(run) -> {claim_id: RealVerdict}`` (see
            :mod:`paper_checks.real_run`); ``""`` for none.
        package: the package that registered it (filled in by discovery).
    """

    key: str
    arxiv: str
    title: str
    sections: tuple[str, ...]
    support_modules: tuple[str, ...] = ()
    claim_prefix: str = ""
    scope: str = ""
    provenance: str = ""
    report_tables: str = ""
    real_checks: str = ""
    package: str = ""

    @property
    def citation(self) -> str:
        """``arXiv <id> (<title>)``, with the scope after a comma where there is one."""
        return f"arXiv {self.arxiv} ({self.title})" + (f", {self.scope}" if self.scope else "")

    def section_module(self, section: str) -> str:
        """The dotted name of one of :attr:`sections`."""
        return f"{self.package}.{section}"


def _registration(package: ModuleType) -> Paper:
    paper = getattr(package, "PAPER", None)
    if not isinstance(paper, Paper):
        raise PaperRegistrationError(
            f"{package.__name__}/__init__.py must define PAPER = paper_checks.papers.Paper(...)")
    return replace(paper, package=package.__name__)


def check_sections(paper: Paper, package: ModuleType) -> None:
    """Every public module of the package is a listed section or support module, and every
    listed name a module."""
    modules = {m.name for m in pkgutil.iter_modules(package.__path__) if not m.ispkg}
    public = {m for m in modules if not m.startswith("_")}
    if len(set(paper.sections)) != len(paper.sections):
        raise PaperRegistrationError(f"{paper.package}: PAPER.sections lists a module twice")
    both = sorted(set(paper.sections) & set(paper.support_modules))
    if both:
        raise PaperRegistrationError(
            f"{paper.package}: {both} listed both in PAPER.sections and PAPER.support_modules")
    missing = [s for s in (*paper.sections, *paper.support_modules) if s not in modules]
    unlisted = sorted(public - set(paper.sections) - set(paper.support_modules))
    if missing or unlisted:
        raise PaperRegistrationError(
            f"{paper.package}: PAPER.sections must name each section module once, in report "
            f"order, and PAPER.support_modules every other public module (listed but missing: "
            f"{missing}; modules not listed: {unlisted})")


@cache
def papers() -> dict[str, Paper]:
    """Every registered paper by key: the seed first, then the sub-packages of the claims package
    in alphabetical order of their package name."""
    root = importlib.import_module(CLAIMS_PACKAGE)
    found = [(root, _registration(root))]
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
        if info.ispkg:
            pkg = importlib.import_module(f"{CLAIMS_PACKAGE}.{info.name}")
            found.append((pkg, _registration(pkg)))
    out: dict[str, Paper] = {}
    prefixes: dict[str, str] = {}
    for pkg, paper in found:
        check_sections(paper, pkg)
        if paper.key in out:
            raise PaperRegistrationError(f"paper key {paper.key!r} registered by "
                                         f"{out[paper.key].package} and {paper.package}")
        if paper.claim_prefix in prefixes:
            raise PaperRegistrationError(
                f"claim prefix {paper.claim_prefix!r} used by papers "
                f"{prefixes[paper.claim_prefix]!r} and {paper.key!r}")
        if paper.claim_prefix and not paper.claim_prefix.endswith("_"):
            raise PaperRegistrationError(f"claim prefix {paper.claim_prefix!r} of {paper.key!r} "
                                         "must end with '_'")
        out[paper.key] = paper
        prefixes[paper.claim_prefix] = paper.key
    return out


def get_paper(key: str) -> Paper:
    """The registered paper ``key``; a clear error naming the known keys otherwise."""
    known = papers()
    if key not in known:
        raise PaperRegistrationError(f"unknown paper {key!r}; known: {sorted(known)}")
    return known[key]


def paper_of_module(module: str) -> Paper:
    """The paper whose section module ``module`` (a dotted name) is; an error for any other."""
    package, _, name = module.rpartition(".")
    for paper in papers().values():
        if paper.package == package:
            if name not in paper.sections:
                raise PaperRegistrationError(
                    f"{module} is not a section of paper {paper.key!r}: add {name!r} to "
                    f"PAPER.sections in {package}/__init__.py")
            return paper
    raise PaperRegistrationError(
        f"claims are registered from the section modules of a paper package under "
        f"{CLAIMS_PACKAGE}, not from {module}")


def section_of_module(module: ModuleType) -> str:
    """The report heading that a section module declares as ``SECTION``."""
    section = getattr(module, "SECTION", None)
    if not isinstance(section, str) or not section.strip():
        raise PaperRegistrationError(
            f"{module.__name__} must declare its report heading once, as SECTION = \"...\", "
            "above its claims")
    return section
