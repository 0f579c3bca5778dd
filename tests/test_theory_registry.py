"""The estimator registry: every registered estimator satisfies the registry's contract.

Adding an estimator (one ``register_estimator`` call) is checked here automatically: float form on
NumPy and torch, shape ``[P, R]``; stated options equal the function's keyword defaults; unknown
options are rejected by name; the exact form (if declared) equals the float form on every binary
group; the estimator is linear iff it declares linear weights, and those weights reproduce it.
"""

from __future__ import annotations

import inspect
from fractions import Fraction

import numpy as np
import pytest

import grpo_theory
from grpo_theory import (
    ESTIMATORS,
    EXACT_ESTIMATORS,
    LINEAR_ESTIMATORS,
    EstimatorSpec,
    compute_advantages,
    estimator_names,
    estimator_spec,
    get_estimator,
    register_estimator,
)
from grpo_theory.bernoulli import advantage_value_table, advantage_values
from grpo_theory.registry import check_options

NAMES = estimator_names()


def _rewards(R: int, seed: int = 0, P: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = rng.random((P, R))
    r[0] = 1.0  # a zero-variance group
    r[1, : R // 2] = 0.0  # a binary-ish group
    return r


def _option_sets(name: str) -> list[dict]:
    spec = estimator_spec(name)
    return [{}, dict(spec.check_options)]


def test_registry_lists_the_builtin_estimators_in_order() -> None:
    assert NAMES[:8] == (
        "grpo", "grpo_std", "dr_grpo", "rloo", "reinforce", "asym_grpo", "power_alpha", "fade",
    )
    assert list(ESTIMATORS) == list(NAMES)
    assert set(EXACT_ESTIMATORS) <= set(NAMES)
    assert set(LINEAR_ESTIMATORS) == {n for n in NAMES if estimator_spec(n).linear is not None}
    assert {"grpo", "dr_grpo", "rloo", "reinforce"} <= set(LINEAR_ESTIMATORS)


@pytest.mark.parametrize("name", NAMES)
def test_float_form_numpy_and_torch_give_same_P_by_R_advantages(name: str) -> None:
    torch = pytest.importorskip("torch")
    R = max(4, estimator_spec(name).min_group_size)
    r = _rewards(R)
    for opts in _option_sets(name):
        a = compute_advantages(name, r, **opts)
        assert isinstance(a, np.ndarray) and a.shape == r.shape and np.all(np.isfinite(a))
        t = compute_advantages(name, torch.tensor(r, dtype=torch.float64), **opts)
        assert isinstance(t, torch.Tensor) and tuple(t.shape) == r.shape
        np.testing.assert_allclose(t.numpy(), a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_stated_options_are_the_functions_keyword_defaults(name: str) -> None:
    spec = estimator_spec(name)
    params = inspect.signature(spec.fn).parameters
    kw = {
        n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert kw == dict(spec.options)
    assert set(spec.check_options) <= set(spec.options)
    assert spec.source, "every estimator cites its source"
    assert get_estimator(name) is spec.fn is ESTIMATORS[name]


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_rejected_naming_it(name: str) -> None:
    r = _rewards(max(4, estimator_spec(name).min_group_size))
    with pytest.raises(ValueError, match="not_an_option"):
        compute_advantages(name, r, not_an_option=1.0)
    if estimator_spec(name).exact is not None:
        with pytest.raises(ValueError, match="not_an_option"):
            advantage_value_table(name, R=4, not_an_option=1.0)


@pytest.mark.parametrize("name", [n for n in NAMES if estimator_spec(n).exact is not None])
def test_exact_form_equals_float_form_on_every_binary_group(name: str) -> None:
    spec = estimator_spec(name)
    for opts in _option_sets(name):
        for R in sorted({max(2, spec.min_group_size), 3, 5}):
            for k in range(R + 1):
                ex = advantage_values(name, R=R, k=k, **opts)
                fl = advantage_values(name, R=R, k=k, exact=False, **opts)
                for e, f in zip(ex, fl, strict=True):
                    assert (e is None) == (f is None)
                    if e is not None:
                        assert float(e) == pytest.approx(f, rel=1e-12, abs=1e-12), (opts, R, k)


def _linear_fit(name: str, R: int, opts: dict) -> tuple[float, float, float, bool]:
    """Fit ``A_1 = a r_1 + b sum_{j != 1} r_j + c`` from basis rows; check it on random rows."""
    basis = np.zeros((3, R))
    basis[1, 0] = 1.0
    basis[2, 1] = 1.0
    A = np.asarray(compute_advantages(name, basis, **opts))[:, 0]
    c, a, b = A[0], A[1] - A[0], A[2] - A[0]
    x = np.random.default_rng(1).random((16, R))
    full = np.asarray(compute_advantages(name, x, **opts))
    ok = True
    for i in range(R):  # every rollout, by symmetry the same weights
        pred = a * x[:, i] + b * (x.sum(1) - x[:, i]) + c
        ok = ok and bool(np.allclose(pred, full[:, i], atol=1e-10, rtol=1e-10))
    return float(a), float(b), float(c), ok


@pytest.mark.parametrize("name", NAMES)
def test_estimator_is_linear_iff_it_declares_linear_weights(name: str) -> None:
    spec = estimator_spec(name)
    opts = dict(spec.check_options)
    R = max(4, spec.min_group_size)
    a, b, c, ok = _linear_fit(name, R, opts)
    assert ok == (spec.linear is not None)
    if spec.linear is not None:
        w = [float(v) for v in spec.linear(Fraction(R), **opts)]
        assert w == pytest.approx([a, b, c], abs=1e-12)


def test_register_estimator_adds_one_entry_to_every_view() -> None:
    def doubled(rewards, *, scale: float = 2.0):  # noqa: ANN001, ANN202
        return scale * grpo_theory.grpo_advantages(rewards)

    spec = EstimatorSpec(
        name="test_doubled_grpo",
        fn=doubled,
        options={"scale": 2.0},
        check_options={"scale": 3.0},
        linear=lambda R, *, scale=2.0: (scale * (1 - 1 / R), -scale / R, 0),
        source="test only",
    )
    register_estimator(spec)
    try:
        assert "test_doubled_grpo" in estimator_names()
        assert ESTIMATORS["test_doubled_grpo"] is doubled
        assert "test_doubled_grpo" in LINEAR_ESTIMATORS
        assert "test_doubled_grpo" not in EXACT_ESTIMATORS
        assert check_options("test_doubled_grpo") == {"scale": 3.0}
        # [[1, 0]]: grpo gives [1/2, -1/2]; scale 3 -> [3/2, -3/2]
        got = compute_advantages("test_doubled_grpo", [[1.0, 0.0]], scale=3.0).tolist()
        assert got == [[1.5, -1.5]]
        with pytest.raises(ValueError, match="already registered"):
            register_estimator(EstimatorSpec(name="test_doubled_grpo", fn=doubled))
    finally:
        from grpo_theory import registry

        del registry._REGISTRY["test_doubled_grpo"]


def test_bad_specs_and_unknown_names_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="check_options"):
        EstimatorSpec(name="x", fn=len, options={"a": 1}, check_options={"b": 2})
    with pytest.raises(ValueError, match="identifier"):
        EstimatorSpec(name="not a name", fn=len)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'.*grpo"):
        estimator_spec("nope")
    with pytest.raises(ValueError, match="no exact form"):
        register_estimator(EstimatorSpec(name="test_no_exact", fn=len, source="t"))
        try:
            advantage_value_table("test_no_exact", R=2)
        finally:
            from grpo_theory import registry

            del registry._REGISTRY["test_no_exact"]
