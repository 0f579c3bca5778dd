"""Bounds, exact tails and tables: exact, statistical (k = 4 standard errors) and CLI checks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import sympy as sp

import grpo_theory as gt
from grpo_audit.cli import main
from grpo_theory import (
    baseline_tail_event,
    bernstein_bound,
    bound_table,
    chebyshev_bound,
    compute_advantages,
    exact_advantage_tail_bernoulli,
    exact_baseline_tail_bernoulli,
    hoeffding_bound,
    sup_baseline_tail_bernoulli,
)
from sims._stats import Z_THRESHOLD

K_SE = Z_THRESHOLD  # statistical tests: |estimate - exact| <= K_SE * SE


def test_closed_form_bounds_values_and_broadcasting() -> None:
    R = np.array([[2], [16]])
    eps = np.array([[0.3, 0.1]])
    h = hoeffding_bound(R=R, eps=eps)
    assert h.shape == (2, 2)
    assert h[1, 0] == pytest.approx(2 * math.exp(-2 * 16 * 0.09), rel=1e-15)
    assert chebyshev_bound(R=4, eps=0.5, sigma2=0.25) == pytest.approx(3 * 0.25 / (4 * 0.25))
    assert bernstein_bound(R=8, eps=0.2, sigma2=0.1) == pytest.approx(
        2 * math.exp(-8 * 0.04 / (0.2 + 2 * 0.2 / 3))
    )


def test_baseline_tail_exact_rational_by_hand() -> None:
    # R = 4, p = 1/2: |k/4 - 1/2| > 1/5 iff k in {0, 1, 3, 4} -> 10/16; > 3/10 iff k in {0, 4}.
    half = sp.Rational(1, 2)
    assert exact_baseline_tail_bernoulli(R=4, eps=sp.Rational(1, 5), p=half) == sp.Rational(5, 8)
    assert exact_baseline_tail_bernoulli(R=4, eps=sp.Rational(3, 10), p=half) == sp.Rational(1, 8)
    # strict '>': k/R - p == eps exactly is excluded (R=2, p=1/2, eps=1/2 -> 0).
    assert exact_baseline_tail_bernoulli(R=2, eps=0.5, p=sp.Rational(1, 2)) == 0
    # float p decided exactly: p = 0.3, R = 5, eps = 0.3: k/5 = 0.6 sits exactly on the boundary.
    val = exact_baseline_tail_bernoulli(R=5, eps=0.3, p=0.3)
    ks = [4, 5]  # k = 0 and k = 3 sit exactly at distance eps and are excluded
    expected = sum(math.comb(5, k) * 0.3**k * 0.7 ** (5 - k) for k in ks)
    assert val == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("R", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("eps", [0.05, 0.1, 0.25, 0.3, 0.5])
def test_sup_baseline_tail_dominates_dense_grid_and_is_attained_nearby(R: int, eps: float) -> None:
    val, arg = sup_baseline_tail_bernoulli(R=R, eps=eps)
    # independent route: float binomial sums on a dense grid (scipy), no piecewise analysis
    from scipy.stats import binom

    grid = np.linspace(0.0, 1.0, 4001)
    k = np.arange(R + 1)[:, None]
    tails = (binom.pmf(k, R, grid[None, :]) * (np.abs(k / R - grid[None, :]) > eps)).sum(axis=0)
    assert val >= tails.max() - 1e-9
    assert val <= 1.0 + 1e-12
    # the sup is a limit at argmax from one side: values just beside argmax come close to it
    near = [
        exact_baseline_tail_bernoulli(R=R, eps=eps, p=min(max(arg + d, 0.0), 1.0))
        for d in (-1e-9, 1e-9)
    ]
    assert max(near) == pytest.approx(val, abs=1e-6)


@pytest.mark.parametrize("R", [2, 4, 8, 16])
def test_hoeffding_and_bernstein_dominate_exact_baseline_tail(R: int) -> None:
    for p in (0.05, 0.3, 0.5, 0.9):
        for eps in (0.1, 0.2, 0.3):
            exact = exact_baseline_tail_bernoulli(R=R, eps=eps, p=p)
            assert exact <= hoeffding_bound(R=R, eps=eps) + 1e-12
            assert exact <= bernstein_bound(R=R, eps=eps, sigma2=p * (1 - p)) + 1e-12


@pytest.mark.parametrize("R", [2, 4, 8])
def test_chebyshev_dominates_exact_grpo_advantage_tail(R: int) -> None:
    for p in (0.1, 0.5, 0.8):
        for eps in (0.1, 0.3, 0.5):
            exact = exact_advantage_tail_bernoulli(R=R, eps=eps, p=p)
            assert exact <= chebyshev_bound(R=R, eps=eps, sigma2=p * (1 - p)) + 1e-12


@pytest.mark.parametrize(
    ("estimator", "opts"),
    [("grpo", {}), ("grpo_std", {"eps": 1e-4}), ("fade", {"alpha": 2.0, "delta": 0.5})],
)
def test_exact_advantage_tail_vs_monte_carlo_statistical(estimator: str, opts: dict) -> None:
    rng = np.random.default_rng(20260721)
    R, p, eps, n = 6, 0.35, 0.3, 40_000
    rewards = (rng.random((n, R)) < p).astype(float)
    a = np.asarray(compute_advantages(estimator, rewards, **opts))[:, 0]
    hits = np.abs(a) > eps
    est, se = hits.mean(), hits.std(ddof=1) / math.sqrt(n)
    exact = exact_advantage_tail_bernoulli(
        R=R, eps=eps, p=p, estimator=estimator, estimator_options=opts
    )
    assert abs(est - exact) <= K_SE * se


def test_exact_baseline_tail_vs_monte_carlo_statistical() -> None:
    rng = np.random.default_rng(7)
    R, p, eps, n = 8, 0.45, 0.2, 40_000
    vhat = (rng.random((n, R)) < p).mean(axis=1)
    hits = np.abs(vhat - p) > eps
    est, se = hits.mean(), hits.std(ddof=1) / math.sqrt(n)
    assert abs(est - exact_baseline_tail_bernoulli(R=R, eps=eps, p=p)) <= K_SE * se


def test_bound_table_values_and_vacuous_flags() -> None:
    t = bound_table("hoeffding", R_values=[2, 4, 8, 16], eps_values=[0.3, 0.2, 0.1])
    expect = 2 * np.exp(-2 * np.array([2, 4, 8, 16])[:, None] * np.array([0.3, 0.2, 0.1]) ** 2)
    np.testing.assert_allclose(t.values, expect, rtol=1e-15)
    np.testing.assert_array_equal(t.vacuous, expect >= 1)


def test_bound_table_kinds_and_errors() -> None:
    sup = bound_table("exact-baseline-tail", R_values=[2, 4], eps_values=[0.3])
    assert "argmax_p" in sup.extra
    assert sup.values[0, 0] == pytest.approx(sup_baseline_tail_bernoulli(R=2, eps=0.3)[0])
    adv = bound_table("exact-advantage-tail", R_values=[4], eps_values=[0.3], p=0.5)
    assert adv.values[0, 0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="exactly one of sigma2 or p"):
        bound_table("chebyshev", R_values=[2], eps_values=[0.1])
    with pytest.raises(ValueError, match="unknown table kind"):
        bound_table("nope", R_values=[2], eps_values=[0.1])
    with pytest.raises(ValueError, match="eps must be > 0"):
        bound_table("hoeffding", R_values=[2], eps_values=[0.0])


def test_cli_tables_hoeffding_prints_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "tables",
            "hoeffding",
            "--R",
            "2",
            "4",
            "8",
            "16",
            "--eps",
            "0.3",
            "0.2",
            "0.1",
            "--format",
            "md",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("\n| ") == 5  # header + 4 rows
    assert f"{2 * math.exp(-2 * 16 * 0.09):#.3g}" in out


def test_cli_tables_other_kinds_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tables", "chebyshev", "--p", "0.5", "--format", "csv"]) == 0
    assert (
        main(
            [
                "tables",
                "exact-advantage-tail",
                "--p",
                "0.5",
                "--estimator",
                "grpo_std",
                "--option",
                "eps=1e-4",
                "--format",
                "latex",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "R,eps,value,vacuous" in out and "\\begin{tabular}" in out
    assert main(["tables", "bernstein", "--sigma2", "-1"]) == 2  # clear error, exit code 2


def test_bounds_bad_input() -> None:
    with pytest.raises(ValueError, match="eps must be > 0"):
        hoeffding_bound(R=4, eps=0.0)
    with pytest.raises(ValueError, match="sigma2 must be >= 0"):
        chebyshev_bound(R=4, eps=0.1, sigma2=-1.0)
    with pytest.raises(ValueError, match="R must be integer"):
        bernstein_bound(R=2.5, eps=0.1, sigma2=0.1)
    with pytest.raises(ValueError, match="must be finite"):
        hoeffding_bound(R=4, eps=np.nan)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        exact_baseline_tail_bernoulli(R=4, eps=-0.1, p=0.5)
    with pytest.raises(ValueError, match="p must be in"):
        exact_advantage_tail_bernoulli(R=4, eps=0.1, p=-0.1)


# --- the one exact baseline tail, AT the breakpoints p = k/R +- eps (strict '>', exact) --------
def test_baseline_tail_at_breakpoint_R2_eps04_p01_by_hand() -> None:
    # R = 2, eps = 2/5, p = 1/10: |0/2 - 1/10| = 1/10, |1/2 - 1/10| = 2/5 (NOT > 2/5: excluded),
    # |2/2 - 1/10| = 9/10 > 2/5. Only k = 2 counts: P = p^2 = 1/100.
    from fractions import Fraction

    assert baseline_tail_event(R=2, eps=0.4, p=0.1).tolist() == [False, False, True]
    assert exact_baseline_tail_bernoulli(R=2, eps=0.4, p=0.1) == pytest.approx(0.01, abs=1e-17)
    assert exact_baseline_tail_bernoulli(
        R=2, eps=Fraction(2, 5), p=Fraction(1, 10)
    ) == sp.Rational(1, 100)
    # just left of the breakpoint k = 1 counts: P(k >= 1) = 1 - (1 - p)^2 -> 1 - 0.81 = 0.19
    assert exact_baseline_tail_bernoulli(
        R=2, eps=Fraction(2, 5), p=Fraction(1, 10) - Fraction(1, 10**9)
    ) == pytest.approx(0.19, abs=1e-8)
    # the float 0.5 - 0.4 = 0.09999999999999998 is read as that decimal, left of 1/10: k = 1 counts
    assert exact_baseline_tail_bernoulli(R=2, eps=0.4, p=0.5 - 0.4) == pytest.approx(
        1 - (1 - (0.5 - 0.4)) ** 2, rel=1e-14
    )


def test_baseline_tail_at_breakpoints_R4_eps025_by_hand() -> None:
    # R = 4, eps = 1/4, p = 1/2: |k/4 - 1/2| = 1/2, 1/4, 0, 1/4, 1/2; > 1/4 only k = 0, 4:
    # P = 2 / 16 = 1/8 (k = 1, 3 sit exactly at distance eps and are excluded).
    assert exact_baseline_tail_bernoulli(R=4, eps=0.25, p=sp.Rational(1, 2)) == sp.Rational(1, 8)
    assert exact_baseline_tail_bernoulli(R=4, eps=0.25, p=0.5) == 0.125
    # p = 3/4 = 1/2 + eps: distances 3/4, 1/2, 1/4, 0, 1/4 -> k = 0, 1 count:
    # (1/4)^4 + 4 (3/4)(1/4)^3 = 1/256 + 12/256 = 13/256
    assert exact_baseline_tail_bernoulli(R=4, eps=0.25, p=sp.Rational(3, 4)) == sp.Rational(13, 256)


def test_every_caller_uses_the_one_tail_at_all_breakpoints() -> None:
    # the sims and paper_checks routes are the library function (980 breakpoint cases used to
    # disagree between them): R <= 20, 8 eps values, every float breakpoint k/R +- eps in [0, 1]
    from paper_checks.enumeration import baseline_tail
    from sims.checks import sampled_baseline_tail_event

    for R in range(1, 21):
        rows = (np.arange(R)[None, :] < np.arange(R + 1)[:, None]).astype(np.float64)
        for eps in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
            for k in range(R + 1):
                for p in (k / R - eps, k / R + eps):
                    if not 0.0 <= p <= 1.0:
                        continue
                    lib = exact_baseline_tail_bernoulli(R=R, eps=eps, p=p)
                    assert baseline_tail(R=R, p=p, eps=eps) == lib
                    ev = baseline_tail_event(R=R, eps=eps, p=p)
                    assert sampled_baseline_tail_event(rows, eps=eps, p=p).tolist() == ev.tolist()


def test_sup_baseline_tail_R2_eps04_is_the_limit_at_the_breakpoint() -> None:
    # R = 2, eps = 2/5; k = 0 counts iff p > 2/5, k = 1 iff |1/2 - p| > 2/5 (p < 1/10 or
    # p > 9/10), k = 2 iff 1 - p > 2/5 (p < 3/5). Pieces:
    #   (0, 1/10):   k = 1, 2   -> 1 - (1-p)^2, increasing to 0.19 at 1/10;
    #   (1/10, 2/5): k = 2      -> p^2 <= 0.16;
    #   (2/5, 3/5):  k = 0, 2   -> p^2 + (1-p)^2, largest at the ends: 0.16 + 0.36 = 0.52;
    #   and the mirror images on (3/5, 1).
    # So sup = 0.52, a limit p -> 2/5 from the right (or 3/5 from the left). AT p = 2/5, k = 0
    # is excluded (|0 - 2/5| = 2/5 is not > 2/5): P = p^2 = 0.16.
    val, arg = sup_baseline_tail_bernoulli(R=2, eps=0.4)
    assert val == pytest.approx(0.52, abs=1e-15)
    assert arg in (0.4, 0.6)
    assert exact_baseline_tail_bernoulli(R=2, eps=0.4, p=0.4) == pytest.approx(0.16, abs=1e-15)
    right = exact_baseline_tail_bernoulli(R=2, eps=0.4, p=0.4 + 1e-9)
    assert right == pytest.approx(0.52, abs=1e-8)


# --- tiny exact cases (rlax style): fixed input, hand-checked output ---------------------------
def test_closed_form_bounds_tiny_exact_cases() -> None:
    # Chebyshev sigma2 / (R eps^2): R = 4, eps = 1/2, sigma2 = 1/4 -> (3/4)/(4/4) = 3/4
    assert chebyshev_bound(R=4, eps=0.5, sigma2=0.25) == 0.75
    # Hoeffding 2 exp(-2 R eps^2): R = 2, eps = 1/2 -> 2 exp(-1)
    assert hoeffding_bound(R=2, eps=0.5) == pytest.approx(2 / math.e, rel=1e-15)
    # Bernstein 2 exp(-R eps^2 / (2 sigma2 + 2 w eps / 3)): R = 1, eps = 1, sigma2 = 0,
    # w = 3/2 -> 2 exp(-1 / 1) = 2/e
    assert bernstein_bound(R=1, eps=1.0, sigma2=0.0, width=1.5) == pytest.approx(2 / math.e)


def test_exact_advantage_tail_and_bound_table_tiny_exact_cases() -> None:
    # grpo, R = 2, p = 1/2: A_1 = +-1/2 when k = 1 (prob 1/2), else 0: P(|A_1| > 0.4) = 1/2
    assert exact_advantage_tail_bernoulli(R=2, eps=0.4, p=sp.Rational(1, 2)) == sp.Rational(1, 2)
    # rloo doubles the values to +-1: P(|A_1| > 0.6) = 1/2 as well, P(|A_1| > 1) = 0
    assert exact_advantage_tail_bernoulli(R=2, eps=1, p=sp.Rational(1, 2), estimator="rloo") == 0
    t = bound_table("hoeffding", R_values=[2], eps_values=[0.5])
    assert t.values.ravel().tolist() == pytest.approx([2 / math.e], rel=1e-15)


# --- large R, symbolic input and extreme values --------------------------------------------------
def test_bound_table_rejects_non_integer_R() -> None:
    with pytest.raises(TypeError, match="R"):
        gt.bound_table("hoeffding", R_values=[2.5], eps_values=[0.1])


def test_sup_baseline_tail_large_R_no_overflow() -> None:
    sup, p_star = gt.sup_baseline_tail_bernoulli(R=1100, eps=0.3)
    assert 0.0 < sup < 1e-80 and 0.0 < p_star < 1.0
    assert sup <= 2 * math.exp(-2 * 1100 * 0.3**2)  # Hoeffding holds
    assert gt.sup_baseline_tail_bernoulli(R=10_000, eps=0.3)[0] == 0.0  # below the float range
    with pytest.raises(ValueError, match="SUP_R_MAX.*hoeffding_bound"):
        gt.sup_baseline_tail_bernoulli(R=10**6, eps=0.3)


@pytest.mark.parametrize("R", [20, 41, 64])
@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3, 0.49])
def test_sup_tail_vectorised_path_equals_exact_path(R: int, eps: float) -> None:
    from fractions import Fraction

    from grpo_theory.bounds import _sup_tail_vectorised

    v, p = gt.sup_baseline_tail_bernoulli(R=R, eps=eps)  # exact rational path (R <= 64)
    vv, pv = _sup_tail_vectorised(R, Fraction(repr(eps)))
    assert vv == pytest.approx(v, rel=1e-12) and pv == pytest.approx(p, abs=1e-12)


def test_sup_tail_far_below_one_is_not_reported_as_zero() -> None:
    # R = 64, eps = 0.49: the supremum is ~1e-15 (a one-sided limit at p = 53/64 - 0.49); the
    # exact path compared with an absolute 1e-15 step and returned 0.0
    v, p = gt.sup_baseline_tail_bernoulli(R=64, eps=0.49)
    assert 1e-16 < v < 1e-14 and p == pytest.approx(53 / 64 - 0.49)
    near = gt.exact_baseline_tail_bernoulli(R=64, eps=0.49, p=p - 1e-12)  # the limiting side
    assert near == pytest.approx(v, rel=1e-6)


def test_symbolic_p_in_baseline_tail_is_a_message() -> None:
    with pytest.raises(TypeError, match="p and eps must be numbers, got p=p"):
        gt.exact_baseline_tail_bernoulli(R=4, eps=0.1, p=sp.Symbol("p"))


@pytest.mark.parametrize(
    "fn,kw,expected",
    [
        ("chebyshev_bound", dict(R=1, eps=1e-320, sigma2=0.25), 0.0),  # (R-1) = 0: no 0 * inf
        ("chebyshev_bound", dict(R=2, eps=1e-320, sigma2=0.25), float("inf")),  # vacuous
        ("chebyshev_bound", dict(R=2, eps=1e-160, sigma2=1e-320), 0.5 * 1e-320 / 1e-160 / 1e-160),
        ("hoeffding_bound", dict(R=10**300, eps=1e200, width=1.0), 0.0),
        ("hoeffding_bound", dict(R=1, eps=1e-320, width=1e-320), 2.0 * math.exp(-2.0)),
        ("bernstein_bound", dict(R=2, eps=1e-320, sigma2=0.0, width=1.0), 2.0),
        ("bernstein_bound", dict(R=2, eps=1e300, sigma2=0.25, width=1e-300), 0.0),
    ],
)
def test_bounds_at_extreme_inputs_are_the_limit_values_without_nan_or_warning(
    fn: str, kw: dict[str, Any], expected: float
) -> None:
    import grpo_theory

    assert getattr(grpo_theory, fn)(**kw) == pytest.approx(expected, rel=1e-12)
