"""GSPO Sec. 5: clipped-token fractions (D14), MoE expert volatility and Routing Replay (D15,
its empirical and its mathematical part), precision tolerance (D16), headline results (D17)."""

from __future__ import annotations

from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

SECTION = "5. Experiments"


def _clip_shares(sigma: float, L: int, drift: float = 0.0) -> tuple[float, float]:
    """(GRPO's clipped-token share, GSPO's clipped-response share) under the printed ranges."""
    from paper_values.gspo import CLIP_GRPO, CLIP_GSPO
    from sims.sequence_ratio import NoiseModel, clip_probability, log_ratio_laws

    laws = log_ratio_laws(NoiseModel(sigma, drift, L))
    tok = clip_probability(*laws["token"], eps_low=CLIP_GRPO[0], eps_high=CLIP_GRPO[1])
    seq = clip_probability(*laws["sequence_normalised"], eps_low=CLIP_GSPO[0],
                           eps_high=CLIP_GSPO[1])
    return tok, seq


def clip_fraction_outcome(ctx: CheckContext) -> Outcome:
    """Toy illustration only: the clipped shares under the printed ranges for i.i.d. token
    log-ratio noise of sd 0.02 .. 0.2 at L = 1000."""
    ev: dict[str, Any] = {}
    for sig in (0.02, 0.05, 0.1, 0.2):
        tok, seq = _clip_shares(sig, 1000)
        ev[f"sigma{sig:g}_grpo_clipped_token_share"] = tok
        ev[f"sigma{sig:g}_gspo_clipped_response_share"] = seq
    return Outcome("inconclusive", ev,
                   correction="needs the training logs of Fig. 2; in the noise model the "
                   "shares depend on the per-token noise (evidence), so a toy cannot decide the "
                   "disparity", short="training logs needed")


@claim(
    "gspo_d14_clipped_token_fractions",
    location="Sec. 5.2, Fig. 2",
    text="The fraction of clipped tokens differs by two orders of magnitude between GSPO "
    "(higher) and GRPO, and changing the clipping ranges does not alter the disparity; although "
    "GSPO trains on fewer tokens it is more efficient, further evidence that GRPO's token-level "
    "gradient estimates are inherently noisy.",
    check="Not checkable here (training logs). Toy illustration: sims.sequence_ratio, i.i.d. "
    "token log-ratios N(0, sigma^2), L = 1000: the share of tokens GRPO's range clips and of "
    "responses GSPO's range clips (paper_values.gspo).",
    kind="empirical",
)
def _d14(ctx: CheckContext) -> Outcome:
    return clip_fraction_outcome(ctx)


def moe_outcome(ctx: CheckContext) -> Outcome:
    return Outcome("inconclusive", {"model": "Qwen3-30B-A3B-Base", "layers": 48},
                   correction="needs MoE training with and without Routing Replay; the "
                   "mathematical part is its own claim (gspo_d15_sequence_likelihood_stability)",
                   short="MoE training needed")


@claim(
    "gspo_d15_moe_routing_replay",
    location="Sec. 5.3, Fig. 3; Sec. 5.1",
    text="For the 48-layer Qwen3-30B-A3B-Base, about 10% of the experts activated for a rollout "
    "change after each gradient update, making token ratios fluctuate drastically; GRPO needs "
    "Routing Replay to converge, GSPO does not.",
    check="Not checkable here (MoE training).",
    kind="empirical",
)
def _d15(ctx: CheckContext) -> Outcome:
    return moe_outcome(ctx)


