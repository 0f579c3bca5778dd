"""Defects found in review of the #8-#13 merge; each test failed before its fix."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import grpo_theory as gt
from grpo_theory.bernoulli import advantage_values


def test_opo_exact_and_linear_forms_match_the_float_form_for_one_sample_groups():
    # R = 1: opo's baseline is 0, so a success has advantage 1 and a failure 0 (hand-checked).
    assert advantage_values("opo", R=1, k=1) == (1, None)
    assert advantage_values("opo", R=1, k=1, exact=False) == (1.0, None)
    assert advantage_values("opo", R=1, k=0) == (None, 0)
    from grpo_theory.registry import estimator_spec

    assert estimator_spec("opo").linear(1) == (1, 0, 0)


def test_gdpo_refuses_non_finite_weights_by_name():
    rewards = [[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]
    with pytest.raises(ValueError, match="weights must be finite"):
        gt.gdpo_advantages(rewards, weights=[float("nan"), 1.0])
    with pytest.raises(ValueError, match="weights must be finite"):
        gt.gdpo_advantages(rewards, weights=[float("inf"), 1.0])


def test_batch_std_raises_only_when_the_whole_batch_is_constant():
    # batch std of [1,1,0,1] (ddof=1) = 0.5; the constant group [1,1] has advantage 0 / 0.5 = 0.
    A = gt.grpo_std_advantages([[1.0, 1.0], [0.0, 1.0]], std_scope="batch", on_zero_std="raise")
    np.testing.assert_allclose(np.asarray(A), [[0.0, 0.0], [-1.0, 1.0]])
    with pytest.raises(ValueError, match="zero-variance"):
        gt.grpo_std_advantages([[1.0, 1.0], [1.0, 1.0]], std_scope="batch", on_zero_std="raise")


def test_exact_grpo_std_refuses_a_non_integer_ddof_like_the_float_form():
    with pytest.raises(TypeError, match="ddof"):
        advantage_values("grpo_std", R=3, k=1, ddof=1.5)
    with pytest.raises(TypeError, match="ddof"):
        advantage_values("grpo_std", R=3, k=1, ddof=1.5, exact=False)


def test_cli_reports_a_type_error_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_audit", "tables", "exact-advantage-tail", "--p", "0.5",
         "--estimator", "grpo_std", "--R", "4", "--eps", "0.3", "--option", "ddof=[1]"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("grpo-audit: error:") and "ddof" in proc.stderr


def test_exact_probability_tables_are_never_marked_vacuous_in_csv_or_latex():
    from grpo_audit.render import bound_table_csv, bound_table_latex

    # R=2, eps=0.2: the exact sup tail is 1 (= 1, a probability, not a vacuous bound).
    t = gt.bound_table("exact-baseline-tail", R_values=[2], eps_values=[0.2])
    assert float(t.values[0, 0]) == 1.0
    assert bound_table_csv(t).splitlines()[1].split(",")[3] == "0"
    assert "dagger" not in bound_table_latex(t)
    h = gt.bound_table("hoeffding", R_values=[2], eps_values=[0.2])  # 2 exp(-0.16) = 1.70 >= 1
    assert bound_table_csv(h).splitlines()[1].split(",")[3] == "1"
    assert "vacuous" in bound_table_latex(h)


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
