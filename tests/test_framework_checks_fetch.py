"""``grpo-audit frameworks`` without the framework installed: the pinned wheel, fetched once.

No network: ``pip`` is replaced by a stand-in that copies a wheel (a small one built here, its
pin patched to match) or fails as pip does offline. The pins themselves are checked against
``pyproject.toml``'s extras, and the end-to-end run from the real wheel (``GRPO_AUDIT_WHEELS``,
as in ``test_framework_checks_equivalence.py``) is in the slow tier.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from framework_checks import cli as frameworks
from framework_checks import fetch, source
from framework_checks.fetch import PINNED, PinnedWheel, pinned_wheel
from framework_checks.source import FrameworkCodeError

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="grpo-audit")
    frameworks.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_pins_are_the_versions_pyproject_pins() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for fw in ("trl", "verl"):
        assert PINNED[fw].requirement(fw) in extras[fw]
    for fw, pin in PINNED.items():
        assert pin.filename.startswith(f"{fw}-{pin.version}-") and pin.filename.endswith(".whl")


@pytest.fixture
def fake_trl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A wheel named like trl's, with its pin patched to that wheel's SHA-256; the cache under
    ``tmp_path``."""
    wheel = tmp_path / "dist" / PINNED["trl"].filename
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("trl/trainer/grpo_trainer.py", "x = 1\n")
        zf.writestr("trl-1.16.0.dist-info/METADATA", "Name: trl\nVersion: 1.16.0\n")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    monkeypatch.setitem(PINNED, "trl", PinnedWheel("1.16.0", wheel.name, digest))
    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "cache"))
    return wheel


REAL_RUN = subprocess.run


class FakePip:
    """Stands in for ``subprocess.run`` of ``pip download``: copies ``wheel`` into ``--dest``,
    or fails with ``stderr`` as pip does (any other command runs as usual)."""

    def __init__(self, wheel: Path | None = None, stderr: str = "") -> None:
        self.wheel, self.stderr, self.calls = wheel, stderr, []

    def __call__(self, cmd: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        if not (isinstance(cmd, list) and cmd[1:4] == ["-m", "pip", "download"]):
            return REAL_RUN(cmd, **kw)
        self.calls.append(cmd)
        if self.wheel is None:
            return subprocess.CompletedProcess(cmd, 1, "", self.stderr)
        shutil.copy(self.wheel, Path(cmd[cmd.index("--dest") + 1]) / self.wheel.name)
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")


def test_missing_wheel_is_fetched_once_after_saying_so(fake_trl: Path) -> None:
    said: list[str] = []
    pip = FakePip(fake_trl)
    got = pinned_wheel("trl", say=said.append, run=pip)
    assert got == fetch.wheel_cache() / fake_trl.name and got.read_bytes() == fake_trl.read_bytes()
    (cmd,) = pip.calls
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and cmd[-1] == "trl==1.16.0"
    (line,) = said
    assert line.startswith("trl is not installed here: fetching its pinned wheel trl==1.16.0")
    assert str(fetch.wheel_cache()) in line and "\n" not in line
    assert pinned_wheel("trl", say=said.append, run=pip) == got  # cached: no second download
    assert len(pip.calls) == 1 and len(said) == 1
    assert [p.name for p in fetch.wheel_cache().iterdir()] == [fake_trl.name]  # no leftovers


def test_offline_failure_is_one_line_with_the_exact_fix(fake_trl: Path) -> None:
    pip = FakePip(stderr="WARNING: Retrying...\nERROR: Could not find a version that satisfies "
                         "the requirement trl==1.16.0 (from versions: none)\n")
    with pytest.raises(FrameworkCodeError) as e:
        pinned_wheel("trl", say=lambda _: None, run=pip)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("could not download trl==1.16.0 (pip: ERROR: Could not find a version")
    assert "; fix: pip install -e '.[trl]', or on a machine with network `pip download " in msg
    assert "pip download --no-deps trl==1.16.0" in msg and f"--source {fake_trl.name}" in msg
    assert list(fetch.wheel_cache().iterdir()) == []  # nothing half-written kept


def test_a_wheel_with_another_hash_is_refused_and_not_kept(
    fake_trl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PINNED, "trl", PinnedWheel("1.16.0", fake_trl.name, "0" * 64))
    with pytest.raises(FrameworkCodeError, match="has SHA-256 .* not the pinned 0000"):
        pinned_wheel("trl", say=lambda _: None, run=FakePip(fake_trl))
    assert list(fetch.wheel_cache().iterdir()) == []


def test_openrlhf_has_no_extra_so_its_fix_is_its_pin_or_source() -> None:
    fix = fetch.missing_framework_fix("openrlhf")
    assert fix.startswith("pip install --no-deps openrlhf==0.11.2 (Linux x86-64, Python 3.11")
    assert "--platform manylinux1_x86_64" in fix and fix.endswith(
        "--source openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl")


def _not_installed(monkeypatch: pytest.MonkeyPatch, framework: str) -> None:
    real = source._installed

    def fake(fw: str) -> source.SourceTree:
        if fw == framework:
            raise FrameworkCodeError(f"{fw} is not importable here")
        return real(fw)

    monkeypatch.setattr(source, "_installed", fake)


def test_no_download_names_the_fix_in_one_line(
    fake_trl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _not_installed(monkeypatch, "trl")
    with pytest.raises(ValueError) as e:
        frameworks.run(_parse(["frameworks", "--framework", "trl", "--no-download"]))
    assert "--no-download was given; fix: pip install -e '.[trl]'" in str(e.value)
    assert "\n" not in str(e.value)


def test_frameworks_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ValueError, match="torch is not installed here; install it first"):
        frameworks.run(_parse(["frameworks", "--framework", "trl"]))


@pytest.mark.slow
def test_frameworks_trl_not_installed_fetches_its_wheel_and_opens_with_a_conclusion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = os.environ.get("GRPO_AUDIT_WHEELS")
    if not wheels or not (Path(wheels) / PINNED["trl"].filename).is_file():
        pytest.skip("set GRPO_AUDIT_WHEELS to a folder holding " + PINNED["trl"].filename)
    monkeypatch.setenv("GRPO_AUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch.subprocess, "run", FakePip(Path(wheels) / PINNED["trl"].filename))
    _not_installed(monkeypatch, "trl")
    out = tmp_path / "out"
    assert frameworks.run(_parse(["frameworks", "--framework", "trl", "--out", str(out)])) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("trl is not installed here: fetching its pinned wheel")
    heading, conclusion = captured.out.split("\n\n")[:2]
    assert heading.startswith("### trl 1.16.0 (float32; source ") and "cache" in heading
    assert conclusion.startswith("**Conclusion.** trl 1.16.0 (float32): ")
    rep = json.loads((out / "frameworks.json").read_text())["reports"][0]
    assert f"{rep['summary']['agree']} of {rep['summary']['settings']} settings" in conclusion
    diagnostics = rep["diagnostics"]  # read from the same fetched wheel, not the installed package
    assert diagnostics is not None and "error" not in diagnostics and diagnostics["rows"]
