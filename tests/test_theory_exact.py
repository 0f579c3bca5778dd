"""Exact tier: sympy identities (simplify(lhs - rhs) == 0) and exact rationals.

The symbolic moments (grpo_theory.symbolic, a linear-form derivation for generic R) are checked
against an independent route: exact enumeration over k ~ Binomial(R, p) with a symbolic p
(grpo_theory.bernoulli), where the reward mean is p and the variance p(1-p).
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

import grpo_theory as gt
from grpo_theory import (
    advantage_distribution,
    advantage_values,
    compute_advantages,
    exact_advantage_moments,
    expected_mass_bernoulli,
    group_outcomes,
    linear_estimator_moments,
)
from grpo_theory.symbolic import R as R_sym
from grpo_theory.symbolic import mu, r_i, sigma2

p = sp.Symbol("p")


def _subs(expr: sp.Expr, n: int) -> sp.Expr:
    return expr.subs({R_sym: n, sigma2: p * (1 - p), mu: p})


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_symbolic_moments_match_bernoulli_enumeration_exact(name: str, n: int) -> None:
    sym = linear_estimator_moments(name)
    enum = exact_advantage_moments(name, R=n, p=p)
    for key in ("mean", "var", "cov"):
        assert sp.simplify(_subs(sym[key], n) - enum[key]) == 0, key
    own = sym["cond_mean_given_own"]
    assert sp.simplify(_subs(own, n).subs(r_i, 1) - enum["cond_mean_success"]) == 0
    assert sp.simplify(_subs(own, n).subs(r_i, 0) - enum["cond_mean_failure"]) == 0


def test_thm4_1_ii_iii_grpo_variance_covariance_exact_sympy() -> None:
    # Our derivation reproduces Theorem 4.1(ii)-(iii) for generic R (stated in the paper; the
    # enumeration test above is what makes this independent of the paper).
    m = linear_estimator_moments("grpo")
    assert sp.simplify(m["var"] - (R_sym - 1) / R_sym * sigma2) == 0
    assert sp.simplify(m["cov"] + sigma2 / R_sym) == 0
    assert m["sum_coefficient"] == 0 and m["sum_constant"] == 0


def test_grpo_own_reward_shrinkage_vs_rloo_exact_sympy() -> None:
    g = linear_estimator_moments("grpo")["cond_mean_given_own"]
    r = linear_estimator_moments("rloo")["cond_mean_given_own"]
    assert sp.simplify(g - (R_sym - 1) / R_sym * (r_i - mu)) == 0
    assert sp.simplify(r - (r_i - mu)) == 0


def test_zero_sum_variance_identity_generic_R_sympy() -> None:
    # Var(sum A_i) = R Var + R(R-1) Cov must vanish for the zero-sum estimators, not for reinforce.
    for name, zero in (("grpo", True), ("rloo", True), ("reinforce", False)):
        m = linear_estimator_moments(name)
        total = sp.simplify(R_sym * m["var"] + R_sym * (R_sym - 1) * m["cov"])
        assert (total == 0) is zero, name


def test_group_outcomes_exact_rationals_sum_to_one() -> None:
    k, pmf = group_outcomes(R=5, p=sp.Rational(2, 7))
    assert list(k) == [0, 1, 2, 3, 4, 5]
    assert sum(pmf) == 1
    assert pmf[0] == sp.Rational(5, 7) ** 5
    _, pmf_f = group_outcomes(R=3, p=Fraction(1, 3))
    assert pmf_f == [
        sp.Rational(8, 27),
        sp.Rational(12, 27),
        sp.Rational(6, 27),
        sp.Rational(1, 27),
    ]


def test_grpo_binary_values_exact() -> None:
    # Sec. 5.1: with k of R correct, successes get 1 - k/R and failures -k/R.
    for n in range(2, 7):
        for k in range(n + 1):
            s, f = advantage_values("grpo", R=n, k=k)
            assert s == (None if k == 0 else 1 - sp.Rational(k, n))
            assert f == (None if k == n else -sp.Rational(k, n))


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("grpo", {}),
        ("rloo", {}),
        ("reinforce", {"baseline": 0.25}),
        ("grpo_std", {"ddof": 1}),
        ("grpo_std", {"ddof": 0, "eps": 1e-4}),
        ("asym_grpo", {"delta": 0.5}),
        ("power_alpha", {"alpha": 2.5}),
        ("fade", {"alpha": 2.0, "delta": 0.3}),
    ],
)
def test_exact_values_equal_numpy_estimator_on_binary_rows(name: str, opts: dict) -> None:
    for n in (2, 3, 5, 8):
        for k in range(n + 1):
            ex = advantage_values(name, R=n, k=k, **opts)
            fl = advantage_values(name, R=n, k=k, exact=False, **opts)
            for a, b in zip(ex, fl, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    assert float(a) == pytest.approx(b, rel=1e-12, abs=1e-12)


def test_grpo_std_sum_of_squares_exact_sympy() -> None:
    # eps = 0, non-degenerate group: sum_i A_i^2 = R - ddof exactly (sqrt kept symbolic).
    for ddof in (0, 1):
        for n in (3, 4, 6):
            for k in range(1, n):
                s, f = advantage_values("grpo_std", R=n, k=k, ddof=ddof)
                assert sp.simplify(k * s**2 + (n - k) * f**2 - (n - ddof)) == 0
                assert sp.simplify(k * s + (n - k) * f) == 0


def test_advantage_distribution_exact_sums_to_one_and_mean_matches() -> None:
    q = sp.Rational(3, 10)
    for name, opts in (("grpo_std", {}), ("asym_grpo", {"delta": 0.5}), ("fade", {"alpha": 2})):
        law = advantage_distribution(name, R=4, p=q, **opts)
        assert sp.simplify(sum(pr for _, pr in law) - 1) == 0
        mean = sp.simplify(sum(v * pr for v, pr in law))
        assert sp.simplify(mean - exact_advantage_moments(name, R=4, p=q, **opts)["mean"]) == 0


def test_asym_grpo_mean_is_negative_for_delta_below_one_exact() -> None:
    # Not zero-sum: with delta < 1 failures are amplified, so E[A_1] < 0 for 0 < p < 1.
    m = exact_advantage_moments("asym_grpo", R=4, p=sp.Rational(1, 2), delta=sp.Rational(1, 2))
    assert m["mean"] < 0


def test_expected_mass_zero_sum_estimators_balance_exact() -> None:
    q = sp.Rational(2, 5)
    for name in ("grpo", "rloo", "grpo_std", "power_alpha"):
        ms, mf = expected_mass_bernoulli(name, R=5, p=q)
        assert sp.simplify(ms - mf) == 0, name
    ms, mf = expected_mass_bernoulli("asym_grpo", R=5, p=q, delta=sp.Rational(1, 2))
    assert sp.simplify(mf - 2 * ms) == 0
    ms, mf = expected_mass_bernoulli("reinforce", R=5, p=q)
    assert mf == 0 and ms == 5 * q


def test_expected_mass_grpo_closed_form_by_independent_sum() -> None:
    # E m_S = E[k (1 - k/R)] = R p - (R p (1-p) + R^2 p^2)/R = (R - 1) p (1 - p): independent route.
    for n in (2, 3, 7):
        ms, _ = expected_mass_bernoulli("grpo", R=n, p=p)
        assert sp.simplify(ms - (n - 1) * p * (1 - p)) == 0
    arr = np.array([0.1, 0.5, 0.9])
    ms, mf = expected_mass_bernoulli("grpo", R=6, p=arr)
    np.testing.assert_allclose(ms, 5 * arr * (1 - arr), rtol=1e-12)
    np.testing.assert_allclose(mf, ms, rtol=1e-12)


def test_numpy_estimator_on_rational_rows_matches_exact_moment() -> None:
    # Enumerate all 2^R binary rows directly (a third route) for grpo_std's variance.
    n, q = 4, 0.3
    rows = np.array([[(m >> j) & 1 for j in range(n)] for m in range(2**n)], dtype=float)
    probs = np.prod(np.where(rows == 1, q, 1 - q), axis=1)
    a = np.asarray(compute_advantages("grpo_std", rows, ddof=1))
    mean = float(probs @ a[:, 0])
    var = float(probs @ a[:, 0] ** 2) - mean**2
    cov = float(probs @ (a[:, 0] * a[:, 1])) - mean**2
    m = exact_advantage_moments("grpo_std", R=n, p=q)
    assert m["mean"] == pytest.approx(mean, abs=1e-12)
    assert m["var"] == pytest.approx(var, rel=1e-12)
    assert m["cov"] == pytest.approx(cov, rel=1e-12)


def test_exact_enumeration_bad_input() -> None:
    with pytest.raises(ValueError, match="p must be in"):
        exact_advantage_moments("grpo", R=3, p=1.5)
    with pytest.raises(ValueError, match="p must be in"):
        group_outcomes(R=3, p=sp.Rational(-1, 2))
    with pytest.raises(ValueError, match="needs R >= 2"):
        advantage_values("rloo", R=1, k=0)
    with pytest.raises(ValueError, match="0 <= k <= R"):
        advantage_values("grpo", R=3, k=4)
    with pytest.raises(ValueError, match="std_scope='group' only"):
        advantage_values("grpo_std", R=3, k=1, std_scope="batch")
    with pytest.raises(ValueError, match="zero variance"):
        advantage_values("grpo_std", R=3, k=3, on_zero_std="raise")
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        advantage_values("ppo", R=3, k=1)
    with pytest.raises(TypeError, match="R must be an int"):
        group_outcomes(R=2.5, p=0.5)


def test_binom_pmf_matches_exact_and_survives_extreme_p() -> None:
    from grpo_theory import binom_pmf

    for n in (1, 4, 9):
        exact = [float(x) for x in group_outcomes(R=n, p=sp.Rational(3, 7))[1]]
        np.testing.assert_allclose(binom_pmf(np.arange(n + 1), n, 3 / 7), exact, rtol=1e-12)
    for q in (0.0, 1.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1 - 1e-16):
        pmf = binom_pmf(np.arange(65), 64, q)
        assert np.all(np.isfinite(pmf)) and abs(pmf.sum() - 1) < 1e-12, q
    assert binom_pmf(np.arange(3), 2, 0.0).tolist() == [1.0, 0.0, 0.0]
    assert binom_pmf(np.arange(3), 2, 1.0).tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce"])
def test_symbolic_moments_match_covariance_matrix_route(name: str) -> None:
    # Independent route for each fixed R: A = W r + c with an explicit R x R matrix W, so
    # Cov(A) = sigma2 W W^T and E[A] = mu W 1 + c (sympy Matrix algebra, no linear-form formula).
    sym = linear_estimator_moments(name)
    for n in range(2, 7):
        ones = sp.ones(n, n)
        W = {
            "grpo": sp.eye(n) - ones / n,
            "rloo": sp.eye(n) * (1 + sp.Rational(1, n - 1)) - ones / (n - 1),
            "reinforce": sp.eye(n),
        }[name]
        C = sigma2 * W * W.T
        E = mu * W * sp.ones(n, 1)
        sub = {R_sym: n}
        assert sp.simplify(sym["var"].subs(sub) - C[0, 0]) == 0
        assert sp.simplify(sym["cov"].subs(sub) - C[0, 1]) == 0
        assert sp.simplify(sym["mean"].subs(sub) - E[0]) == 0
        # E[A_1 | r_1] = W[0, 0] r_1 + mu * sum_{j != 1} W[0, j]
        cond = W[0, 0] * r_i + mu * sum(W[0, j] for j in range(1, n))
        assert sp.simplify(sym["cond_mean_given_own"].subs(sub) - cond) == 0


# --- tiny exact cases (rlax style): fixed input, hand-checked output ---------------------------
def test_to_exact_tiny_exact_case() -> None:
    from fractions import Fraction

    from grpo_theory import to_exact

    # floats read as the decimal they print as; ints and Fractions exactly
    assert to_exact(0.1) == sp.Rational(1, 10)
    assert to_exact(2) == sp.Integer(2)
    assert to_exact(Fraction(1, 3)) == sp.Rational(1, 3)


def test_binom_pmf_tiny_exact_case() -> None:
    from grpo_theory import binom_pmf

    # Bin(3, 1/2): C(3, k) / 8 = [1, 3, 3, 1] / 8; k = 4 is outside 0..3 -> 0
    assert binom_pmf([0, 1, 2, 3, 4], 3, 0.5).tolist() == [0.125, 0.375, 0.375, 0.125, 0.0]


def test_group_outcomes_tiny_exact_case() -> None:
    # R = 3, p = 1/3: (2/3)^3 = 8/27, 3 (1/3)(2/3)^2 = 12/27, 3 (1/3)^2 (2/3) = 6/27, 1/27
    k, pmf = group_outcomes(R=3, p=sp.Rational(1, 3))
    assert k.tolist() == [0, 1, 2, 3]
    assert pmf == [sp.Rational(8, 27), sp.Rational(12, 27), sp.Rational(6, 27), sp.Rational(1, 27)]


def test_advantage_value_table_rloo_tiny_exact_case() -> None:
    from grpo_theory import advantage_value_table

    # rloo, R = 3: a_S(k) = 3/2 (1 - k/3) -> k=1: 1, k=2: 1/2, k=3: 0 (a_S(0): no success);
    # a_F(k) = 3/2 (-k/3) = -k/2 -> 0, -1/2, -1 (a_F(3): no failure)
    s, f = advantage_value_table("rloo", R=3)
    half = sp.Rational(1, 2)
    assert s == [None, 1, half, 0]
    assert f == [0, -half, -1, None]


def test_advantage_distribution_rloo_tiny_exact_case() -> None:
    # R = 2, p = 1/2: A_1 = r_1 - r_2 in {-1, 0, 1} with probabilities 1/4, 1/2, 1/4
    q = sp.Rational(1, 4)
    assert advantage_distribution("rloo", R=2, p=sp.Rational(1, 2)) == [(-1, q), (0, 2 * q), (1, q)]


def test_exact_advantage_moments_rloo_tiny_exact_case() -> None:
    # R = 2, p = 1/2: A_1 = r_1 - r_2 = -A_2: mean 0, var = E A_1^2 = 1/4 + 1/4 = 1/2,
    # cov = -var = -1/2, E[A_1 | r_1 = 1] = 1 - E r_2 = 1/2, E[A_1 | r_1 = 0] = -1/2
    m = exact_advantage_moments("rloo", R=2, p=sp.Rational(1, 2))
    half = sp.Rational(1, 2)
    assert (m["mean"], m["var"], m["cov"]) == (0, half, -half)
    assert (m["cond_mean_success"], m["cond_mean_failure"]) == (half, -half)


def test_linear_weights_tiny_exact_case() -> None:
    from grpo_theory import linear_weights

    # grpo: A_i = r_i - (1/R) sum_j r_j = (1 - 1/R) r_i - (1/R) sum_{j != i} r_j
    assert linear_weights("grpo") == (1 - 1 / R_sym, -1 / R_sym, 0)
    # reinforce with baseline b: A_i = r_i - b
    b = sp.Symbol("b")
    assert linear_weights("reinforce", baseline=b) == (1, 0, -b)
    with pytest.raises(ValueError, match="no linear closed form"):
        linear_weights("grpo_std")


def test_linear_estimator_moments_rloo_cov_tiny_exact_case() -> None:
    # rloo: alpha = 1, beta = -1/(R-1): cov = (2 alpha beta + (R-2) beta^2) sigma2
    # = (-2(R-1) + (R-2)) / (R-1)^2 sigma2 = -R sigma2 / (R-1)^2 (R = 2, sigma2 = 1/4: -1/2, as
    # in the enumeration above)
    cov = linear_estimator_moments("rloo")["cov"]
    assert sp.simplify(cov + R_sym * sigma2 / (R_sym - 1) ** 2) == 0
    assert cov.subs({R_sym: 2, sigma2: sp.Rational(1, 4)}) == -sp.Rational(1, 2)


# --- binom_pmf, exact tables and moments: bad input, large R, one-sample groups ------------------
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("p", [NAN, 1.5, -0.1, INF])
def test_binom_pmf_rejects_p_outside_unit_interval(p: float) -> None:
    with pytest.raises(ValueError, match="p must be in \\[0, 1\\]"):
        gt.binom_pmf([0, 1, 2], 2, p)


def test_binom_pmf_rejects_non_integer_or_negative_R_and_k() -> None:
    with pytest.raises(TypeError, match="R must be an int"):
        gt.binom_pmf([0, 1], 2.5, 0.5)
    with pytest.raises(ValueError, match="R must be >= 0"):
        gt.binom_pmf([0], -1, 0.5)
    with pytest.raises(ValueError, match="k must hold integers"):
        gt.binom_pmf(0.5, 2, 0.5)
    with pytest.raises(ValueError, match="k must hold integers"):
        gt.binom_pmf(1.5, 2, 0.5)


def test_binom_pmf_hand_checked() -> None:
    assert gt.binom_pmf([0, 1, 2, 3], 2, 0.5).tolist() == [0.25, 0.5, 0.25, 0.0]


def test_advantage_value_table_option_type_error_names_it() -> None:
    with pytest.raises(TypeError, match="delta"):
        gt.advantage_value_table("asym_grpo", R=4, delta=[0.5])


def test_exact_advantage_moments_large_R_fast_float_path() -> None:
    t0 = time.perf_counter()
    m = gt.exact_advantage_moments("grpo", R=3000, p=0.3)
    assert time.perf_counter() - t0 < 10.0  # correctness of the O(R) float path at large R
    assert m["var"] == pytest.approx(0.3 * 0.7 * (1 - 1 / 3000), rel=1e-9)
    assert m["cov"] == pytest.approx(-0.3 * 0.7 / 3000, rel=1e-6)


def test_exact_enumeration_beyond_its_limit_names_the_alternatives() -> None:
    with pytest.raises(ValueError, match="EXACT_R_MAX=10000.*closed forms"):
        gt.exact_advantage_moments("grpo", R=10**6, p=0.3)


@pytest.mark.slow
def test_exact_advantage_moments_at_the_limit_within_15_s() -> None:
    # the exact table (~3 s) plus O(R) NumPy; sympy arithmetic per term took 18-35 s
    t0 = time.perf_counter()
    m = gt.exact_advantage_moments("grpo", R=10_000, p=0.3)
    assert time.perf_counter() - t0 < 15.0
    assert m["var"] == pytest.approx(0.3 * 0.7 * (1 - 1e-4), rel=1e-9)


def test_symbolic_alpha_with_float_p_is_a_message() -> None:
    with pytest.raises(ValueError, match=r"\['alpha'\] are symbolic.*exact p"):
        gt.exact_advantage_moments("power_alpha", R=4, p=0.5, alpha=sp.Symbol("a"))
    # with an exact p the symbolic alpha is supported (closed form in a)
    m = gt.exact_advantage_moments("power_alpha", R=4, p=sp.Rational(1, 2), alpha=sp.Symbol("a"))
    assert m["mean"] == 0 and m["var"].free_symbols == {sp.Symbol("a")}


def test_opo_exact_and_linear_forms_match_the_float_form_for_one_sample_groups():
    # R = 1: opo's baseline is 0, so a success has advantage 1 and a failure 0 (hand-checked).
    assert advantage_values("opo", R=1, k=1) == (1, None)
    assert advantage_values("opo", R=1, k=1, exact=False) == (1.0, None)
    assert advantage_values("opo", R=1, k=0) == (None, 0)
    from grpo_theory.registry import estimator_spec

    assert estimator_spec("opo").linear(1) == (1, 0, 0)


def test_exact_grpo_std_refuses_a_non_integer_ddof_like_the_float_form():
    with pytest.raises(TypeError, match="ddof"):
        advantage_values("grpo_std", R=3, k=1, ddof=1.5)
    with pytest.raises(TypeError, match="ddof"):
        advantage_values("grpo_std", R=3, k=1, ddof=1.5, exact=False)
