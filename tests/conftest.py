"""Shared pytest configuration: reproducible hypothesis examples, and the audit summary printed
at the end of every run.

``tests/test_paper_claims.py`` records each claim's computed verdict through the
``audit_record`` fixture; :func:`pytest_terminal_summary` then prints, per paper, the count
by verdict and the refuted claim ids (the refutations themselves are XFAIL tests whose reason is
the computed correction; see ``docs/paper_checks.md``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (a suite that is the audit must be
# reproducible); ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples to hunt for new ones.
settings.register_profile("repro", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repro"))

if TYPE_CHECKING:
    from paper_checks.registry import ClaimResult

#: The user property under which a test reports a claim's computed verdict: reports travel from
#: pytest-xdist's worker processes to the process that prints the summary.
_VERDICT = "grpo_audit_verdict"
#: paper -> claim id -> verdict, gathered from the test reports (in the process that prints).
_AUDIT: dict[str, dict[str, str]] = {}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (pyproject.toml's default: one process per core) for the default tier and the
    slow tier; any other selection (``-m gpu``, both tiers at once) runs in one process. The
    tests that load the offline SmolLM2 (several GB each) are marked
    ``pytest.mark.xdist_group("offline_model")``: with ``--dist loadgroup`` (pyproject.toml) they
    run one after another in one worker."""
    return None if config.option.markexpr in ("not slow", "slow") else 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Gather the verdicts the tests reported (see :func:`audit_record`)."""
    for name, value in report.user_properties:
        if name == _VERDICT:
            paper, claim_id, verdict = value
            _AUDIT.setdefault(paper, {})[claim_id] = verdict


@pytest.fixture
def user_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user cache (``GRPO_AUDIT_CACHE``, where checkpoints go by default) under ``tmp_path``,
    and matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "user-cache"))


class QuickClaims:
    """Each claim's quick check (seed 0) run once per test session: the per-claim tests and the
    snapshot test read the same deterministic results instead of computing them twice."""

    def __init__(self) -> None:
        self._results: dict[str, ClaimResult] = {}

    def __call__(self, claim_id: str) -> ClaimResult:
        """``paper_checks.registry.run_claim(claim_id, seed=0, quick=True)``, computed once."""
        from paper_checks.registry import run_claim

        if claim_id not in self._results:
            self._results[claim_id] = run_claim(claim_id, seed=0, quick=True)
        return self._results[claim_id]


@pytest.fixture(scope="session")
def quick_claim() -> QuickClaims:
    """``quick_claim(claim_id)``: the claim's quick check (seed 0), run once per session."""
    return QuickClaims()


@pytest.fixture
def audit_record(request: pytest.FixtureRequest):
    """``audit_record(paper, claim_id, verdict)``: record a verdict for the summary."""

    def rec(paper: str, claim_id: str, verdict: str) -> None:
        request.node.user_properties.append((_VERDICT, (paper, claim_id, verdict)))

    return rec


def _write_audit_summary(tr: pytest.TerminalReporter, audit: dict[str, dict[str, str]]) -> None:
    from paper_checks.papers import get_paper
    from paper_checks.registry import VERDICTS

    tr.write_sep("=", "audit summary (computed verdicts, quick checks, seed 0)")
    for paper, verdicts in audit.items():
        counts = Counter(verdicts.values())
        tr.write_line(f"{get_paper(paper).citation}: {len(verdicts)} claims checked; "
                      + ", ".join(f"{v}: {counts.get(v, 0)}" for v in VERDICTS))
        refuted = [c for c, v in verdicts.items() if v == "refuted"]
        if refuted:
            tr.write_line(f"  refuted ({len(refuted)}; XFAIL with the correction as reason): "
                          + ", ".join(refuted))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Print the audit summary as the last lines of the run (after pytest's short summary and
    its final counts): per paper, counts by verdict and the refuted ids."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if _AUDIT and tr is not None and not hasattr(config, "workerinput"):
        _write_audit_summary(tr, _AUDIT)
