"""Bounded work: every exact routine whose cost grows with the group size R answers or refuses at
R = 10^9 within a second (grpo_theory.limits and the sims caps).

Every call runs in one child process under a 2 GiB address-space limit, so a routine that tried
to build an array of R entries fails fast there (MemoryError: reported as a failure here)
instead of swapping this machine; each call is timed on its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
R = 10**9

# name -> (expression evaluated with R = 10**9, expected outcome): an outcome is "answer" or the
# cap's name, and a refusal must also name one of the ALTERNATIVES
CASES: dict[str, tuple[str, str]] = {
    # grpo_theory
    "binom_pmf": ("gt.binom_pmf(np.arange(3), R, 0.5)", "answer"),
    "group_outcomes(float p)": ("gt.group_outcomes(R=R, p=0.5)", "ARRAY_R_MAX"),
    "group_outcomes(exact p)": ("gt.group_outcomes(R=R, p=Fraction(1, 2))", "EXACT_P_R_MAX"),
    "advantage_value_table": ("gt.advantage_value_table('grpo', R=R)", "EXACT_R_MAX"),
    "advantage_values(exact)": ("gt.advantage_values('grpo', R=R, k=3)", "EXACT_R_MAX"),
    "advantage_values(float)": ("gt.advantage_values('grpo', R=R, k=3, exact=False)",
                                "ARRAY_R_MAX"),
    "advantage_distribution": ("gt.advantage_distribution('rloo', R=R, p=0.5)", "EXACT_R_MAX"),
    "exact_advantage_moments(float p)": ("gt.exact_advantage_moments('grpo', R=R, p=0.5)",
                                         "EXACT_R_MAX"),
    "exact_advantage_moments(exact p)": (
        "gt.exact_advantage_moments('grpo', R=R, p=Fraction(1, 3))", "EXACT_R_MAX"),
    "baseline_tail_counts": ("gb.baseline_tail_counts(R=R, eps=0.1, p=0.5)", "answer"),
    "baseline_tail_event": ("gt.baseline_tail_event(R=R, eps=0.1, p=0.5)", "ARRAY_R_MAX"),
    "exact_baseline_tail_bernoulli(float p)": (
        "gt.exact_baseline_tail_bernoulli(R=R, eps=0.1, p=0.5)", "answer"),
    "exact_baseline_tail_bernoulli(exact p)": (
        "gt.exact_baseline_tail_bernoulli(R=R, eps=0.1, p=Fraction(1, 2))", "EXACT_P_R_MAX"),
    "sup_baseline_tail_bernoulli": ("gt.sup_baseline_tail_bernoulli(R=R, eps=0.1)", "SUP_R_MAX"),
    "advantage_tail_event": ("gt.advantage_tail_event(R=R, eps=0.1)", "EXACT_R_MAX"),
    "exact_advantage_tail_bernoulli": (
        "gt.exact_advantage_tail_bernoulli(R=R, eps=0.1, p=0.5)", "EXACT_R_MAX"),
    "expected_mass_bernoulli": ("gt.expected_mass_bernoulli('grpo', R=R, p=0.5)", "EXACT_R_MAX"),
    "exact_grpo_passk": ("gfe.exact_grpo_passk(R, 1)", "answer"),
    "exact_opo": ("gfe.exact_opo(R, 3)", "answer"),
    "gram_isotropic": ("gt.gram_isotropic(R)", "SQUARE_R_MAX"),
    "gram_common_component": ("gt.gram_common_component(R, strength=1.0)", "SQUARE_R_MAX"),
    "gram_clustered": ("gt.gram_clustered(np.broadcast_to(np.int8(1), (R,)))", "SQUARE_R_MAX"),
    "isotropic_effective_rank_binary": ("gt.isotropic_effective_rank_binary(R, 3)", "answer"),
    "chebyshev_bound": ("gt.chebyshev_bound(R=R, eps=0.1, sigma2=0.25)", "answer"),
    "hoeffding_bound": ("gt.hoeffding_bound(R=R, eps=0.1)", "answer"),
    "bernstein_bound": ("gt.bernstein_bound(R=R, eps=0.1, sigma2=0.25)", "answer"),
    "bound_table(hoeffding)": ("gt.bound_table('hoeffding', R_values=[R], eps_values=[0.1])",
                               "answer"),
    "bound_table(exact-baseline-tail, p)": (
        "gt.bound_table('exact-baseline-tail', R_values=[R], eps_values=[0.1], p=0.5)", "answer"),
    "bound_table(exact-baseline-tail, sup)": (
        "gt.bound_table('exact-baseline-tail', R_values=[R], eps_values=[0.1])", "SUP_R_MAX"),
    "bound_table(exact-advantage-tail)": (
        "gt.bound_table('exact-advantage-tail', R_values=[R], eps_values=[0.1], p=0.5)",
        "EXACT_R_MAX"),
    "success_failure_values": ("qw.success_failure_values('grpo', G=R)", "SQUARE_R_MAX"),
    "conditional_advantages": ("qw.conditional_advantages('grpo', G=R, p=0.5)", "SQUARE_R_MAX"),
    "question_weight": ("qw.question_weight('grpo', G=R, p=0.5)", "SQUARE_R_MAX"),
    "group_mean_factor": ("qw.group_mean_factor(R)", "answer"),
    "others_reward_length_law": ("lb.others_reward_length_law(np.ones((2, 4)) / 8, R)",
                                 "LAW_CELLS_MAX"),
    "rollout_weight": ("lb.rollout_weight(3, 10 * R, G=R, mode='token_mean')", "ARRAY_R_MAX"),
    "own_advantage_table": ("lb.own_advantage_table('grpo', G=R)", "SQUARE_R_MAX"),
    "conditional_weighted_advantage": (
        "lb.conditional_weighted_advantage('grpo', probs=[0.5, 0.5], means=[0.3, 0.8], "
        "lengths=[3, 8], G=R, mode='token_mean')", "SQUARE_R_MAX"),
    "expected_aggregated_gradient": (
        "lb.expected_aggregated_gradient('grpo', probs=[0.5, 0.5], means=[0.3, 0.8], "
        "lengths=[3, 8], psi=np.eye(2), G=R, mode='token_mean')", "SQUARE_R_MAX"),
    "brute_force_aggregated_gradient": (
        "lb.brute_force_aggregated_gradient('grpo', probs=[0.5, 0.5], means=[0.3, 0.8], "
        "lengths=[3, 8], psi=np.eye(2), G=R, mode='token_mean')", "BRUTE_FORCE_MAX_GROUPS"),
    # sims
    "expected_update (length dynamics)": ("ld.expected_update(rb, 'dr_grpo', G=R)",
                                          "SQUARE_R_MAX"),
    "group_advantage_table (success dynamics)": (
        "sd.group_advantage_table(R, estimator='grpo', opts={})", "TABLE_R_MAX"),
    "compositions": ("sd.compositions(R, 3)", "ARRAY_R_MAX"),
    "exact_sampled_expectation": (
        "sd.exact_sampled_expectation(fwd, G=R, beta=1.0, eps=0.1, n_steps=2)", "BRANCHES_MAX"),
    "own_reward_table": ("se.own_reward_table('grpo', R=R)", "TABLE_R_MAX"),
    "pair_table": ("se.pair_table('grpo', R=R)", "TABLE_R_MAX"),
    "cond_advantage_given_reward": ("se.cond_advantage_given_reward('grpo', R=R, p=0.5)",
                                    "TABLE_R_MAX"),
    "bernoulli_advantage_moments": ("se.bernoulli_advantage_moments('grpo', R=R, p=0.5)",
                                    "TABLE_R_MAX"),
    "bernoulli_tail": ("se.bernoulli_tail('grpo', R=R, p=0.5, eps=0.1)", "EXACT_R_MAX"),
    "expected_gradient_bernoulli": (
        "se.expected_gradient_bernoulli('grpo', probs=np.array([.5, .5]), "
        "means=np.array([0., 1.]), psi=np.eye(2), R=R)", "TABLE_R_MAX"),
    "linear_coefficients": ("se.linear_coefficients('grpo', R=R)", "ARRAY_R_MAX"),
    "expected_gradient_linear": (
        "se.expected_gradient_linear('grpo', probs=np.array([.5, .5]), "
        "means=np.array([0., 1.]), psi=np.eye(2), R=R)", "ARRAY_R_MAX"),
    "power_alpha_prompt_mass": ("fd.power_alpha_prompt_mass(np.array([0.5]), R=R, alpha=0.5)",
                                "ARRAY_R_MAX"),
    "one_step_exact": ("fd.one_step_exact(fw, 'grpo', R=R, lr=0.1)", "GROUPS_MAX"),
    "mean_field_trajectory": ("fd.mean_field_trajectory(fw, 'grpo', R=R, lr=0.1, steps=1)",
                              "TABLE_R_MAX"),
    "MultiTurnMDP.expected_own_advantage_given_total": (
        "mdp.expected_own_advantage_given_total('grpo', R=R)", "MULTISET_CELLS_MAX"),
    "multiturn_bias_table": ("mc.multiturn_bias_table(mdp, 'grpo', R=R)", "MULTISET_CELLS_MAX"),
    "multiturn_mode_coefficients": (
        "mc.multiturn_mode_coefficients('total_minus_group_mean', R=R, H=3)", "ARRAY_R_MAX"),
    "check_spectra_limit": (
        "sc.check_spectra_limit('isotropic', 'grpo', R=R, p=0.5, n_groups=10, "
        "rng=np.random.default_rng(0))", "SPECTRA_R_MAX"),
}

#: a refusal must say how to go on
ALTERNATIVES = ("closed form", "Hoeffding", "hoeffding_bound", "Monte Carlo", "binom_pmf",
                "baseline_tail_counts", "float", "exact form", "eigenvalues",
                "isotropic_effective_rank_binary", "mean-field", "linear_weights",
                "expected_aggregated_gradient")

CHILD = r"""
import json, resource, sys, time
from fractions import Fraction
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
import numpy as np
import sympy  # imported before the clock starts: the timings are of the routines, not imports
import grpo_theory as gt
import grpo_theory.bounds as gb
import grpo_theory.outcome_baselines as gfe
import grpo_theory.length_bias as lb
import grpo_theory.question_weights as qw
import sims.length_dynamics as ld
import sims.success_dynamics as sd
from sims.length_worlds import ResponseBandit
import sims.checks as sc
import sims.exact as se
import sims.fade_dynamics as fd
import sims.multiturn_checks as mc
from sims.bandit import SoftmaxBandit
from sims.multiturn import MultiTurnMDP
R = 10**9
fw = fd.FadeWorld(SoftmaxBandit(np.array([0.0, 0.5]), np.array([0.2, 0.7])))
mdp = MultiTurnMDP.random(np.random.default_rng(0), H=3, S=2, A=2)
fwd = sd.FiniteWorld(np.array([0.5, 0.3, 0.2]), np.array([1, 0, 0]))
rb = ResponseBandit(np.zeros(2), np.array([3, 8]), np.array([0.3, 0.8]))
out = {}
for name, (expr, _) in json.loads(sys.argv[1]).items():
    t = time.perf_counter()
    try:
        value = eval(expr)
        res = {"outcome": "answer", "value": repr(value)[:200]}
    except ValueError as exc:
        res = {"outcome": "ValueError", "message": str(exc)}
    except BaseException as exc:
        res = {"outcome": type(exc).__name__, "message": str(exc)[:300]}
    res["seconds"] = time.perf_counter() - t
    out[name] = res
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_routine_at_R_1e9_answers_or_names_its_cap_and_an_alternative_within_a_second(
    outcomes: dict[str, Any], name: str
) -> None:
    res, expected = outcomes[name], CASES[name][1]
    assert res["seconds"] < 1.0, res
    if expected == "answer":
        assert res["outcome"] == "answer", res
        return
    assert res["outcome"] == "ValueError", res
    msg = res["message"]
    assert f"R={R}" in msg or f"{R}" in msg, msg
    assert expected in msg, msg
    assert any(a in msg for a in ALTERNATIVES), msg


def test_exact_baseline_tail_float_route_matches_the_exact_sum_and_stays_below_hoeffding() -> None:
    from grpo_theory import exact_baseline_tail_bernoulli, hoeffding_bound
    from grpo_theory.bounds import baseline_tail_counts

    for Rv, eps, p in [(1, 0.0, 0.5), (2, 0.4, 0.1), (7, 0.2, 0.35), (40, 0.05, 0.9),
                       (300, 0.1, 0.5), (1000, 0.03, 0.02), (64, 0.3, 0.0), (64, 0.3, 1.0)]:
        fast = exact_baseline_tail_bernoulli(R=Rv, eps=eps, p=p)
        exact = exact_baseline_tail_bernoulli(R=Rv, eps=eps, p=Fraction(repr(p)))
        assert fast == pytest.approx(float(exact), rel=1e-12, abs=1e-300), (Rv, eps, p)
    v = exact_baseline_tail_bernoulli(R=10**7, eps=0.001, p=0.5)  # O(1): two incomplete betas
    assert 0 < v <= hoeffding_bound(R=10**7, eps=0.001)
    assert baseline_tail_counts(R=10**9, eps=0.1, p=0.5) == (399_999_999, 600_000_001)
