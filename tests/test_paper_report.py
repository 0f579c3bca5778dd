"""The audit's report, findings first: every claim has a kind, the key findings come first and are
ranked from the computed outcomes, the report is short and its links resolve, corrections and
findings quote their own evidence, and a real-model run (``--real``) is read, checked and decided.

The reports here are written from the quick checks the session already computed (the
``quick_claim`` fixture, shared with ``tests/test_paper_claims.py``), so building them costs the
writing only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from paper_checks.findings import KIND_TIER, ranked
from paper_checks.papers import get_paper, papers
from paper_checks.real_run import RealRunError, read_real_rank
from paper_checks.registry import KINDS, REGISTRY, claim, load_claims, ordered_ids
from paper_checks.report import write_audit

CONSEQUENTIAL_SEED_REFUTATIONS = (  # what a reader of the seed paper must meet first
    "eq15_grpo_gradient_is_unbiased_reinforce",  # E[g] = (R-1)/R grad J
    "sec7_rank2_intrinsic_from_zero_sum",  # the rank-2 "intrinsic" argument
    "table1_internal_consistency",  # Table 1's R = 2 row is impossible
    "sec7_max_rank_r_minus_1",
    "sec6_grpo_exact_single_turn",
)


def _report(out: Path, paper: str, quick_claim: Any, *, run: Any = None,
            ids: list[str] | None = None) -> dict[str, Any]:
    """Write ``paper``'s audit outputs from the session's quick checks (copies: the shared
    results stay untouched); no claim figure is drawn. Returns meta.json's content."""
    results = [dataclasses.replace(quick_claim(i)) for i in (ids or ordered_ids(paper))]
    return write_audit(out, get_paper(paper), results, seed=0, quick=True, ids=ids, run=run,
                       seconds_claims=0.0, figures=False)


@pytest.fixture(scope="module")
def seed_report(tmp_path_factory: pytest.TempPathFactory, quick_claim: Any) -> Path:
    out = tmp_path_factory.mktemp("seed_report")
    _report(out, "seed", quick_claim)
    return out


# --- kinds --------------------------------------------------------------------------------------
def test_every_claim_of_every_paper_has_a_kind() -> None:
    load_claims()
    assert REGISTRY and all(c.kind in KINDS for c in REGISTRY.values())
    assert set(KIND_TIER) == set(KINDS)


def test_a_claim_registered_without_a_kind_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="claim 'x_kindless': kind= is required"):
        claim("x_kindless", location="-", text="-", check="-")
    with pytest.raises(ValueError, match="claim 'x_odd_kind': kind= is required"):
        claim("x_odd_kind", kind="theorem", location="-", text="-", check="-")


def test_the_seed_papers_kinds_count_as_read() -> None:
    kinds = {k: sum(REGISTRY[i].kind == k for i in ordered_ids()) for k in KINDS}
    assert kinds["printed-value"] == 12  # the App. A.2 cells
    assert kinds["as-practised"] == 5 and kinds["reference"] == 1
    assert REGISTRY["cross_references_resolve"].kind == "reference"
    assert REGISTRY["table1_empirical_values"].kind == "empirical"


