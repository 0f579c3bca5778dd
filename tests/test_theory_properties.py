"""Hypothesis property tests of the estimators, plus bad-input and zero-variance rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from grpo_theory import ESTIMATORS, compute_advantages, grpo_std_advantages, zero_variance_groups

SETTINGS = settings(max_examples=40, deadline=None)


def reward_matrices(min_R: int = 2, unit: bool = False) -> st.SearchStrategy[np.ndarray]:
    lo, hi = (0.0, 1.0) if unit else (-10.0, 10.0)
    shapes = st.tuples(st.integers(1, 4), st.integers(min_R, 8))
    # rewards are O(1) numbers: no subnormals / 1e-300 spreads (those only test float rounding)
    elems = st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=64).filter(
        lambda x: x == 0.0 or abs(x) > 1e-6
    )
    return shapes.flatmap(lambda s: arrays(np.float64, s, elements=elems))


def binary_matrices() -> st.SearchStrategy[np.ndarray]:
    shapes = st.tuples(st.integers(1, 4), st.integers(2, 8))
    return shapes.flatmap(lambda s: arrays(np.float64, s, elements=st.sampled_from([0.0, 1.0])))


ZERO_SUM = [
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("grpo_std", {}),
    ("grpo_std", {"eps": 1e-4}),
    ("grpo_std", {"std_scope": "batch"}),
]


@SETTINGS
@given(reward_matrices())
def test_zero_sum_estimators_rows_sum_to_zero(r: np.ndarray) -> None:
    for name, opts in ZERO_SUM:
        a = np.asarray(compute_advantages(name, r, **opts))
        scale = 1.0 + np.abs(a).sum(axis=1)
        assert np.all(np.abs(a.sum(axis=1)) <= 1e-9 * scale), name


@SETTINGS
@given(binary_matrices())
def test_fade_family_zero_sum_only_at_delta_one(r: np.ndarray) -> None:
    mixed = r.max(axis=1) > r.min(axis=1)
    p1 = np.asarray(compute_advantages("power_alpha", r, alpha=2.0)).sum(axis=1)
    assert np.allclose(p1, 0.0, atol=1e-12)
    a = np.asarray(compute_advantages("asym_grpo", r, delta=0.5)).sum(axis=1)
    # each mixed group: m_S - m_F = m_S - 2 m_S = -m_S < 0, i.e. NOT zero-sum
    assert np.all(a[mixed] < -1e-12)
    assert np.allclose(a[~mixed], 0.0)


def test_reinforce_is_not_zero_sum() -> None:
    a = np.asarray(compute_advantages("reinforce", [[1.0, 0.0, 1.0]]))
    assert a.sum() == 2.0


@SETTINGS
@given(reward_matrices(), st.floats(-5, 5, allow_nan=False))
def test_centred_estimators_shift_invariant(r: np.ndarray, c: float) -> None:
    for name, opts in ZERO_SUM:
        a = np.asarray(compute_advantages(name, r, **opts))
        b = np.asarray(compute_advantages(name, r + c, **opts))
        if name == "grpo_std":  # skip groups whose spread is lost to rounding in r + c
            spread = r.max(axis=1) - r.min(axis=1)
            ok = spread > 1e-6 * (1.0 + np.abs(r).max(axis=1) + abs(c))
            a, b = a[ok], b[ok]
        np.testing.assert_allclose(a, b, atol=1e-6 * (1 + np.abs(a).max(initial=0)))


@SETTINGS
@given(reward_matrices(min_R=3), st.floats(0.01, 100.0))
def test_grpo_std_scale_invariant_and_unit_norm(r: np.ndarray, c: float) -> None:
    a = np.asarray(grpo_std_advantages(r))
    b = np.asarray(grpo_std_advantages(r * c))
    ok = ~zero_variance_groups(r)
    spread = r.max(axis=1) - r.min(axis=1)
    ok &= spread > 1e-6 * (1 + np.abs(r).max(axis=1))  # avoid catastrophic cancellation
    np.testing.assert_allclose(a[ok], b[ok], rtol=1e-6, atol=1e-8)
    R = r.shape[1]
    np.testing.assert_allclose((a[ok] ** 2).sum(axis=1), R - 1, rtol=1e-6)


@SETTINGS
@given(reward_matrices(unit=True), st.randoms(use_true_random=False))
def test_all_estimators_permutation_equivariant(r: np.ndarray, rnd) -> None:  # noqa: ANN001
    perm = list(range(r.shape[1]))
    rnd.shuffle(perm)
    opts = {
        "asym_grpo": {"delta": 0.5},
        "power_alpha": {"alpha": 2.0},
        "fade": {"alpha": 2.0, "delta": 0.4},
    }
    for name in ESTIMATORS:
        a = np.asarray(compute_advantages(name, r, **opts.get(name, {})))
        b = np.asarray(compute_advantages(name, r[:, perm], **opts.get(name, {})))
        np.testing.assert_allclose(a[:, perm], b, atol=1e-12)


@SETTINGS
@given(reward_matrices(unit=True))
def test_numpy_and_torch_agree(r: np.ndarray) -> None:
    opts = {
        "asym_grpo": {"delta": 0.5},
        "power_alpha": {"alpha": 2.5},
        "fade": {"alpha": 2.0, "delta": 0.4},
        "grpo_std": {"eps": 1e-4},
    }
    t = torch.tensor(r, dtype=torch.float64)
    for name in ESTIMATORS:
        a = np.asarray(compute_advantages(name, r, **opts.get(name, {})))
        b = compute_advantages(name, t, **opts.get(name, {}))
        assert isinstance(b, torch.Tensor) and b.dtype == torch.float64
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-12)


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["grpo", "dr_grpo", "rloo", "grpo_std", "asym_grpo", "power_alpha", "fade"]
)
def test_group_size_one_raises_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match="group_size >= 2"):
        compute_advantages(name, [[1.0], [0.0]])


def test_reinforce_accepts_group_size_one() -> None:
    assert np.asarray(compute_advantages("reinforce", [[1.0], [0.0]])).tolist() == [[1.0], [0.0]]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_non_finite_rewards_raise(bad: float, backend: str) -> None:
    r = np.array([[1.0, 0.0, bad]])
    x = torch.tensor(r) if backend == "torch" else r
    for name in ESTIMATORS:
        with pytest.raises(ValueError, match="non-finite"):
            compute_advantages(name, x)


@pytest.mark.parametrize("shape", [(4,), (2, 3, 1), (0, 3), (2, 0)])
def test_wrong_shapes_raise(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="2-D|empty axis"):
        compute_advantages("grpo", np.zeros(shape))


def test_unknown_estimator_and_bad_options_raise() -> None:
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("ppo", [[1.0, 0.0]])
    with pytest.raises(ValueError, match="delta must be > 0"):
        compute_advantages("asym_grpo", [[1.0, 0.0]], delta=0.0)
    with pytest.raises(ValueError, match="rewards in \\[0, 1\\]"):
        compute_advantages("power_alpha", [[2.0, 0.0]])
    with pytest.raises(ValueError, match="std_scope"):
        compute_advantages("grpo_std", [[1.0, 0.0]], std_scope="global")


def test_zero_variance_group_rule_zero_and_raise() -> None:
    r = np.array([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]])
    a = np.asarray(grpo_std_advantages(r))  # documented default: on_zero_std="zero"
    assert a[0].tolist() == [0.0, 0.0, 0.0]
    assert np.all(np.isfinite(a))
    with pytest.raises(ValueError, match=r"zero-variance group\(s\) \[0\]"):
        grpo_std_advantages(r, on_zero_std="raise")
    # with eps > 0 the formula itself gives 0/(0+eps) = 0, so "raise" does not trigger
    b = np.asarray(grpo_std_advantages(r, eps=1e-4, on_zero_std="raise"))
    assert b[0].tolist() == [0.0, 0.0, 0.0]
    tz = grpo_std_advantages(torch.tensor(r))
    assert tz[0].tolist() == [0.0, 0.0, 0.0]