def stability_outcome(ctx: CheckContext, *, quantity: str = "sequence_normalised",
                      sigma: float = 0.1, lengths: tuple[int, ...] = (10, 100, 1000)) -> Outcome:
    """Independent per-token perturbations (sd sigma): the sd of log w, log s and log rho by
    length (exact; Monte Carlo at the middle length)."""
    from paper_checks.claim_support import K_SE, mc_evidence
    from sims.results import make_check
    from sims.sequence_ratio import NoiseModel, log_ratio_laws, sample_log_ratios

    ev: dict[str, Any] = {}
    checks = []
    for L in lengths:
        laws = log_ratio_laws(NoiseModel(sigma, 0.0, L))
        for k in ("token", "sequence_normalised", "sequence"):
            ev[f"L{L}_sd_log_{k}"] = laws[k][1]
        if L == lengths[1]:
            n = 4000 if ctx.quick else 40_000
            x = sample_log_ratios(NoiseModel(sigma, 0.0, L), n=n, rng=ctx.rng(2709))
            v = x["sequence"] ** 2
            checks.append(make_check(f"Var log rho L {L}", estimate=float(v.mean()),
                                     exact=laws["sequence"][1] ** 2,
                                     se=float(v.std(ddof=1) / np.sqrt(n)), n=n, k=K_SE,
                                     se_from="sample"))
    mc_ev, mc_ok = mc_evidence(checks, "mc_")
    ev.update(mc_ev)
    calmer = {k: all(ev[f"L{L}_sd_log_{k}"] < ev[f"L{L}_sd_log_token"] for L in lengths)
              for k in ("sequence_normalised", "sequence")}
    ok = calmer[quantity]
    L0, L1 = lengths[0], lengths[-1]
    return Outcome(
        verdict_from(ok, computed=mc_ok, agrees="holds-with-conditions"), ev,
        conditions=("true of the length-normalised ratio s (sd of log s = sigma/sqrt(L): "
                    f"{ev[f'L{L1}_sd_log_sequence_normalised']:.3g} at L = {L1} against "
                    f"{sigma:g} for a token), not of the sequence likelihood ratio itself: sd of "
                    f"log rho = sigma sqrt(L) = {ev[f'L{L1}_sd_log_sequence']:.3g}"),
        correction=None if ok else (
            f"the sequence quantity '{quantity}' fluctuates more than a token's: sd "
            f"{ev[f'L{L0}_sd_log_{quantity}']:.3g} .. {ev[f'L{L1}_sd_log_{quantity}']:.3g} "
            f"against {sigma:g}"),
        short="only for s = rho^(1/|y|); log rho fluctuates sqrt(L) times a token's")


@claim(
    "gspo_d15_sequence_likelihood_stability",
    location="Sec. 5.3 (the stated reason GSPO does not need Routing Replay)",
    text="GSPO depends only on the sequence likelihood, which does not fluctuate drastically "
    "(the model keeps its language-modelling ability) while individual token likelihoods do.",
    check="sims.sequence_ratio: independent per-token log-ratio perturbations of sd 0.1, "
    "L = 10, 100, 1000: exact sd of log w (a token), log s (GSPO's normalised ratio) and "
    "log rho (the sequence likelihood ratio); Monte Carlo of Var log rho (L = 100), k = 4 SE. "
    "Registered reading: the quantity GSPO uses, s.",
    kind="interpretation",
)
def _d15_math(ctx: CheckContext) -> Outcome:
    return stability_outcome(ctx)