# --- the report ---------------------------------------------------------------------------------
def test_seed_report_opens_with_the_paper_the_bottom_line_and_the_key_findings(
        seed_report: Path) -> None:
    lines = (seed_report / "REPORT.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 700
    head = "\n".join(lines[:60])
    assert lines[0].startswith("# Proof audit of arXiv 2606.29238")
    assert "**The paper:** arXiv 2606.29238" in head and "seed paper" in head
    assert head.index("## Bottom line") < head.index("## Key findings")
    for cid in CONSEQUENTIAL_SEED_REFUTATIONS:
        assert f"(#{cid})" in head, f"{cid} is not among the key findings of the first 60 lines"
    # ranked: the derivation refutations come before any printed value or reference
    key = head[head.index("## Key findings"):]
    assert key.index("eq15_grpo") < key.index("a2_cell_r2_eps0_3")
    assert key.index("(#sec7_rank2") < key.index("(#cross_references_resolve)")


def test_key_findings_are_ranked_from_the_computed_outcomes(quick_claim: Any) -> None:
    results = [quick_claim(i) for i in ordered_ids()]
    order = ranked(results)
    tiers = [(r.verdict, KIND_TIER[r.kind]) for r in order]
    refuted = [t for v, t in tiers if v == "refuted"]
    assert refuted == sorted(refuted) and order[0].verdict == "refuted"
    assert all(r.kind in ("printed-value", "reference") for r in order[len(refuted) - 9:
                                                                        len(refuted)])
    # every consequential refutation says what is true with a computed number (a rank, a scale)
    for r in order[:len(refuted)]:
        if KIND_TIER[r.kind] < 3:
            assert r.headline and re.search(r"\d", r.headline.replace("(R-1)/R", "")), r.id


def test_counts_by_kind_and_verdict_replace_the_totals(seed_report: Path) -> None:
    text = (seed_report / "REPORT.md").read_text(encoding="utf-8")
    meta = json.loads((seed_report / "meta.json").read_text())
    counts = meta["kind_verdict_counts"]
    assert sum(sum(c.values()) for c in counts.values()) == len(ordered_ids())
    row = counts["printed-value"]
    assert (f"| printed-value | {row.get('holds', 0)} | 0 | {row['refuted']} | 0 | 12 |"
            in text)


def test_report_links_resolve_to_files_and_anchors(seed_report: Path) -> None:
    text = (seed_report / "REPORT.md").read_text(encoding="utf-8")
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    assert set(ordered_ids()) <= anchors
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    for t in targets:
        if t.startswith("#"):
            assert t[1:] in anchors, t
        else:
            assert (seed_report / t).is_file(), t


def test_claim_entries_are_short_and_the_full_evidence_is_in_csv(seed_report: Path) -> None:
    import csv

    text = (seed_report / "REPORT.md").read_text(encoding="utf-8")
    claims = {c["id"]: c for c in json.loads((seed_report / "claims.json").read_text())}
    big = claims["abstract_baseline_optimality_conditions"]
    assert len(big["evidence"]) > 20
    section = text[text.index('<a id="abstract_baseline_optimality_conditions">'):]
    section = section[:section.index("\n#### ")]
    assert section.count("\n| ") <= 1 + 5  # the header and at most 5 rows of 2 values
    rows = list(csv.reader((seed_report / big["evidence_csv"]).open(encoding="utf-8")))
    assert rows[0] == ["key", "value"] and len(rows) - 1 >= len(big["evidence"])
    assert claims["eq15_grpo_gradient_is_unbiased_reinforce"]["consequence_rank"] < \
        claims["a2_cell_r4_eps0_3"]["consequence_rank"]


def test_summary_csv_and_latex_carry_the_kind_and_the_version(seed_report: Path) -> None:
    rows = (seed_report / "claims_summary.csv").read_text().strip().splitlines()
    assert rows[0] == "#,claim,kind,location,verdict,correction / conditions"
    assert len(rows) == len(ordered_ids()) + 1
    tex = (seed_report / "claims_summary.tex").read_text()
    assert tex.startswith("% grpo-audit ") and "\\begin{longtable}" in tex
    assert "eq26\\_a3\\_conditional\\_expectation" in tex
    assert "^" not in tex.replace("\\textasciicircum{}", "")


def test_without_a_real_run_the_report_names_the_command_that_decides_table1(
        seed_report: Path) -> None:
    text = (seed_report / "REPORT.md").read_text(encoding="utf-8")
    assert "grpo-audit real rank --out runs/rank" in text
    assert "--real runs/rank/results.json" in text


# the seed paper in the default tier, every other paper in the slow tier (each runs its audit)
@pytest.mark.parametrize("paper", [p if p == "seed" else pytest.param(p, marks=pytest.mark.slow)
                                   for p in sorted(papers())])
def test_every_paper_gets_the_same_report_structure(paper: str, tmp_path: Path,
                                                     quick_claim: Any) -> None:
    _report(tmp_path, paper, quick_claim)
    text = (tmp_path / "REPORT.md").read_text(encoding="utf-8")
    heads = ["## Bottom line", "## Key findings", "## Counts by kind and verdict", "## Run",
             "## Claims"]
    assert [text.index(h) for h in heads] == sorted(text.index(h) for h in heads)
    assert text.index("## Key findings") < len("\n".join(text.splitlines()[:60]))
    assert len(text.splitlines()) <= 700
    assert all(f'<a id="{c}"></a>' in text for c in ordered_ids(paper))


# --- corrections agree with their evidence --------------------------------------------------------
_DECIMAL = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?:e[-+]?\d+)?(?![\w.])")
_REFERENCE = re.compile(r"(?:Thm|Theorem|Sec\.|Eq\.|Eqs\.|Corollary|Lemma|Prop\.|Table|Fig\.|"
                        r"App\.|Remark|Proposition)\s*\(?$")


