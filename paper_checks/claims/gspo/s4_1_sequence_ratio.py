"""GSPO Sec. 4.1: the sequence ratio as importance sampling (D6), its definition (D7), length
normalisation (D8), and the clipping ranges (D9)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paper_checks.registry import CheckContext, Outcome, claim, verdict_from

from . import formulas as F

SECTION = "4.1 GSPO: the sequence-level importance ratio"


def _gspo_ratio(log_rho: np.ndarray, L: int) -> np.ndarray:
    """Eq. (7): s = rho^(1/|y|)."""
    return np.exp(log_rho / L)


def sequence_ratio_is_outcome(ctx: CheckContext, *,
                              ratio: Callable[[np.ndarray, int], np.ndarray] = _gspo_ratio
                              ) -> Outcome:
    """E_old[s f] against E_pi[f] and E_old[rho f]; E_old[s]; the first-order change of
    E_old[s f] at theta_old against grad J (fixed length) and, for a group of unequal lengths,
    the per-response factor 1/|y_i|."""
    from grpo_theory import kl

    w, old_logits = F.token_world()
    old_lp = kl.tabular_token_log_probs(old_logits, vocab=w.vocab, length=w.length)
    q = np.exp(old_lp.sum(1))
    log_rho = (w.logp - old_lp).sum(1)
    s = ratio(log_rho, w.length)
    f = w.seq_rewards
    ev: dict[str, Any] = {"E_pi_f": float(w.probs @ f), "E_old_s_f": float(q @ (s * f)),
                          "E_old_rho_f": float(q @ (np.exp(log_rho) * f)),
                          "E_old_s": float(q @ s), "E_old_rho": float(q @ np.exp(log_rho))}
    err = abs(ev["E_old_s_f"] - ev["E_pi_f"])
    ev["abs_error_s_weighted_vs_target"] = err
    ev["abs_error_rho_weighted_vs_target"] = abs(ev["E_old_rho_f"] - ev["E_pi_f"])
    g, _ = F.group()
    x = g.old_logits
    fd = F.fd_gradient(lambda th: float((F.sequence_ratio(g, th) * g.advantages).sum()), x)
    psi = g.scores(x).sum(1)
    ev["rel_error_grad_sum_s_A_vs_sum_A_psi_over_L"] = F.rel(
        fd, (g.advantages / g.lengths) @ psi)
    ev["rel_error_grad_sum_s_A_vs_sum_A_psi"] = F.rel(fd, g.advantages @ psi)
    ok = err < 1e-9
    return Outcome(
        verdict_from(ok), ev,
        correction=None if ok else (
            f"the importance weight of a sequence-level quantity is rho = pi(y)/pi_old(y) "
            f"(E_old[rho r] = {ev['E_old_rho_f']:.6f} = E_pi[r] = {ev['E_pi_f']:.6f}); "
            f"s = rho^(1/|y|) is not one: E_old[s] = {ev['E_old_s']:.4f} (not 1), E_old[s r] = "
            f"{ev['E_old_s_f']:.6f}; at theta_old grad s = s psi / |y|, so each response's "
            "likelihood-ratio gradient is divided by its length (relative error "
            f"{ev['rel_error_grad_sum_s_A_vs_sum_A_psi_over_L']:.1e} against sum A psi / |y|)"),
        short=(f"E_old[s r] = E_pi[r] to {err:.1e}" if ok
               else f"s is not an IS weight: E_old[s] = {ev['E_old_s']:.3f}, "
               f"E_old[s r] - E_pi[r] = {ev['E_old_s_f'] - ev['E_pi_f']:.3g}"))


@claim(
    "gspo_d6_sequence_ratio_is_importance_sampling",
    location="Sec. 1; Sec. 4.1 (first paragraph); Sec. 6",
    text="GSPO's importance ratio as defined in Eq. (7), with the 1/|y_i| power, is the "
    "principled importance-sampling correction for sequence-level rewards ('aligning with the "
    "basic principle of importance sampling').",
    check="Token MDP (V = 2, T = 3), theta_old = theta + noise: E_old[s r], E_old[rho r] and "
    "E_pi[r] over every sequence; E_old[s]; for a group of lengths 4, 2, 3, 1, finite "
    "differences of sum_i s_i A_i at theta_old against sum_i A_i psi_i / |y_i| and "
    "sum_i A_i psi_i.",
    kind="derivation",
)
def _d6(ctx: CheckContext) -> Outcome:
    return sequence_ratio_is_outcome(ctx)


def definition_outcome(ctx: CheckContext) -> Outcome:
    """Eq. (7)'s two forms at random points; Eq. (5)'s clip acts per response."""
    g, theta = F.group()
    rng = ctx.rng(2705)
    worst = 0.0
    for _ in range(20):
        th = g.old_logits + 0.3 * rng.standard_normal(theta.size)
        worst = max(worst, F.rel(F.sequence_ratio(g, th), F.sequence_ratio_mean_form(g, th)))
    th = g.old_logits + 0.6 * rng.standard_normal(theta.size)
    s = F.sequence_ratio(g, th)
    per = F.clip_term(s, g.advantages, 0.05, 0.05)
    direct = abs(F.j_gspo(g, th, eps_low=0.05, eps_high=0.05) - float(per.mean()))
    ev = {"max_rel_diff_two_forms_of_eq7": worst, "abs_diff_eq5_vs_per_response_clip": direct,
          "responses_clipped_at_eps_0.05": int(np.sum(np.abs(s - 1) > 0.05))}
    ok = worst < 1e-12 and direct < 1e-15
    return Outcome(verdict_from(ok), ev, correction=None if ok else
                   f"the two forms of Eq. (7) differ by {worst:.3g}",
                   short=(f"the two forms agree to {worst:.1e}; "
                          f"{ev['responses_clipped_at_eps_0.05']} responses clipped whole") if ok
                   else f"forms differ by {worst:.2g}")


@claim(
    "gspo_d7_objective_and_ratio",
    location="Sec. 4.1, Eqs. (5)-(7)",
    text="J_GSPO = E[(1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps, 1 + eps) A_i)] with s_i = "
    "(pi(y_i|x)/pi_old(y_i|x))^(1/|y_i|) = exp((1/|y_i|) sum_t log w_it) (the two forms equal); "
    "clipping acts on whole responses.",
    check="A group of lengths 4, 2, 3, 1: both forms of Eq. (7) at 20 random points; Eq. (5) "
    "against the per-response clipped terms at a point where responses are clipped (eps 0.05).",
    kind="derivation",
)
def _d7(ctx: CheckContext) -> Outcome:
    return definition_outcome(ctx)


def length_normalisation_outcome(ctx: CheckContext, *, sigma: float = 0.01,
                                 drift: float = 0.002, lengths: tuple[int, ...] = (10, 100, 1000)
                                 ) -> Outcome:
    """Independent token noise: sd of log s and log rho by length (exact and Monte Carlo);
    systematic drift: log s = drift for every length; GSPO's clip probability by length."""
    from paper_checks.claim_support import K_SE, mc_evidence
    from paper_values.gspo import CLIP_GSPO
    from sims.results import make_check
    from sims.sequence_ratio import NoiseModel, clip_probability, log_ratio_laws, sample_log_ratios

    ev: dict[str, Any] = {}
    checks = []
    clips = []
    for L in lengths:
        laws = log_ratio_laws(NoiseModel(sigma, 0.0, L))
        ev[f"L{L}_sd_log_s"] = laws["sequence_normalised"][1]
        ev[f"L{L}_sd_log_rho"] = laws["sequence"][1]
        ev[f"L{L}_drift_log_s"] = log_ratio_laws(NoiseModel(0.0, drift, L))[
            "sequence_normalised"][0]
        ev[f"L{L}_drift_log_rho"] = log_ratio_laws(NoiseModel(0.0, drift, L))["sequence"][0]
        clips.append(clip_probability(0.0, laws["sequence_normalised"][1],
                                      eps_low=CLIP_GSPO[0], eps_high=CLIP_GSPO[1]))
        ev[f"L{L}_independent_noise_gspo_clip_probability"] = clips[-1]
        if L == lengths[1]:
            n = 4000 if ctx.quick else 40_000
            x = sample_log_ratios(NoiseModel(sigma, 0.0, L), n=n, rng=ctx.rng(2706))
            v = x["sequence_normalised"] ** 2
            checks.append(make_check(f"Var log s L {L}", estimate=float(v.mean()),
                                     exact=laws["sequence_normalised"][1] ** 2,
                                     se=float(v.std(ddof=1) / np.sqrt(n)), n=n, k=K_SE,
                                     se_from="sample"))
    mc_ev, mc_ok = mc_evidence(checks, "mc_")
    ev.update(mc_ev)
    sd_shrinks = all(ev[f"L{a}_sd_log_s"] > ev[f"L{b}_sd_log_s"]
                     for a, b in zip(lengths, lengths[1:], strict=False))
    drift_common = len({round(ev[f"L{L}_drift_log_s"], 15) for L in lengths}) == 1
    ok = sd_shrinks and drift_common
    return Outcome(
        verdict_from(ok, computed=mc_ok, agrees="holds-with-conditions"), ev,
        conditions=(f"the 1/|y| power removes the length from a systematic shift (log s = "
                    f"{drift:g} at every length, log rho = L x {drift:g}) and shrinks independent "
                    f"fluctuations (sd sigma/sqrt(L)); but then one range does not fit every "
                    f"length: with sigma = {sigma:g} GSPO's range clips "
                    + ", ".join(f"{100 * c:.0f}%" for c in clips)
                    + f" of responses of lengths {list(lengths)}"),
        correction=None if ok else "length normalisation does not reduce the spread here",
        short=(f"unified only for systematic shifts; independent noise: clip share "
               f"{100 * clips[0]:.0f}% (L {lengths[0]}) vs {100 * clips[-1]:.0f}% "
               f"(L {lengths[-1]})"))


