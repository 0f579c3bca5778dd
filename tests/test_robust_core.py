"""Issue 13, core library: no silent wrong result, no traceback (each test failed before)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest
import sympy as sp

import grpo_theory as gt

NAN, INF = float("nan"), float("inf")
CENTRED = ["grpo", "grpo_std", "dr_grpo", "rloo", "asym_grpo", "power_alpha", "fade"]
# grpo_std already detected constant groups by max == min; the others computed r - mean(r)
NOT_YET_EXACT = ["grpo", "dr_grpo", "rloo", "asym_grpo", "power_alpha", "fade"]


# --- binom_pmf -------------------------------------------------------------------------------
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


# --- constant groups -------------------------------------------------------------------------
@pytest.mark.parametrize("name", NOT_YET_EXACT)
@pytest.mark.parametrize("value", [0.1, 0.7])
def test_constant_group_gives_exact_zeros(name: str, value: float) -> None:
    A = np.asarray(gt.compute_advantages(name, [[value] * 3, [0.0, 1.0, 1.0]]))
    assert A[0].tolist() == [0.0, 0.0, 0.0]
    m = gt.spectral_metrics(np.eye(3), A[0])
    assert m.degenerate and m.rank == 0


@pytest.mark.parametrize("name", NOT_YET_EXACT)
def test_constant_group_gives_exact_zeros_in_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    A = gt.compute_advantages(name, torch.tensor([[0.1] * 3, [0.0, 1.0, 1.0]], dtype=torch.float64))
    assert A[0].tolist() == [0.0, 0.0, 0.0]


# --- options: range and type -------------------------------------------------------------------
R01 = [[0.0, 1.0, 1.0]]


@pytest.mark.parametrize(
    ("name", "opts", "match"),
    [
        ("grpo_std", {"eps": NAN}, "eps"),
        ("grpo_std", {"eps": INF}, "eps"),
        ("asym_grpo", {"delta": NAN}, "delta"),
        ("asym_grpo", {"delta": INF}, "delta"),
        ("asym_grpo", {"delta": 1e-320}, "delta"),
        ("power_alpha", {"alpha": NAN}, "alpha"),
        ("power_alpha", {"alpha": INF}, "alpha"),
        ("power_alpha", {"alpha": -1000.0}, "alpha"),
        ("fade", {"alpha": NAN}, "alpha"),
        ("fade", {"delta": NAN}, "delta"),
    ],
)
def test_non_finite_or_overflowing_options_are_errors(name: str, opts: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gt.compute_advantages(name, R01, **opts)


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"eps": "1e-4"}, "eps must be a real number"),
        ({"eps": np.array([1e-4, 1e-4])}, "eps must be a real number"),
        ({"ddof": "1"}, "ddof must be an integer"),
        ({"ddof": 1.5}, "ddof must be an integer"),
    ],
)
def test_option_type_errors_name_the_option(opts: dict, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        gt.compute_advantages("grpo_std", R01, **opts)


def test_get_estimator_type_error_names_the_argument() -> None:
    with pytest.raises(TypeError, match="estimator name must be a string"):
        gt.get_estimator([])  # type: ignore[arg-type]


def test_advantage_value_table_option_type_error_names_it() -> None:
    with pytest.raises(TypeError, match="delta"):
        gt.advantage_value_table("asym_grpo", R=4, delta=[0.5])


def test_aggregation_and_mass_options_must_be_finite() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        gt.aggregation_weights(np.array([[3, 4]]), mode="dr_grpo", max_tokens=NAN)
    with pytest.raises(ValueError, match="success_threshold"):
        gt.gradient_mass(np.array([[0.5, -0.5]]), np.array([[1.0, 0.0]]), success_threshold=NAN)


# --- huge finite rewards -------------------------------------------------------------------------
HUGE = np.array([[1.7e308, 1.7e308, 0.0], [-1.7e308, 1.7e308, 1.0]])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "grpo_std"])
def test_huge_finite_rewards_do_not_overflow(name: str) -> None:
    x = HUGE[:1] if name == "rloo" else HUGE  # rloo of row 2 is -2.55e308: not representable
    A = np.asarray(gt.compute_advantages(name, x))
    assert np.all(np.isfinite(A))
    small = np.asarray(gt.compute_advantages(name, x / 1e300))
    scale = 1.0 if name == "grpo_std" else 1e300  # grpo_std is scale-free
    np.testing.assert_allclose(A, small * scale, rtol=1e-12)


def test_unrepresentable_advantages_are_refused_not_inf() -> None:
    with pytest.raises(ValueError, match="rloo: the advantages overflow"):
        gt.compute_advantages("rloo", HUGE[1:])  # r_1 - (r_2 + r_3)/2 = -2.55e308


def test_huge_constant_group_is_zero() -> None:
    for name in ("grpo", "grpo_std", "rloo"):
        assert np.asarray(gt.compute_advantages(name, [[1.7e308, 1.7e308]])).tolist() == [[0, 0]]


def test_multiturn_huge_rewards_scaled_or_refused() -> None:
    x = np.array([[[1.7e308], [1.7e308], [0.0]]])
    A = np.asarray(gt.multiturn_advantages(x))
    np.testing.assert_allclose(A, np.asarray(gt.multiturn_advantages(x / 1e300)) * 1e300)
    two = np.array([[[1.7e308, 1.7e308], [0.0, 0.0]]])  # a return of 3.4e308, advantages +-1.7e308
    A2 = np.asarray(gt.multiturn_advantages(two))
    np.testing.assert_allclose(A2, np.asarray(gt.multiturn_advantages(two / 1e300)) * 1e300)
    with pytest.raises(ValueError, match="overflow"):  # A_1 = 3.4e308 - 1.13e308: not a float
        gt.multiturn_advantages(np.array([[[1.7e308, 1.7e308], [0.0, 0.0], [0.0, 0.0]]]))


# --- tables and large R --------------------------------------------------------------------------
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
    # was 18-35 s (sympy arithmetic per term); now the exact table (~3 s) plus O(R) NumPy
    t0 = time.perf_counter()
    m = gt.exact_advantage_moments("grpo", R=10_000, p=0.3)
    assert time.perf_counter() - t0 < 15.0
    assert m["var"] == pytest.approx(0.3 * 0.7 * (1 - 1e-4), rel=1e-9)


# --- torch dtypes and devices ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["asym_grpo", "fade"])
def test_bf16_input_gives_bf16_output(name: str) -> None:
    torch = pytest.importorskip("torch")
    x = torch.tensor([[0.0, 1.0, 1.0, 0.0]], dtype=torch.bfloat16)
    A = gt.compute_advantages(name, x, delta=0.5)
    assert A.dtype == torch.bfloat16
    ref = gt.compute_advantages(name, x.double(), delta=0.5)
    assert torch.allclose(A.double(), ref, atol=1e-2)


def test_meta_tensor_is_a_named_error() -> None:
    torch = pytest.importorskip("torch")
    for name in ("grpo", "asym_grpo"):
        with pytest.raises(ValueError, match="meta tensor"):
            gt.compute_advantages(name, torch.empty(2, 3, device="meta"))


# --- symbolic inputs ---------------------------------------------------------------------------
def test_symbolic_p_in_baseline_tail_is_a_message() -> None:
    with pytest.raises(TypeError, match="p and eps must be numbers, got p=p"):
        gt.exact_baseline_tail_bernoulli(R=4, eps=0.1, p=sp.Symbol("p"))


def test_symbolic_alpha_with_float_p_is_a_message() -> None:
    with pytest.raises(ValueError, match=r"\['alpha'\] are symbolic.*exact p"):
        gt.exact_advantage_moments("power_alpha", R=4, p=0.5, alpha=sp.Symbol("a"))
    # with an exact p the symbolic alpha is supported (closed form in a)
    m = gt.exact_advantage_moments("power_alpha", R=4, p=sp.Rational(1, 2), alpha=sp.Symbol("a"))
    assert m["mean"] == 0 and m["var"].free_symbols == {sp.Symbol("a")}


def test_paper_checks_grid_sup_tail_states_its_limit() -> None:
    from paper_checks._exact import sup_baseline_tail

    with pytest.raises(ValueError, match="R <= 2000.*sup_baseline_tail_bernoulli"):
        sup_baseline_tail(R=10_000, eps=0.3)


def test_complex_rewards_are_an_error_not_a_warning() -> None:
    with pytest.raises(TypeError, match="rewards must be real"):
        gt.compute_advantages("grpo", np.array([[1 + 1j, 0.0]]))


def test_isotropic_effective_rank_rejects_fractional_k() -> None:
    with pytest.raises(TypeError, match="k must be an integer"):
        gt.isotropic_effective_rank_binary(4, 1.5)


def test_pytest_turns_runtime_warnings_from_the_library_modules_into_errors() -> None:
    """pyproject's filterwarnings entry: a RuntimeWarning attributed to one of the library's
    modules fails the test; the same warning from another module does not."""
    import warnings

    code = "import numpy as np\ndef f():\n    return np.float64(1e308) * 10.0\n"
    for module in ("grpo_theory.advantages", "sims.checks", "real_model", "grpo_io.locks",
                   "paper_checks.report", "framework_checks.audit", "paper_values",
                   "grpo_audit.cli"):
        ns: dict[str, Any] = {"__name__": module}
        exec(compile(code, f"<{module}>", "exec"), ns)
        with pytest.raises(RuntimeWarning, match="overflow"):
            ns["f"]()
    ns = {"__name__": "somebody_else"}
    exec(compile(code, "<somebody_else>", "exec"), ns)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        warnings.filterwarnings(
            "error", category=RuntimeWarning,
            module="(grpo_io|paper_values|grpo_theory|sims|real_model|paper_checks|"
                   "framework_checks|grpo_audit)([.]|$)",
        )
        assert ns["f"]() == float("inf")
    assert [w.category for w in seen] == [RuntimeWarning]


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


def test_singular_values_beyond_the_float_range_are_refused_before_the_multiply() -> None:
    from grpo_theory import spectral_metrics

    with pytest.raises(ValueError, match="exceed the float range"):
        spectral_metrics(np.eye(3) * 1e308, [1e308, -1e308, 0.0])
    m = spectral_metrics(np.eye(3) * 1e300, [1e-300, -1e-300, 0.0])  # scale-free: fine
    assert m.effective_rank == pytest.approx(2.0)
