"""``grpo-audit compare``: toy worlds' rank behaviour beside a real model's and the paper's Table 1.

Toy worlds (the ``d -> infinity`` limit Grams of ``sims.psi_models.limit_gram``, or the same closed
forms of :mod:`grpo_theory.spectral` when ``sims`` is unavailable), for a group of size ``R`` whose
binary rewards are i.i.d. Bernoulli(``p``) and conditioned on being mixed (``0 < k < R``):

* ``isotropic``: ``K = I``;
* ``clustered``: ``K = gram_clustered(r, within=1, between=0, noise=0.1)`` (clusters by reward);
* ``common (strength 1)``: ``K = strength 1 1^T + I`` with ``strength = 1`` (the audit's
  ``common (strength 4)`` is a different world, named by its strength).

In these worlds the metrics of ``diag(A) K diag(A)`` (GRPO advantages ``A = r - mean r``) depend on
the group only through the number of successes ``k``, so the conditional means are computed exactly
by summing over ``k = 1 .. R-1`` with Binomial(``R``, ``p``) weights (no Monte Carlo).
``p`` defaults to the real run's accuracy when ``--real`` is given, else 0.5.

The real rows come from a ``grpo-audit real rank`` ``results.json`` (means over mixed groups), or
a training run's (``real trl-train``): when its steps carry the training diagnostics, compare also
draws their noise scale and SNR per step (``diagnostics.png``,
:func:`real_model.outputs.diagnostics_figure`).
:data:`paper_values.PAPER_TABLE1` (the one place for them) holds the values the paper *reports* in
its Table 1 (Nemotron-4B, GSM8K), labelled as such; they are the claims under test, not results of
this code.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb
from pathlib import Path
from typing import Any

import numpy as np

from grpo_io import atomic_write_text, locks_out_dir, save_figure
from grpo_theory.advantages import compute_advantages
from grpo_theory.spectral import spectral_metrics
from paper_values import PAPER_TABLE1, PAPER_TABLE1_EFF_RANK_TEXT

from .outputs import diagnostics_figure, has_diagnostics
from .run_io import read_results, write_json

__all__ = [
    "TOY_WORLDS", "toy_gram", "toy_rank_rows", "run_compare", "plot_compare", "compare_title",
]

#: World name -> (psi model of :func:`sims.psi_models.limit_gram`, its parameters). A world's name
#: carries the parameters that distinguish it (the audit's world is "common (strength 4)").
TOY_WORLDS: dict[str, tuple[str, dict[str, float]]] = {
    "isotropic": ("isotropic", {}),
    "clustered": ("clustered", {"within": 1.0, "between": 0.0, "noise": 0.1}),
    "common (strength 1)": ("common", {"strength": 1.0}),
}


def toy_gram(world: str, labels: Any) -> np.ndarray:
    """Limit Gram of ``world`` for labels ``[R]`` (``sims`` if importable, else closed form)."""
    lab = np.asarray(labels)
    if world not in TOY_WORLDS:
        raise ValueError(f"unknown toy world {world!r}; use one of {sorted(TOY_WORLDS)}")
    model, kw = TOY_WORLDS[world]
    try:
        from sims.psi_models import limit_gram
    except ImportError:
        from grpo_theory.spectral import gram_clustered, gram_common_component, gram_isotropic

        if model == "isotropic":
            return gram_isotropic(lab.size)
        if model == "clustered":
            return gram_clustered(lab, **kw)
        return gram_common_component(lab.size, **kw)
    return np.asarray(limit_gram(model, lab, **kw), dtype=np.float64)


def toy_rank_rows(
    R_values: Sequence[int] = (2, 4, 8), *, p: float = 0.5, estimator: str = "grpo"
) -> list[dict[str, Any]]:
    """Exact conditional means (given a mixed group) of effective rank and top-1 per world and R."""
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    rows = []
    for world in TOY_WORLDS:
        for R in sorted(R_values):
            if R < 2:
                raise ValueError(f"R must be >= 2, got {R}")
            ws = np.array([comb(R, k) * p**k * (1 - p) ** (R - k) for k in range(1, R)])
            ws = ws / ws.sum()
            er, t1 = [], []
            for k in range(1, R):
                r = np.array([1.0] * k + [0.0] * (R - k))
                A = np.asarray(compute_advantages(estimator, r[None, :]), dtype=float)[0]
                m = spectral_metrics(toy_gram(world, r), A)
                er.append(m.effective_rank)
                t1.append(m.top1_fraction)
            rows.append(
                {
                    "source": f"toy:{world}",
                    "R": int(R),
                    "p": p,
                    "effective_rank_mean": float(ws @ np.array(er)),
                    "top1_mean": float(ws @ np.array(t1)),
                    "effective_rank_sd": None,
                    "top1_sd": None,
                }
            )
    return rows


def _real_rows(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist (run `grpo-audit real rank --out DIR` first)")
    res = read_results(p)  # schema-checked: one line naming the file and the fault
    name = res["model"]["name"]
    rows = [
        {
            "source": f"real:{name}",
            "R": r["R"],
            "p": res.get("accuracy"),
            "effective_rank_mean": r["effective_rank_mean"],
            "effective_rank_sd": r["effective_rank_sd"],
            "top1_mean": r["top1_mean"],
            "top1_sd": r["top1_sd"],
            "mixed_groups": r["mixed_groups"],
        }
        for r in res["summary"]
    ]
    return rows, res


def _source_label(row: dict[str, Any]) -> str:
    """Legend label of a row's source: a toy world's exact value, or the real run's mean."""
    kind, _, name = row["source"].partition(":")
    if kind == "toy":
        return f"toy world {name} (exact)"
    return f"real model {name} (mean ± sd over mixed groups)"


