"""Experiments of :mod:`sims`: each writes ``results.json``, ``table.md`` and ``figure.png``.

``EXPERIMENTS[name](out_dir, *, seed, quick) -> dict`` runs one experiment (``quick=True``: a few
seconds, used by the audit) and returns the dict it wrote to ``results.json`` (with the seed,
library versions, device and the command that reproduces it). Plot functions take an ``ax``;
figures are ``matplotlib.figure.Figure`` objects (no pyplot, no backend switch, no restyling).

=================  =========================================================================
name               what
=================  =========================================================================
``moments``        Thm 4.1 (i)-(iv) per estimator and R in a Bernoulli bandit (+ Beta rewards)
``unbiasedness``   E[g_hat] vs grad J (ratio, cosine), E[A_i | outcome]; bandit, token MDP, batch
``multiturn``      E[A_GRPO(h) | prefix] vs exact / Eq. 26-27, and the gradient bias
``spectra``        effective rank / top-1 of diag(A) Psi vs R per psi model
``training``       GRPO dynamics: sigma_r, zero-advantage groups, |g|, effective rank, masses
``tails``          sampled vs exact P(|A_i| > eps), P(|v_hat - v| > eps), Chebyshev, Hoeffding
=================  =========================================================================
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import (
    atomic_write_text,
    dumps,
    environment,
    locks_out_dir,
    save_figure,
    to_jsonable,
)

from .plots import (
    legend_below,
    plot_gradient_ratio,
    plot_multiturn_bias,
    plot_spectra,
    plot_tails,
    plot_training,
    plot_variance_ratio,
)
from .progress import progress
from .results import CheckResult, md_escape, results_table

__all__ = ["EXPERIMENTS", "run_experiment"]

def _all_estimators() -> tuple[str, ...]:
    """Every registered per-group estimator, in registration order (:mod:`grpo_theory.registry`;
    batch-coupled estimators such as whitening are left out: their law is not per group)."""
    from grpo_theory import estimator_names

    return estimator_names(batch_coupled=False)


def _bandit(reward: str = "bernoulli") -> Any:
    from .bandit import SoftmaxBandit

    return SoftmaxBandit(
        np.array([0.0, 0.5, -0.5, 1.0]), np.array([0.2, 0.5, 0.7, 0.9]), reward=reward
    )  # type: ignore[arg-type]


def _write(
    out_dir: Path,
    name: str,
    seed: int,
    quick: bool,
    payload: dict[str, Any],
    table: str,
    fig: Any,
    t0: float,
) -> dict[str, Any]:
    out_dir = Path(out_dir)  # callers may pass a str
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {
        "experiment": name,
        "seed": seed,
        "quick": quick,
        "command": f"grpo-audit sims {name} --out {out_dir} --seed {seed}" + (" --quick" * quick),
        "environment": environment(libraries=("numpy", "scipy", "matplotlib"), device="cpu"),
        "wall_time_s": round(time.perf_counter() - t0, 3),
        **payload,
    }
    res = to_jsonable(res)
    atomic_write_text(out_dir / "results.json", dumps(res, indent=2))
    atomic_write_text(
        out_dir / "table.md",
        f"# sims: {name} (seed {seed}{', quick' if quick else ''})\n\n" + table + "\n",
    )
    save_figure(fig, out_dir / "figure.png", dpi=110, bbox_inches="tight")
    return res


def _checks_payload(checks: list[CheckResult]) -> dict[str, Any]:
    return {
        "checks": [c.as_dict() for c in checks],
        "n_checks": len(checks),
        "n_passed": sum(c.passed for c in checks),
    }


def _fig(ncols: int = 1, w: float = 5.0, h: float = 3.6) -> tuple[Any, Any]:
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend switch

    fig = Figure(figsize=(w * ncols, h), layout="constrained")  # room for labels and legends
    axes = fig.subplots(1, ncols, squeeze=False)
    return fig, axes[0]


# --- moments ------------------------------------------------------------------------------------
def exp_moments(out_dir: Path, *, seed: int, quick: bool) -> dict[str, Any]:
    """Thm 4.1 (i)-(iv) for every estimator in a 4-arm Bernoulli bandit, and Beta rewards."""
    from .checks import check_theorem41

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    Rs = (4,) if quick else (2, 4, 8, 16)
    n = 20_000 if quick else 200_000
    ests = ("grpo", "grpo_std", "rloo") if quick else _all_estimators()
    bern, beta = _bandit(), _bandit("beta")
    checks: list[CheckResult] = []
    cells = [(R, e, bern, {"eps_values": (0.3,)}) for R in Rs for e in ests]
    cells += [(R, e, beta, {}) for R in Rs for e in ("grpo", "rloo")]
    cells.sort(key=lambda c: c[0])  # the order of the sampling: R by R, Bernoulli then Beta
    for R, e, world, kw in progress(cells, label="sims moments", quick=quick):
        checks += check_theorem41(world, e, R=R, n_groups=n, rng=rng, **kw)
    curve = _variance_ratio_curve(ests, p=bern.J())
    fig, (ax,) = _fig(w=7.5)
    plot_variance_ratio(ax, checks, exact_curve=curve)
    ax.set_title(f"Thm 4.1(ii): Var(A_i)/sigma_r^2, Bernoulli rewards (J={bern.J():.3g})")
    payload = {**_checks_payload(checks), "variance_ratio_exact": curve}
    return _write(out_dir, "moments", seed, quick, payload, results_table(checks), fig, t0)


def _variance_ratio_curve(estimators: tuple[str, ...], *, p: float) -> dict[str, Any]:
    """The exact ``Var(A_i) / sigma_r^2`` of each estimator for Bernoulli(``p``) rewards at
    every ``R`` in 2..16 (:func:`sims.exact.bernoulli_advantage_moments`): the lines of the
    moments figure, drawn whatever ``R`` were sampled."""
    from .exact import bernoulli_advantage_moments

    Rs = list(range(2, 17))
    return {
        "R": Rs,
        "p": p,
        "ratio": {e: [bernoulli_advantage_moments(e, R=R, p=p)["var"] / (p * (1 - p))
                      for R in Rs] for e in estimators},
    }


# --- unbiasedness -------------------------------------------------------------------------------
def exp_unbiasedness(out_dir: Path, *, seed: int, quick: bool) -> dict[str, Any]:
    """E[g_hat] vs grad J and E[A_i | outcome] vs the true advantage for several R."""
    from .bandit import SoftmaxBandit
    from .checks import check_unbiasedness, check_unbiasedness_batch
    from .token_mdp import TokenMDP

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    Rs = (2, 8) if quick else (2, 4, 8, 16)
    n = 10_000 if quick else 100_000
    ests = ("grpo", "grpo_std", "rloo") if quick else _all_estimators()
    bandit = _bandit()
    mdp = TokenMDP.random(np.random.default_rng(seed + 1), vocab=3, length=3)
    # three prompts of different difficulty (solve rates ~0.1, ~0.5, ~0.9), separate parameters
    batch = [
        SoftmaxBandit(np.array([0.0, 0.5, -0.5]), np.array(m))
        for m in ([0.05, 0.1, 0.3], [0.3, 0.6, 0.5], [0.8, 0.95, 0.9])
    ]
    checks: list[CheckResult] = []
    for R in progress(Rs, label="sims unbiasedness (R)", quick=quick):
        for e in ests:
            checks += check_unbiasedness(bandit, e, R=R, n_groups=n, rng=rng)
            checks += check_unbiasedness(mdp, e, R=R, n_groups=n, rng=rng, n_outcomes=3)
        checks += check_unbiasedness(_bandit("beta"), "grpo", R=R, n_groups=n, rng=rng)
        for e in ests:
            checks += check_unbiasedness_batch(batch, e, R=R, n_groups=n // 2, rng=rng)
    fig, axes = _fig(2)
    plot_gradient_ratio(axes[0], checks, world="SoftmaxBandit")
    plot_gradient_ratio(axes[1], checks, world="TokenMDP")
    legend_below(fig, axes, ncol=6)
    return _write(
        out_dir,
        "unbiasedness",
        seed,
        quick,
        _checks_payload(checks),
        results_table(checks),
        fig,
        t0,
    )


# --- multiturn ----------------------------------------------------------------------------------
def exp_multiturn(out_dir: Path, *, seed: int, quick: bool) -> dict[str, Any]:
    """Per-stage advantage bias (exact, MC, Eq. 23) and the bias of the gradient."""
    from .checks import check_multiturn, check_multiturn_modes, multiturn_bias_table
    from .multiturn import MultiTurnMDP

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    mdp = MultiTurnMDP.random(np.random.default_rng(seed + 2), H=3, S=3, A=2)
    Rs = (4,) if quick else (2, 4, 8)
    n = 20_000 if quick else 200_000
    ests = ("grpo", "rloo", "grpo_std")
    checks: list[CheckResult] = []
    stage_summary = []
    cells = [("adv", R, e) for R in Rs for e in ests]
    cells += [("modes", R, bl) for R in Rs for bl in ("group_mean", "leave_one_out")]
    mode_rows: list[dict[str, Any]] = []
    for what, R, e in progress(cells, label="sims multiturn", quick=quick):
        if what == "adv":
            checks += check_multiturn(mdp, e, R=R, n=n, rng=rng)
            stage_summary += _stage_bias_summary(multiturn_bias_table(mdp, e, R=R), e, R=R,
                                                 H=mdp.shape[0])
        else:
            cm, rows_m = check_multiturn_modes(mdp, R=R, n=n // 2, rng=rng, baseline=e)
            checks += cm
            mode_rows += rows_m
    grpo_rows = multiturn_bias_table(mdp, "grpo", R=4)
    v, _ = mdp.values()
    payload = {
        **_checks_payload(checks),
        "mdp": {
            "H": mdp.shape[0],
            "S": mdp.shape[1],
            "A": mdp.shape[2],
            "J": mdp.J(),
            "v0": float(v[0, mdp.init_state]),
        },
        "stage_summary": stage_summary,
        "prefix_table_grpo_R4": grpo_rows,
        "stagewise_modes": mode_rows,
    }
    table = _multiturn_markdown(checks, stage_summary, mode_rows)
    fig, (ax,) = _fig()
    plot_multiturn_bias(ax, grpo_rows)
    ax.set_title("GRPO R=4: per-prefix advantage bias")
    return _write(out_dir, "multiturn", seed, quick, payload, table, fig, t0)


def _stage_bias_summary(
    rows: list[dict[str, Any]], estimator: str, *, R: int, H: int
) -> list[dict[str, Any]]:
    """Per stage ``h`` (1-based), the prefix-probability-weighted mean bias and mean absolute
    bias of ``E[A_hat(h) | prefix]``, exact and Eq. 23, and the largest
    ``|exact - Eq. 26|`` over the prefixes (rows of :func:`sims.checks.multiturn_bias_table`)."""
    out = []
    for h in range(H):
        rr = [r for r in rows if r["h"] == h]
        w = np.array([r["prob"] for r in rr])
        out.append(
            {
                "estimator": estimator,
                "R": R,
                "h": h + 1,
                "mean_exact_bias": float(w @ [r["exact_bias"] for r in rr]),
                "mean_paper_bias": float(w @ [r["paper_bias"] for r in rr]),
                "mean_abs_exact_bias": float(w @ np.abs([r["exact_bias"] for r in rr])),
                "mean_abs_paper_bias": float(w @ np.abs([r["paper_bias"] for r in rr])),
                "max_abs_exact_minus_paper_cond_adv": float(
                    np.max(np.abs([r["exact_cond_adv"] - r["paper_cond_adv"] for r in rr]))
                ),
            }
        )
    return out


def _multiturn_markdown(
    checks: list[CheckResult], stage_summary: list[dict[str, Any]],
    mode_rows: list[dict[str, Any]],
) -> str:
    """The multiturn experiment's ``table.md``: the checks, the per-stage bias table and the
    stage-wise advantage modes table."""
    lines = [
        "| estimator | R | stage h | E bias (exact) | E bias (Eq. 23) | E abs bias (exact) | "
        "E abs bias (Eq. 23) | max abs(exact - Eq. 26) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in stage_summary:
        lines.append(
            f"| {s['estimator']} | {s['R']} | {s['h']} | {s['mean_exact_bias']:.4f} | "
            f"{s['mean_paper_bias']:.4f} | {s['mean_abs_exact_bias']:.4f} | "
            f"{s['mean_abs_paper_bias']:.4f} | "
            f"{s['max_abs_exact_minus_paper_cond_adv']:.4f} |"
        )
    mlines = [
        "| mode | baseline | R | exact ratio E[g]/grad J | exact cosine | MC tr Cov(g_hat) |",
        "|---|---|---|---|---|---|",
    ]
    for r in mode_rows:
        mlines.append(
            f"| {r['mode']} | {r['baseline']} | {r['R']} | {r['exact_ratio']:.4f} | "
            f"{r['exact_cosine']:.6f} | {r['mc_trace_cov_g']:.4g} |"
        )
    return (
        results_table(checks)
        + "\n\nPer-stage bias (prefix-probability weighted):\n\n"
        + "\n".join(lines)
        + "\n\nStage-wise advantage modes (grpo_theory.multiturn_advantages): gradient bias "
        "and variance:\n\n" + "\n".join(mlines)
    )


# --- spectra ------------------------------------------------------------------------------------
#: The toy worlds are named by their parameters ("common (strength 4)", "clustered (noise 0.1)"),
#: as in the audit; ``grpo-audit compare``'s common world is "common (strength 1)".
CLUSTERED_01: dict[str, float] = {"within": 1.0, "between": 0.0, "noise": 0.1}


def _spectra_models(quick: bool) -> list[tuple[str, str, dict[str, Any], int | None]]:
    d = 512 if quick else 4096
    return [
        ("isotropic d=inf", "isotropic", {}, None),
        (f"isotropic d={d}", "isotropic", {}, d),
        ("clustered (noise 0.1) d=inf", "clustered", CLUSTERED_01, None),
        (f"clustered (noise 0.1) d={d}", "clustered", CLUSTERED_01, d),
        ("common (strength 4) d=inf", "common", {"strength": 4.0}, None),
        (f"common (strength 4) d={d}", "common", {"strength": 4.0}, d),
        ("token_mdp psi", "token_mdp", {}, None),
    ]


def exp_spectra(out_dir: Path, *, seed: int, quick: bool) -> dict[str, Any]:
    """Distributions of rank / effective ranks / top-1 of diag(A) Psi for R in {2,4,8,16}."""
    from grpo_theory import compute_advantages, spectral_metrics

    from .checks import check_spectra_limit, spectra_summary
    from .psi_models import sample_gram
    from .token_mdp import TokenMDP

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    Rs = (2, 4, 8, 16)
    n = 100 if quick else 1000
    p = 0.5
    mdp = TokenMDP.random(
        np.random.default_rng(seed + 3), vocab=3, length=3, success_fraction=0.5, logit_scale=0.5
    )
    psi_tab = mdp.psi()
    summary: list[dict[str, Any]] = []
    for lab, model, kw, d in progress(_spectra_models(quick), label="sims spectra (worlds)",
                                      quick=quick):
        for R in Rs:
            if model == "token_mdp":
                idx, rewards = mdp.sample(n, R, rng)
            else:
                rewards = (rng.random((n, R)) < p).astype(np.float64)
            A = np.asarray(compute_advantages("grpo", rewards))
            mets = []
            for i in range(n):
                if model == "token_mdp":
                    Ps = psi_tab[idx[i]]
                    K = Ps @ Ps.T
                else:
                    K = sample_gram(model, rewards[i], d=d, rng=rng, **kw)
                mets.append(spectral_metrics(K, A[i]))
            summary.append({"model": lab, "R": R, "estimator": "grpo", **spectra_summary(mets)})
    checks: list[CheckResult] = []
    for model, kw in (
        ("isotropic", {}),
        ("clustered", {"noise": 0.1}),
        ("common", {"strength": 4.0}),
    ):
        for R in Rs:
            checks += check_spectra_limit(model, "grpo", R=R, p=p, n_groups=n, rng=rng, **kw)
    lines = [
        "| psi model | R | frac. degenerate | rank (mean) | eff. rank mean [q05, q95] | "
        "entropy eff. rank | top-1 mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        if s["effective_rank"] is None:
            continue
        er = s["effective_rank"]
        lines.append(
            f"| {s['model']} | {s['R']} | {s['frac_degenerate']:.3f} | {s['rank']['mean']:.3f} | "
            f"{er['mean']:.3f} [{er['quantiles']['q05']:.3f}, {er['quantiles']['q95']:.3f}] | "
            f"{s['entropy_effective_rank']['mean']:.3f} | {s['top1_fraction']['mean']:.3f} |"
        )
    table = (
        "Rewards i.i.d. Bernoulli(0.5) (token MDP: its own rewards), GRPO advantages; "
        "metrics over non-degenerate groups.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + results_table(checks)
    )
    fig, axes = _fig(2)
    plot_spectra(axes[0], summary, metric="effective_rank")
    plot_spectra(axes[1], summary, metric="top1_fraction")
    legend_below(fig, axes, ncol=4)
    payload = {**_checks_payload(checks), "summary": summary, "p": p, "n_groups_per_cell": n}
    return _write(out_dir, "spectra", seed, quick, payload, table, fig, t0)


# --- training -----------------------------------------------------------------------------------
def exp_training(out_dir: Path, *, seed: int, quick: bool) -> dict[str, Any]:
    """GRPO training with each estimator: sigma_r, zero-advantage groups, |g|, effective rank."""
    from .training import make_prompts, run_training, summarize_training

    t0 = time.perf_counter()
    ests = ("grpo",) if quick else ("grpo", "grpo_std", "rloo", "asym_grpo", "fade")
    steps = 25 if quick else 300
    n_prompts = 8 if quick else 32
    runs, summaries = {}, {}
    variants = [(e, e, "sampled") for e in ests]
    if not quick:
        variants.append(("grpo exact E[g]", "grpo", "exact"))
    for label, e, grad in progress(variants, label="sims training (estimators)", quick=quick):
        prompts = make_prompts(np.random.default_rng(seed), n_prompts=n_prompts)
        runs[label] = run_training(
            estimator=e,
            rng=np.random.default_rng(seed + 100),
            prompts=prompts,
            R=8,
            steps=steps,
            lr=0.5,
            gradient=grad,  # type: ignore[arg-type]
        )
        summaries[label] = summarize_training(runs[label])
    checks = [CheckResult(**s["zero_adv_check"]) for s in summaries.values()]
    lines = [
        "| estimator | J first -> last | sigma_r first -> last | eff. rank first -> last | "
        "slope log norm(g) vs log sigma_r | Spearman(norm(g), sigma_r) | "
        "Spearman(eff. rank, sigma_r) | mean m_S | mean m_F |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e, s in summaries.items():
        f = lambda v: "nan" if v is None or not math.isfinite(v) else f"{v:.3f}"  # noqa: E731
        lines.append(
            f"| {e} | {f(s['J_first_last'][0])} -> {f(s['J_first_last'][1])} | "
            f"{f(s['sigma_r_first_last'][0])} -> {f(s['sigma_r_first_last'][1])} | "
            f"{f(s['eff_rank_first_last'][0])} -> {f(s['eff_rank_first_last'][1])} | "
            f"{f(s['gradnorm_vs_sigma_loglog_slope'])} | {f(s['spearman_gradnorm_sigma'])} | "
            f"{f(s['spearman_effrank_sigma'])} | {f(s['mean_m_S'])} | {f(s['mean_m_F'])} |"
        )
    table = "\n".join(lines) + "\n\n" + results_table(checks)
    fig, axes = _fig(3, w=4.2)
    plot_training(axes[0], runs, key="sigma_r")
    plot_training(axes[1], runs, key="eff_rank")
    plot_training(axes[2], runs, key="grad_norm")
    legend_below(fig, axes, ncol=6)
    payload = {**_checks_payload(checks), "summaries": summaries, "runs": runs}
    return _write(out_dir, "training", seed, quick, payload, table, fig, t0)


# --- tails --------------------------------------------------------------------------------------
def exp_tails(out_dir: Path, *, seed: int, quick: bool) -> dict[str, Any]:
    """Sampled vs exact tails of the advantage and of the baseline error, with both bounds."""
    from grpo_theory.bounds import (
        chebyshev_bound,
        exact_baseline_tail_bernoulli,
        hoeffding_bound,
    )

    from .checks import check_tails, sampled_advantage_tail_event, sampled_baseline_tail_event
    from .exact import bernoulli_tail

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    p = 0.5
    Rs = (2, 4, 8, 16)
    n = 20_000 if quick else 200_000
    checks: list[CheckResult] = []
    for R in progress(Rs, label="sims tails (checks, R)", quick=quick):
        checks += check_tails(
            estimator="grpo", R=R, p=p, eps_values=(0.1, 0.2, 0.3), n_groups=n, rng=rng
        )
    eps_grid = np.round(np.linspace(0.02, 0.6, 30), 4)
    curves = []
    for R in progress(Rs, label="sims tails (curves, R)", quick=quick):
        rew = (rng.random((n, R)) < p).astype(np.float64)
        curves.append(
            {
                "R": R,
                "p": p,
                "eps": eps_grid.tolist(),
                "exact_adv_tail": [
                    bernoulli_tail("grpo", R=R, p=p, eps=float(e)) for e in eps_grid
                ],
                "mc_adv_tail": [
                    float(sampled_advantage_tail_event(rew, eps=float(e), estimator="grpo").mean())
                    for e in eps_grid
                ],
                "exact_base_tail": [
                    exact_baseline_tail_bernoulli(R=R, eps=float(e), p=p) for e in eps_grid
                ],
                "mc_base_tail": [
                    float(sampled_baseline_tail_event(rew, eps=float(e), p=p).mean())
                    for e in eps_grid
                ],
                "chebyshev": [
                    float(chebyshev_bound(R=R, eps=float(e), sigma2=p * (1 - p))) for e in eps_grid
                ],
                "hoeffding": [float(hoeffding_bound(R=R, eps=float(e))) for e in eps_grid],
            }
        )
    lines = [
        "| check | exact | bound | bound holds | bound vacuous (>= 1) |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        b = c.details.get("chebyshev_bound", c.details.get("hoeffding_bound"))
        lines.append(
            f"| {md_escape(c.name)} | {c.exact:.4f} | {b:.4f} | {c.details['bound_holds']} | "
            f"{c.details['bound_vacuous']} |"
        )
    table = results_table(checks) + "\n\nBounds vs exact:\n\n" + "\n".join(lines)
    fig, axes = _fig(len(Rs), w=3.6)
    for n, (ax, cv) in enumerate(zip(axes, curves, strict=True)):
        plot_tails(ax, cv, ylabel=n == 0)
    legend_below(fig, axes[:1])
    payload = {**_checks_payload(checks), "curves": curves}
    return _write(out_dir, "tails", seed, quick, payload, table, fig, t0)


EXPERIMENTS: dict[str, Callable[..., dict[str, Any]]] = {
    "moments": exp_moments,
    "unbiasedness": exp_unbiasedness,
    "multiturn": exp_multiturn,
    "spectra": exp_spectra,
    "training": exp_training,
    "tails": exp_tails,
}


@locks_out_dir("sims")
def run_experiment(
    name: str, out_dir: str | Path, *, seed: int = 0, quick: bool = False
) -> dict[str, Any]:
    """Run ``EXPERIMENTS[name]`` writing into ``out_dir``; ValueError for an unknown name."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown sims experiment {name!r}; choose one of {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name](Path(out_dir), seed=int(seed), quick=bool(quick))
