"""sims.success_dynamics: the sampled-group PoS iteration, exact enumeration against seeded Monte
Carlo (|estimate - exact| <= 4 SE), and hand-checked cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_theory import advantage_values
from grpo_theory.tilted_policies import grpo_policy_iterates
from sims._stats import Z_THRESHOLD as K_SE  # the one k of the statistical tier
from sims.success_dynamics import (
    PAPER_ESTIMATOR_OPTIONS,
    FiniteWorld,
    compositions,
    exact_sampled_expectation,
    group_advantage_table,
    simulate_sampled_iterates,
)

WORLD = FiniteWorld(np.array([0.1, 0.2, 0.3, 0.4]), np.array([1, 1, 0, 0]))


def test_compositions_count_and_sums():
    c = compositions(4, 3)
    assert len(c) == math.comb(6, 2) and np.all(c.sum(1) == 4) and np.all(c >= 0)
    assert len({tuple(r) for r in c}) == len(c)


def test_group_advantage_table_is_the_registry():
    a_S, a_F = group_advantage_table(5, estimator="grpo_std",
                                     opts={**PAPER_ESTIMATOR_OPTIONS, "eps": 0.1})
    for k in range(6):
        s, f = advantage_values("grpo_std", R=5, k=k, exact=False, ddof=0, eps=0.1,
                                eps_mode="add_var")
        assert a_S[k] == pytest.approx(0.0 if s is None else s, abs=1e-14)
        assert a_F[k] == pytest.approx(0.0 if f is None else f, abs=1e-14)


def test_exact_expectation_starts_at_p_ref_and_approaches_the_population_for_large_g():
    ex = exact_sampled_expectation(WORLD, G=2, beta=5.0, eps=1e-5, n_steps=1)
    assert ex["mean_p"][0] == pytest.approx(WORLD.p_ref) and ex["mean_tv"][0] == 0.0
    pop = grpo_policy_iterates(WORLD.pi_ref, WORLD.success, beta=5.0, eps=1e-5, n_steps=1)
    p1 = float(pop[1][WORLD.success].sum())
    gaps = [abs(exact_sampled_expectation(WORLD, G=G, beta=5.0, eps=1e-5, n_steps=1)["mean_p"][1]
                - p1) for G in (2, 8, 24)]
    assert gaps[2] < gaps[0]


@pytest.mark.parametrize("beta", [1.0, 5.0])
def test_monte_carlo_matches_exact_enumeration_within_k_se(beta):
    ex = exact_sampled_expectation(WORLD, G=6, beta=beta, eps=1e-5, n_steps=2)
    mc = simulate_sampled_iterates(WORLD, G=6, beta=beta, eps=1e-5, n_steps=2, n_runs=6000,
                                   rng=np.random.default_rng(21))
    for n in (1, 2):
        est, se = mc["p"][n].mean(), mc["p"][n].std(ddof=1) / math.sqrt(6000)
        assert abs(est - ex["mean_p"][n]) <= K_SE * se
        tv_est = mc["tv"][n].mean()
        tv_se = mc["tv"][n].std(ddof=1) / math.sqrt(6000)
        assert abs(tv_est - ex["mean_tv"][n]) <= K_SE * tv_se


def test_mean_only_registry_estimator_runs_and_is_seeded():
    a = simulate_sampled_iterates(WORLD, G=4, beta=1.0, eps=0.0, n_steps=3, n_runs=50,
                                  rng=np.random.default_rng(1), estimator="dr_grpo", opts={})
    b = simulate_sampled_iterates(WORLD, G=4, beta=1.0, eps=0.0, n_steps=3, n_runs=50,
                                  rng=np.random.default_rng(1), estimator="dr_grpo", opts={})
    assert np.array_equal(a["p"], b["p"]) and np.all((a["p"] >= 0) & (a["p"] <= 1))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="group size G"):
        simulate_sampled_iterates(WORLD, G=1, beta=1.0, eps=0.1, n_steps=1, n_runs=2,
                                  rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_runs"):
        simulate_sampled_iterates(WORLD, G=2, beta=1.0, eps=0.1, n_steps=1, n_runs=0,
                                  rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="alpha"):
        exact_sampled_expectation(WORLD, G=2, beta=1.0, eps=0.1, n_steps=1, alpha=2.0)
    with pytest.raises(ValueError, match="success must"):
        FiniteWorld(np.array([0.5, 0.5]), np.array([1, 0, 0]))
