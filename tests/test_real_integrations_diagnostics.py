"""The protocol's training diagnostics (``integrations.protocol``): the sums of whole groups of
any sizes, merged as scalars, equal the diagnostics of all the groups at once; rows without
gradient are zero rows; the log entries leave out what the hosts already log and every undefined
value; ``diagnostics.png`` says in words when the ``|mu|^2`` estimate is not positive."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_theory.diagnostics import step_diagnostics
from real_model.integrations.protocol import (
    DIAGNOSTICS_UNLOGGED,
    diagnostic_sums,
    diagnostics_metrics,
    padded_gram,
    step_diagnostics_fields,
)


def _rows(rng, n, R, d=7):
    g = rng.standard_normal((n, R, d))
    g[0] = 0.0  # a dead group
    return g


def test_split_sums_equal_the_diagnostics_of_all_groups_from_the_rows():
    """Two "processes" holding whole groups; every key against its definition from the rows."""
    rng = np.random.default_rng(0)
    g = _rows(rng, 5, 3)
    tokens = rng.integers(1, 9, (5, 3))
    rewards = rng.integers(0, 2, (5, 3)).astype(float)
    K = np.einsum("gid,gjd->gij", g, g)
    total = float(np.linalg.norm(g.sum(axis=(0, 1))))
    parts = [diagnostic_sums([(K[i], tokens[i], rewards[i]) for i in idx])
             for idx in ([0, 1], [2, 3, 4])]
    d = step_diagnostics_fields(parts, total_grad_norm=total, num_groups=5)
    ref = step_diagnostics(K, tokens=tokens, rewards=rewards, total_grad_norm=total)
    assert d.keys() == ref.keys()
    for k in d:
        assert (math.isnan(d[k]) and math.isnan(ref[k])) or d[k] == pytest.approx(ref[k],
                                                                                   rel=1e-12)
    Gg = g.sum(axis=1)  # the definitions, from the rows
    n, S, T = 5, float((Gg**2).sum()), total**2
    assert d["noise/mu_sq"] == pytest.approx(n / (n - 1) * (T - S), rel=1e-10)
    assert d["noise/trace_sigma"] == pytest.approx(n / (n - 1) * (n * S - T), rel=1e-10)
    assert d["rollout_grad_norm/max"] == pytest.approx(np.linalg.norm(g, axis=2).max(), rel=1e-12)
    assert d["group_grad_norm/mean"] == pytest.approx(np.linalg.norm(Gg, axis=1).mean(),
                                                      rel=1e-12)
    assert d["dead_groups/count"] == 1.0
    assert d["dead_groups/token_share"] == pytest.approx(tokens[0].sum() / tokens.sum())


def test_groups_of_different_sizes_and_unscored_rewards_merge():
    a = (np.eye(2), [1, 2], [1.0, None])
    b = (np.ones((3, 3)), [1, 1, 1], [0.0, 1.0, 1.0])
    s = diagnostic_sums([a, b])
    assert s["groups"] == 2.0 and s["rollouts"] == 5.0
    assert s["mass_solved_1_of_2"] == 2.0 and s["mass_solved_2_of_3"] == 9.0
    assert diagnostic_sums([]) == {}
    d = step_diagnostics_fields([s, {}], total_grad_norm=None, num_groups=2)
    assert d["noise/status"] == 2.0  # no host norm: said, not guessed
    with pytest.raises(ValueError, match="num_groups=3"):
        step_diagnostics_fields([s], total_grad_norm=1.0, num_groups=3)


def test_padded_gram_places_the_measured_rows_and_zero_rows_elsewhere():
    K = padded_gram([[1.0, 2.0], [2.0, 5.0]], [0, 2], 3)
    assert K.tolist() == [[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [2.0, 0.0, 5.0]]
    assert padded_gram(np.zeros((0, 0)), [], 2).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_metrics_leave_out_the_hosts_own_keys_and_undefined_values():
    d = step_diagnostics([np.eye(2), np.eye(2)], tokens=[[1, 1], [1, 1]],
                         rewards=[[1, 0], [0, 1]], total_grad_norm=1.0)
    m = diagnostics_metrics(d, prefix="geometry/")
    assert all(k.startswith("geometry/") for k in m)
    assert not any(k[len("geometry/"):] in DIAGNOSTICS_UNLOGGED for k in m)
    assert all(math.isfinite(v) for v in m.values())
    assert "geometry/noise/status" in m and "geometry/noise/b_simple" not in m  # status 4


@pytest.mark.slow  # matplotlib: seconds on a loaded machine
def test_diagnostics_figure_says_when_mu_sq_is_not_positive(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    from real_model.outputs import diagnostics_figure

    texts: list[str] = []
    real_label = Axes.set_xlabel
    monkeypatch.setattr(Axes, "set_xlabel", lambda self, s, *a, **k:
                        texts.append(s) or real_label(self, s, *a, **k))
    good = step_diagnostics([np.eye(2), 2 * np.eye(2)], tokens=[[1, 1], [1, 1]],
                            rewards=[[1, 0], [0, 1]], total_grad_norm=2.5)
    bad = step_diagnostics([np.eye(2), np.eye(2)], tokens=[[1, 1], [1, 1]],
                           rewards=[[1, 0], [0, 1]], total_grad_norm=1.0)
    assert good["noise/status"] == 0.0 and bad["noise/status"] == 4.0
    recs = [{"step": 0, "diagnostics": good}, {"step": 1, "diagnostics": bad},
            {"step": 2}]
    diagnostics_figure(tmp_path / "diagnostics.png", recs)
    assert (tmp_path / "diagnostics.png").stat().st_size > 0
    assert any("|mu|^2 estimate <= 0" in t for t in texts)
    assert any("without a defined value" in t for t in texts)