def _numbers(ev: Any) -> list[float]:
    if isinstance(ev, dict):
        return [x for v in ev.values() for x in _numbers(v)]
    if isinstance(ev, list):
        return [x for v in ev for x in _numbers(v)]
    if isinstance(ev, bool) or not isinstance(ev, int | float) or not math.isfinite(ev):
        return []
    return [float(ev)]


def _formatted_from(token: str, values: list[float]) -> bool:
    """``token`` is one of ``values`` as printed (at the token's number of decimals; a token in
    e-notation to 1%)."""
    x = float(token)
    if "e" in token.lower():  # as printed by f"{v:.{d}e}" or f"{v:.{d + 1}g}"
        d = len(token.lower().split("e")[0].split(".")[1])
        return any(f"{abs(v):.{d}e}" == token.lstrip("+-") or math.isclose(
            abs(v), abs(x), rel_tol=0.5 * 10 ** -d) for v in values)
    dec = len(token.split(".")[1])
    return any(abs(round(abs(v), dec) - abs(x)) < 0.5 * 10 ** -dec + 1e-12 for v in values)


def unquoted_numbers(r: Any) -> dict[str, list[str]]:
    """The decimal numbers of ``r``'s finding, short form, correction and conditions that are
    neither evidence values (as printed) nor written in the claim, its location, its check or an
    evidence key (the parameters), nor a section/equation number."""
    values = _numbers(r.evidence)
    context = " ".join([r.claim, r.location, r.check, *map(str, _flat_keys(r.evidence))])
    bad: dict[str, list[str]] = {}
    for field in ("finding", "short", "correction", "conditions"):
        text = getattr(r, field) or ""
        for m in _DECIMAL.finditer(text):
            tok = m.group(0).lstrip("+")
            if _REFERENCE.search(text[:m.start()]) or tok in context:
                continue
            if not _formatted_from(tok, values):
                bad.setdefault(field, []).append(tok)
    return bad


def _flat_keys(ev: Any) -> list[str]:
    if isinstance(ev, dict):
        return [k for key, v in ev.items() for k in (str(key), *_flat_keys(v))]
    return []


@pytest.mark.parametrize("paper", [p if p == "seed" else pytest.param(p, marks=pytest.mark.slow)
                                   for p in sorted(papers())])  # others: slow tier
def test_numbers_quoted_in_findings_and_corrections_are_the_evidence(paper: str,
                                                                     quick_claim: Any) -> None:
    bad = {cid: b for cid in ordered_ids(paper) if (b := unquoted_numbers(quick_claim(cid)))}
    assert not bad, f"numbers not formatted from the claim's evidence: {bad}"


def test_the_number_check_catches_a_number_typed_into_a_correction(quick_claim: Any) -> None:
    r = dataclasses.replace(quick_claim("sec7_rank2_intrinsic_from_zero_sum"))
    assert not unquoted_numbers(r)
    r.correction = (r.correction or "") + "; clustered scores give at most 1.50"
    assert unquoted_numbers(r) == {"correction": ["1.50"]}


def test_rank2_correction_says_what_its_evidence_shows(quick_claim: Any) -> None:
    r = quick_claim("sec7_rank2_intrinsic_from_zero_sum")
    ev, text = r.evidence, r.correction or ""
    assert r.verdict == "refuted"
    # "<= 2" only for noiseless clusters; with noise the evidence grows past 2 and says so
    assert ev["max_over_R_clustered_noise_0"] <= 2 + 1e-9
    assert f"at most {ev['max_over_R_clustered_noise_0']:.2f}" in text
    for key in ("clustered_noise_0.01_R16", "clustered_noise_0.1_R16"):
        assert ev[key] > 2 and f"{ev[key]:.2f}" in text
    assert "give <= 2" not in text