def precision_outcome(ctx: CheckContext, *, sigmas: tuple[float, ...] = (1e-4, 1e-3, 1e-2),
                      lengths: tuple[int, ...] = (100, 1000, 10_000),
                      bias: float = 5e-4) -> Outcome:
    """Precision errors between engines as i.i.d. token log-ratio noise (sd sigma) or a
    systematic bias: absolute spreads, and the shares clipped by the printed ranges from the
    errors alone."""
    from sims.sequence_ratio import NoiseModel, log_ratio_laws

    ev: dict[str, Any] = {}
    rel_worse = []
    for sig in sigmas:
        for L in lengths:
            tok, seq = _clip_shares(sig, L)
            ev[f"sigma{sig:g}_L{L}_grpo_token_share_clipped"] = tok
            ev[f"sigma{sig:g}_L{L}_gspo_response_share_clipped"] = seq
            laws = log_ratio_laws(NoiseModel(sig, 0.0, L))
            ev[f"sigma{sig:g}_L{L}_sd_log_s_over_sd_log_w"] = (laws["sequence_normalised"][1]
                                                               / laws["token"][1])
            if seq > tok:
                rel_worse.append((sig, L))
    tok_b, seq_b = _clip_shares(0.0, 1000, drift=bias)
    ev["systematic_bias"] = bias
    ev["systematic_grpo_token_share_clipped"] = tok_b
    ev["systematic_gspo_response_share_clipped"] = seq_b
    absolute = all(ev[f"sigma{s:g}_L{L}_sd_log_s_over_sd_log_w"] < 1 for s in sigmas
                   for L in lengths)
    ok = absolute
    worst = max(rel_worse, key=lambda sl: ev[f"sigma{sl[0]:g}_L{sl[1]}_gspo_response_share_clipped"]
                ) if rel_worse else None
    cond = ("in absolute terms only: a precision error of sd sigma moves log s by sigma/sqrt(L) "
            "against sigma for a token; relative to the printed clipping ranges GSPO is the less "
            "tolerant one")
    if worst:
        s0, L0 = worst
        ev["worst_gspo_response_percent_clipped"] = 100 * ev[
            f"sigma{s0:g}_L{L0}_gspo_response_share_clipped"]
        ev["worst_grpo_token_percent_clipped"] = 100 * ev[
            f"sigma{s0:g}_L{L0}_grpo_token_share_clipped"]
        cond += (f" (sd {s0:g}, L = {L0}: GSPO's range clips "
                 f"{ev['worst_gspo_response_percent_clipped']:.1f}% of responses "
                 "from the errors alone, GRPO's "
                 f"{ev['worst_grpo_token_percent_clipped']:.2g}% "
                 "of tokens)")
    cond += (f"; a systematic bias of {bias:g} per token clips "
             f"{100 * seq_b:.0f}% of GSPO's responses and {100 * tok_b:.0f}% of GRPO's tokens")
    return Outcome(verdict_from(ok, agrees="holds-with-conditions"), ev, conditions=cond,
                   correction=None if ok else "the sequence ratio is not calmer than a token's",
                   short="absolute spread only; relative to the printed ranges GSPO clips more")


@claim(
    "gspo_d16_precision_tolerance",
    location="Sec. 5.4",
    text="Sequence-level likelihoods are much more tolerant of precision discrepancies between "
    "training and inference engines than token-level ones, so GSPO can use the inference "
    "engine's likelihoods directly (stated as intuition).",
    check="sims.sequence_ratio: precision errors as i.i.d. token log-ratio noise of sd 1e-4, "
    "1e-3, 1e-2 at L = 100, 1000, 10000, or a systematic per-token bias 5e-4: the spread of "
    "log s against log w, and the shares of responses (GSPO, 3e-4 / 4e-4) and tokens (GRPO, "
    "0.2 / 0.27) that the printed ranges clip from the errors alone.",
    kind="interpretation",
)
def _d16(ctx: CheckContext) -> Outcome:
    return precision_outcome(ctx)


def headline_outcome(ctx: CheckContext) -> Outcome:
    return Outcome("inconclusive", {"base_model": "Qwen3-30B-A3B-Base",
                                    "benchmarks": "AIME'24, LiveCodeBench 202410-202502, "
                                    "CodeForces"},
                   correction="needs the Qwen3 training runs and their benchmark curves (Fig. 1)",
                   short="LLM training needed")


@claim(
    "gspo_d17_headline_results",
    location="Abstract; Sec. 1; Sec. 5.1; Fig. 1; Sec. 6",
    text="Fine-tuning a cold-start Qwen3-30B-A3B-Base, GSPO trains stably throughout and has "
    "higher training efficiency than GRPO (better training accuracy and benchmark performance at "
    "equal compute); GSPO was used for the latest Qwen3 models.",
    check="Not checkable here (LLM training; the results are curves).",
    kind="empirical",
)
def _d17(ctx: CheckContext) -> Outcome:
    return headline_outcome(ctx)
