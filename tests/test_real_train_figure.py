"""Per-window means with spread for the training figures (``real_model.outputs.window_stats``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from real_model.outputs import default_window, plot_training_metric, window_stats


def test_window_stats_hand_checked_case():
    st = window_stats([0, 1, 2, 3, 4], [[1.0], [3.0], [2.0, 4.0], [], []], window=2)
    assert st["center"].tolist() == [0.5, 2.5]  # the last window (step 4) holds no value: dropped
    assert st["mean"].tolist() == [2.0, 3.0]
    assert st["sd"] == pytest.approx([math.sqrt(2.0), math.sqrt(2.0)])
    assert st["n"].tolist() == [2, 2]
    one = window_stats([0, 1], [[5.0], [None]], window=1)
    assert one["mean"].tolist() == [5.0] and math.isnan(one["sd"][0])


def test_window_stats_rejects_bad_input():
    with pytest.raises(ValueError, match="window must be >= 1"):
        window_stats([0], [[1.0]], window=0)
    with pytest.raises(ValueError, match="differ in length"):
        window_stats([0, 1], [[1.0]], window=1)


def test_default_window_gives_about_ten_windows():
    assert [default_window(n) for n in (1, 9, 60, 200)] == [1, 1, 6, 20]


def test_training_plot_draws_window_means_of_pooled_group_values():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [{"step": s, "accuracy": 0.1 * s,
             "spectra": {"2": {"effective_rank_mean": 1.0 + s,
                               "effective_rank_values": [1.0 + s, 1.0 + s]}}}
            for s in range(4)]
    fig, ax = plt.subplots()
    plot_training_metric(ax, recs, metric="effective_rank_mean", R_values=(2,), window=2)
    means = [ln for ln in ax.get_lines() if ln.get_label() == "R=2"][0]
    assert np.allclose(means.get_xdata(), [0.5, 2.5]) and np.allclose(means.get_ydata(), [1.5, 3.5])
    fig2, ax2 = plt.subplots()
    plot_training_metric(ax2, recs, metric="accuracy", window=4)
    assert np.allclose(ax2.get_lines()[1].get_ydata(), [0.15])
    plt.close(fig), plt.close(fig2)


def test_training_plot_without_any_mixed_group_says_so_and_leaves_the_legend_to_the_figure():
    from matplotlib.figure import Figure

    recs = [{"step": s, "accuracy": 0.0, "spectra": {"2": {"effective_rank_mean": None,
                                                             "effective_rank_values": []}}}
            for s in range(3)]
    ax = Figure().subplots()
    plot_training_metric(ax, recs, metric="effective_rank_mean", R_values=(2,))
    assert [t.get_text() for t in ax.texts] == ["no value: no step had a mixed-reward group"]
    assert ax.get_legend() is None and ax.get_xlabel() == "GRPO step"
    ax = Figure().subplots()
    plot_training_metric(ax, recs, metric="accuracy")
    assert list(ax.texts) == [] and ax.get_ylabel() == "accuracy (mean reward)"


def test_train_figure_has_one_legend_with_the_papers_effective_rank(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from real_model import outputs

    drawn, real_savefig = {}, Figure.savefig

    def keep(fig, path, **kw):
        drawn["fig"] = fig
        return real_savefig(fig, path, **kw)

    recs = [{"step": s, "accuracy": 0.5, "spectra": {"2": {"effective_rank_mean": 1.5,
                                                             "effective_rank_values": [1.5]}}}
            for s in range(2)]
    monkeypatch.setattr(Figure, "savefig", keep)
    outputs.train_figure(tmp_path / "train.png", recs, (2,))
    fig = drawn["fig"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "R=2", 'paper Table 1: effective rank "~2"']
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert (tmp_path / "train.png").stat().st_size > 0
