"""Sec. 7's measured Table 1 decided on a real-model run (``grpo-audit audit --real FILE``).

The paper measures (Nemotron-4B, GSM8K) an effective rank "~2" for every group size R and top-1
fractions 0.6-0.7, 0.7-0.8, 0.5-0.6 at R = 2, 4, 8 (:data:`paper_values.PAPER_TABLE1`). A
``grpo-audit real rank`` run measures the same two quantities (means over the groups with mixed
rewards, at the model's current weights) on the model it ran; :func:`decide` decides the claim
``table1_empirical_values`` on that run, beside its computed verdict (which stays ``inconclusive``:
the paper's own model is not available here).

Rule (statistical tier, k = 4 as everywhere): at each R the interval mean +- 4 SE (SE = sd /
sqrt(mixed groups)) of the run's mean is compared with the band the paper prints: inside it,
the part holds at that R; disjoint from it, it is refuted; overlapping its edge, or with fewer
than two mixed groups, it is undecided at that R. "~2" is read as "rounds to 2", the band
[1.5, 2.5]; a top-1 range is read as printed. A part holds when it holds at every R of Table 1,
is refuted when it is refuted at one R; the claim holds when both parts hold and is refuted when
one part is refuted.
"""

from __future__ import annotations

from typing import Any

from paper_checks.claim_support import K_SE
from paper_checks.real_run import RankRow, RealRankRun, RealVerdict
from paper_values import PAPER_TABLE1

__all__ = ["CLAIMS", "EFF_RANK_BAND", "decide", "band_verdict"]

#: The claims a real run decides (``Paper.real_checks``).
CLAIMS: tuple[str, ...] = ("table1_empirical_values",)

#: The printed "~2" read as "rounds to 2".
EFF_RANK_BAND: tuple[float, float] = (1.5, 2.5)


def band_verdict(row: RankRow | None, what: str, band: tuple[float, float]
                 ) -> tuple[str, str]:
    """``(verdict, why)`` of "the mean of ``what`` lies in ``band``" at one R (module rule)."""
    if row is None:
        return "inconclusive", "not in the run (add it with real rank --R)"
    if row.mixed_groups == 0:
        return "inconclusive", ("no group with mixed rewards (more prompts, a larger R or "
                                "easier problems)")
    se = row.se(what)
    m = getattr(row, f"{what}_mean")
    if se is None or m is None:
        return "inconclusive", f"{row.mixed_groups} mixed group; two or more give a standard error"
    lo, hi = m - K_SE * se, m + K_SE * se
    if band[0] <= lo and hi <= band[1]:
        return "holds", "inside the band"
    if hi < band[0] or lo > band[1]:
        return "refuted", "outside the band"
    return "inconclusive", "the interval straddles the band's edge (more prompts)"


def _combine(verdicts: list[str]) -> str:
    if "refuted" in verdicts:
        return "refuted"
    return "holds" if verdicts and all(v == "holds" for v in verdicts) else "inconclusive"


def _mean_se(row: RankRow | None, what: str) -> str:
    if row is None or getattr(row, f"{what}_mean") is None:
        return "n/a"
    se = row.se(what)
    m = getattr(row, f"{what}_mean")
    return f"{m:.3f}" + ("" if se is None else f" +- {se:.3f}")


def decide(run: RealRankRun) -> dict[str, RealVerdict]:
    """``table1_empirical_values`` decided on ``run`` (the module's rule), for the R of Table 1."""
    ev: dict[str, Any] = {"k": K_SE, "eff_rank_band_lo": EFF_RANK_BAND[0],
                          "eff_rank_band_hi": EFF_RANK_BAND[1]}
    eff_v, top_v, per_R = [], [], []
    for R, printed in PAPER_TABLE1.items():
        row = run.row(R)
        top_band = tuple(float(x) for x in printed["top1"])  # type: ignore[union-attr]
        ve, we = band_verdict(row, "effective_rank", EFF_RANK_BAND)
        vt, wt = band_verdict(row, "top1", top_band)  # type: ignore[arg-type]
        eff_v.append(ve)
        top_v.append(vt)
        if row is None or row.mixed_groups == 0:
            per_R.append(f"R={R}: {ve} ({we})")
        else:
            per_R.append(
                f"R={R}: eff. rank {_mean_se(row, 'effective_rank')} {ve}"
                + ("" if ve in ("holds", "refuted") else f" ({we})")
                + f", top-1 {_mean_se(row, 'top1')} vs {top_band[0]:g}-{top_band[1]:g} {vt}"
                + ("" if vt in ("holds", "refuted") else f" ({wt})"))
        ev[f"R{R}_groups"] = None if row is None else row.groups
        ev[f"R{R}_mixed_groups"] = None if row is None else row.mixed_groups
        for what in ("effective_rank", "top1"):
            ev[f"R{R}_{what}_mean"] = None if row is None else getattr(row, f"{what}_mean")
            ev[f"R{R}_{what}_se"] = None if row is None else row.se(what)
        ev[f"R{R}_printed_top1_lo"], ev[f"R{R}_printed_top1_hi"] = top_band
        ev[f"R{R}_eff_rank_verdict"] = ve
        ev[f"R{R}_top1_verdict"] = vt
    eff, top = _combine(eff_v), _combine(top_v)
    ev["eff_rank_about_2_for_every_R"] = eff
    ev["top1_in_printed_ranges"] = top
    finding = (f"on {run.model} ({run.size}; mixed groups {run.mixed}): effective rank ~2 for "
               f"every R {eff}, top-1 in the printed ranges {top} (mean +- SE, decided at "
               f"+-{K_SE:g} SE): " + "; ".join(per_R))
    return {"table1_empirical_values": RealVerdict(_combine([eff, top]), finding, ev)}