# --- a real-model run (--real) -----------------------------------------------------------------
def _rank_results(path: Path, rows: dict[int, tuple[int, int, list[float], list[float]]],
                  *, name: str = "tiny-test-model", params: int = 1234) -> Path:
    """A ``results.json`` written by real_model's own writer from synthetic records: per R,
    (groups, mixed groups, effective ranks, top-1 fractions) of the mixed groups."""
    from real_model.config import RankConfig
    from real_model.outputs import rank_results

    n = max(g for g, _, _, _ in rows.values())
    records = []
    for i in range(n):
        by_R = {}
        for R, (_, mixed, eff, top) in rows.items():
            m = i < mixed
            est = {"effective_rank": eff[i] if m else None, "top1_fraction": top[i] if m else None,
                   "rank": R if m else 0, "max_rank": R if m else 0,
                   "entropy_effective_rank": eff[i] if m else None}
            by_R[str(R)] = {"mixed": m, "estimators": {"grpo": est}}
        records.append({"by_R": by_R, "rewards": [1.0, 0.0]})
    loaded = SimpleNamespace(describe=lambda: {"name": name, "num_parameters": params},
                             device="cpu")
    cfg = RankConfig(prompts=n, R_values=tuple(rows), estimators=("grpo",))
    res = rank_results(cfg, loaded, records, wall_s=0.0, results_jsonl=path / "x.jsonl")
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(res), encoding="utf-8")
    return path / "results.json"


def test_table1_is_decided_on_a_real_run_beside_its_computed_verdict(tmp_path: Path,
                                                                     quick_claim: Any) -> None:
    near2 = [1.98, 1.96, 1.97, 1.99]
    f = _rank_results(tmp_path / "run", {
        2: (4, 4, near2, [0.65, 0.66, 0.64, 0.65]),
        4: (4, 4, [3.1, 3.2, 3.0, 3.1], [0.5, 0.52, 0.49, 0.51]),
        8: (4, 1, [5.0], [0.3])}, name="TinyLM", params=2_500_000)
    run = read_real_rank(f)
    assert run.model == "TinyLM" and run.size == "2.5M parameters"
    assert [(r.R, r.mixed_groups) for r in run.rows] == [(2, 4), (4, 4), (8, 1)]
    out = tmp_path / "audit"
    _report(out, "seed", quick_claim, run=run,
            ids=["table1_empirical_values", "sec7_rank2_intrinsic_from_zero_sum"])
    rows = {c["id"]: c for c in json.loads((out / "claims.json").read_text())}
    t1 = rows["table1_empirical_values"]
    assert t1["verdict"] == "inconclusive"  # the computed verdict does not change
    rr = t1["real_run"]
    assert rr["run"]["model"] == "TinyLM" and rr["run"]["mixed_groups"] == {"2": 4, "4": 4,
                                                                            "8": 1}
    ev = rr["evidence"]
    assert ev["R2_eff_rank_verdict"] == "holds" and ev["R4_eff_rank_verdict"] == "refuted"
    assert ev["R8_eff_rank_verdict"] == "inconclusive"  # one mixed group: no standard error
    assert rr["verdict"] == "refuted" and rows["sec7_rank2_intrinsic_from_zero_sum"][
        "real_run"] is None
    text = (out / "REPORT.md").read_text(encoding="utf-8")
    assert "model **TinyLM** (2.5M parameters)" in text and "R=8: 1/4" in text
    assert (out / rr["evidence_csv"]).is_file()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["command"].endswith(f"--real {f}")


_ROW0 = ('{"R": 2, "groups": 2, "mixed_groups": 1, "effective_rank_mean": 1.5, '
         '"effective_rank_sd": null, "top1_mean": 0.7, "top1_sd": null}')


def _file(summary: str = f"[{_ROW0}]", model: str = '{"name": "m"}') -> str:
    return (f'{{"experiment": "real_rank", "model": {model}, "main_estimator": "grpo", '
            f'"num_groups": 2, "summary": {summary}}}')