def plot_compare(ax_rank: Any, ax_top1: Any, rows: Sequence[dict[str, Any]]) -> tuple[Any, Any]:
    """Effective rank (``ax_rank``) and top-1 fraction (``ax_top1``) against R for every source
    of ``rows``, beside the paper's reported Table 1 (drawn just right of each R so it covers no
    value of ours). No legend: :func:`run_compare` draws one under both panels."""
    sources = list(dict.fromkeys(r["source"] for r in rows))
    top = 1.02
    for n, src in enumerate(sources):
        rr = sorted((r for r in rows if r["source"] == src), key=lambda r: r["R"])
        Rs = [r["R"] for r in rr]
        style = {"marker": "o", "ls": "-" if src.startswith("toy") else "-.", "color": f"C{n}"}
        for ax, key in ((ax_rank, "effective_rank"), (ax_top1, "top1")):
            y = [np.nan if r[f"{key}_mean"] is None else r[f"{key}_mean"] for r in rr]
            e = [0.0 if r.get(f"{key}_sd") is None else r[f"{key}_sd"] for r in rr]
            ax.errorbar(Rs, y, yerr=e, label=_source_label(rr[0]), capsize=3, **style)
            if key == "top1":
                top = max(top, *(np.nan_to_num(np.add(y, e)) + 0.02))
    pR = sorted(PAPER_TABLE1)
    x_paper = [R * 1.12 for R in pR]
    ax_rank.scatter(
        x_paper,
        [PAPER_TABLE1[R]["eff_rank"] for R in pR],
        marker="*",
        s=120,
        color="k",
        zorder=4,
        label=f'paper Table 1: effective rank "{PAPER_TABLE1_EFF_RANK_TEXT}" (reported)',
    )
    lo = [PAPER_TABLE1[R]["top1"][0] for R in pR]
    hi = [PAPER_TABLE1[R]["top1"][1] for R in pR]
    ax_top1.vlines(x_paper, lo, hi, color="k", lw=4, label="paper Table 1: top-1 range (reported)")
    allR = sorted({r["R"] for r in rows} | set(pR))
    ax_rank.plot(allR, allR, ls=":", color="grey", label="R (largest possible effective rank)")
    for ax, lab in ((ax_rank, "effective rank (sum s)^2 / sum s^2"),
                    (ax_top1, "top-1 fraction s_1^2 / sum s^2")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(allR, [str(R) for R in allR])
        ax.set_xlim(allR[0] / 1.4, allR[-1] * 1.4)
        ax.set_xlabel("group size R")
        ax.set_ylabel(lab)
    ax_rank.set_title("effective rank of diag(A) Psi, given a mixed group", fontsize=9)
    ax_top1.set_title("top-1 fraction of diag(A) Psi, given a mixed group", fontsize=9)
    ax_top1.set_ylim(0, top)
    return ax_rank, ax_top1


def compare_title(*, p: float, p_from: str, real_name: str | None) -> str:
    """``compare.png``'s title: what is shown (toy worlds, the real run when there is one, the
    paper's Table 1), and the toy worlds' success probability ``p`` with where it came from."""
    shown = f"toy worlds and the real model {real_name}" if real_name else "toy worlds"
    hint = "" if real_name else "; real model: pass --real RESULTS.json"
    return (f"GRPO gradient spectrum: {shown} beside the paper's Table 1\n"
            f"(GRPO advantages; toy rewards Bernoulli(p={p:.3f}), {p_from}{hint})")


def _md(rows: Sequence[dict[str, Any]]) -> str:
    def f(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    out = "| R | source | effective rank | top-1 fraction |\n|---|---|---|---|\n"
    for R in sorted({r["R"] for r in rows}):
        for r in (r for r in rows if r["R"] == R):
            er = f(r["effective_rank_mean"]) + (
                f" ± {f(r['effective_rank_sd'])}" if r.get("effective_rank_sd") is not None else ""
            )
            t1 = f(r["top1_mean"]) + (
                f" ± {f(r['top1_sd'])}" if r.get("top1_sd") is not None else ""
            )
            out += f"| {R} | {r['source']} | {er} | {t1} |\n"
        if R in PAPER_TABLE1:
            t = PAPER_TABLE1[R]
            out += (
                f"| {R} | paper Table 1 (reported; max rank {t['max_rank']}) | "
                f"{PAPER_TABLE1_EFF_RANK_TEXT} | {t['top1'][0]}–{t['top1'][1]} |\n"
            )
    return out


@locks_out_dir("compare")
def run_compare(
    out_dir: str | Path,
    *,
    real: str | Path | None = None,
    R_values: Sequence[int] = (2, 4, 8),
    p: float | None = None,
) -> dict[str, Any]:
    """Write ``compare.json``, ``compare.md`` and ``compare.png`` (and ``diagnostics.png`` for a
    training run whose steps carry diagnostics) to ``out_dir``; returns the JSON.

    Args:
        out_dir: output folder.
        real: a ``real rank`` ``results.json`` (optional).
        R_values: group sizes (default 2 4 8).
        p: success probability of the toy groups (default: the real accuracy, else 0.5).
    """
    import matplotlib.pyplot as plt

    from .run_io import environment

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    real_rows, real_res = ([], None) if real is None else _real_rows(real)
    p_from = "--p"
    if p is None:
        acc = real_res.get("accuracy") if real_res else None
        p, p_from = (acc, "the real run's accuracy") if acc is not None and 0 < acc < 1 else (
            0.5, "the default")
    rows = toy_rank_rows(R_values, p=p) + [r for r in real_rows if r["R"] in set(R_values)]
    md = (
        f"Toy worlds: exact means given a mixed group, rewards Bernoulli(p={p:.3f}); "
        "real: means ± sd "
        "over mixed groups; paper: values as reported in its Table 1.\n\n" + _md(rows)
    )
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), layout="constrained")
    plot_compare(axes[0], axes[1], rows)
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=2, fontsize=8,
               frameon=False)
    real_name = (real_res.get("model") or {}).get("name", "real") if real_res else None
    fig.suptitle(compare_title(p=p, p_from=p_from, real_name=real_name), fontsize=10)
    save_figure(fig, out / "compare.png", dpi=120)
    plt.close(fig)
    res = {
        "experiment": "compare",
        "p": p,
        "R_values": list(R_values),
        "toy_worlds": {w: {"model": m, **kw} for w, (m, kw) in TOY_WORLDS.items()},
        "rows": rows,
        "paper_table1_reported": PAPER_TABLE1,
        "real_results": str(real) if real else None,
        "environment": environment(),
        "table_md": md,
    }
    steps = (real_res or {}).get("steps") or []
    if has_diagnostics(steps):
        diagnostics_figure(out / "diagnostics.png", steps,
                           title=f"training run {real_name}")
        res["diagnostics_figure"] = "diagnostics.png"
    write_json(out / "compare.json", res)
    atomic_write_text(out / "compare.md", md)
    return res
