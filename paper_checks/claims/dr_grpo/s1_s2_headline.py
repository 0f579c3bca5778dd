"""Dr. GRPO (arXiv 2503.20783) abstract, Sec. 1-2 and App. B: the headline empirical numbers.

They need LLM training and evaluation and are registered as ``inconclusive`` with what would
decide them; the one statement that is arithmetic on the paper's own printed numbers (the
relative gain of the no-template setting) is recomputed. Printed values:
:mod:`paper_values.dr_grpo`.
"""

from __future__ import annotations

from typing import Any

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "Dr. GRPO Abstract, Sec. 1-2, App. B: headline numbers"


@claim(
    "drgrpo_headline_empirical_numbers", kind="empirical",
    location="Abstract; Sec. 1; Fig. 2; Table 4 (App. B); Fig. 13 (App. D)",
    text="Oat-Zero-7B (Qwen2.5-Math-7B, Dr. GRPO, MATH level 3-5, Qwen-Math template) reaches "
    "43.3% on AIME 2024 and a five-benchmark average of 51.4 after 27 hours on 8 A100s; for "
    "DeepSeek-R1-Zero nearly half of the responses with self-reflection are no more accurate "
    "than those without.",
    check="Not decidable by computation here: needs the training run and the evaluations. "
    "Evidence: the printed values (paper_values.dr_grpo).",
)
def _headline(ctx: CheckContext) -> Outcome:
    from paper_values.dr_grpo import OAT_ZERO_7B

    return Outcome("inconclusive", {f"printed_{k}": v for k, v in OAT_ZERO_7B.items()},
                   correction="decided by retraining Oat-Zero-7B with the released recipe "
                   "(several seeds) and evaluating on AIME 2024, AMC, MATH500, Minerva Math and "
                   "OlympiadBench; the self-reflection statement by re-grading R1-Zero's "
                   "responses with and without reflection keywords",
                   short="needs the LLM training run and evaluations")


def no_template_gain_outcome(ctx: CheckContext, *,
                             values: dict[str, tuple[float, float]] | None = None,
                             stated: float = 60.0, tolerance: float = 5.0) -> Outcome:
    """Relative gain ``no_template / four_shot - 1`` per model vs the stated percentage
    (``|gain - stated| <= tolerance`` percentage points reads as "about")."""
    from paper_values.dr_grpo import NO_TEMPLATE_AVERAGE_GAIN

    vals = values if values is not None else NO_TEMPLATE_AVERAGE_GAIN
    ev: dict[str, Any] = {}
    near = {}
    for model, (four, none) in vals.items():
        gain = 100.0 * (none / four - 1.0)
        ev[f"{model}_relative_gain_percent"] = gain
        near[model] = abs(gain - stated) <= tolerance
    ev["stated_gain_percent"] = stated
    ev["tolerance_percentage_points"] = tolerance
    all_near, any_near = all(near.values()), any(near.values())
    verdict = verdict_from(any_near, agrees="holds" if all_near else "holds-with-conditions")
    fits = [m for m, ok in near.items() if ok]
    off = {m: ev[f"{m}_relative_gain_percent"] for m, ok in near.items() if not ok}
    return Outcome(
        verdict, ev,
        conditions=(f"\"about {stated:g}%\" fits {', '.join(fits)}; the printed averages give "
                    + ", ".join(f"{m}: +{g:.1f}%" for m, g in off.items()))
        if verdict == "holds-with-conditions" else None,
        short=("fits " + ", ".join(fits) + "; " + ", ".join(f"{m} +{g:.1f}%"
                                                           for m, g in off.items()))
        if verdict == "holds-with-conditions" else
        (f"printed gains are not about {stated:g}%" if verdict == "refuted" else None),
        correction=None if verdict != "refuted" else
        "the printed averages give " + ", ".join(f"{m}: +{ev[f'{m}_relative_gain_percent']:.1f}%"
                                                 for m in vals))


@claim(
    "drgrpo_sec2_no_template_gain", kind="printed-value",
    location="Sec. 2.2, Table 1 (templates) and its discussion",
    text="For Qwen2.5-Math base models, dropping the template raises the five-benchmark average "
    "over 4-shot prompting from 19.7 to 33.1 (1.5B) and from 23.8 to 38.2 (7B), \"about 60%\".",
    check="Arithmetic on the printed averages: relative gain per model vs the stated 60%, "
    "\"about\" read as within 5 percentage points.",
)
def _no_template(ctx: CheckContext) -> Outcome:
    return no_template_gain_outcome(ctx)
