"""``grpo-audit frameworks``: runs TRL's own code (the ``trl`` extra) and writes its table."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from pathlib import Path

import pytest

from framework_checks import battery as battery_module
from framework_checks import cli as frameworks


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="grpo-audit")
    frameworks.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_frameworks_command_prints_and_writes_the_trl_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("trl", reason="trl is not installed (pip install grpo-audit[trl])")
    args = _parse(["frameworks", "--framework", "trl", "--out", str(tmp_path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    version = importlib.metadata.version("trl")
    assert f"### trl {version} (float32" in out
    assert '`GRPOConfig(scale_rewards="group")`' in out
    assert "constant [0.7]*16" in out  # the edge-value table
    data = json.loads((tmp_path / "frameworks.json").read_text())
    (rep,) = data["reports"]
    assert rep["version"] == version and rep["dtype"] == "float32"
    settings = {r["setting"] for r in rep["rows"]}
    assert 'GRPOConfig(loss_type="sapo")' in settings and "RLOOTrainer loss" in settings
    md = (tmp_path / "frameworks.md").read_text()
    assert md.startswith(f"### trl {version}")
    conclusion = md.split("\n\n")[1]  # the paragraph under the heading opens the report
    s = rep["summary"]
    assert conclusion.startswith(f"**Conclusion.** trl {version} (float32): {s['agree']} of "
                                 f"{s['settings']} settings agree with grpo_theory")
    assert s["settings"] == len(rep["rows"]) and conclusion in out
    assert all(f"`{d['setting']}`" in conclusion for d in s["differences"])


def test_frameworks_command_names_a_missing_source() -> None:
    args = _parse(["frameworks", "--framework", "verl", "--source", "/nonexistent/core_algos.py"])
    with pytest.raises(ValueError, match="--source .*core_algos.py: no such file or folder"):
        frameworks.run(args)
    with pytest.raises(ValueError, match="--source needs --framework"):
        frameworks.run(_parse(["frameworks", "--source", "x.whl"]))


def test_battery_is_fixed_and_covers_every_edge_case_family() -> None:
    a, b = battery_module.battery(), battery_module.battery()
    assert [c.name for c in a] == [c.name for c in b]
    for x, y in zip(a, b, strict=True):
        assert ((x.rewards == y.rewards) | (x.rewards != x.rewards)).all()
    families = {c.family for c in a}
    for fam in (
        "random normal",
        "constant",
        "single success",
        "singletons",
        "NaN in a group",
        "huge scale",
        "tiny scale",
        "overflow",
        "unequal lengths",
        "empty completions",
    ):
        assert fam in families, fam


def test_frameworks_cli_module_imports_no_numpy() -> None:
    import subprocess
    import sys

    code = "import sys, framework_checks.cli; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_source_without_the_expected_functions_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "verl" / "trainer" / "ppo" / "core_algos.py"
    f.parent.mkdir(parents=True)
    f.write_text("import torch\n\ndef agg_loss():\n    pass\n")
    (tmp_path / "verl" / "utils").mkdir()
    (tmp_path / "verl" / "utils" / "torch_functional.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="verl unknown .*cannot load its code"):
        frameworks.run(_parse(["frameworks", "--framework", "verl", "--source", str(f)]))


def _report(differences: list[dict]) -> dict:
    rows = [{"setting": "A", "discrepancies": {}}, {"setting": "B", "discrepancies": {"x": {}}},
            {"setting": "C", "discrepancies": {"x": {}}}]
    return {"framework": "fw", "version": "1.0", "dtype": "float32",
            "summary": {"settings": len(rows), "agree": 1, "differences": differences}}


def _diff(setting: str, status: str, family: str, **kw: object) -> dict:
    from framework_checks.audit import ORDINARY_FAMILIES

    return {"setting": setting, "kind": f"{status} ({family})", "status": status,
            "family": family, "ordinary": family in ORDINARY_FAMILIES, "cases": 1,
            "max_abs_diff": 0.5, "example": "case", "framework": None, "grpo_theory": None,
            "framework_nonfinite": None, "error": None, **kw}


def test_conclusion_counts_agreeing_settings_and_words_each_difference() -> None:
    from framework_checks.report import conclusion

    text = conclusion(_report([
        _diff("B", "grpo_theory refuses", "NaN group", framework_nonfinite=True),
        _diff("B", "differs", "constant", cases=4, max_abs_diff=0.13,
              example="constant [123.456]*5", framework=-0.0703, grpo_theory=0.0),
        _diff("B", "grpo_theory refuses", "singletons", framework_nonfinite=False),
        _diff("C", "framework raises", "random normal", error="RuntimeError: boom"),
    ]))
    assert text == (
        "**Conclusion.** fw 1.0 (float32): 1 of 3 settings agree with grpo_theory on every case "
        "of the battery; 1 differ on ordinary inputs and 1 only on edge cases. `B`: on groups "
        "whose rewards are all equal it differs by up to 0.13 (4 cases; e.g. constant "
        "[123.456]*5: framework -0.0703, grpo_theory 0); grpo_theory refuses groups whose "
        "rewards are all NaN and one-completion groups (R=1) by design, where the framework "
        "returns NaN or inf on some and finite values on others. `C`: on ordinary groups of "
        "normal rewards it raises (1 case: RuntimeError: boom)."
    )
    assert "\n" not in text
    all_agree = _report([])
    all_agree["summary"]["agree"] = 3
    assert conclusion(all_agree).endswith("3 of 3 settings agree with grpo_theory on every case "
                                          "of the battery.")
