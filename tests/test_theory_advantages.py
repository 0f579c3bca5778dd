"""Tiny exact cases of grpo_theory.advantages (rlax style): a fixed input, its hand-checked output.

Every expected value below is derived by hand in the comment beside it (not by calling the code).
Rewards used throughout: r = [[1, 0, 0, 1], [1, 0, 0, 0]] (mean 1/2 and 1/4), dyadic values so
that the floats are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import grpo_theory as gt
from grpo_theory import (
    asym_grpo_advantages,
    compute_advantages,
    dr_grpo_advantages,
    fade_advantages,
    fade_alpha_schedule,
    fade_delta_schedule,
    get_estimator,
    grpo_advantages,
    grpo_std_advantages,
    power_alpha_advantages,
    reinforce_advantages,
    rloo_advantages,
    zero_variance_groups,
)

R2 = [[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]


def test_grpo_tiny_exact_case() -> None:
    # row 1: mean 1/2 -> [1/2, -1/2, -1/2, 1/2]; row 2: mean 1/4 -> [3/4, -1/4, -1/4, -1/4]
    assert grpo_advantages(R2).tolist() == [[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]]


def test_dr_grpo_tiny_exact_case() -> None:
    # same centring as grpo (Dr.GRPO changes the aggregation only)
    assert dr_grpo_advantages(R2).tolist() == [[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]]


def test_rloo_tiny_exact_case() -> None:
    # A_i = r_i - (sum_{j!=i} r_j)/3. Row 2 (sum 1): success 1 - 0/3 = 1; failure 0 - 1/3 = -1/3.
    # Row [1, 0]: 1 - 0 = 1 and 0 - 1 = -1.
    a = rloo_advantages(R2)
    np.testing.assert_allclose(a[1], [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=0, atol=1e-15)
    # row 1 (sum 2): success 1 - 1/3 = 2/3, failure 0 - 2/3 = -2/3
    np.testing.assert_allclose(a[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=0, atol=1e-15)
    assert rloo_advantages([[1.0, 0.0]]).tolist() == [[1.0, -1.0]]


def test_grpo_std_tiny_exact_case() -> None:
    # row 2: centred [3/4, -1/4, -1/4, -1/4]; sum of squares 9/16 + 3/16 = 12/16 = 3/4.
    # ddof=1: var = (3/4)/3 = 1/4, std = 1/2 -> [3/2, -1/2, -1/2, -1/2].
    # ddof=0: var = (3/4)/4 = 3/16, std = sqrt(3)/4 -> 3/4 / (sqrt(3)/4) = sqrt(3) and -1/sqrt(3).
    assert grpo_std_advantages([R2[1]]).tolist() == [[1.5, -0.5, -0.5, -0.5]]
    s3 = 3**0.5
    np.testing.assert_allclose(
        grpo_std_advantages([R2[1]], ddof=0)[0], [s3, -1 / s3, -1 / s3, -1 / s3], rtol=1e-15
    )
    # eps = 1/2 added to std 1/2 -> divide by 1: the centred rewards
    assert grpo_std_advantages([R2[1]], eps=0.5).tolist() == [[0.75, -0.25, -0.25, -0.25]]
    # batch scope: all 8 rewards, 3 ones, mean 3/8; sum of squared deviations 3*(5/8)^2 +
    # 5*(3/8)^2 = 75/64 + 45/64 = 120/64 = 15/8; ddof=1: var = (15/8)/7 = 15/56.
    # row 1 advantages: (r - 1/2)/sqrt(15/56) (group-centred, batch std)
    got = grpo_std_advantages(R2, std_scope="batch")
    np.testing.assert_allclose(got[0], np.array([0.5, -0.5, -0.5, 0.5]) / (15 / 56) ** 0.5,
                               rtol=1e-14)


def test_reinforce_tiny_exact_case() -> None:
    # A_i = r_i - b: b = 0 -> the rewards; b = 1/4 -> [3/4, -1/4, -1/4, -1/4]
    assert reinforce_advantages([R2[1]]).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert reinforce_advantages([R2[1]], baseline=0.25).tolist() == [[0.75, -0.25, -0.25, -0.25]]


def test_asym_grpo_tiny_exact_case() -> None:
    # row 2 centred [3/4, -1/4, -1/4, -1/4]; delta = 1/2 divides the negatives: -1/4 / (1/2) = -1/2
    assert asym_grpo_advantages([R2[1]], delta=0.5).tolist() == [[0.75, -0.5, -0.5, -0.5]]


def test_power_alpha_tiny_exact_case() -> None:
    # row 2: mean 1/4, factor (1 - 1/4)^(alpha - 1); alpha = 2 -> 3/4:
    # [3/4 * 3/4, -1/4 * 3/4, ...] = [9/16, -3/16, -3/16, -3/16]
    assert power_alpha_advantages([R2[1]], alpha=2.0).tolist() == [
        [0.5625, -0.1875, -0.1875, -0.1875]
    ]
    # all-ones group: mean 1, c = 0 -> 0 for every alpha
    assert power_alpha_advantages([[1.0, 1.0]], alpha=3.0).tolist() == [[0.0, 0.0]]


def test_fade_tiny_exact_case() -> None:
    # power_alpha(2) row 2 = [9/16, -3/16, -3/16, -3/16]; delta = 1/2 doubles the negatives
    assert fade_advantages([R2[1]], alpha=2.0, delta=0.5).tolist() == [
        [0.5625, -0.375, -0.375, -0.375]
    ]


def test_fade_schedules_tiny_exact_cases() -> None:
    # alpha = clip(3 (1 - p) / (2 p), 1, 3): p = 1/4 -> 3 (3/4) / (1/2) = 4.5 -> 3;
    # p = 1/2 -> 3 (1/2) / 1 = 1.5; p = 3/4 -> 3 (1/4) / (3/2) = 0.5 -> 1; p = 0 -> 3
    assert fade_alpha_schedule([0.25, 0.5, 0.75, 0.0]).tolist() == [3.0, 1.5, 1.0, 3.0]
    # delta = clip(1 + H - H_target, 0.3, 1): H = 0.5, target 1 -> 0.5; H = 2 -> 2 -> 1;
    # H = 0, target 1 -> 0 -> 0.3
    assert fade_delta_schedule([0.5, 2.0, 0.0], target=1.0).tolist() == [0.5, 1.0, 0.3]


def test_zero_variance_groups_tiny_exact_case() -> None:
    # rows [1,1], [0,1], [0.5,0.5]: all-equal rows are 1 and 3
    assert zero_variance_groups([[1.0, 1.0], [0.0, 1.0], [0.5, 0.5]]).tolist() == [
        True, False, True,
    ]


def test_get_estimator_and_compute_advantages_tiny_exact_case() -> None:
    # compute_advantages("rloo", [[1, 0]]) = rloo_advantages: [[1 - 0, 0 - 1]] = [[1, -1]]
    assert get_estimator("rloo") is rloo_advantages
    assert compute_advantages("rloo", [[1.0, 0.0]]).tolist() == [[1.0, -1.0]]
    with pytest.raises(ValueError, match="delta_typo"):
        compute_advantages("asym_grpo", [[1.0, 0.0]], delta_typo=0.5)


# --- bad input, constant groups, extreme rewards, torch dtypes and devices -----------------------
NAN, INF = float("nan"), float("inf")
#: Estimators that subtract a group mean: a constant group must give exact zeros, not rounding.
MEAN_CENTRED = ["grpo", "dr_grpo", "rloo", "asym_grpo", "power_alpha", "fade"]
R01 = [[0.0, 1.0, 1.0]]
HUGE = np.array([[1.7e308, 1.7e308, 0.0], [-1.7e308, 1.7e308, 1.0]])


@pytest.mark.parametrize("name", MEAN_CENTRED)
@pytest.mark.parametrize("value", [0.1, 0.7])
def test_constant_group_gives_exact_zeros(name: str, value: float) -> None:
    A = np.asarray(gt.compute_advantages(name, [[value] * 3, [0.0, 1.0, 1.0]]))
    assert A[0].tolist() == [0.0, 0.0, 0.0]
    m = gt.spectral_metrics(np.eye(3), A[0])
    assert m.degenerate and m.rank == 0


@pytest.mark.parametrize("name", MEAN_CENTRED)
def test_constant_group_gives_exact_zeros_in_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    A = gt.compute_advantages(name, torch.tensor([[0.1] * 3, [0.0, 1.0, 1.0]], dtype=torch.float64))
    assert A[0].tolist() == [0.0, 0.0, 0.0]


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


def test_complex_rewards_are_an_error_not_a_warning() -> None:
    with pytest.raises(TypeError, match="rewards must be real"):
        gt.compute_advantages("grpo", np.array([[1 + 1j, 0.0]]))


def test_batch_std_raises_only_when_the_whole_batch_is_constant():
    # batch std of [1,1,0,1] (ddof=1) = 0.5; the constant group [1,1] has advantage 0 / 0.5 = 0.
    A = gt.grpo_std_advantages([[1.0, 1.0], [0.0, 1.0]], std_scope="batch", on_zero_std="raise")
    np.testing.assert_allclose(np.asarray(A), [[0.0, 0.0], [-1.0, 1.0]])
    with pytest.raises(ValueError, match="zero-variance"):
        gt.grpo_std_advantages([[1.0, 1.0], [1.0, 1.0]], std_scope="batch", on_zero_std="raise")
