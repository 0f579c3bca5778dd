"""Equivalence against the frameworks' OWN code (framework_checks).

TRL runs from the installed package (the ``trl`` extra; skipped without it). verl 0.9.1 and
OpenRLHF 0.11.2 run from their wheels' source files, with the heavy imports stubbed: set
``GRPO_AUDIT_WHEELS`` to a directory holding ``verl-0.9.1-*.whl`` and ``openrlhf-0.11.2-*.whl``
(``pip download --no-deps verl==0.9.1 openrlhf==0.11.2 -d DIR``); skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from framework_checks.audit import audit_framework
from framework_checks.load import load_framework

AGREE_FAMILIES = ("random normal", "random binary", "single success", "unequal lengths")


def _wheel(name: str) -> str:
    d = os.environ.get("GRPO_AUDIT_WHEELS")
    if not d:
        pytest.skip(f"set GRPO_AUDIT_WHEELS to a directory with the {name} wheel to run its code")
    hits = sorted(Path(d).glob(f"{name}-*.whl"))
    if not hits:  # the folder was named for this run: a missing wheel must not pass as a skip
        pytest.fail(f"no {name}-*.whl in GRPO_AUDIT_WHEELS={d}")
    return str(hits[-1])


def _source(fw: str) -> str | None:
    if fw == "trl":
        if importlib.util.find_spec("trl") is None:
            pytest.skip("trl is not installed (pip install grpo-audit[trl])")
        return None
    return _wheel(fw)


@pytest.fixture(scope="module", params=["trl", "verl", "openrlhf"])
def report(request: pytest.FixtureRequest) -> dict:
    return audit_framework(request.param, _source(request.param))


def test_every_mapped_setting_agrees_with_the_framework_on_ordinary_inputs(report: dict) -> None:
    for row in report["rows"]:
        for res in row["results"]:
            if res["family"] in AGREE_FAMILIES or row["kind"] == "loss":
                assert res["status"] == "agree", (report["framework"], row["setting"], res)


def test_every_trl_loss_type_of_the_conventions_table_is_audited(report: dict) -> None:
    from grpo_theory.conventions import TRL_LOSS_TYPES

    if report["framework"] != "trl":
        pytest.skip("the TRL loss-type table")
    audited = {r["setting"] for r in report["rows"] if r["kind"] == "loss"}
    assert {lt.setting for lt in TRL_LOSS_TYPES.values()} <= audited


def test_every_loss_mode_reduces_to_our_weights_at_ratio_one(report: dict) -> None:
    losses = [r for r in report["rows"] if r["kind"] == "loss"]
    assert losses
    for row in losses:
        assert row["agree"] == row["total"], row["setting"]


# documented values (docs/conventions.md): a constant float32 group is not exactly 0
CONSTANT_F32 = {
    "trl": {"[0.7]*16": 5.96e-4, "[123.456]*12": -0.132, "[123.456]*5": -0.0703},
    "verl": {"[0.7]*16": 0.0561, "[123.456]*12": -0.901, "[123.456]*5": -0.801},
    "openrlhf": {"[0.7]*16": 0.953, "[123.456]*12": -0.957, "[123.456]*5": -0.894},
}
CONSTANT_F64_123_456_X5 = {"trl": 1.42e-10, "verl": 1.42e-8, "openrlhf": 1.42e-5}
DEFAULT = {
    "trl": 'GRPOConfig(scale_rewards="group")',
    "verl": "algorithm.adv_estimator=grpo",
    "openrlhf": "--algo.advantage.estimator group_norm",
}


@pytest.mark.parametrize("fw", ["trl", "verl", "openrlhf"])
def test_constant_float32_groups_get_the_documented_nonzero_advantage(fw: str) -> None:
    f = load_framework(fw, _source(fw)).advantages[DEFAULT[fw]]
    for text, expected in CONSTANT_F32[fw].items():
        value, n = text.strip("[").split("]*")
        r = np.full((1, int(n)), float(value))
        got = f(r, np.full(r.shape, 3))
        assert np.allclose(got, expected, rtol=0.01), (fw, text, got)
    exact = f(np.full((1, 4), 1.0), np.full((1, 4), 3))  # 1.0 is exact in float32
    assert np.all(exact == 0.0)


@pytest.mark.parametrize("fw", ["trl", "verl", "openrlhf"])
def test_float64_overflow_gives_zero_where_grpo_theory_gives_plus_minus_0_7071(fw: str) -> None:
    from grpo_theory import compute_advantages

    f = load_framework(fw, _source(fw), dtype="float64").advantages[DEFAULT[fw]]
    r = np.array([[1e200, -1e200]])
    assert np.all(f(r, np.full(r.shape, 3)) == 0.0)
    assert np.allclose(compute_advantages("grpo_std", r), [[2**-0.5, -(2**-0.5)]])


@pytest.mark.parametrize("fw", ["trl", "verl", "openrlhf"])
def test_float64_constant_group_is_not_zero_either(fw: str) -> None:
    f = load_framework(fw, _source(fw), dtype="float64").advantages[DEFAULT[fw]]
    got = f(np.full((1, 5), 123.456), np.full((1, 5), 3))
    assert np.allclose(got, CONSTANT_F64_123_456_X5[fw], rtol=0.01)


def test_trl_nan_rewards_are_excluded_and_zeroed_like_nan_excluding_advantages() -> None:
    from grpo_theory import nan_excluding_advantages

    fc = load_framework("trl", _source("trl"), dtype="float64")
    r = np.array([[1.0, np.nan, 0.0, 1.0], [np.nan, 2.0, np.nan, np.nan], [0.3, 0.1, 0.9, 0.4]])
    L = np.full(r.shape, 3)
    got = fc.advantages['GRPOConfig(scale_rewards="group")'](r, L)
    ours = nan_excluding_advantages("grpo_std", r, ddof=1, eps=1e-4)
    # (TRL's nanstd Bessel factor count / (count - 1) is a float32 tensor: 1e-7 relative)
    assert np.allclose(got, ours, rtol=1e-7, atol=1e-12)
    rl = fc.advantages["RLOOConfig()"](r, L)
    assert np.allclose(rl, nan_excluding_advantages("rloo", r), rtol=1e-12, atol=1e-12)


def test_verl_remax_and_optimal_token_baseline_match_ours() -> None:
    import torch

    from grpo_theory import (
        optimal_token_baseline_advantages,
        remax_advantages,
    )

    fc = load_framework("verl", _source("verl"), dtype="float64")
    rng = np.random.default_rng(3)
    r, b = rng.normal(size=(2, 3)), rng.normal(size=2)
    L = rng.integers(1, 6, (2, 3))
    got = fc.extras["remax"](r, L, np.repeat(b, 3))
    assert np.allclose(got, remax_advantages(r, greedy_rewards=b), rtol=1e-12)
    # OTB on token-level inputs, groups of 3, verl's flat layout with an index
    P, R, T = 2, 3, 6
    L = np.array([[6, 2, 4], [3, 3, 1]])
    m = (np.arange(T)[None, None, :] < L[..., None]).astype(float)
    tok = np.zeros((P, R, T))
    for p in range(P):
        for i in range(R):
            tok[p, i, L[p, i] - 1] = rng.normal()
    pi, sp2 = rng.uniform(0.1, 0.9, (P, R, T)), rng.uniform(0.2, 0.6, (P, R, T))
    t = lambda x: torch.tensor(x.reshape(P * R, T))  # noqa: E731
    ref = fc.extras["optimal_token_baseline"](
        token_level_rewards=t(tok),
        response_mask=t(m),
        index=np.repeat(np.arange(P), R),
        old_log_probs=torch.log(t(pi)),
        sum_pi_squared=t(sp2),
    )[0]
    ours = optimal_token_baseline_advantages(tok, m, pi, sp2)
    assert np.allclose(ref.numpy().reshape(P, R, T), ours, rtol=1e-10, atol=1e-12)


def test_verl_groups_of_unequal_size_match_grouped_advantages() -> None:
    import torch

    from grpo_theory import grouped_advantages

    fc = load_framework("verl", _source("verl"), dtype="float64")
    fn = fc.extras["grpo_outcome"]
    r = np.array([1.0, 0.0, 0.5, 2.0, 0.0, 1.0, 3.0])
    ids = np.array([4, 4, 9, 9, 9, 2, 4])  # sizes 3, 3, 1 in any order
    out = fn(torch.tensor(r)[:, None], torch.ones(7, 1, dtype=torch.float64), ids)[0][:, 0]
    ours = grouped_advantages("grpo_std", r, ids, singleton="raw", ddof=1, eps=1e-6)
    ours[5] = r[5] / (1 + 1e-6)  # verl: one-sample group -> mean 0, std 1 -> r / (1 + eps)
    # (verl builds the one-sample mean 0, std 1 as float32 tensors, so 1 + 1e-6 is rounded)
    assert np.allclose(out.numpy(), ours, rtol=1e-6)


def test_source_may_be_a_wheel_a_directory_or_one_file(tmp_path: Path) -> None:
    import zipfile

    from framework_checks.source import FrameworkCodeError, find_source

    whl = _wheel("verl")
    with zipfile.ZipFile(whl) as zf:
        members = [n for n in zf.namelist() if n.startswith("verl/") and n.endswith(".py")]
        zf.extractall(tmp_path, members=members)
    by_wheel = find_source("verl", whl)
    by_dir = find_source("verl", tmp_path)
    by_file = find_source("verl", tmp_path / "verl/trainer/ppo/core_algos.py")
    assert by_wheel.version == "0.9.1"
    assert by_wheel.files == by_dir.files == by_file.files
    with pytest.raises(FrameworkCodeError, match="not one of"):
        find_source("verl", tmp_path / "verl/trainer/ppo/__init__.py")


@pytest.mark.parametrize(
    ("fw", "name"), [("trl", "TRL"), ("verl", "verl"), ("openrlhf", "OpenRLHF")]
)
def test_every_conventions_row_with_an_estimator_reproduces_the_framework(
    fw: str, name: str
) -> None:
    import inspect

    from grpo_theory import CONVENTIONS, compute_advantages, estimator_spec

    fc = load_framework(fw, _source(fw), dtype="float64")
    rng = np.random.default_rng(11)
    r = rng.normal(size=(3, 4))
    L = rng.integers(1, 9, (3, 4))
    rows = [c for c in CONVENTIONS if c.framework == name and c.estimator is not None]
    assert rows
    for c in rows:
        key = c.setting.replace(", norm_adv_by_std_in_grpo=True", "").replace(" (gamma=1)", "")
        got = fc.advantages[key](r, L)
        opts = dict(c.options)
        if "lengths" in inspect.signature(estimator_spec(c.estimator).fn).parameters:
            opts["lengths"] = L
        ours = np.asarray(compute_advantages(c.estimator, r, **opts))
        # TRL's Bessel factor is a float32 tensor (1e-7); verl's masked_mean adds 1e-8 to counts
        np.testing.assert_allclose(got, ours, rtol=2e-7, atol=1e-9, err_msg=c.setting)


def test_trl_gdpo_with_two_reward_functions_and_nan_matches_gdpo_advantages() -> None:
    from grpo_theory import gdpo_advantages

    fc = load_framework("trl", _source("trl"), dtype="float64")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 4, 2))
    x[0, 1, 0] = np.nan  # one function did not score this completion
    x[2, 3, :] = np.nan  # no function did: advantage 0
    got = fc.advantages['GRPOConfig(multi_objective_aggregation="normalize_then_sum")'](
        x, np.full((3, 4), 3)
    )
    # (TRL's nanstd Bessel factor is a float32 tensor: 1e-7 relative)
    np.testing.assert_allclose(got, gdpo_advantages(x), rtol=2e-7, atol=1e-9)
    assert got[2, 3] == 0.0
