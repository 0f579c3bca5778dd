"""Dr. GRPO (arXiv 2503.20783) App. D: response lengths of DeepSeek-V3-Base and DeepSeek-R1-Zero
(Table 5) and the paper's explanation (harder questions need longer responses and fail more
often: a selection effect, not the length bias).

The printed numbers are the paper's (:mod:`paper_values.dr_grpo`) and are not reproducible here.
The mechanism is checked in question mixes (:mod:`sims.question_mix`) where it is the only
mechanism (length independent of correctness inside each question) and where only the length
bias can act (every question the same length law), by exact enumeration and exact expected
steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "Dr. GRPO App. D: response lengths of R1-Zero"


def _table5_ratios() -> dict[str, float]:
    from paper_values.dr_grpo import TABLE5_MEAN_LENGTH_CHARS as T5

    return {f"{model}_incorrect_over_correct": T5["incorrect"][i] / T5["correct"][i]
            for i, model in enumerate(("deepseek_v3_base", "deepseek_r1_zero"))}


@claim(
    "drgrpo_table5_r1_zero_lengths", kind="empirical",
    location="App. D, Table 5",
    text="On 500 MATH questions (R1 template, truncated responses excluded) incorrect "
    "responses are longer than correct ones, for DeepSeek-V3-Base (1038.9 vs 621.3 "
    "characters) and DeepSeek-R1-Zero (8206.1 vs 4965.4).",
    check="The measurements need both models' rollouts and are not reproducible here. Evidence: "
    "the ratios incorrect/correct computed from the printed table.",
)
def _table5(ctx: CheckContext) -> Outcome:
    return Outcome("inconclusive", _table5_ratios(),
                   correction="decided by sampling DeepSeek-V3-Base and DeepSeek-R1-Zero on the "
                   "same 500 MATH questions with the R1 template and grading with Math-Verify",
                   short="needs DeepSeek-V3-Base / R1-Zero rollouts")


def selection_world(*, shared_stop: bool = True) -> Any:
    """Three questions (solve rates about 0.8, 0.5, 0.2); harder ones are longer; with
    ``shared_stop`` the length law of a question does not depend on the answer."""
    from sims.length_worlds import AnswerLengthMDP
    from sims.question_mix import QuestionMix

    worlds = []
    for lead, z in ((1.4 + np.log(2.0), 0.5), (np.log(2.0), -0.5), (-1.4 + np.log(2.0), -1.5)):
        rows = 1 if shared_stop else 3
        worlds.append(AnswerLengthMDP(np.array([lead, 0.0, 0.0]), np.full((rows, 5), z),
                                      np.array([1.0, 0.0, 0.0]), shared_stop=shared_stop))
    return QuestionMix(tuple(worlds), np.full(3, 1.0 / 3.0))


def bias_world() -> Any:
    """The same three difficulties, every question and answer with the same length law, stop
    logits per answer (so the length bias can act, selection cannot)."""
    from sims.length_worlds import AnswerLengthMDP
    from sims.question_mix import QuestionMix

    worlds = [AnswerLengthMDP(np.array([lead, 0.0, 0.0]), np.full((3, 5), -0.5),
                              np.array([1.0, 0.0, 0.0]))
              for lead in (1.4 + np.log(2.0), np.log(2.0), -1.4 + np.log(2.0))]
    return QuestionMix(tuple(worlds), np.full(3, 1.0 / 3.0))


def _gap(world: Any) -> float:
    from sims.length_dynamics import length_summary

    s = length_summary(world)
    return s["mean_length_incorrect"] - s["mean_length_correct"]


def selection_mechanism_outcome(ctx: CheckContext, *, shared_stop: bool = True) -> Outcome:
    """Exact E[L | incorrect] - E[L | correct] in the selection world, the check that length is
    independent of correctness inside each question, and a seeded Monte Carlo of the gap."""
    from sims._stats import Z_THRESHOLD

    w = selection_world(shared_stop=shared_stop)
    ev: dict[str, Any] = {"solve_rates": w.success_rates().tolist(),
                          "mean_length_by_question": [float(q.mean_length_given_answer().mean())
                                                      for q in w.worlds]}
    ev["max_within_question_length_spread_over_answers"] = float(max(
        np.ptp(q.mean_length_given_answer()) for q in w.worlds))
    ev["exact_gap_incorrect_minus_correct"] = _gap(w)
    n = 20_000 if ctx.quick else 200_000
    idx, rew = w.sample(n, 1, ctx.rng(2551))
    L = w.lengths[idx[:, 0]].astype(float)
    inc, cor = L[rew[:, 0] == 0], L[rew[:, 0] == 1]
    est = inc.mean() - cor.mean()
    se = float(np.hypot(inc.std(ddof=1) / np.sqrt(inc.size), cor.std(ddof=1) / np.sqrt(cor.size)))
    ev.update({"mc_gap_estimate": est, "mc_gap_se": se, "mc_gap_n": n,
               "mc_gap_z": (est - ev["exact_gap_incorrect_minus_correct"]) / se})
    mc_ok = abs(ev["mc_gap_z"]) <= Z_THRESHOLD
    no_bias = ev["max_within_question_length_spread_over_answers"] < 1e-12
    ok = no_bias and ev["exact_gap_incorrect_minus_correct"] > 0
    return Outcome(verdict_from(ok, computed=mc_ok), ev,
                   correction=None if ok else "in this world incorrect responses are not longer, "
                   "or length depends on correctness inside a question",
                   short=None if ok else "no selection effect in the toy world")


@claim(
    "drgrpo_appd_selection_effect_mechanism", kind="derivation",
    location="App. D, the paragraph around Table 5",
    text="Harder questions need longer responses and fail more often, so incorrect responses are "
    "longer on average even when length does not depend on correctness within a question (a "
    "selection effect, not the length bias).",
    check="Mix of 3 token-MDP questions (solve rates 0.8, 0.5, 0.2; the harder, the longer; one "
    "row of stop logits per question, so inside a question length does not depend on the "
    "answer): exact E[L | incorrect] - E[L | correct] > 0 with zero within-question spread; "
    "seeded Monte Carlo of the gap from 20000 sampled responses (200000 full), k = 4 SE.",
)
def _selection(ctx: CheckContext) -> Outcome:
    return selection_mechanism_outcome(ctx)


def attribution_outcome(ctx: CheckContext, *, optimiser: str = "grpo") -> Outcome:
    """Train the selection world and the bias world with ``optimiser`` (R1-Zero used GRPO) by
    exact expected steps: does each end with incorrect responses longer? If both do, the sign
    of Table 5's gap cannot tell the mechanisms apart."""
    from sims.length_dynamics import flow

    steps = 30 if ctx.quick else 120
    ev: dict[str, Any] = dict(_table5_ratios())
    gaps = {}
    for name, w in (("selection_world", selection_world()), ("bias_world", bias_world())):
        f = flow(w, optimiser, G=8, lr=3.0, steps=steps)
        gaps[name] = float(f["mean_length_incorrect"][-1] - f["mean_length_correct"][-1])
        ev[f"{name}_gap_before_training"] = float(f["mean_length_incorrect"][0]
                                                  - f["mean_length_correct"][0])
        ev[f"{name}_gap_after_training"] = gaps[name]
        ev[f"{name}_J_after_training"] = float(f["J"][-1])
    sel, bias = gaps["selection_world"] > 1e-9, gaps["bias_world"] > 1e-9
    if sel and bias:
        return Outcome(
            "inconclusive", ev,
            correction="a longer incorrect mean arises from selection alone and, under "
            f"{optimiser}, from the length bias alone (both toy worlds end with incorrect "
            "responses longer), so Table 5 cannot attribute it; the ratio incorrect/correct "
            "barely moves from V3-Base to R1-Zero, which fits the paper's reading but does not "
            "decide it. Decided by comparing correct and incorrect lengths question by question "
            "(difficulty held fixed), before and after GRPO training",
            short="both selection and the length bias reproduce the gap; needs per-question data")
    verdict = verdict_from(sel, agrees="holds-with-conditions")
    return Outcome(
        verdict, ev,
        conditions="in these toy worlds only selection produces the gap (the optimiser has no "
        "length bias)" if verdict == "holds-with-conditions" else None,
        short="only selection produces the gap here" if verdict == "holds-with-conditions"
        else "selection does not produce the gap",
        correction=None if verdict != "refuted" else "the selection world does not end with "
        "incorrect responses longer")


@claim(
    "drgrpo_appd_selection_effect_attribution", kind="interpretation",
    location="App. D, the paragraph around Table 5",
    text="DeepSeek-R1-Zero's incorrect responses are longer than its correct ones probably "
    "because harder questions need longer responses (selection), not because of GRPO's "
    "length bias.",
    check="Two toy question mixes with the same difficulties (0.8, 0.5, 0.2), trained by exact "
    "expected steps of GRPO (the optimiser of R1-Zero; G = 8, lr 3, 30 steps quick / 120 full): "
    "one where only selection can act (harder questions longer, length independent of the "
    "answer) and one where only the length bias can (one length law for every question, stop "
    "logits per answer). If both end with incorrect responses longer, the sign of Table 5's gap "
    "does not identify the cause. Evidence also: Table 5's incorrect/correct ratios.",
    variants=("grpo_std",),
)
def _attribution(ctx: CheckContext) -> Outcome:
    return attribution_outcome(ctx)