@claim(
    "gspo_d8_length_normalisation",
    location="Sec. 4.1, paragraph after Eq. (7)",
    text="The 1/|y_i| power is adopted to reduce the variance and to keep s_i in a unified "
    "numerical range: without it, changes in a few tokens' likelihoods could make the sequence "
    "ratio fluctuate dramatically, and responses of different lengths would need different "
    "clipping ranges.",
    check="sims.sequence_ratio: token log-ratios i.i.d. N(0, 0.01^2) (independent) or equal to "
    "0.002 (systematic drift), L = 10, 100, 1000: exact sd and mean of log s and log rho; the "
    "probability that GSPO's range (paper_values.gspo.CLIP_GSPO) clips a response; Monte Carlo "
    "of Var log s (L = 100), k = 4 SE.",
    kind="interpretation",
)
def _d8(ctx: CheckContext) -> Outcome:
    return length_normalisation_outcome(ctx)


def clip_ranges_outcome(ctx: CheckContext, *, sigma: float = 0.05, drift: float = 0.01,
                        lengths: tuple[int, ...] = (100, 1000)) -> Outcome:
    """Typical |log w| against |log s| under independent noise (ratio sqrt(L)) and under a
    systematic drift (ratio 1); the printed ranges and TRL's reproduction of them."""
    from paper_values.gspo import CLIP_GRPO, CLIP_GSPO, TRL_GSPO_CONFIG
    from sims.sequence_ratio import NoiseModel, log_ratio_laws

    ev: dict[str, Any] = {"printed_gspo_range": list(CLIP_GSPO), "printed_grpo_range":
                          list(CLIP_GRPO), "printed_range_ratio": CLIP_GRPO[0] / CLIP_GSPO[0],
                          "trl_reproduction_matches_paper": bool(
                              (TRL_GSPO_CONFIG["epsilon"], TRL_GSPO_CONFIG["epsilon_high"])
                              == CLIP_GSPO)}
    for L in lengths:
        ind = log_ratio_laws(NoiseModel(sigma, 0.0, L))
        sysd = log_ratio_laws(NoiseModel(0.0, drift, L))
        ev[f"L{L}_independent_sd_token_over_sd_s"] = ind["token"][1] / ind[
            "sequence_normalised"][1]
        ev[f"L{L}_systematic_token_over_s"] = sysd["token"][0] / sysd["sequence_normalised"][0]
    ind_ok = all(ev[f"L{L}_independent_sd_token_over_sd_s"] >= 10 for L in lengths)
    sys_same = all(abs(ev[f"L{L}_systematic_token_over_s"] - 1) < 1e-12 for L in lengths)
    ok = ind_ok and sys_same and ev["trl_reproduction_matches_paper"]
    return Outcome(
        verdict_from(ok, agrees="holds-with-conditions"), ev,
        conditions=(f"under independent per-token fluctuations the typical |log w| is sqrt(L) "
                    f"times |log s| ({ev[f'L{lengths[0]}_independent_sd_token_over_sd_s']:.0f}x at "
                    f"L = {lengths[0]}, "
                    f"{ev[f'L{lengths[-1]}_independent_sd_token_over_sd_s']:.0f}x "
                    f"at L = {lengths[-1]}; the printed ranges differ "
                    f"{ev['printed_range_ratio']:.0f}x); under a systematic drift the two are "
                    "equal, and the ranges would not differ"),
        correction=None if ok else "the ratios' scales do not differ as stated",
        short="only for independent per-token noise (sqrt(L)); equal under systematic drift")


@claim(
    "gspo_d9_clipping_ranges",
    location="Sec. 4.1 (last sentence); Sec. 5.1 (paper_values.gspo)",
    text="GSPO's and GRPO's clipping ranges typically differ in order of magnitude because the "
    "ratios are defined differently; the experiments use 3e-4 / 4e-4 for GSPO and 0.2 / 0.27 "
    "for GRPO (carefully tuned).",
    check="sims.sequence_ratio: the sd of log w over the sd of log s under i.i.d. N(0, 0.05^2) "
    "token log-ratios (L = 100, 1000), and the two under a systematic drift 0.01; the printed "
    "ranges (their ratio) and TRL's reproduction config against them.",
    kind="interpretation",
)
def _d9(ctx: CheckContext) -> Outcome:
    return clip_ranges_outcome(ctx)
