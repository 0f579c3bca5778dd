"""The project's own files: those a new user looks for (licence, citation, changelog, install
notes), the words of docs and code, and pyproject's pytest configuration."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_file_is_the_apache_2_text_pyproject_declares() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    lic = _pyproject()["project"]["license"]
    assert (lic if isinstance(lic, str) else lic["text"]) == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) >= 200  # the full text, not a pointer to it


def test_citation_cff_matches_the_package_version_and_licence() -> None:
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    version = _pyproject()["project"]["version"]
    assert re.search(r"^cff-version: 1\.2\.0$", cff, re.M)
    assert re.search(rf"^version: {re.escape(version)}$", cff, re.M)
    assert re.search(r"^license: Apache-2\.0$", cff, re.M)
    assert "2606.29238" in cff  # the audited paper is cited


def test_changelog_lists_the_current_version() -> None:
    log = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in log
    assert f"## [{_pyproject()['project']['version']}]" in log


def test_readme_says_which_torch_build_to_install() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "https://download.pytorch.org/whl/cpu" in readme
    assert "https://download.pytorch.org/whl/cu" in readme


def test_docs_and_code_speak_of_the_project_not_of_a_team() -> None:
    # internal team notes ("shared with four other engineers", "engineer C") do not belong in
    # what users read: docs, README and the packages' source
    pattern = re.compile(r"\bengineers?\b|\bcolleagues?\b|\bteammates?\b|\bour team\b", re.I)
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for pkg in ("grpo_theory", "grpo_io", "grpo_audit", "sims", "real_model", "paper_checks"):
        files += sorted((ROOT / pkg).rglob("*.py"))
    hits = [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "\n".join(hits)


# --- pytest configuration ------------------------------------------------------------------------
def test_pytest_turns_runtime_warnings_from_the_library_modules_into_errors() -> None:
    """pyproject's filterwarnings entry: a RuntimeWarning attributed to one of the library's
    modules fails the test; the same warning from another module does not."""
    import warnings

    code = "import numpy as np\ndef f():\n    return np.float64(1e308) * 10.0\n"
    for module in ("grpo_theory.advantages", "sims.checks", "real_model", "grpo_io.locks",
                   "paper_checks.report", "framework_checks.audit", "paper_values",
                   "grpo_audit.cli"):
        ns: dict[str, Any] = {"__name__": module}
        exec(compile(code, f"<{module}>", "exec"), ns)
        with pytest.raises(RuntimeWarning, match="overflow"):
            ns["f"]()
    ns = {"__name__": "somebody_else"}
    exec(compile(code, "<somebody_else>", "exec"), ns)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        warnings.filterwarnings(
            "error", category=RuntimeWarning,
            module="(grpo_io|paper_values|grpo_theory|sims|real_model|paper_checks|"
                   "framework_checks|grpo_audit)([.]|$)",
        )
        assert ns["f"]() == float("inf")
    assert [w.category for w in seen] == [RuntimeWarning]