@pytest.mark.parametrize("content,message", [
    (None, "no such file"),
    ("{not json", "not valid JSON (Expecting property name"),
    ("[1, 2]", "not a `real rank` results.json (it holds a list, not an object)"),
    ('{"experiment": "real_train"}', "not a `real rank` results.json (experiment 'real_train')"),
    ('{"experiment": "real_trl_train", "model": {"name": "m"}, "summary": []}',
     "not a `real rank` results.json (experiment 'real_trl_train')"),
    ('{"experiment": "real_rank", "model": {"name": "m"}, "main_estimator": "grpo"}',
     "key 'summary' is missing"),
    (_file(_ROW0.join("[]").replace('"R": 2', '"R": "2"')),
     "summary[0].R must be an integer, got '2'"),
    (_file(_ROW0.join("[]").replace('"R": 2', '"R": 1')), "summary[0].R must be >= 2, got 1"),
    (_file(model='"m"'), "model must be an object, got 'm'"),
    (_file(model='{"name": ""}'), "model.name is empty"),
    (_file(model='{"name": "m", "num_parameters": 0}'), "model.num_parameters must be >= 1"),
    (_file("[]"), "summary has no rows"),
    (_file(f"[{_ROW0}, {_ROW0}]"), "summary holds R = [2, 2], some twice"),
    (_file(_ROW0.join("[]").replace('"mixed_groups": 1', '"mixed_groups": 3')),
     "summary[0].mixed_groups (3) exceeds summary[0].groups (2)"),
    (_file(_ROW0.join("[]").replace('"effective_rank_mean": 1.5', '"effective_rank_mean": null')),
     "summary[0] has 1 mixed groups but effective_rank_mean is null"),
    (_file(_ROW0.join("[]").replace('"top1_mean": 0.7', '"top1_mean": "inf"')),
     "summary[0].top1_mean must be finite, got inf"),
    (_file().replace('"num_groups": 2', '"num_groups": true'),
     "num_groups must be an integer, got True"),
])
def test_a_bad_real_file_is_one_line_naming_it_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
        message: str) -> None:
    from grpo_audit.cli import main

    f = tmp_path / "results.json"
    if content is not None:
        f.write_text(content, encoding="utf-8")
    out = tmp_path / "audit"
    assert main(["audit", "--out", str(out), "--real", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(f) in err and message in err, err
    assert not out.exists()
    with pytest.raises(RealRunError, match=re.escape(message)):
        read_real_rank(f)


def test_the_real_file_reader_imports_only_grpo_io_of_real_model() -> None:
    """``audit --real`` reads through ``real_model.run_io`` (the file's one schema) and stays
    cheap: ``real_model`` is lazy and ``run_io`` needs nothing but ``grpo_io``."""
    code = ("import sys, paper_checks.real_run; "
            "bad = [m for m in ('numpy', 'torch', 'transformers', 'matplotlib') if m in "
            "sys.modules] + [m for m in sys.modules if m.startswith('real_model.') and m != "
            "'real_model.run_io']; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_real_run_is_refused_for_a_paper_without_real_checks(tmp_path: Path,
                                                             capsys: Any) -> None:
    from grpo_audit.cli import main

    f = _rank_results(tmp_path / "run", {2: (2, 2, [2.0, 2.0], [0.5, 0.5])})
    assert main(["audit", "--paper", "fade", "--out", str(tmp_path / "a"), "--real",
                 str(f)]) == 2
    assert "no claim of --paper fade is decided on a real-model run" in capsys.readouterr().err


@pytest.mark.slow
def test_a_real_rank_run_of_the_tiny_model_is_read_and_decided(tmp_path: Path) -> None:
    """real rank's own output, from the tiny random model the pipeline tests use."""
    sys.path.insert(0, str(Path(__file__).parent))
    from real_pipeline_helpers import odd_reward, tiny_loaded

    from paper_checks.claims.s7_real_model import decide
    from real_model.rank import RankConfig, run_rank

    cfg = RankConfig(prompts=4, R_values=(2, 4), max_new_tokens=4, shots=1, stop_strings=("\n",))
    run_rank(tmp_path, cfg, loaded=tiny_loaded(), progress=False, reward_fn=odd_reward)
    run = read_real_rank(tmp_path / "results.json")
    assert run.model == "tiny" and [r.R for r in run.rows] == [2, 4]
    verdict = decide(run)["table1_empirical_values"]
    assert verdict.verdict in ("holds", "refuted", "inconclusive")
    assert verdict.evidence["R8_eff_rank_verdict"] == "inconclusive"  # R = 8 was not run


# --- progress -------------------------------------------------------------------------------------
def test_progress_line_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from paper_checks.cli import _progress_line

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert _progress_line() is None
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    show = _progress_line()
    show(0, 77, "eq15_grpo_gradient_is_unbiased_reinforce")
    show(77, 77, "")
    text = tty.getvalue()
    assert "checking claim 1/77: eq15_grpo_gradient_is_unbiased_reinforce" in text
    assert "77/77 claims checked" in text and text.endswith("\n")
