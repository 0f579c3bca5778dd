"""The claim ids and verdicts of every audited paper match the snapshot in
``tests/data/claims_snapshot.json``: moving claims between modules, or reordering the report,
changes neither which claims exist nor what their checks decide.

The snapshot holds, per paper, the ``id`` and ``verdict`` of each row of ``claims.json`` written by
the quick audit (seed 0), in the report order of the code it was taken from. It was generated
before the claims were filed by paper section, with::

    grpo-audit audit --quick --out OUT_SEED
    grpo-audit audit --quick --paper fade --out OUT_FADE
    python tests/test_claims_snapshot.py seed=OUT_SEED/claims.json fade=OUT_FADE/claims.json

Regenerate it the same way only when a verdict change is intended (and say so in CHANGELOG.md).
Papers registered after the snapshot are not in it and are not compared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SNAPSHOT = Path(__file__).parent / "data" / "claims_snapshot.json"


def _snapshot() -> dict[str, list[dict[str, str]]]:
    if not SNAPSHOT.exists():
        return {}
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def test_the_snapshot_holds_the_seed_and_fade_papers() -> None:
    snap = _snapshot()
    assert {"seed", "fade"} <= set(snap) and all(snap.values())


@pytest.mark.slow  # reruns every quick check; the default tier's test_claim runs each once
@pytest.mark.parametrize("paper", sorted(_snapshot()))
def test_claim_ids_and_verdicts_match_the_snapshot(paper: str, quick_claim) -> None:
    from paper_checks.registry import load_claims, ordered_ids

    load_claims()
    expected = {row["id"]: row["verdict"] for row in _snapshot()[paper]}
    # the quick checks (seed 0) that ``run_claims(paper=paper)`` runs, shared with test_claim
    got = {r.id: r.verdict for r in map(quick_claim, ordered_ids(paper))}
    assert sorted(got) == sorted(expected), "claim ids differ from the snapshot"
    changed = {i: (expected[i], got[i]) for i in expected if got[i] != expected[i]}
    assert not changed, f"verdicts differ from the snapshot (was, now): {changed}"


def _rows(claims_json: str) -> list[dict[str, str]]:
    return [{"id": r["id"], "verdict": r["verdict"]}
            for r in json.loads(Path(claims_json).read_text(encoding="utf-8"))]


if __name__ == "__main__":  # python tests/test_claims_snapshot.py PAPER=claims.json ...
    pairs = dict(arg.split("=", 1) for arg in sys.argv[1:])
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps({paper: _rows(path) for paper, path in pairs.items()},
                                   indent=1) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
