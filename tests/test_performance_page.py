"""docs/performance.md and the script that regenerates it (``benchmarks/performance.py``).

The page: every block is well formed (its command, machine and date lines and one Markdown table
whose rows have the header's number of cells) and every command it names exists, with options
its script or ``grpo-audit`` accepts. The script: its collectors on hand-made outputs (exact), and
a regeneration end to end on a temporary page with cheap commands (no benchmark runs here).
"""

from __future__ import annotations

import datetime
import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("performance", ROOT / "benchmarks" /
                                                  "performance.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["performance"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


PERF = _load()
BLOCKS = PERF.parse_page((ROOT / "docs" / "performance.md").read_text(encoding="utf-8"))


def test_the_page_has_blocks_and_its_doctests_pass() -> None:
    import doctest

    assert len(BLOCKS) >= 5
    res = doctest.testmod(PERF)
    assert res.attempted > 0 and res.failed == 0


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_names_its_commands_machine_and_date_over_a_well_formed_table(block) -> None:
    assert PERF.check_body(block) == []
    for run in block.runs:
        assert run in block.body or PERF.arguments(run) in block.body, (
            f"block {block.name}: the visible part does not show `{run}`")
    for note in block.notes:
        assert note in block.body


def _check_command(run: str) -> None:
    words = [w for w in shlex.split(run) if "=" not in w or w.startswith("-")]
    if words[0] == "grpo-audit":
        from grpo_audit.cli import build_parser

        build_parser().parse_args(words[1:])  # SystemExit(2) on an unknown option
        return
    script = next((w for w in words if w.endswith(".py")), None)
    assert script is not None, f"no script in `{run}`"
    source = (ROOT / script).read_text(encoding="utf-8")
    args = words[words.index(script) + 1:]
    unknown = [w for w in args if w.startswith("--") and f'"{w}"' not in source]
    assert not unknown, f"`{run}`: {script} has no option {unknown}"


@pytest.mark.parametrize("run", [r for b in BLOCKS for r in b.runs])
def test_every_command_of_the_page_exists_with_its_options(run: str) -> None:
    _check_command(run)


def test_command_check_catches_a_missing_script_or_option() -> None:
    with pytest.raises(FileNotFoundError):
        _check_command("python benchmarks/bench_nothing.py --rounds 3")
    with pytest.raises(AssertionError, match="no option"):
        _check_command("python benchmarks/bench_gram.py --no-such-option 3")
    with pytest.raises(SystemExit):
        _check_command("grpo-audit audit --out x --no-such-option")


# --- collectors (exact tier) --------------------------------------------------------------
def test_markdown_table_takes_the_last_table_and_refuses_output_without_one() -> None:
    out = "| a |\n|---|\n| 1 |\ntext\n| b | c |\n|---|---|\n| 2 | x \\| y |\n"
    assert PERF.markdown_table(out) == (["b", "c"], [["2", "x \\| y"]])
    with pytest.raises(ValueError, match="no Markdown table"):
        PERF.markdown_table("| not | a table |\nplain text")


def test_verl_table_reads_every_mode_line_and_refuses_other_output() -> None:
    out = ("verl 0.9.1, ...\nmode                     median step s   vs off  mean step s   vs off"
           "   paired in rounds (95% interval)\n"
           "off                             0.0500   1.000x       0.0510   1.000x   1.000x "
           "(1.000-1.000)\n"
           "in-run, per call                0.0687   1.374x       0.0700   1.373x   1.374x "
           "(1.300-1.400)\n(ratios: ...)\n")
    header, rows = PERF.verl_table(out)
    assert len(header) == 6 and [r[0] for r in rows] == ["off", "in-run, per call"]
    assert rows[1][5] == "1.374x (1.300-1.400)"
    with pytest.raises(ValueError, match="no mode table"):
        PERF.verl_table("nothing here")


def test_stack_needs_one_header_for_all_commands() -> None:
    with pytest.raises(ValueError, match="different columns"):
        PERF.stack([("--a", (["x"], [["1"]])), ("--b", (["y"], [["2"]]))])


# --- regeneration end to end --------------------------------------------------------------
def _page(tmp_path: Path, table_cmd: str) -> Path:
    page = tmp_path / "performance.md"
    page.write_text(
        "# P\n\n<!-- performance:begin name=t collect=table\n"
        f"run: {table_cmd}\nnote: a kept note\n-->\nold body\n<!-- performance:end -->\n\n"
        "<!-- performance:begin name=w collect=time\nrun: true\n-->\nuntouched\n"
        "<!-- performance:end -->\n", encoding="utf-8")
    return page


def test_regenerating_a_block_rewrites_it_alone_with_machine_date_and_notes(
        tmp_path: Path) -> None:
    printer = (f"{shlex.quote(sys.executable)} -c \"print('x'); print('| a | b |'); "
               "print('|---|---|'); print('| 1 | 2 |')\"")
    page = _page(tmp_path, printer)
    assert PERF.main(["t", "--page", str(page), "--machine", "test box"]) == 0
    text = page.read_text(encoding="utf-8")
    (t, w) = PERF.parse_page(text)
    assert PERF.check_body(t) == [] and w.body == "untouched\n"
    assert f"**Measured**: {datetime.date.today().isoformat()}" in t.body
    assert "**Machine**: test box" in t.body and "| 1 | 2 |" in t.body
    assert t.body.rstrip().endswith("a kept note")
    assert PERF.main(["w", "--page", str(page)]) == 0  # timed: wall, CPU, memory, this machine
    w = PERF.parse_page(page.read_text(encoding="utf-8"))[1]
    assert PERF.check_body(w) == [] and "| `true` |" in w.body and "load average" in w.body


def test_a_failing_command_leaves_the_page_as_it_was(tmp_path: Path) -> None:
    page = _page(tmp_path, "false")
    before = page.read_text(encoding="utf-8")
    assert PERF.main(["t", "--page", str(page), "--machine", "m"]) == 1
    assert page.read_text(encoding="utf-8") == before


def test_from_output_takes_the_table_from_a_log(tmp_path: Path) -> None:
    page = _page(tmp_path, "python benchmarks/bench_rollouts.py --repeat 1")
    log = tmp_path / "bench.log"
    log.write_text("| path | tokens/s |\n|---|---:|\n| old | 108 |\n| new | 175 |\n")
    assert PERF.main(["t", "--page", str(page), "--from-output", str(log), "--machine",
                      "one GPU", "--date", "2026-01-02"]) == 0
    t = PERF.parse_page(page.read_text(encoding="utf-8"))[0]
    assert PERF.check_body(t) == [] and "**Measured**: 2026-01-02" in t.body
    assert "| new | 175 |" in t.body
