"""``real_model.integrations.verl.cpu`` without verl: the savers that several processes call on one
path."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from real_model.integrations.verl import cpu as vc  # noqa: E402


def test_save_tiny_llama_writes_a_loadable_model_once(tmp_path):
    path = vc.save_tiny_llama(tmp_path / "tiny", hidden=16, layers=1, vocab=32)
    first = (path / "config.json").stat().st_mtime_ns
    assert vc.save_tiny_llama(path, hidden=16, layers=1, vocab=32) == path
    assert (path / "config.json").stat().st_mtime_ns == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_a_saver_whose_rename_is_overtaken_keeps_the_winners_files(tmp_path, monkeypatch):
    """The race as ``torchrun`` met it: the other process renames its copy into place after this
    one found the path free and before its own rename (which then fails: the target is a
    non-empty folder)."""
    path = tmp_path / "tiny"
    rename = Path.rename

    def overtaken(self: Path, target: Path) -> Path:
        if Path(target) == path and not path.exists():
            path.mkdir()
            (path / "written_by_the_winner").write_text("kept")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", overtaken)
    assert vc.save_tiny_llama(path, hidden=16, layers=1, vocab=32) == path
    assert [p.name for p in path.iterdir()] == ["written_by_the_winner"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
