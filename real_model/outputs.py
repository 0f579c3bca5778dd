"""Outputs of the real-model experiments: the JSON results, Markdown tables and figures.

One module for what ``real rank``, ``real train`` and ``real trl-train`` write, so the three
report alike:

* JSON: :func:`run_header` (``experiment``, ``config``, ``model``, ``environment``: the head of
  every ``results.json``), :func:`rank_results` / :func:`write_rank_results`,
  :func:`write_train_results`, :func:`train_step_record` (a line of ``steps.jsonl``) and
  :func:`step_spectra` (its ``spectra`` field).
* Tables: :func:`summarize_rank` (per ``R``, over mixed-reward groups) and
  :func:`rank_table_markdown`; :func:`train_table_markdown` (one row per step).
* Figures: :func:`plot_rank_metric` / :func:`rank_figure` (``rank.png``);
  :func:`window_stats`, :func:`plot_training_metric` / :func:`train_figure` (``train.png``),
  :func:`diagnostics_figure` (``diagnostics.png``: noise scale and SNR per step).

**Rank summary** (per ``R``, for one estimator, over groups with mixed rewards only, since an
all-equal group has ``A = 0`` and no spectrum): max rank (largest number of nonzero weights, the
rank bound of ``diag(w) Psi``), mean numerical rank, mean +/- sd of the effective rank
``(sum s)^2 / sum s^2``, mean entropy effective rank, mean +/- sd of the top-1 fraction
``s_1^2 / sum s^2``, the score geometry's means, and the number of mixed groups out of all groups.

matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_io import atomic_write_text, save_figure

from .run_io import environment, write_json

if TYPE_CHECKING:
    from .config import RankConfig

__all__ = [
    "run_header",
    "summarize_rank",
    "rank_table_markdown",
    "rank_title",
    "rank_results",
    "no_mixed_group_notes",
    "write_rank_results",
    "plot_rank_metric",
    "rank_figure",
    "step_spectra",
    "train_step_record",
    "train_table_markdown",
    "has_diagnostics",
    "diagnostics_figure",
    "write_train_results",
    "window_stats",
    "default_window",
    "plot_training_metric",
    "train_figure",
]


def run_header(experiment: str, cfg: RankConfig, loaded: Any) -> dict[str, Any]:
    """The head of every ``results.json``: ``experiment``, ``config`` (every option of the
    dataclass ``cfg``), ``model`` (``loaded.describe()``, if it has one) and ``environment``
    (library versions and device, :func:`real_model.run_io.environment`)."""
    return {
        "experiment": experiment,
        "config": asdict(cfg),
        "model": loaded.describe() if hasattr(loaded, "describe") else None,
        "environment": environment(getattr(loaded, "device", None)),
    }


# --- real rank -----------------------------------------------------------------------------------


def rank_title(result: dict[str, Any]) -> str:
    """Title line of ``real rank``'s ``table.md``: model, estimator, aggregation, prompts, seed,
    accuracy, read from its ``results.json`` content ``result``."""
    m = result.get("model") or {}
    c = result["config"]
    return (
        f"real rank: model {m.get('name')}, estimator {result['main_estimator']}, aggregation "
        f"{c['aggregation']}, {result['num_groups']} prompts, seed {c['seed']}, "
        f"accuracy {result['accuracy']:.3f}"
    )


def summarize_rank(
    records: Sequence[dict[str, Any]],
    *,
    estimator: str = "grpo",
    R_values: Sequence[int] = (2, 4, 8),
) -> list[dict[str, Any]]:
    """Per-``R`` summary of ``estimator`` over mixed-reward groups (see the module docstring).

    Args:
        records: ``real rank`` records (``by_R[str(R)]`` = a group's geometry at size ``R``).
        estimator: the estimator whose spectra are summarised.
        R_values: group sizes, one row each (sorted).

    Returns:
        one dict per ``R``: ``R``, ``groups``, ``mixed_groups``, ``max_rank``, and the means (and
        sds, ddof 1, ``None`` below two values) named in the module docstring.
    """
    rows = []
    for R in sorted(R_values):
        geos = [r["by_R"][str(R)] for r in records if str(R) in r["by_R"]]
        mixed = [g for g in geos if g["mixed"]]
        ests = [g["estimators"][estimator] for g in mixed]

        def stat(key: str, vals: list[dict[str, Any]] = ests) -> tuple[float | None, float | None]:
            x = np.array([v[key] for v in vals if v.get(key) is not None], dtype=float)
            if x.size == 0:
                return None, None
            return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else None

        er, er_sd = stat("effective_rank")
        t1, t1_sd = stat("top1_fraction")
        rows.append(
            {
                "R": int(R),
                "groups": len(geos),
                "mixed_groups": len(mixed),
                "max_rank": max((v["max_rank"] for v in ests), default=None),
                "numerical_rank_mean": stat("rank")[0],
                "effective_rank_mean": er,
                "effective_rank_sd": er_sd,
                "entropy_effective_rank_mean": stat("entropy_effective_rank")[0],
                "top1_mean": t1,
                "top1_sd": t1_sd,
                "common_share_mean": stat("common_share", mixed)[0],
                "cos_between_mean": stat("cos_between", mixed)[0],
                "cos_within_success_mean": stat("cos_within_success", mixed)[0],
                "cos_within_failure_mean": stat("cos_within_failure", mixed)[0],
            }
        )
    return rows


def _f(x: float | None, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _pm(m: float | None, s: float | None) -> str:
    return _f(m) if s is None else f"{_f(m)} ± {_f(s)}"


def rank_table_markdown(rows: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """Markdown table of :func:`summarize_rank` rows."""
    head = (
        "| R | max rank | numerical rank | effective rank | entropy eff. rank | top-1 fraction "
        "| common share | cos(S,F) | mixed groups |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['R']} | {r['max_rank'] if r['max_rank'] is not None else 'n/a'} "
        f"| {_f(r['numerical_rank_mean'], 2)} "
        f"| {_pm(r['effective_rank_mean'], r['effective_rank_sd'])} "
        f"| {_f(r['entropy_effective_rank_mean'])} | {_pm(r['top1_mean'], r['top1_sd'])} "
        f"| {_f(r['common_share_mean'])} | {_f(r['cos_between_mean'])} "
        f"| {r['mixed_groups']}/{r['groups']} |\n"
        for r in rows
    )
    note = (
        "\nMeans (± sd) over mixed-reward groups. max rank = largest number of nonzero weights "
        "(rank bound of diag(w) Psi); common share = lambda_max(cosine matrix)/R; cos(S,F) = mean "
        "cosine between success and failure scores. Smaller R are nested subsets of the largest "
        "group.\n"
    )
    return (f"{title}\n\n" if title else "") + head + body + note


def _equal_group_counts(records: Sequence[dict[str, Any]], R: int) -> dict[float, int]:
    """How many of the size-``R`` groups (each record's first ``R`` rewards) had all rewards equal
    to each value (binary rewards: ``{0.0: all wrong, 1.0: all right}``)."""
    counts: dict[float, int] = {}
    for r in records:
        w = np.asarray(r["rewards"], dtype=float)[:R]
        if w.size == R and np.all(w == w[0]):
            counts[float(w[0])] = counts.get(float(w[0]), 0) + 1
    return counts


def _equal_label(value: float) -> str:
    return {0.0: "all wrong", 1.0: "all right"}.get(value, f"all {value:g}")


def _more_mixed_options(
    cfg: RankConfig, counts: dict[float, int], records: Sequence[dict[str, Any]]
) -> str:
    """The options that give more mixed groups: more prompts, larger groups, longer completions
    (when some stopped at ``max_new_tokens``: their answers may be cut off), and problems that
    are easier (mostly all wrong) or harder (mostly all right), by the options that set them."""
    more = max(2 * cfg.prompts, 16)
    larger = " ".join(str(2 * R) for R in sorted(cfg.R_values))
    opts = [f"more prompts (--prompts {more})", f"larger groups (--R {larger})"]
    reasons = [x for r in records for x in r.get("stop_reasons", [])]
    cut = reasons.count("length")
    if cut:
        opts.append(f"longer completions (--max-new-tokens {2 * cfg.max_new_tokens}: {cut} of "
                    f"{len(reasons)} stopped at the limit, perhaps before their answer)")
    wrong, right = counts.get(0.0, 0), counts.get(1.0, 0)
    if cfg.source != "generated":
        if wrong >= right:
            opts.append("easier problems (--source generated --difficulty 1 --operations add sub)")
    elif wrong >= right:
        if tuple(cfg.difficulty) != (1,) or not set(cfg.operations) <= {"add", "sub"}:
            opts.append("easier problems (--difficulty 1 --operations add sub)")
    else:
        opts.append(f"harder problems (--difficulty {max(cfg.difficulty) + 1})")
    return ", ".join(opts[:-1]) + " or " + opts[-1]


def no_mixed_group_notes(
    cfg: RankConfig, records: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]]
) -> list[str]:
    """One line per ``R`` of ``summary`` without a mixed-reward group: why (every group's rewards
    were equal, by kind: all wrong / all right, so every advantage is 0 and there is no gradient
    to take a spectrum of) and which options would give mixed groups
    (:func:`_more_mixed_options`; ``records``' ``stop_reasons`` say whether completions were cut
    at ``max_new_tokens``). Empty when every ``R`` has a mixed group.

    >>> from real_model.config import RankConfig
    >>> recs = [{"rewards": [0, 0, 1, 0]}, {"rewards": [1, 1, 1, 1]}]
    >>> rows = [{"R": 2, "groups": 2, "mixed_groups": 0}, {"R": 4, "groups": 2, "mixed_groups": 1}]
    >>> no_mixed_group_notes(RankConfig(R_values=(2, 4), prompts=2), recs, rows)[0][:78]
    'R=2: no mixed group: all 2 groups had equal rewards (1 all wrong, 1 all right)'
    """
    notes = []
    for row in summary:
        if row["mixed_groups"] or not row["groups"]:
            continue
        R = row["R"]
        counts = _equal_group_counts(records, R)
        kinds = ", ".join(f"{n} {_equal_label(v)}" for v, n in sorted(counts.items()))
        groups = "the one group" if row["groups"] == 1 else f"all {row['groups']} groups"
        notes.append(
            f"R={R}: no mixed group: {groups} had equal rewards ({kinds}), so every advantage "
            "is 0: no gradient, no spectrum (n/a). For mixed groups: "
            f"{_more_mixed_options(cfg, counts, records)}."
        )
    return notes


#: What each metric of ``rank.png`` is called on its axis.
_METRIC_LABELS = {"effective_rank": "effective rank (sum s)^2 / sum s^2",
                  "top1_fraction": "top-1 fraction s_1^2 / sum s^2", "rank": "numerical rank"}


def plot_rank_metric(
    ax: Any,
    records: Sequence[dict[str, Any]],
    *,
    metric: str = "effective_rank",
    estimator: str = "grpo",
    R_values: Sequence[int] = (2, 4, 8),
    seed: int = 0,
    paper: bool = True,
) -> Any:
    """``metric`` per mixed group against ``R`` (jittered dots) with their mean (diamond);
    returns ``ax``.

    With ``paper`` (default) the paper's Table 1 is drawn beside ours, from
    :data:`paper_values.PAPER_TABLE1` (its reported effective rank "~2" as a star, its top-1
    fraction ranges as bars); the effective rank also gets the line ``R`` (the largest possible).
    An ``R`` without a mixed group is labelled so at its place, and an axis with no mixed group at
    any ``R`` says so in its middle: the panel is never silently empty.
    """
    from paper_values import PAPER_TABLE1

    rng = np.random.default_rng(seed)
    Rs = sorted(R_values)
    paper_Rs = sorted(PAPER_TABLE1) if paper and metric in ("effective_rank", "top1_fraction") \
        else []
    empty: list[int] = []
    labels = {"dots": "ours: one mixed group", "mean": "ours: mean"}  # on the first R drawn
    for R in Rs:
        vals = [
            r["by_R"][str(R)]["estimators"][estimator][metric]
            for r in records
            if str(R) in r["by_R"] and r["by_R"][str(R)]["mixed"]
        ]
        vals = [v for v in vals if v is not None]
        if not vals:
            empty.append(R)
            continue
        x = R * 2.0 ** rng.uniform(-0.12, 0.12, len(vals))
        ax.scatter(x, vals, s=12, alpha=0.5, color="C0", label=labels.pop("dots", None))
        ax.scatter([R], [np.mean(vals)], s=60, marker="D", color="C3", zorder=3,
                   label=labels.pop("mean", None))
    if metric == "effective_rank" and paper_Rs:
        ax.scatter([R * 1.18 for R in paper_Rs], [PAPER_TABLE1[R]["eff_rank"] for R in paper_Rs],
                   marker="*", s=140,
                   color="k", zorder=4, label='paper Table 1: effective rank "~2"')
    if metric == "top1_fraction" and paper_Rs:
        ax.vlines([R * 1.18 for R in paper_Rs], [PAPER_TABLE1[R]["top1"][0] for R in paper_Rs],
                  [PAPER_TABLE1[R]["top1"][1] for R in paper_Rs], color="k", lw=4, zorder=4,
                  label="paper Table 1: top-1 range")
    if metric in ("effective_rank", "rank"):
        ax.plot(Rs, Rs, ls="--", color="grey", lw=1, label="R (largest possible)")
    if metric == "top1_fraction":
        ax.set_ylim(0, 1.02)
    lo, hi = ax.get_ylim()
    for R in empty:
        ax.text(R, lo + 0.5 * (hi - lo), "no mixed\ngroup", ha="center", va="center",
                fontsize=7, color="C3", rotation=90)
    if len(empty) == len(Rs):  # said above the data, where it covers nothing
        ax.set_title("ours: no mixed group at any R, so no spectrum\n(every group's rewards "
                     "were equal; table.md says what to change)", fontsize=8, color="C3")
    ticks = sorted({*Rs, *paper_Rs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(r) for r in ticks])
    ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
    ax.set_xlabel("group size R")
    ax.set_ylabel(_METRIC_LABELS.get(metric, metric.replace("_", " ")))
    return ax


def rank_figure(
    path: Path, records: Sequence[dict[str, Any]], estimator: str, R_values: Sequence[int]
) -> None:
    """``rank.png``: effective rank and top-1 fraction per mixed group against ``R``, beside
    the paper's Table 1 (:func:`plot_rank_metric`), one legend under both panels."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, metric in zip(axes, ("effective_rank", "top1_fraction"), strict=True):
        plot_rank_metric(ax, records, metric=metric, estimator=estimator, R_values=R_values)
    handles, labels = {}, {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
            labels[lab] = lab
    fig.legend(list(handles.values()), list(labels), loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    n_mixed = {R: sum(bool(r["by_R"].get(str(R), {}).get("mixed")) for r in records)
               for R in sorted(R_values)}
    fig.suptitle(
        f"GRPO gradient spectrum of the real model ({estimator} advantages; mixed groups: "
        + ", ".join(f"R={R}: {n}/{len(records)}" for R, n in n_mixed.items()) + ")",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def rank_results(
    cfg: RankConfig, loaded: Any, records: Sequence[dict[str, Any]], *, wall_s: float,
    results_jsonl: Path,
) -> dict[str, Any]:
    """``real rank``'s ``results.json``: :func:`run_header`, the summary of the main estimator
    ``cfg.estimators[0]`` and of every estimator, ``notes`` (:func:`no_mixed_group_notes`: why an
    ``R`` has no number, and what to change), accuracy (mean reward), number of groups,
    ``wall_s`` (this call's seconds) and the path of the records."""
    main = cfg.estimators[0]
    summary = summarize_rank(records, estimator=main, R_values=cfg.R_values)
    return {
        **run_header("real_rank", cfg, loaded),
        "main_estimator": main,
        "summary": summary,
        "summary_by_estimator": {
            e: summarize_rank(records, estimator=e, R_values=cfg.R_values) for e in cfg.estimators
        },
        "notes": no_mixed_group_notes(cfg, records, summary),
        "accuracy": float(np.mean([np.mean(r["rewards"]) for r in records])),
        "num_groups": len(records),
        "wall_s_this_call": wall_s,
        "results_jsonl": str(results_jsonl),
    }


def write_rank_results(
    out: Path,
    cfg: RankConfig,
    loaded: Any,
    records: Sequence[dict[str, Any]],
    *,
    wall_s: float,
    results_jsonl: Path,
) -> dict[str, Any]:
    """Write ``real rank``'s ``results.json`` (:func:`rank_results`), ``table.md`` and
    ``rank.png`` into ``out``; returns the ``results.json`` content."""
    result = rank_results(cfg, loaded, records, wall_s=wall_s, results_jsonl=results_jsonl)
    write_json(out / "results.json", result)
    table = rank_table_markdown(result["summary"], title=rank_title(result))
    if result["notes"]:
        table += "\n" + "\n".join(f"Note: {n}" for n in result["notes"]) + "\n"
    atomic_write_text(out / "table.md", table)
    rank_figure(out / "rank.png", records, result["main_estimator"], cfg.R_values)
    return result


# --- real train ----------------------------------------------------------------------------------


def step_spectra(geos: Sequence[dict[int, dict[str, Any]]], estimator: str) -> dict[str, Any]:
    """The ``spectra`` field of a training step's record, from its groups' nested geometries.

    Args:
        geos: per group of the step, ``{R: geometry}`` of
            :func:`~real_model.geometry.nested_group_geometry`.
        estimator: the estimator whose spectra are recorded.

    Returns:
        ``{str(R): {...}}``: ``mixed_groups``, ``groups``, and over the mixed groups the means of
        ``effective_rank``, ``top1_fraction``, ``rank`` (``None`` if no group is mixed), their
        per-group ``*_values``, and ``common_share_mean``.
    """
    out: dict[str, Any] = {}
    for R in sorted({R for g in geos for R in g}):
        mixed = [g[R] for g in geos if g[R]["mixed"]]
        vals = {
            k: [
                m["estimators"][estimator][k]
                for m in mixed
                if m["estimators"][estimator][k] is not None
            ]
            for k in ("effective_rank", "top1_fraction", "rank")
        }
        out[str(R)] = {
            "mixed_groups": len(mixed),
            "groups": len(geos),
            **{f"{k}_mean": (float(np.mean(v)) if v else None) for k, v in vals.items()},
            **{f"{k}_values": v for k, v in vals.items()},
            "common_share_mean": float(np.mean([m["common_share"] for m in mixed]))
            if mixed
            else None,
        }
    return out


def train_step_record(
    step: int,
    rewards: np.ndarray,
    geometry: Sequence[dict[int, dict[str, Any]]],
    estimator: str,
    *,
    grad_norm: float,
    loss: float,
    diagnostics: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A training step's line of ``steps.jsonl`` (``real train`` adds ``time_s`` and ``config``).

    Args:
        step: the step index.
        rewards: ``[P, R]`` rewards of the step's groups.
        geometry: per group, the nested geometry (see :func:`step_spectra`).
        estimator: the estimator whose spectra are recorded.
        grad_norm, loss: the step's gradient norm and loss.
        diagnostics: the step's training diagnostics
            (:func:`grpo_theory.diagnostics.step_diagnostics`), if measured.

    Returns:
        ``step``, ``accuracy`` (mean reward), ``reward_std_within`` (mean over groups of the
        within-group std, ddof 0), ``reward_std`` (over all rollouts), ``zero_adv_fraction``
        (groups whose rewards are all equal), ``grad_norm``, ``loss``, ``spectra`` and, when
        given, ``diagnostics``.
    """
    rw = np.asarray(rewards)
    extra = {} if diagnostics is None else {"diagnostics": diagnostics}
    return {
        "step": step,
        "accuracy": float(rw.mean()),
        "reward_std_within": float(rw.std(axis=1).mean()),
        "reward_std": float(rw.std()),
        "zero_adv_fraction": float(np.mean(rw.min(axis=1) == rw.max(axis=1))),
        "grad_norm": grad_norm,
        "loss": loss,
        "spectra": step_spectra(geometry, estimator),
        **extra,
    }


def write_train_results(
    out: Path,
    cfg: RankConfig,
    loaded: Any,
    records: list[dict[str, Any]],
    *,
    checkpoint: Path,
    steps_on_disk: int,
    checkpoint_steps: int,
    note: str | None = None,
) -> dict[str, Any]:
    """Write ``real train``'s ``results.json``, ``table.md``, ``train.png`` and, when its steps
    carry diagnostics, ``diagnostics.png`` (:func:`diagnostics_figure`) into ``out``.

    ``records`` are the reported steps; ``steps_on_disk`` and ``checkpoint_steps`` say what
    ``out`` and the ``checkpoint`` file hold; ``note`` (if any) is recorded and printed under
    the table. Returns the ``results.json`` content.
    """
    result = {
        **run_header("real_train", cfg, loaded),
        "estimator": cfg.estimators[0],
        "steps_done": len(records),
        "steps_on_disk": steps_on_disk,
        "steps": [{k: v for k, v in r.items()} for r in records],
        "checkpoint": str(checkpoint),
        "checkpoint_steps_done": checkpoint_steps,
        "note": note,
    }
    write_json(out / "results.json", result)
    table = train_table_markdown(records, cfg.R_values)
    if note:
        table += f"\nNote: {note}.\n"
    atomic_write_text(out / "table.md", table)
    train_figure(out / "train.png", records, cfg.R_values)
    if has_diagnostics(records):
        diagnostics_figure(out / "diagnostics.png", records)
    return result


def train_table_markdown(records: Sequence[dict[str, Any]], R_values: Sequence[int]) -> str:
    """``table.md`` of a training run: one row per step (accuracy, within-group reward std,
    zero-advantage fraction, gradient norm, and per ``R`` the step's mean effective rank and
    top-1 fraction over its mixed groups)."""
    Rs = sorted(R_values)
    head = (
        "| step | accuracy | reward std | zero-adv frac | grad norm | "
        + " | ".join(f"eff. rank R={R} | top-1 R={R}" for R in Rs)
        + " |\n"
    )
    head += "|" + "---|" * (5 + 2 * len(Rs)) + "\n"
    body = ""
    for r in records:
        cells = []
        for R in Rs:
            sp = r["spectra"].get(str(R), {})
            cells += [_f(sp.get("effective_rank_mean")), _f(sp.get("top1_fraction_mean"))]
        body += (
            f"| {r['step']} | {_f(r['accuracy'])} | {_f(r['reward_std_within'])} | "
            f"{_f(r['zero_adv_fraction'])} | {r['grad_norm']:.3g} | " + " | ".join(cells) + " |\n"
        )
    return head + body + "\nSpectra: means over the step's mixed-reward groups (n/a: none mixed).\n"


def window_stats(
    steps: Sequence[int], values: Sequence[Sequence[float]], *, window: int
) -> dict[str, np.ndarray]:
    """Per-window mean, spread and count of values pooled over ``window`` consecutive steps.

    Per-step spectra are means over that step's few mixed groups (noisy); pooling the per-group
    values of ``window`` consecutive steps gives a mean with a stated spread.

    Args:
        steps: step indices, increasing, one per record.
        values: for each step, the values to pool (e.g. per-group effective ranks; may be empty).
        window: steps per window (>= 1); windows are ``records[k window : (k+1) window]``.

    Returns:
        ``center`` (mean step of the window), ``mean``, ``sd`` (sample sd, ddof 1; NaN for fewer
        than 2 values) and ``n`` (values pooled), each ``[num_windows]``; windows with no value
        are dropped.
    """
    if int(window) < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length: {len(steps)} vs {len(values)}")
    rows = []
    for k in range(0, len(steps), window):
        pooled = np.array([v for vs in values[k : k + window] for v in vs if v is not None],
                          dtype=float)
        if pooled.size == 0:
            continue
        sd = float(pooled.std(ddof=1)) if pooled.size > 1 else float("nan")
        rows.append((float(np.mean(steps[k : k + window])), float(pooled.mean()), sd, pooled.size))
    c, m, sd, n = (np.array(x) for x in zip(*rows, strict=True)) if rows else ([],) * 4
    return {"center": np.asarray(c, dtype=float), "mean": np.asarray(m, dtype=float),
            "sd": np.asarray(sd, dtype=float), "n": np.asarray(n, dtype=int)}


def default_window(num_steps: int) -> int:
    """Steps per window of the training figure: about 10 windows, at least 1 step each."""
    return max(1, round(num_steps / 10))


#: Axis labels of the training figure's metrics.
_TRAIN_LABELS = {
    "effective_rank_mean": "effective rank (mixed groups)",
    "top1_fraction_mean": "top-1 fraction (mixed groups)",
    "rank_mean": "numerical rank (mixed groups)",
    "accuracy": "accuracy (mean reward)",
}


def plot_training_metric(
    ax: Any,
    records: list[dict[str, Any]],
    *,
    metric: str,
    R_values: Sequence[int] = (2, 4, 8),
    window: int | None = None,
) -> Any:
    """``metric`` against the GRPO step: per-window means with a +/- 1 sd band, per-step values
    faint behind them. Returns ``ax``; no legend (:func:`train_figure` draws one for all
    panels), and an axis with no value at all says so in words.

    ``metric``: ``effective_rank_mean`` / ``top1_fraction_mean`` / ``rank_mean`` (one line per
    ``R``; the window pools the per-group values of its steps) or a step field such as
    ``accuracy`` (the window pools the per-step values). ``window``: steps per window (default
    :func:`default_window`; 1 draws the per-step values with no pooling across steps).
    """
    steps = [r["step"] for r in records]
    window = default_window(len(records)) if window is None else int(window)
    if records and metric in records[0]:
        series = [("_nolegend_", [r[metric] for r in records], [[r[metric]] for r in records])]
    else:
        base = metric[: -len("_mean")] if metric.endswith("_mean") else metric
        series = []
        for R in sorted(R_values):
            sp = [r["spectra"].get(str(R), {}) for r in records]
            per_step = [np.nan if x.get(metric) is None else x[metric] for x in sp]
            series.append((f"R={R}", per_step, [x.get(f"{base}_values", []) for x in sp]))
    drawn = 0
    for label, per_step, pooled in series:
        y = np.array([np.nan if v is None else v for v in per_step], dtype=float)
        (faint,) = ax.plot(steps, y, ls="none", marker=".", alpha=0.3)
        st = window_stats(steps, pooled, window=window)
        drawn += st["mean"].size
        ax.plot(st["center"], st["mean"], marker="o", color=faint.get_color(), label=label)
        band = np.nan_to_num(st["sd"])
        ax.fill_between(st["center"], st["mean"] - band, st["mean"] + band,
                        color=faint.get_color(), alpha=0.15)
    if not drawn:
        ax.text(0.5, 0.75, "no step recorded" if not records else
                "no value: no step had a mixed-reward group", transform=ax.transAxes,
                ha="center", va="center", fontsize=8, color="C3",
                bbox={"facecolor": "white", "edgecolor": "none"})
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(_TRAIN_LABELS.get(metric, metric.replace("_", " ")))
    return ax


def train_figure(path: Path, records: list[dict[str, Any]], R_values: Sequence[int]) -> None:
    """``train.png``: effective rank and top-1 fraction per ``R``, and accuracy, against the step
    (:func:`plot_training_metric`; the analogues of the paper's Figs. 1-3), with the paper's
    reported effective rank "~2" (Table 1, :data:`paper_values.PAPER_TABLE1`) as a reference
    line; one legend under the panels; the window and band explained in the title."""
    import matplotlib.pyplot as plt

    from paper_values import PAPER_TABLE1, PAPER_TABLE1_EFF_RANK_TEXT

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), layout="constrained")
    metrics = ("effective_rank_mean", "top1_fraction_mean", "accuracy")
    for ax, metric in zip(axes, metrics, strict=True):
        plot_training_metric(ax, records, metric=metric, R_values=R_values)
    ranks = sorted({float(v["eff_rank"]) for v in PAPER_TABLE1.values()})
    for er in ranks:
        axes[0].axhline(er, color="k", ls="--", lw=0.8,
                        label=f'paper Table 1: effective rank "{PAPER_TABLE1_EFF_RANK_TEXT}"')
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center",
                   ncol=len(seen), fontsize=8, frameon=False)
    w = default_window(len(records))
    fig.suptitle("GRPO training: spectra of the gradient matrix (cf. paper Figs. 1-3); dots: "
                 f"per step, lines: means over {w}-step windows, band: +/- 1 sd", fontsize=10)
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def has_diagnostics(records: Sequence[dict[str, Any]]) -> bool:
    """Whether any step record carries the training diagnostics (``diagnostics``)."""
    return any(r.get("diagnostics") for r in records)


def _diag(records: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if not r.get("diagnostics") or r["diagnostics"].get(key) is None
                     else float(r["diagnostics"][key]) for r in records], dtype=float)


def diagnostics_figure(path: Path, records: list[dict[str, Any]], *, title: str = "") -> None:
    """``diagnostics.png``: the gradient noise scale and the SNR of each step's gradient.

    Panels against the step (records with ``diagnostics``, keys of
    :func:`grpo_theory.diagnostics.step_diagnostics`): (1) ``B_simple = tr(Sigma) / |mu|^2`` in
    prompts (log scale) with the prompts per step; (2) the SNR ``|mu|^2 / (tr(Sigma) / n)`` (log
    scale) with SNR = 1; (3) both parts, ``|mu|^2`` and the step's noise ``tr(Sigma) / n``, in the
    squared units of the gradient (linear: a negative ``|mu|^2`` estimate shows as such); (4)
    the dead groups' share of the prompts. A step whose ``|mu|^2`` estimate is not positive
    (``noise/status`` 4) has no noise scale and no positive SNR: panels 1 and 2 mark it with a
    red x on the bottom edge and say so in words under the axis, never plot a value for it (the
    line has a gap there); a step with no defined value at all (other statuses, no diagnostics)
    is a gap too, counted under the axis.
    """
    import matplotlib.pyplot as plt

    steps = np.array([r["step"] for r in records], dtype=float)
    status = _diag(records, "noise/status")
    ok, nomu = status == 0, status == 4
    other = ~ok & ~nomu
    fig, axes = plt.subplots(1, 4, figsize=(15, 4.2), layout="constrained")
    b, snr, n = _diag(records, "noise/b_simple"), _diag(records, "noise/snr"), _diag(records,
                                                                                   "groups")
    panels = ((axes[0], b, n, "prompts per step", "noise scale B_simple [prompts]"),
              (axes[1], snr, np.ones_like(snr), "SNR = 1", "SNR of the step's gradient"))
    for ax, y, ref, ref_label, ylabel in panels:
        if ok.any():  # undefined steps are gaps in the line, never values
            ax.plot(steps, np.where(ok, y, np.nan), marker="o", color="C0",
                    label="estimate (noise status 0)")
            ax.plot(steps[ok], ref[ok], color="k", ls="--", lw=0.8, label=ref_label)
            ax.set_yscale("log")
        if nomu.any():
            ax.plot(steps[nomu], np.zeros(nomu.sum()), ls="none", marker="x", color="C3",
                    clip_on=False, transform=ax.get_xaxis_transform(),
                    label="|mu|^2 estimate <= 0: not defined")
        words = []
        if nomu.any():
            words.append(f"x: {int(nomu.sum())} step(s) with |mu|^2 estimate <= 0,\n"
                         "no shared signal detected: no value")
        if other.any():
            words.append(f"{int(other.sum())} step(s) without a defined value\n"
                         "(noise/status)")
        if not ok.any() and not nomu.any():
            words.append("no defined value at any step")
        ax.set_xlabel("\n".join(["training step", *words]), fontsize=9 if words else None)
        ax.set_ylabel(ylabel)
    mu, noise = _diag(records, "noise/mu_sq"), _diag(records, "noise/step_noise_sq")
    axes[2].plot(steps, mu, marker="o", color="C2", label="|mu|^2 estimate (signal)")
    axes[2].plot(steps, noise, marker="s", color="C1", label="tr(Sigma)/n estimate (noise)")
    axes[2].axhline(0.0, color="k", lw=0.6)
    axes[2].set_ylabel("squared gradient norm")
    axes[3].plot(steps, _diag(records, "dead_groups/group_share"), marker="o", color="C4",
                 label="dead groups (exactly zero gradient)")
    axes[3].set_ylim(-0.05, 1.05)
    axes[3].set_ylabel("share of the step's prompts")
    seen: dict[str, Any] = {}
    for ax in axes:
        if len(steps):
            ax.set_xlim(steps.min() - 0.5, steps.max() + 0.5)
        if not ax.get_xlabel():
            ax.set_xlabel("training step")
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center",
                   ncol=len(seen), fontsize=8, frameon=False)
    fig.suptitle((title + ": " if title else "") + "gradient noise scale and SNR per step "
                 "(prompts as the units; McCandlish et al. 2018), exact from the per-rollout "
                 "gradient Grams", fontsize=10)
    save_figure(fig, path, dpi=120)
    plt.close(fig)
