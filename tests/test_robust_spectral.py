"""Issue 13: spectral metrics reject bad input and are scale-free (each test failed before)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_theory import (
    effective_rank,
    entropy_effective_rank,
    gram_clustered,
    gram_common_component,
    numerical_rank,
    singular_values_from_gram,
    spectral_metrics,
    spectral_metrics_from_matrix,
    stable_rank,
    top1_fraction,
)
from grpo_theory.spectral import PSD_RTOL

W4 = [0.5, 0.5, -0.5, -0.5]


def test_negative_definite_gram_is_an_error_naming_the_eigenvalue() -> None:
    with pytest.raises(ValueError, match=r"not positive semi-definite: eigenvalue -1"):
        spectral_metrics(-np.eye(4), W4)


def test_one_negative_eigenvalue_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"eigenvalue -1"):
        spectral_metrics(np.diag([-1.0, 1.0, 1.0, 1.0]), W4)
    with pytest.raises(ValueError, match=r"eigenvalue -1"):
        singular_values_from_gram(np.diag([-1.0, 1.0, 1.0, 1.0]))


def test_asymmetric_gram_is_an_error() -> None:
    K = np.eye(3)
    K[0, 1] = 0.5
    with pytest.raises(ValueError, match=r"K must be symmetric: \|K\[0,1\] - K\[1,0\]\| = 0.5"):
        spectral_metrics(K, [1.0, -1.0, 0.5])


def test_round_off_negative_eigenvalue_within_stated_tolerance_is_set_to_zero() -> None:
    # rank-1 Gram with a -1e-12 relative perturbation: documented round-off, clamped to 0
    v = np.array([1.0, 2.0, 3.0])
    K = np.outer(v, v) - 1e-12 * np.linalg.norm(v) ** 2 * np.eye(3)
    m = spectral_metrics(K, [1.0, 1.0, 1.0])
    assert m.rank == 1 and not m.degenerate
    assert PSD_RTOL == 1e-5
    # just past the tolerance: error
    K2 = np.outer(v, v) - 2 * PSD_RTOL * np.linalg.norm(v) ** 2 * np.eye(3)
    with pytest.raises(ValueError, match="not positive semi-definite"):
        spectral_metrics(K2, [1.0, 1.0, 1.0])


@pytest.mark.parametrize("scale", [1e-200])
def test_spectral_metrics_are_scale_free_in_the_weights(scale: float) -> None:
    ref = spectral_metrics(np.eye(4), W4)
    m = spectral_metrics(np.eye(4), np.asarray(W4) * scale)
    assert not m.degenerate
    assert (m.rank, m.effective_rank, m.top1_fraction) == (
        ref.rank,
        ref.effective_rank,
        ref.top1_fraction,
    )
    assert m.singular_values[0] == pytest.approx(0.5 * scale, rel=1e-12)


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_spectral_metrics_are_scale_free_in_K(scale: float) -> None:
    ref = spectral_metrics(np.eye(4), W4)
    m = spectral_metrics(scale * np.eye(4), W4)
    assert (m.rank, m.effective_rank, m.stable_rank) == (
        ref.rank,
        ref.effective_rank,
        ref.stable_rank,
    )
    g = spectral_metrics_from_matrix(scale * np.diag(W4))
    assert (g.rank, g.effective_rank) == (ref.rank, ref.effective_rank)


def test_metric_functions_are_scale_free() -> None:
    assert effective_rank([1e-200] * 2) == 2.0
    assert top1_fraction([1e200] * 2) == 0.5
    assert stable_rank([1e200] * 2) == 2.0
    assert entropy_effective_rank([1e-320, 1e-320]) == pytest.approx(2.0)
    assert numerical_rank([1e-300, 1e-300]) == 2


def test_negative_singular_values_are_an_error() -> None:
    for f in (effective_rank, entropy_effective_rank, stable_rank, top1_fraction, numerical_rank):
        with pytest.raises(ValueError, match="singular values must be >= 0, got -1.0"):
            f([-1.0, 1.0])


def test_complex_input_is_an_error_not_a_warning() -> None:
    with pytest.raises(TypeError, match="must be real"):
        effective_rank(np.array([1 + 1j, 1.0]))
    with pytest.raises(TypeError, match="K must be real"):
        spectral_metrics(np.eye(2) * (1 + 0j), [1.0, -1.0])
    with pytest.raises(TypeError, match="weights must be real"):
        spectral_metrics(np.eye(2), np.array([1j, 1.0]))
    with pytest.raises(TypeError, match="G must be real"):
        spectral_metrics_from_matrix(np.eye(2) * 1j)


@pytest.mark.parametrize("rtol", [float("nan"), 2.0, 1.0, -0.1, float("inf")])
def test_rank_tolerance_out_of_range_is_an_error(rtol: float) -> None:
    with pytest.raises(ValueError, match="rtol must satisfy 0 <= rtol < 1"):
        spectral_metrics(np.eye(4), W4, rtol=rtol)
    with pytest.raises(ValueError, match="rtol must satisfy"):
        numerical_rank([1.0, 1.0], rtol=rtol)
    with pytest.raises(ValueError, match="psd_rtol must satisfy"):
        spectral_metrics(np.eye(4), W4, psd_rtol=rtol)


def test_reference_gram_options_must_be_finite() -> None:
    with pytest.raises(ValueError, match="noise must be finite"):
        gram_clustered([0, 1], noise=float("nan"))
    with pytest.raises(ValueError, match="within must be finite"):
        gram_clustered([0, 1], within=float("inf"))
    with pytest.raises(ValueError, match="strength must be finite"):
        gram_common_component(3, strength=float("nan"))
    with pytest.raises(TypeError, match="R must be an integer"):
        gram_common_component(2.5, strength=1.0)  # type: ignore[arg-type]


def test_meta_tensor_gram_is_a_named_error() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="K is a meta tensor"):
        spectral_metrics(torch.empty(2, 2, device="meta"), [1.0, -1.0])
