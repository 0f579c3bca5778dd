"""real_model.trl_train: a missing ``trl`` extra and bad sampling options are messages, before
any work."""

from __future__ import annotations

import sys

import pytest


def test_trl_train_without_the_extra_is_a_message_naming_it(monkeypatch, tmp_path):
    from real_model.trl_train import TRLTrainConfig, run_trl_train

    monkeypatch.setitem(sys.modules, "trl", None)  # makes `import trl` raise ImportError
    with pytest.raises(ValueError, match=r"trl extra"):
        run_trl_train(tmp_path / "out", TRLTrainConfig())


def test_trl_train_checks_sampling_options_before_any_work(tmp_path):
    pytest.importorskip("trl")
    from real_model.trl_train import TRLTrainConfig, run_trl_train

    with pytest.raises(ValueError, match="top_p"):
        run_trl_train(tmp_path / "out", TRLTrainConfig(top_p=1.5))
    assert not (tmp_path / "out").exists()
