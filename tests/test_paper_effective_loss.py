"""The audit of arXiv 2503.06639 v4 (``--paper grpo-effective-loss``): planted errors flip the
verdicts, the printed side is the only input a check takes from the paper, and the CLI writes the
paper's own report.

Planted-error tests: each check takes the paper's printed formula or value (from
``paper_checks.claims.effective_loss.printed``) as an argument; passing a perturbed copy must
change the verdict. The sample covers every verdict kind this paper's audit has (holds,
holds-with-conditions, refuted, inconclusive), in both directions where it makes sense.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from paper_checks.claims.effective_loss import printed_formulas as P
from paper_checks.claims.effective_loss.appA_experiments import check_gsm8k
from paper_checks.claims.effective_loss.appB_algorithm import check_plugin_advantage
from paper_checks.claims.effective_loss.appC_stability import check_beta_condition, check_fig5
from paper_checks.claims.effective_loss.appD_general import check_theorem8
from paper_checks.claims.effective_loss.appE_two_kl import (
    check_lemma2,
    check_lemma3,
    check_printed_conditionals,
)
from paper_checks.claims.effective_loss.appF_parametric import check_theorem10
from paper_checks.claims.effective_loss.s2_contrastive_loss import (
    check_clip_helper,
    check_no_clip,
    check_whitened_advantage,
)
from paper_checks.claims.effective_loss.s3_1_amplification import (
    check_abstract_converges,
    check_theorem3,
)
from paper_checks.claims.effective_loss.s3_dynamics import (
    check_p_one_fixed,
    check_prop1_sigmoid,
    check_theorem1,
    check_theorem2,
)
from paper_checks.claims.effective_loss.s5_mean_only import check_takeaway_beta_sigma
from paper_checks.registry import ordered_ids


# --- planted errors: holds -> refuted ----------------------------------------------------------
def test_planted_beta_error_in_theorem2_flips_holds_to_refuted():
    assert check_theorem2().verdict == "holds"
    wrong = check_theorem2(h=lambda p, p_ref, beta, eps: P.h_thm2(p, p_ref, 2 * beta, eps))
    assert wrong.verdict == "refuted" and wrong.evidence["max_abs_difference"] > 1e-3


def test_planted_missing_beta_in_theorem1_flips_holds_to_refuted():
    def no_beta(pi_ref, s, wp, wm, beta):
        return P.theorem1_policy(pi_ref, s, wp, wm, 1.0)

    assert check_theorem1().verdict == "holds"
    assert check_theorem1(policy=no_beta).verdict == "refuted"


def test_planted_sign_error_in_prop1_sigmoid_form_flips_to_refuted():
    def minus(p, p_ref, beta, eps, *, xp=np):
        return P.h_sigmoid_prop1(p, p_ref, -beta, eps, xp=xp)

    assert check_prop1_sigmoid().verdict == "holds"
    assert check_prop1_sigmoid(h_sig=minus).verdict == "refuted"


def test_planted_swapped_weights_in_eq3_flip_to_refuted():
    def swapped(p, *, xp=np):
        a, b = P.advantage_binary(p, xp=xp)
        return -b, -a

    assert check_whitened_advantage().verdict == "holds"
    assert check_whitened_advantage(swapped).verdict == "refuted"


def test_planted_error_in_eq4_breaks_the_cross_paper_agreement():
    def eps_outside(p, eps, *, xp=np):
        s = xp.sqrt(p * (1 - p)) + eps
        return (1 - p) / s, p / s

    assert check_plugin_advantage().verdict == "holds"
    assert check_plugin_advantage(eps_outside).verdict == "refuted"


def test_planted_amplification_reversal_flips_theorem3():
    def de_amplify(p, p_ref, beta, eps):
        return 1 - P.h_thm2(p, 1 - p_ref, beta, eps)

    assert check_theorem3().verdict == "holds"
    assert check_theorem3(h=de_amplify).verdict == "refuted"


def test_planted_anchor_error_flips_lemma2_and_lemma3():
    def arithmetic(a, b, *, alpha):
        return alpha * a + (1 - alpha) * b

    assert check_lemma2().verdict == "holds"
    assert check_lemma2(anchor=arithmetic).verdict == "refuted"
    assert check_lemma3(formula=lambda L, Lp, dS, dF, a: P.lemma3_logit(L, Lp, dF, dS, a)
                        ).verdict == "refuted"


def test_planted_bound_error_flips_the_beta_condition():
    assert check_beta_condition(lambda p, eps: 2 * P.beta_bound_appc2(p, eps)).verdict == "refuted"


# --- planted errors: refuted -> holds ----------------------------------------------------------
def test_theorem8_with_the_kl_weight_restored_holds():
    def with_beta(anchor, s, wp, wm, beta):
        return P.theorem8_policy(anchor, s, wp / beta, wm / beta, 1.0)

    assert check_theorem8().verdict == "refuted"
    fixed = check_theorem8(policy=with_beta,
                           pos_logit=lambda L, Om, beta: P.theorem8_pos_logit(L, Om / beta, beta))
    assert fixed.verdict == "holds"


def test_clip_helper_with_x_and_y_in_place_holds():
    def right(x, y, clip):
        return np.where(y > 0, y * np.minimum(x, 1 + clip), y * np.maximum(x, 1 - clip))

    assert check_clip_helper().verdict == "refuted"
    assert check_clip_helper(right).verdict == "holds"


def test_conditionals_with_the_success_indicator_hold():
    def right(pi_ref, pi_prev, s):
        d = P.conditionals_as_printed(pi_ref, pi_prev, s)
        d["prev_S"] = pi_prev * s / pi_prev[s].sum()
        return d

    assert check_printed_conditionals().verdict == "refuted"
    assert check_printed_conditionals(defs=right).verdict == "holds"


def test_p_one_is_a_fixed_point_of_a_map_with_h_of_1_equal_1():
    def mirror_like(p, p_ref, beta, eps, *, xp=np):  # sigma(logit p + ...): h(1) = 1 exactly
        return p / (p + (1 - p) * xp.exp(-1 / xp.sqrt(p * (1 - p) + eps) / beta))

    assert check_p_one_fixed(h=mirror_like).verdict == "holds"


def test_abstract_holds_on_a_grid_without_two_cycles():
    from paper_checks.claims.effective_loss.worlds_and_scans import orbit_scan

    assert check_abstract_converges().verdict == "refuted"
    converging = tuple(o for o in orbit_scan() if o[1] == "fixed point")
    assert check_abstract_converges(converging).verdict == "holds"


# --- planted errors: holds-with-conditions -> refuted / holds ----------------------------------
def test_theorem10_with_a_too_small_factor_is_refuted():
    assert check_theorem10().verdict == "holds-with-conditions"
    assert check_theorem10(factor=0.5).verdict == "refuted"


def test_fig5_at_a_converging_case_is_refuted():
    assert check_fig5().verdict == "holds-with-conditions"
    assert check_fig5({"beta": 10.0, "p_ref": 0.001}).verdict == "refuted"


def test_takeaway_with_the_sec5_beta_eff_holds():
    assert check_takeaway_beta_sigma().verdict == "holds-with-conditions"
    assert check_takeaway_beta_sigma(beff=P.beta_eff).verdict == "holds"
    assert check_takeaway_beta_sigma(beff=lambda b, s2, e: 2 * P.beta_eff(b, s2, e)
                                     ).verdict == "refuted"


def test_no_clip_identity_breaks_with_a_wrong_contrast():
    assert check_no_clip().verdict == "holds-with-conditions"
    assert check_no_clip(contrast=lambda pi, s, wp, wm: P.no_clip_pos_contrast(pi, s, wp, 0.0)
                         ).verdict == "refuted"


# --- inconclusive -> decided with measurements -------------------------------------------------
def test_gsm8k_claim_is_decided_by_measurements():
    assert check_gsm8k().verdict == "inconclusive"
    rng = np.random.default_rng(3)
    p_ref = np.concatenate([np.zeros(50), rng.uniform(0.05, 0.6, 400)])
    gained = {"p_ref": p_ref, "p_after": np.where(p_ref > 0, np.minimum(1, p_ref + 0.15), 0.0)}
    assert check_gsm8k(gained).verdict == "holds"
    flat = {"p_ref": p_ref, "p_after": p_ref + rng.normal(0, 0.01, p_ref.size)}
    assert check_gsm8k(flat).verdict == "refuted"


# --- the audit of this paper --------------------------------------------------------------------
def test_every_claim_id_carries_the_prefix_and_names_a_v4_location():
    ids = ordered_ids("grpo-effective-loss")
    assert len(ids) >= 40 and all(i.startswith("effloss_") for i in ids)


def test_effective_loss_audit_cli_writes_its_own_report(tmp_path):
    from grpo_audit.cli import main

    out = tmp_path / "el"
    assert main(["audit", "--paper", "grpo-effective-loss", "--out", str(out), "--quick",
                 "--only", "effloss_thm8_general_weights_anchor",
                 "effloss_appa_gsm8k_amplification"]) == 0
    rep = (out / "REPORT.md").read_text()
    assert "arXiv 2503.06639" in rep.splitlines()[0] and "printed_formulas.py" in rep
    meta = json.loads((out / "meta.json").read_text())
    assert meta["paper_key"] == "grpo-effective-loss" and meta["refuted"] == [
        "effloss_thm8_general_weights_anchor"]


@pytest.mark.slow
def test_full_effective_loss_audit_writes_every_figure(tmp_path):
    from grpo_audit.cli import main

    out = tmp_path / "el_full"
    assert main(["audit", "--paper", "grpo-effective-loss", "--out", str(out)]) == 0
    claims = json.loads((out / "claims.json").read_text())
    assert len(claims) >= 40 and all(r["verdict"] for r in claims)
    figs = [r["figure"] for r in claims if r["figure"]]
    assert len(figs) >= 5 and all((out / f).stat().st_size > 0 for f in figs)


def test_paper_is_registered_and_listed_for_the_cli():
    from paper_checks.papers import get_paper

    paper = get_paper("grpo-effective-loss")
    assert paper.claim_prefix == "effloss_" and paper.sections[0] == "s2_contrastive_loss"


@pytest.mark.slow
def test_full_relaxation_check_agrees_with_exact_enumeration():
    from paper_checks.claims.effective_loss.appF_parametric import check_relaxation

    out = check_relaxation(seed=1, quick=False)
    assert out.verdict == "holds-with-conditions"
    zs = [v for k, v in out.evidence.items() if "_E_p" in k and k.endswith("_z")]
    assert len(zs) == 4 and all(abs(z) <= 4 for z in zs)  # k = 4 SE, the one k
