"""The sims figures as a reader sees them, and the progress bar of full-size runs.

Exact tier: the moments figure's exact lines cover R = 2..16 whatever R were sampled (GRPO's
``Var(A_i) / sigma^2 = (R-1)/R`` and RLOO's ``R/(R-1)``, derived by hand); every panel has a y
label; legends sit under the panels, not on them; the tails panels say their bounds are cut.
Progress: a bar only for a full-size run with stderr on a terminal.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure

from sims import plots
from sims.experiments import _variance_ratio_curve
from sims.progress import progress, show_progress
from sims.results import make_check


def _fig(ncols: int = 1) -> tuple[Figure, Any]:
    fig = Figure(layout="constrained")
    return fig, np.atleast_1d(fig.subplots(1, ncols))


def test_variance_ratio_curve_is_exact_on_every_R_from_2_to_16() -> None:
    curve = _variance_ratio_curve(("grpo", "rloo"), p=0.3)
    R = np.array(curve["R"])
    assert curve["R"] == list(range(2, 17))
    # A_i = r_i - mean(r): Var = (1 - 1/R) sigma^2; RLOO A_i = r_i - mean_{j != i} r_j:
    # Var = sigma^2 + sigma^2 / (R - 1)
    np.testing.assert_allclose(curve["ratio"]["grpo"], (R - 1) / R, rtol=1e-12)
    np.testing.assert_allclose(curve["ratio"]["rloo"], R / (R - 1), rtol=1e-12)


def _variance_check(est: str, R: int) -> Any:
    s2 = 0.21
    return make_check(f"thm4.1(ii) Var(A_i) {est} R={R} J=0.7", estimate=(R - 1) / R * s2,
                      exact=(R - 1) / R * s2, se=0.001, n=100, details={"sigma2": s2})


def test_moments_figure_of_one_sampled_R_draws_the_exact_lines_over_all_R() -> None:
    curve = _variance_ratio_curve(("grpo", "rloo"), p=0.7)
    fig, (ax,) = _fig()
    plots.plot_variance_ratio(ax, [_variance_check("grpo", 4), _variance_check("rloo", 4)],
                              exact_curve=curve)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert len(lines["grpo"].get_xdata()) == 15 and len(lines["rloo"].get_xdata()) == 15
    assert len(lines["paper: (R-1)/R"].get_xdata()) == 15
    assert ax.get_ylabel() and ax.get_legend() is not None
    anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
    assert anchor.x0 > 1.0  # right of the axes, over no line


def _tails_curve(R: int) -> dict[str, Any]:
    eps = [0.1, 0.2, 0.3]
    return {"R": R, "p": 0.5, "eps": eps, "exact_adv_tail": [0.9, 0.5, 0.1],
            "mc_adv_tail": [0.9, 0.5, 0.1], "exact_base_tail": [0.6, 0.2, 0.0],
            "mc_base_tail": [0.6, 0.2, 0.0], "chebyshev": [12.5, 3.1, 1.4],
            "hoeffding": [1.9, 1.7, 1.4]}


def test_tails_panels_have_a_y_label_one_legend_under_them_and_say_the_bounds_are_cut() -> None:
    fig, axes = _fig(2)
    for n, ax in enumerate(axes):
        plots.plot_tails(ax, _tails_curve(2 * (n + 1)), ylabel=n == 0)
    plots.legend_below(fig, axes[:1])
    assert axes[0].get_ylabel().startswith("probability")
    assert all(ax.get_legend() is None for ax in axes)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == 6 and sum(f"cut at {plots.TAILS_YMAX:g}" in x for x in labels) == 2
    assert axes[0].get_ylim()[1] == plots.TAILS_YMAX


def _spectra_summary() -> list[dict[str, Any]]:
    q = {"q05": 1.0, "q25": 1.5, "q50": 2.0, "q75": 2.5, "q95": 3.0}
    return [{"model": m, "R": R, "effective_rank": {"mean": 2.0, "quantiles": q},
             "top1_fraction": {"mean": 0.5, "quantiles": q}}
            for m in ("isotropic", "clustered") for R in (2, 4)]


def test_spectra_training_and_unbiasedness_panels_leave_the_legend_to_the_figure() -> None:
    fig, axes = _fig(2)
    for ax, metric in zip(axes, ("effective_rank", "top1_fraction"), strict=True):
        plots.plot_spectra(ax, _spectra_summary(), metric=metric)
        assert ax.get_legend() is None and ax.get_title() and ax.get_ylabel()
    plots.legend_below(fig, axes, ncol=4)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "isotropic", "clustered", "paper: ~2 for all R"]  # each label once

    runs = {e: {"history": {"eff_rank": list(np.linspace(1, 3, 30))}} for e in ("grpo", "rloo")}
    fig, (ax,) = _fig()
    plots.plot_training(ax, runs, key="eff_rank")
    assert ax.get_legend() is None
    assert "running mean over 10 steps" in ax.get_xlabel()
    assert ax.get_ylabel() == plots.TRAINING_LABELS["eff_rank"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_for_full_size_runs_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    assert not show_progress(quick=False)
    assert list(progress(range(3), label="x", quick=False)) == [0, 1, 2]
    assert pipe.getvalue() == ""  # a pipe or a log: nothing
    tty = _Terminal()
    monkeypatch.setattr("sys.stderr", tty)
    assert not show_progress(quick=True) and show_progress(quick=False)
    assert list(progress(range(3), label="x", quick=True)) == [0, 1, 2]
    assert tty.getvalue() == ""  # a quick run (the audit's): nothing
    assert list(progress(range(3), label="sims demo", quick=False)) == [0, 1, 2]
    assert "sims demo" in tty.getvalue() and "0/3" in tty.getvalue()


def test_progress_line_without_tqdm_on_the_light_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` raises ImportError
    tty = _Terminal()
    monkeypatch.setattr("sys.stderr", tty)
    assert list(progress(range(3), label="sims demo", quick=False)) == [0, 1, 2]
    assert "sims demo: 2/3" in tty.getvalue()
