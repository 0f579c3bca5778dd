"""The frameworks' own diagnostics audited (``grpo-audit frameworks``): TRL's
``frac_reward_zero_std`` / ``reward_std`` from its installed code, verl's ``variance_proxy/*``
from its wheel (``GRPO_AUDIT_WHEELS``, as in ``test_framework_checks_equivalence.py``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from framework_checks.diagnostics_audit import audit_diagnostics, render_diagnostics
from framework_checks.source import FILES


def _trl() -> None:
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pip install grpo-audit[trl])")


def _verl_wheel() -> str:
    d = os.environ.get("GRPO_AUDIT_WHEELS")
    if not d:
        pytest.skip("set GRPO_AUDIT_WHEELS to a directory with the verl wheel to run its code")
    hits = sorted(Path(d).glob("verl-*.whl"))
    if not hits:
        pytest.fail(f"no verl-*.whl in GRPO_AUDIT_WHEELS={d}")
    return str(hits[-1])


@pytest.fixture(scope="module")
def trl_audit() -> dict:
    _trl()
    return audit_diagnostics("trl")


@pytest.fixture(scope="module")
def verl_audit() -> dict:
    return audit_diagnostics("verl", _verl_wheel())


def _row(audit: dict, setting: str, case: str) -> dict:
    return next(r for r in audit["rows"] if setting in r["setting"] and r["case"] == case)


# --- TRL ------------------------------------------------------------------------------------------
def test_trl_frac_reward_zero_std_is_per_group_under_group_and_none_scaling(trl_audit: dict
                                                                           ) -> None:
    for sr in ('"group"', '"none"'):
        r = _row(trl_audit, f"scale_rewards={sr}", "binary, 3 of 8 groups all-or-nothing")
        assert r["frac_reward_zero_std"] == pytest.approx(3 / 8) == r["dead_share"]


def test_trl_frac_reward_zero_std_is_a_batch_flag_under_batch_scaling_and_normalize_then_sum(
        trl_audit: dict) -> None:
    for setting in ('scale_rewards="batch"', "normalize_then_sum"):
        rows = [r for r in trl_audit["rows"] if setting in r["setting"]]
        assert {r["frac_reward_zero_std"] for r in rows} <= {0.0, 1.0}
        r = _row(trl_audit, setting, "binary, 3 of 8 groups all-or-nothing")
        assert r["frac_reward_zero_std"] == 0.0 and r["dead_share"] == pytest.approx(3 / 8)
    # every group dead, yet the batch has spread: TRL reads 0 under batch scaling
    r = _row(trl_audit, 'scale_rewards="batch"', "binary, every group all-or-nothing")
    assert (r["frac_reward_zero_std"], r["dead_share"]) == (0.0, 1.0)


def test_trl_counts_tiny_but_live_groups_as_zero_std(trl_audit: dict) -> None:
    r = _row(trl_audit, 'scale_rewards="group"', "continuous, scale 1e-9")
    assert (r["frac_reward_zero_std"], r["dead_share"]) == (1.0, 0.0)


def test_trl_reward_std_is_the_batch_std_not_the_within_group_std(trl_audit: dict) -> None:
    for r in trl_audit["rows"]:
        assert r["reward_std"] == pytest.approx(r["batch_std"], rel=1e-5, abs=1e-7)
    r = _row(trl_audit, 'scale_rewards="group"', "binary, every group all-or-nothing")
    assert r["reward_std"] > 0.5 and r["within_std"] == 0.0


def test_trl_findings_say_what_each_setting_measures(trl_audit: dict) -> None:
    text = render_diagnostics(trl_audit)
    assert "| setting | rewards | frac_reward_zero_std |" in text
    f = trl_audit["findings"]
    assert len(f) == 6
    assert "scale_rewards=\"batch\")` is a batch flag" in f[1]
    assert "scale_rewards=\"group\")` is the share of groups" in f[0]
    assert "normalize_then_sum\")` is a batch flag" in f[3]
    assert f[-1].startswith("`reward_std` is the std of the summed rewards over the whole batch")


def test_a_trl_without_the_metric_lines_is_reported_not_raised(tmp_path: Path) -> None:
    _trl()
    import trl

    root = Path(trl.__file__).parent.parent
    for rel in FILES["trl"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, tmp_path / rel)
    f = tmp_path / "trl/trainer/grpo_trainer.py"
    f.write_text(f.read_text().replace('["frac_reward_zero_std"]', '["zero_std_share"]'))
    out = audit_diagnostics("trl", str(tmp_path))
    assert "error" in out and "frac_reward_zero_std" in out["error"]
    assert "not run" in render_diagnostics(out)
    assert audit_diagnostics("openrlhf") is None and render_diagnostics(None) == ""


# --- verl -----------------------------------------------------------------------------------------
def test_verl_proxies_are_exact_where_their_formula_holds(verl_audit: dict) -> None:
    c = next(c for c in verl_audit["cases"]
             if c["world"] == "tabular" and c["loss_agg_mode"] == "seq-mean-token-sum")
    assert c["grad_matches_minus_gbar"]
    for k in ("proxy1", "proxy2", "proxy3", "snr"):
        assert c["ratio"][k] == pytest.approx(1.0, abs=1e-6), k
    w = c["w_over_exact_per_sequence"]
    assert w["min"] == pytest.approx(1.0, abs=1e-12) and w["max"] == pytest.approx(1.0, abs=1e-12)


def test_verl_proxy1_under_token_mean_is_scaled_by_the_mean_length(verl_audit: dict) -> None:
    for c in verl_audit["cases"]:
        if c["loss_agg_mode"] == "token-mean":
            assert not c["grad_matches_minus_gbar"]
            assert c["ratio"]["proxy1"] == pytest.approx(c["token_mean_scale"], rel=1e-12)
            assert c["token_mean_scale"] == pytest.approx((c["sequences"] / c["tokens"]) ** 2)


def test_verl_proxy2_misses_the_jacobian_on_networks(verl_audit: dict) -> None:
    nets = [c for c in verl_audit["cases"] if c["world"] != "tabular"]
    assert nets
    for c in nets:
        assert abs(c["ratio"]["proxy2"] - 1.0) > 0.5
        assert c["w_over_exact_per_sequence"]["max"] > c["w_over_exact_per_sequence"]["min"]


def test_verl_clamp_is_reported_when_it_happens(verl_audit: dict) -> None:
    for c in verl_audit["cases"]:
        assert c["proxy3_clamped"] == (c["verl"]["proxy2"] < c["verl"]["proxy1"])
        if c["proxy3_clamped"]:
            assert c["verl"]["proxy3"] == 0.0 and c["exact"]["proxy3"] > 0
            assert np.isinf(c["verl"]["snr"])
    text = render_diagnostics(verl_audit)
    assert "| policy | loss_agg_mode | proxy1 (signal) |" in text
    assert len(verl_audit["findings"]) == 5


def test_verl_exact_side_equals_one_backward_per_sequence() -> None:
    torch = pytest.importorskip("torch")
    from framework_checks.diagnostics_verl import _flat_grads

    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(a @ b) * (a**2).sum(1)
    batched = _flat_grads(y, [a, b])
    loop = np.stack([_flat_grads(y[i], [a, b]) for i in range(3)])
    np.testing.assert_allclose(batched, loop, rtol=1e-13, atol=1e-15)
