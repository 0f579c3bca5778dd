"""Plot functions of the sims experiments: each draws on a given matplotlib ``ax`` (no pyplot,
no global style changes) from the dicts / :class:`sims.results.CheckResult` lists the experiments
produce.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .results import CheckResult

__all__ = [
    "plot_variance_ratio",
    "plot_gradient_ratio",
    "plot_multiturn_bias",
    "plot_spectra",
    "plot_training",
    "plot_tails",
    "legend_below",
    "plot_expected_mass",
]


def plot_variance_ratio(
    ax: Any, checks: list[CheckResult], *, exact_curve: dict[str, Any] | None = None
) -> None:
    """``Var(A_i) / sigma_r^2`` vs R per estimator, Bernoulli rewards: exact (line), Monte Carlo
    (x, +-2 SE) at the sampled R, the paper's ``(R-1)/R`` (dashed); legend right of the axes.

    ``exact_curve`` (``{"R": [...], "ratio": {estimator: [...]}}``) draws the exact lines over
    its whole ``R`` grid, so a run that sampled one ``R`` still shows how the ratio moves with R;
    without it the lines join the exact values at the sampled ``R``.
    """
    rows: dict[str, list[tuple[int, float, float, float]]] = {}
    for c in checks:
        if c.name.startswith("thm4.1(ii)") and "(beta)" not in c.name:
            est = c.name.split()[2]
            R = int(c.name.split("R=")[1].split()[0])
            s2 = c.details["sigma2"]
            rows.setdefault(est, []).append((R, c.estimate / s2, c.exact / s2, c.se / s2))
    for est, r in rows.items():
        r.sort()
        Rs = [x[0] for x in r]
        if exact_curve is not None and est in exact_curve["ratio"]:
            line = ax.plot(exact_curve["R"], exact_curve["ratio"][est], lw=2, label=est)[0]
        else:
            line = ax.plot(Rs, [x[2] for x in r], marker="o", ms=3, label=est)[0]
        ax.errorbar(
            Rs, [x[1] for x in r], yerr=[2 * x[3] for x in r], fmt="x", color=line.get_color()
        )
    Rg = np.array(exact_curve["R"] if exact_curve is not None
                  else sorted({x[0] for r in rows.values() for x in r}))
    ax.plot(Rg, (Rg - 1) / Rg, color="k", ls=(0, (3, 3)), lw=1, label="paper: (R-1)/R")
    ax.errorbar([], [], yerr=[], fmt="x", color="grey", label="Monte Carlo +-2 SE")
    ax.set_xscale("log", base=2)
    ticks = [R for R in (2, 4, 8, 16) if Rg.min() <= R <= Rg.max()]
    ax.set_xticks(ticks, [str(R) for R in ticks])
    ax.set_xlabel("group size R")
    ax.set_ylabel("Var(A_i) / sigma_r^2")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def plot_gradient_ratio(ax: Any, checks: list[CheckResult], *, world: str) -> None:
    """``<E g_hat, grad J>/|grad J|^2`` vs R: exact (line) and MC (x, 95% CI); no legend (the
    figure's :func:`legend_below` names the lines)."""
    rows: dict[str, list[tuple[int, float, float, float]]] = {}
    for c in checks:
        if c.name.startswith("E[g_hat] ratio") and world in c.name and "(beta)" not in c.name:
            parts = c.name.split()
            rows.setdefault(parts[2], []).append((int(parts[3][2:]), c.estimate, c.exact, c.se))
    for est, r in rows.items():
        r.sort()
        Rs = [x[0] for x in r]
        line = ax.plot(Rs, [x[2] for x in r], marker="o", ms=3, label=est)[0]
        ax.errorbar(
            Rs, [x[1] for x in r], yerr=[1.96 * x[3] for x in r], fmt="x", color=line.get_color()
        )
    ax.errorbar([], [], yerr=[], fmt="x", color="grey", label="Monte Carlo, 95% CI")
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="unbiased (paper Eqs. 6-7)")
    ax.set_xscale("log", base=2)
    Rs_all = sorted({x[0] for r in rows.values() for x in r})
    ax.set_xticks(Rs_all, [str(R) for R in Rs_all])
    ax.set_xlabel("group size R")
    ax.set_ylabel("projection ratio of E[g_hat] on grad J")
    ax.set_title(world)


