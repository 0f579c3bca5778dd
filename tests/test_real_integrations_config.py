"""``real_model.integrations.config``: the one geometry config of every host, and its views."""

from __future__ import annotations

import dataclasses

import pytest

from real_model.integrations import config as gconfig
from real_model.integrations.verl.config import block_help


def test_every_option_has_help_and_the_hosts_read_their_own_options():
    names = {f.name for f in dataclasses.fields(gconfig.GeometryConfig)}
    assert all(f.metadata["help"] for f in dataclasses.fields(gconfig.GeometryConfig))
    trl = {f.name for f in gconfig.host_fields("trl")}
    verl = {f.name for f in gconfig.host_fields("verl")}
    assert trl | verl == names
    assert trl & verl == names - set(gconfig.HOSTS)  # the shared options
    assert "mode" in trl - verl and "second_pass_rows" in verl - trl


@pytest.mark.parametrize(("kw", "error", "field"), [
    ({"every": "2"}, TypeError, "every"), ({"every": 1.5}, TypeError, "every"),
    ({"every": True}, TypeError, "every"), ({"every": -1}, ValueError, "every"),
    ({"score_every": -2}, ValueError, "score_every"), ({"rtol": 2.0}, ValueError, "rtol"),
    ({"rtol": 0.0}, ValueError, "rtol"), ({"mode": "inrun"}, ValueError, "mode"),
    ({"weight_grads": "fast"}, ValueError, "weight_grads"),
    ({"jsonl_path": 3}, TypeError, "jsonl_path"), ({"strict": 1}, TypeError, "strict"),
    ({"success_threshold": float("inf")}, ValueError, "success_threshold"),
    ({"second_pass_rows": 0}, ValueError, "second_pass_rows"),
    ({"memory_budget_mb": 64.0}, ValueError, "memory_budget_mb")])  # needs grad_norm off
def test_a_bad_value_is_refused_at_construction_naming_its_option(kw, error, field):
    with pytest.raises(error, match=f"^{field}"):
        gconfig.GeometryConfig(**kw)


def test_measured_and_scored_steps_count_optimizer_then_measured_steps():
    cfg = gconfig.GeometryConfig(every=2, score_every=2)
    assert [s for s in range(9) if cfg.measures(s)] == [0, 2, 4, 6, 8]
    assert [s for s in range(9) if cfg.scores(s)] == [0, 4, 8]  # every 2nd measured step
    assert not any(gconfig.GeometryConfig().scores(s) for s in range(5))  # default 0: never
    assert not any(gconfig.GeometryConfig(every=0).measures(s) for s in range(5))  # off


def test_a_hosts_block_keeps_to_its_options():
    assert gconfig.from_mapping(None, host="verl") is None
    assert gconfig.from_mapping({"enable": False, "every": 3}, host="verl") is None
    assert gconfig.from_mapping({"every": 3}, host="verl") == gconfig.GeometryConfig(every=3)
    with pytest.raises(ValueError, match=r"unknown geometry option\(s\) \['group_order'\]"):
        gconfig.from_mapping({"group_order": True}, host="verl")


@pytest.mark.parametrize(("block", "error", "message"), [
    ({"every": "3"}, TypeError, r"every: must be an integer, got '3' \(str\)"),
    ({"every": True}, TypeError, r"every: must be an integer, got True \(bool\)"),
    ({"score_every": 1.0}, TypeError, "score_every: must be an integer"),
    ({"second_pass_rows": False}, TypeError, "second_pass_rows: must be an integer"),
    ({"rtol": float("nan")}, ValueError, "rtol: must be a finite number"),
    ({"success_threshold": float("-inf")}, ValueError, "success_threshold: must be a finite"),
    ({"success_threshold": "0.5"}, TypeError, "success_threshold: must be a number"),
    ({"keep_groups": "false"}, TypeError, "keep_groups: must be True or False"),
    ({"jsonl_path": 1}, TypeError, "jsonl_path: must be a string")])
def test_verls_block_refuses_a_bad_value_naming_its_key(block, error, message):
    with pytest.raises(error, match=f"^{message}"):
        gconfig.from_mapping(block, host="verl")


def test_verls_block_help_is_the_configs_own():
    keys = block_help()
    assert list(keys)[0] == "enable"
    for f in gconfig.host_fields("verl"):
        assert keys[f.name] == (f.default, f.metadata["help"])
    assert set(keys) == {"enable"} | {f.name for f in gconfig.host_fields("verl")}
