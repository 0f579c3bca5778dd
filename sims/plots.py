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
    "plot_expected_mass",
]


def plot_variance_ratio(ax: Any, checks: list[CheckResult]) -> None:
    """``Var(A_i) / sigma_r^2`` vs R per estimator: exact (line), MC (+-2 SE), paper (dashed)."""
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
        line = ax.plot(Rs, [x[2] for x in r], marker="o", ms=3, label=est)[0]
        ax.errorbar(
            Rs, [x[1] for x in r], yerr=[2 * x[3] for x in r], fmt="x", color=line.get_color()
        )
    Rg = np.array(sorted({x[0] for r in rows.values() for x in r}))
    ax.plot(Rg, (Rg - 1) / Rg, "k--", label="paper (R-1)/R")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("group size R")
    ax.set_ylabel("Var(A_i) / sigma_r^2")
    ax.legend(fontsize=6, ncol=2)


def plot_gradient_ratio(ax: Any, checks: list[CheckResult], *, world: str) -> None:
    """``<E g_hat, grad J>/|grad J|^2`` vs R: exact (line) and MC (95% CI)."""
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
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="unbiased (paper Eqs. 6-7)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("group size R")
    ax.set_ylabel("projection ratio of E[g_hat] on grad J")
    ax.set_title(world)
    ax.legend(fontsize=6, ncol=2)


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
    """Mean (and 25-75% band) of a spectral metric vs R, one line per psi model."""
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
    ax.set_xlabel("group size R")
    ax.set_ylabel(metric.replace("_", " "))
    ax.legend(fontsize=6)


def plot_training(ax: Any, runs: dict[str, dict[str, Any]], *, key: str) -> None:
    """A tracked statistic over training steps, one line per estimator (NaN steps skipped)."""
    for est, run in runs.items():
        y = np.asarray(run["history"][key], dtype=np.float64)
        x = np.arange(y.size)
        ok = np.isfinite(y)
        if key in ("eff_rank", "top1", "grad_norm") and y.size > 20:
            # running mean over a window of 10 steps of the finite values (noisy per step)
            w = 10
            yy = np.where(ok, y, 0.0)
            num = np.convolve(yy, np.ones(w), "same")
            den = np.convolve(ok.astype(float), np.ones(w), "same")
            y = np.where(den > 0, num / np.maximum(den, 1), np.nan)
            ok = np.isfinite(y)
        ax.plot(x[ok], y[ok], label=est, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.legend(fontsize=6)


def plot_tails(ax: Any, curve: dict[str, Any]) -> None:
    """Exact and sampled ``P(|A_i| > eps)``, ``P(|v_hat - v| > eps)`` with both bounds vs eps."""
    e = curve["eps"]
    ax.plot(e, curve["exact_adv_tail"], "C0-", label="P(|A_i|>eps) exact")
    ax.plot(e, curve["mc_adv_tail"], "C0x", ms=3, label="... sampled")
    ax.plot(e, curve["exact_base_tail"], "C1-", label="P(|v_hat-v|>eps) exact")
    ax.plot(e, curve["mc_base_tail"], "C1x", ms=3, label="... sampled")
    ax.plot(e, curve["chebyshev"], "C0--", label="Chebyshev (Eq. 20)")
    ax.plot(e, curve["hoeffding"], "C1--", label="Hoeffding (App. A.2)")
    ax.set_ylim(0, 1.5)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("eps")
    ax.set_title(f"R={curve['R']}, p={curve['p']}")
    ax.legend(fontsize=5)


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