def plot_multiturn_bias(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Per prefix: exact bias of E[A_GRPO(h)|prefix] vs the paper's Eq. 23 bias, coloured by h."""
    H = max(r["h"] for r in rows) + 1
    for h in range(H):
        rr = [r for r in rows if r["h"] == h]
        ax.scatter(
            [r["paper_bias"] for r in rr],
            [r["exact_bias"] for r in rr],
            s=10,
            label=f"stage h={h + 1}",
        )
    lim = [
        min(min(r["paper_bias"], r["exact_bias"]) for r in rows),
        max(max(r["paper_bias"], r["exact_bias"]) for r in rows),
    ]
    ax.plot(lim, lim, "k--", lw=0.8, label="exact = Eq. 23")
    ax.set_xlabel("paper bias, Eq. 23")
    ax.set_ylabel("exact bias E[A_hat(h)|prefix] - A(s_h,a_h)")
    ax.legend(fontsize=7)


def plot_spectra(ax: Any, summary: list[dict[str, Any]], *, metric: str = "effective_rank") -> None:
    """Mean (and 25-75% band) of a spectral metric vs R, one line per psi model; no legend (the
    figure's :func:`legend_below` names the models)."""
    labels = sorted(
        {s["model"] for s in summary}, key=lambda x: [s["model"] for s in summary].index(x)
    )
    for lab in labels:
        rr = sorted([s for s in summary if s["model"] == lab and s[metric]], key=lambda s: s["R"])
        if not rr:
            continue
        Rs = [s["R"] for s in rr]
        line = ax.plot(Rs, [s[metric]["mean"] for s in rr], marker="o", ms=3, label=lab)[0]
        ax.fill_between(
            Rs,
            [s[metric]["quantiles"]["q25"] for s in rr],
            [s[metric]["quantiles"]["q75"] for s in rr],
            color=line.get_color(),
            alpha=0.12,
        )
    if metric == "effective_rank":
        ax.axhline(2.0, color="k", ls="--", lw=0.8, label="paper: ~2 for all R")
    ax.set_xscale("log", base=2)
    Rs_all = sorted({s["R"] for s in summary})
    ax.set_xticks(Rs_all, [str(R) for R in Rs_all])
    ax.set_xlabel("group size R")
    ax.set_ylabel(metric.replace("_", " ").replace("top1", "top-1"))
    ax.set_title(f"{metric.replace('_', ' ').replace('top1', 'top-1')}: mean, band 25-75%",
                 fontsize=9)


#: Axis labels of the training statistics (:data:`sims.training.HISTORY_KEYS`).
TRAINING_LABELS = {
    "J": "mean reward J (exact)",
    "sigma_r": "reward sd sigma_r = mean_p sqrt(J_p (1 - J_p))",
    "eff_rank": "effective rank of diag(A) Psi (mixed groups)",
    "top1": "top-1 fraction of diag(A) Psi (mixed groups)",
    "grad_norm": "gradient norm |g_p| (mean over prompts)",
    "zero_adv_frac": "fraction of groups with all rewards equal",
}
#: Steps of the running mean of the noisy per-step statistics (:func:`plot_training`).
TRAINING_WINDOW = 10


def plot_training(ax: Any, runs: dict[str, dict[str, Any]], *, key: str) -> None:
    """A tracked statistic over training steps, one line per estimator (NaN steps skipped); the
    noisy per-step statistics (effective rank, top-1, gradient norm) of runs longer than 20 steps
    as a centred running mean over :data:`TRAINING_WINDOW` steps, said on the x axis. No legend
    (the figure's :func:`legend_below` names the estimators)."""
    smoothed = False
    for est, run in runs.items():
        y = np.asarray(run["history"][key], dtype=np.float64)
        x = np.arange(y.size)
        ok = np.isfinite(y)
        if key in ("eff_rank", "top1", "grad_norm") and y.size > 20:
            # running mean over a window of steps of the finite values (noisy per step)
            w = TRAINING_WINDOW
            yy = np.where(ok, y, 0.0)
            num = np.convolve(yy, np.ones(w), "same")
            den = np.convolve(ok.astype(float), np.ones(w), "same")
            y = np.where(den > 0, num / np.maximum(den, 1), np.nan)
            ok = np.isfinite(y)
            smoothed = True
        ax.plot(x[ok], y[ok], label=est, lw=1)
    ax.set_xlabel("GRPO step" + (f" (running mean over {TRAINING_WINDOW} steps)" if smoothed
                                 else ""))
    ax.set_ylabel(TRAINING_LABELS.get(key, key), fontsize=8)


#: Upper limit of the tails figure's y axis: bounds above it are vacuous and are cut there (the
#: figure says so in its legend).
TAILS_YMAX = 1.5


def plot_tails(ax: Any, curve: dict[str, Any], *, ylabel: bool = True) -> None:
    """Exact and sampled ``P(|A_i| > eps)``, ``P(|v_hat - v| > eps)`` with both bounds vs eps.

    The y axis stops at :data:`TAILS_YMAX`: a bound there is above 1 (vacuous), and the labels of
    the two bounds say that they are cut. No legend is drawn (the figure draws one for all
    panels: see :func:`legend_below`).
    """
    e = curve["eps"]
    ax.plot(e, curve["exact_adv_tail"], "C0-", label="P(|A_i| > eps), exact")
    ax.plot(e, curve["mc_adv_tail"], "C0x", ms=3, label="P(|A_i| > eps), sampled")
    ax.plot(e, curve["exact_base_tail"], "C1-", label="P(|v_hat - v| > eps), exact")
    ax.plot(e, curve["mc_base_tail"], "C1x", ms=3, label="P(|v_hat - v| > eps), sampled")
    ax.plot(e, curve["chebyshev"], "C0--",
            label=f"Chebyshev bound on P(|A_i| > eps) (Eq. 20; cut at {TAILS_YMAX:g})")
    ax.plot(e, curve["hoeffding"], "C1--",
            label=f"Hoeffding bound on P(|v_hat - v| > eps) (App. A.2; cut at {TAILS_YMAX:g})")
    ax.set_ylim(0, TAILS_YMAX)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("eps")
    if ylabel:
        ax.set_ylabel("probability (bounds: above 1 = vacuous)")
    ax.set_title(f"R={curve['R']}, p={curve['p']}")


def legend_below(fig: Any, axes: Any, *, ncol: int = 3) -> None:
    """One legend for all ``axes`` of ``fig``, under them (never over a curve; ``fig`` has the
    constrained layout, which makes room for it); each label once, in the order drawn."""
    seen: dict[str, Any] = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol,
               fontsize=8, frameon=False)


