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
    assert (tmp_path / "frameworks.md").read_text().startswith(f"### trl {version}")


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
