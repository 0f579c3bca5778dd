"""The audit as a test suite: one test per registered claim of arXiv 2606.29238, of the FADE
abstract (arXiv 2607.01490), of Dr. GRPO (arXiv 2503.20783) and of arXiv 2503.06639 v4 (GRPO's
effective loss).

``pytest -k <claim id>`` audits one claim. Each test runs the claim's quick check and asserts the
verdict that the computation gives (recorded in ``tests/expected_verdicts.py`` from the
computation, not from the paper). A
claim whose computed verdict is ``refuted`` then calls ``pytest.xfail`` with the computed
correction (the counterexample or the correct value) as its reason, so every refutation is
listed as XFAIL with its evidence in pytest's summary while the suite exits 0; if a refuted
claim stopped being refuted (or any verdict changed), the verdict assertion fails the test.
Every computed verdict is also recorded for the audit summary that ``tests/conftest.py`` prints
at the end of the run (counts by verdict and the refuted ids, per paper).
"""

from __future__ import annotations

import math

import pytest
from expected_verdicts import EXPECTED, EXPECTED_DR_GRPO, EXPECTED_EFFLOSS, EXPECTED_FADE

from paper_checks.registry import VERDICTS, ordered_ids


def test_expected_table_covers_every_registered_claim():
    assert set(EXPECTED) == set(ordered_ids())
    assert set(EXPECTED_FADE) == set(ordered_ids("fade"))
    assert set(EXPECTED_DR_GRPO) == set(ordered_ids("dr-grpo"))
    assert set(EXPECTED_EFFLOSS) == set(ordered_ids("grpo-effective-loss"))
    assert (set(EXPECTED.values()) | set(EXPECTED_FADE.values())
            | set(EXPECTED_DR_GRPO.values()) | set(EXPECTED_EFFLOSS.values())) <= set(VERDICTS)


def _numbers(ev, path=""):
    if isinstance(ev, dict):
        for k, v in ev.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(ev, list):
        for i, v in enumerate(ev):
            yield from _numbers(v, f"{path}[{i}]")
    else:
        yield path, ev


ALL_EXPECTED = {**EXPECTED, **EXPECTED_FADE, **EXPECTED_DR_GRPO, **EXPECTED_EFFLOSS}


@pytest.mark.parametrize("claim_id", list(ALL_EXPECTED), ids=list(ALL_EXPECTED))
def test_claim(claim_id: str, audit_record, quick_claim) -> None:
    r = quick_claim(claim_id)
    audit_record(r.paper, claim_id, r.verdict)
    assert r.evidence, f"{claim_id}: no evidence"
    for path, v in _numbers(r.evidence):
        assert isinstance(v, bool | int | float | str), f"{claim_id}{path}: {v!r}"
        if isinstance(v, float):
            assert math.isfinite(v), f"{claim_id}{path} = {v}"
    assert "computation_failed" not in r.evidence, r.evidence
    assert r.verdict == ALL_EXPECTED[claim_id], (
        f"{claim_id}: computed verdict {r.verdict!r}, recorded {ALL_EXPECTED[claim_id]!r}; "
        f"evidence {r.evidence}"
    )
    if r.verdict == "holds-with-conditions":
        assert r.conditions and r.short
    if r.verdict in ("refuted", "inconclusive"):
        assert r.summary, f"{claim_id}: a {r.verdict} claim needs its short form"
    if r.verdict == "refuted":
        assert r.correction and r.short
        pytest.xfail(f"REFUTED {claim_id} ({r.location}): {r.correction}")