def plot_expected_mass(
    ax: Any,
    estimator: str,
    *,
    R: int,
    p: Any = None,
    label: str | None = None,
    **opts: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plot ``E m_S(p)`` (solid) and ``E m_F(p)`` (dashed) of one estimator on ``ax``.

    The numbers come from :func:`grpo_theory.mass.expected_mass_bernoulli`; this only draws them.

    Args:
        ax: a matplotlib Axes (nothing global is changed).
        estimator: registry name.
        R: group size.
        p: solve-rate grid (default 201 points in [0, 1]).
        label: legend stem (default: the estimator name).
        **opts: estimator options.

    Returns:
        ``(p, E m_S, E m_F)`` arrays.
    """
    from grpo_theory.mass import expected_mass_bernoulli

    grid = np.linspace(0.0, 1.0, 201) if p is None else np.asarray(p, dtype=np.float64)
    ms, mf = expected_mass_bernoulli(estimator, R=R, p=grid, **opts)
    name = label or estimator
    (line,) = ax.plot(grid, ms, "-", label=f"{name}: E m_S")
    ax.plot(grid, mf, "--", color=line.get_color(), label=f"{name}: E m_F")
    ax.set_xlabel("solve rate p")
    ax.set_ylabel(f"expected mass per group (R={R})")
    return grid, np.asarray(ms), np.asarray(mf)
