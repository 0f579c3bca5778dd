"""Under FSDP2 with several processes the second pass runs only when every process would run the
same forwards (each forward is collective): :func:`real_model.integrations.trl.rows.second_pass_
shape` and the meter's agreement step. No TRL needed: the process exchange is replaced by a
list."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import real_model.gram as gram
from real_model.integrations import collectives
from real_model.integrations import config as gconfig
from real_model.integrations.trl import meter
from real_model.integrations.trl import rows as trl_rows


def _rows(weights: list[list[float]], mask: list[list[int]],
          group: list[int]) -> trl_rows.GeometryRows:
    w = torch.tensor(weights, dtype=torch.float64)
    m = torch.tensor(mask, dtype=torch.float64)
    n, t = w.shape
    return trl_rows.GeometryRows(
        input_ids=torch.zeros(n, t, dtype=torch.long), attention_mask=torch.ones(n, t),
        position_ids=torch.arange(t).repeat(n, 1), loss_mask=m, weights=w,
        rewards=np.zeros(n), advantages=np.zeros(n), group=np.asarray(group),
        local=np.ones(n, dtype=bool), row=np.arange(n))


def test_second_pass_shape_counts_passes_and_forwards_by_hand():
    mask = [[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 1]]
    # u_i = a_i m_i on every row (one pass), two groups with a nonzero weight
    prop = _rows([[0, 2, 2], [0, -1, 0], [0, 3, 3], [0, 0.5, 0.5]], mask, [0, 0, 1, 1])
    assert trl_rows.second_pass_shape(prop, grad_norm=False) == (1, 2)
    assert trl_rows.second_pass_shape(prop, grad_norm=True) == (1, 1)  # the full Gram: one forward
    # token weights not proportional to the mask (a ratio-weighted loss): score pass + weight pass
    other = _rows([[0, 2, 1], [0, -1, 0], [0, 0, 0], [0, 0, 0]], mask, [0, 0, 1, 1])
    assert trl_rows.second_pass_shape(other, grad_norm=False) == (2, 1)  # group 1 has no gradient
    zero = _rows([[0, 0, 0]] * 4, mask, [0, 0, 1, 1])
    assert trl_rows.second_pass_shape(zero, grad_norm=False) == (0, 0)
    assert trl_rows.second_pass_shape(None, grad_norm=False) is None


class _Meter:
    """The meter's agreement step with its process exchange replaced (``others``: the other
    processes' payloads, gathered after this process's own)."""

    def __init__(self, others: list[dict], *, mode: str = "second_pass") -> None:
        self.others = others
        self.config = gconfig.GeometryConfig(mode=mode, grad_norm=False)
        self.trainer = SimpleNamespace(
            accelerator=SimpleNamespace(unwrap_model=lambda m: m, num_processes=1 + len(others)),
            model=torch.nn.Linear(1, 1))

    def _agree(self, payload):  # the order of the processes does not matter here
        return [payload, *self.others]

    def _agree_collective_pass(self, rows, err):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(collectives, "all_gather", self._agree)
            return meter._agree_collective_pass(self.trainer, self.config, rows, err)


@pytest.fixture
def sharded(monkeypatch):
    monkeypatch.setattr(gram, "fsdp_sharded", lambda model: True)


def test_processes_that_agree_run_the_collective_pass_one_group_per_forward(sharded):
    rows = _rows([[0, 1, 1], [0, -1, -1]], [[0, 1, 1], [0, 1, 1]], [0, 0])
    meter = _Meter([{"err": None, "shape": (1, 1)}])
    assert meter._agree_collective_pass(rows, None) == (None, True)


def test_processes_that_disagree_all_skip_with_one_reason(sharded):
    rows = _rows([[0, 1, 1], [0, -1, -1]], [[0, 1, 1], [0, 1, 1]], [0, 0])
    err, collective = _Meter([{"err": None, "shape": (0, 0)}])._agree_collective_pass(rows, None)
    assert collective and "FSDP2" in err and "(1, 1)" in err and "(0, 0)" in err


def test_an_error_on_another_process_skips_the_pass_here_too(sharded):
    rows = _rows([[0, 1, 1], [0, -1, -1]], [[0, 1, 1], [0, 1, 1]], [0, 0])
    meter = _Meter([{"err": "exchange failed on process 1", "shape": None}])
    assert meter._agree_collective_pass(rows, None) == ("exchange failed on process 1", True)
    # and this process's own error reaches the others through the same exchange
    here = _Meter([{"err": None, "shape": (1, 1)}])
    assert here._agree_collective_pass(None, "boom")[0] == "boom"


def test_without_fsdp_no_exchange_happens(monkeypatch):
    monkeypatch.setattr(gram, "fsdp_sharded", lambda model: False)

    class NoExchange(_Meter):
        def _agree(self, payload):
            raise AssertionError("exchanged without FSDP")

    assert NoExchange([{}])._agree_collective_pass(None, "e") == ("e", False)
