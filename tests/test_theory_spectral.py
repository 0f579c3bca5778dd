"""Spectral metrics: properties (hypothesis) and closed forms vs an explicit SVD of sampled psi."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_theory as gt
from grpo_theory import (
    compute_advantages,
    effective_rank,
    entropy_effective_rank,
    gradient_gram,
    gram_clustered,
    gram_common_component,
    gram_isotropic,
    isotropic_effective_rank_binary,
    numerical_rank,
    singular_values_from_gram,
    spectral_metrics,
    spectral_metrics_from_matrix,
    stable_rank,
    top1_fraction,
)
from grpo_theory.spectral import PSD_RTOL, spectral_metrics_batch


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_metric_inequalities_hold(R: int, d: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    psi = rng.standard_normal((R, d))
    w = rng.standard_normal(R)
    m = spectral_metrics(psi @ psi.T, w)
    assert m.rank <= min(R, d)
    assert 1.0 - 1e-9 <= m.effective_rank <= m.rank + 1e-9
    assert 1.0 - 1e-9 <= m.entropy_effective_rank <= m.rank + 1e-9
    assert (
        1.0 - 1e-9 <= m.stable_rank <= m.effective_rank + 1e-9
    )  # sum s^2/s1^2 <= (sum s)^2/sum s^2
    assert m.top1_fraction == pytest.approx(1.0 / m.stable_rank)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 8), st.integers(1, 30), st.integers(0, 2**32 - 1))
def test_gram_route_equals_explicit_svd(R: int, d: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    psi = rng.standard_normal((R, d))
    w = rng.standard_normal(R)
    a = spectral_metrics(psi @ psi.T, w)
    b = spectral_metrics_from_matrix(w[:, None] * psi)
    np.testing.assert_allclose(
        a.singular_values[: min(R, d)], b.singular_values[: min(R, d)], atol=1e-9
    )
    assert a.rank == b.rank
    assert a.effective_rank == pytest.approx(b.effective_rank, rel=1e-9)


def test_zero_sum_weights_leave_rank_of_weighted_scores_at_count_of_nonzero_weights() -> None:
    # psi_i = c + xi_i: zero-sum weights cancel the common direction c only in the SUM of the
    # rows w_i psi_i, not in the matrix diag(w) Psi, whose rank is the number of nonzero w_i: R
    # for a mixed binary GRPO group (all weights nonzero), i.e. NOT capped at R - 1.
    rng = np.random.default_rng(0)
    R, d = 8, 50
    psi = rng.standard_normal((1, d)) * 5 + rng.standard_normal((R, d))
    rewards = np.array([[1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    w = np.asarray(compute_advantages("grpo", rewards))[0]  # 5/8 (x3), -3/8 (x5)
    assert w.sum() == pytest.approx(0.0, abs=1e-15) and np.count_nonzero(w) == R
    assert spectral_metrics_from_matrix(w[:, None] * psi).rank == R
    w0 = np.r_[1.0, -1.0, np.zeros(R - 2)]  # zero-sum with two nonzero weights: rank 2
    assert spectral_metrics_from_matrix(w0[:, None] * psi).rank == 2


@pytest.mark.parametrize("R", [2, 4, 8, pytest.param(16, marks=pytest.mark.slow)])
def test_isotropic_closed_form_vs_sampled_high_dimensional_psi(R: int) -> None:
    rng = np.random.default_rng(R)
    d = 5_000  # worst relative error over 20 seeds x all (R, k) was 0.011 R; tolerance 0.05 R
    psi = rng.standard_normal((R, d)) / np.sqrt(d)
    for k in range(1, R):
        rewards = np.array([[1.0] * k + [0.0] * (R - k)])
        w = np.asarray(compute_advantages("grpo", rewards))[0]
        sampled = spectral_metrics_from_matrix(w[:, None] * psi).effective_rank
        closed = isotropic_effective_rank_binary(R, k)
        via_gram = spectral_metrics(gram_isotropic(R), w).effective_rank
        assert via_gram == pytest.approx(closed, rel=1e-12)
        # finite-d error of K = psi psi^T is O(1/sqrt(d))
        assert sampled == pytest.approx(closed, abs=0.05 * R)


def test_clustered_by_label_gram_has_rank_two_when_noise_free() -> None:
    labels = np.array([1, 1, 0, 0, 0, 1])
    K = gram_clustered(labels, within=1.0, between=0.3, noise=0.0)
    w = np.asarray(compute_advantages("grpo", labels[None, :].astype(float)))[0]
    m = spectral_metrics(K, w)
    assert m.rank <= 2
    # explicit construction: two centres with <mu1, mu0> = 0.3
    mu1 = np.array([1.0, 0.0])
    mu0 = np.array([0.3, np.sqrt(1 - 0.09)])
    psi = np.where(labels[:, None] == 1, mu1, mu0)
    np.testing.assert_allclose(K, psi @ psi.T, atol=1e-12)
    assert m.effective_rank == pytest.approx(
        spectral_metrics_from_matrix(w[:, None] * psi).effective_rank
    )


def test_common_component_gram_matches_sampled() -> None:
    rng = np.random.default_rng(3)
    R, d, s = 6, 40_000, 4.0
    c = rng.standard_normal(d)
    c /= np.linalg.norm(c)
    psi = np.sqrt(s) * c + rng.standard_normal((R, d)) / np.sqrt(d)
    np.testing.assert_allclose(psi @ psi.T, gram_common_component(R, strength=s), atol=0.05)


def test_degenerate_zero_weights_flagged() -> None:
    m = spectral_metrics(np.eye(3), [0.0, 0.0, 0.0])
    assert m.degenerate and m.rank == 0 and np.isnan(m.effective_rank)
    assert effective_rank([0.0]) != effective_rank([0.0])  # NaN, documented


def test_spectral_bad_input() -> None:
    with pytest.raises(ValueError, match="square"):
        gradient_gram(np.ones((2, 3)), [1.0, 1.0])
    with pytest.raises(ValueError, match="weights must be shaped"):
        gradient_gram(np.eye(3), [1.0, 1.0])
    with pytest.raises(ValueError, match="NaN or inf"):
        spectral_metrics(np.eye(2), [np.nan, 1.0])


# --- tiny exact cases (rlax style): fixed input, hand-checked output ---------------------------
def test_gradient_gram_tiny_exact_case() -> None:
    from grpo_theory import gradient_gram

    # w_i K_ij w_j with K = [[1, 1/2], [1/2, 1]], w = [2, -1]: [[4, -1], [-1, 1]]
    assert gradient_gram([[1.0, 0.5], [0.5, 1.0]], [2.0, -1.0]).tolist() == [[4.0, -1.0],
                                                                            [-1.0, 1.0]]


def test_singular_values_from_gram_and_numerical_rank_tiny_exact_case() -> None:
    from grpo_theory import numerical_rank, singular_values_from_gram

    # diag(4, 1) -> singular values sqrt: [2, 1]; [[1, 1], [1, 1]] has eigenvalues 2, 0
    assert singular_values_from_gram([[4.0, 0.0], [0.0, 1.0]]).tolist() == [2.0, 1.0]
    np.testing.assert_allclose(singular_values_from_gram([[1.0, 1.0], [1.0, 1.0]]),
                               [2**0.5, 0.0], atol=1e-15)
    # rank counts s > 1e-6 * s_max: [2, 1, 1e-9] -> 2; all zero -> 0
    assert numerical_rank([2.0, 1.0, 1e-9]) == 2
    assert numerical_rank([0.0, 0.0]) == 0


def test_rank_metrics_tiny_exact_case() -> None:
    from grpo_theory import effective_rank, entropy_effective_rank, stable_rank, top1_fraction

    s = [2.0, 1.0, 1.0]  # sum 4, sum of squares 6, max 2
    assert effective_rank(s) == pytest.approx(16 / 6, rel=1e-15)  # 4^2 / 6 = 8/3
    assert stable_rank(s) == 1.5  # 6 / 2^2
    assert top1_fraction(s) == pytest.approx(4 / 6, rel=1e-15)  # 2^2 / 6 = 2/3
    # p = [1/2, 1/4, 1/4]: H = (1/2) ln 2 + 2 (1/4) ln 4 = (3/2) ln 2 -> exp(H) = 2^(3/2)
    assert entropy_effective_rank(s) == pytest.approx(2**1.5, rel=1e-14)


def test_spectral_metrics_tiny_exact_cases() -> None:
    from grpo_theory import spectral_metrics, spectral_metrics_from_matrix

    # K = diag(1, 4), w = [1, 1]: G G^T = diag(1, 4), s = [2, 1]: rank 2,
    # effective rank 3^2 / 5 = 9/5, top-1 4/5
    m = spectral_metrics(np.diag([1.0, 4.0]), [1.0, 1.0])
    assert m.singular_values == (2.0, 1.0) and m.rank == 2
    assert m.effective_rank == pytest.approx(9 / 5) and m.top1_fraction == pytest.approx(4 / 5)
    # G = [[3, 0, 0], [0, 4, 0]]: s = [4, 3]: effective rank 49/25, top-1 16/25
    g = spectral_metrics_from_matrix([[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    np.testing.assert_allclose(g.singular_values, [4.0, 3.0], rtol=1e-14)
    assert g.effective_rank == pytest.approx(49 / 25) and g.top1_fraction == pytest.approx(16 / 25)


def test_reference_grams_tiny_exact_cases() -> None:
    from grpo_theory import (
        gram_clustered,
        gram_common_component,
        gram_isotropic,
        isotropic_effective_rank_binary,
    )

    assert gram_isotropic(2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    # labels [1, 0, 1]: same label -> within 2, different -> between 1/2, plus noise 1 on diagonal
    assert gram_clustered([1, 0, 1], within=2.0, between=0.5, noise=1.0).tolist() == [
        [3.0, 0.5, 2.0], [0.5, 3.0, 0.5], [2.0, 0.5, 3.0],
    ]
    # strength 3: 3 * ones + I
    assert gram_common_component(2, strength=3.0).tolist() == [[4.0, 3.0], [3.0, 4.0]]
    # 4 k (R - k) / R with R = 4, k = 1: 4 * 1 * 3 / 4 = 3
    assert isotropic_effective_rank_binary(4, 1) == 3.0


# --- bad input and extreme scales ----------------------------------------------------------------
def test_isotropic_effective_rank_rejects_fractional_k() -> None:
    with pytest.raises(TypeError, match="k must be an integer"):
        gt.isotropic_effective_rank_binary(4, 1.5)


def test_singular_values_beyond_the_float_range_are_refused_before_the_multiply() -> None:
    from grpo_theory import spectral_metrics

    with pytest.raises(ValueError, match="exceed the float range"):
        spectral_metrics(np.eye(3) * 1e308, [1e308, -1e308, 0.0])
    m = spectral_metrics(np.eye(3) * 1e300, [1e-300, -1e-300, 0.0])  # scale-free: fine
    assert m.effective_rank == pytest.approx(2.0)


def test_singular_values_in_range_are_finite_when_the_scale_factors_are_not() -> None:
    """Scores of norms 1 and 1e50 (K = diag(1, 1e100)), weights 1e300 and 1e250: G = diag(1e300,
    1e300) up to rotation, both singular values 1e300, though max|w| sqrt(max|K|) = 1e350."""
    from grpo_theory import spectral_metrics, spectral_metrics_batch

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        m = spectral_metrics(np.diag([1.0, 1e100]), [1e300, 1e250])
        b = spectral_metrics_batch(np.diag([1.0, 1e100])[None], [[1e300, 1e250]])[0]
    assert m.singular_values == pytest.approx((1e300, 1e300), rel=1e-12)
    assert (m.rank, m.stable_rank) == (2, pytest.approx(2.0))
    assert b == m


# --- bad input is an error; the metrics are scale-free -------------------------------------------
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


# --- batched metrics: spectral_metrics_batch is spectral_metrics group by group ---------------
def _same_metrics(a: gt.SpectralMetrics, b: gt.SpectralMetrics) -> bool:
    """Every field equal (NaN equal to NaN), same types."""
    da, db = a.as_dict(), b.as_dict()
    return da.keys() == db.keys() and all(
        type(da[k]) is type(db[k])
        and (da[k] == db[k] or (isinstance(da[k], float) and da[k] != da[k] and db[k] != db[k]))
        for k in da
    )


def _mixed_groups(R: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Seeded groups of size R: full-rank and rank-deficient Grams, an all-zero K, all-zero
    weights, weights with zeros, wide scales, mixed-sign weights."""
    Ks, ws = [], []
    for d in (R + 2, max(R // 2, 1), 1, R + 2, R + 2, R + 2, R + 2):
        psi = rng.standard_normal((R, d)) * rng.uniform(0.1, 3.0, (R, 1))
        Ks.append(psi @ psi.T)
        ws.append(rng.standard_normal(R))  # mixed sign
    Ks[3] = np.zeros((R, R))  # all-zero K
    ws[4] = np.zeros(R)  # all-zero weights
    ws[5][: R // 2] = 0.0  # some rows without a gradient
    Ks[6], ws[6] = Ks[6] * 1e250, ws[6] * 1e-200  # far from order 1 (scale-free)
    return np.stack(Ks), np.stack(ws)


@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_batched_metrics_equal_the_single_metrics_field_by_field(R: int) -> None:
    K, w = _mixed_groups(R, np.random.default_rng(R))
    batch = spectral_metrics_batch(K, w)
    single = [spectral_metrics(K[g], w[g]) for g in range(K.shape[0])]
    assert len(batch) == len(single) == K.shape[0]
    for g, (a, b) in enumerate(zip(batch, single, strict=True)):
        assert _same_metrics(a, b), (g, a, b)
    assert batch[3].degenerate and batch[4].degenerate and not batch[0].degenerate
    if R > 1:
        assert batch[2].rank == 1  # d = 1: rank-deficient Gram


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_batched_metrics_equal_the_single_metrics_for_random_groups(
    R: int, G: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    psi = rng.standard_normal((G, R, int(rng.integers(1, R + 3))))
    K = psi @ np.swapaxes(psi, 1, 2)
    w = rng.standard_normal((G, R)) * (rng.random((G, R)) < 0.8)  # some weights zero
    batch = spectral_metrics_batch(K, w, rtol=1e-8)
    assert len(batch) == G
    for g in range(G):
        assert _same_metrics(batch[g], spectral_metrics(K[g], w[g], rtol=1e-8))


def test_batched_metrics_of_no_groups_are_an_empty_list() -> None:
    assert spectral_metrics_batch(np.zeros((0, 3, 3)), np.zeros((0, 3))) == []


def test_batched_asymmetric_gram_error_names_the_group() -> None:
    K = np.stack([np.eye(3)] * 3)
    K[1, 0, 1] = 0.5
    with pytest.raises(ValueError, match=r"K\[1\] must be symmetric: \|K\[1\]\[0,1\] - "
                                         r"K\[1\]\[1,0\]\| = 0.5"):
        spectral_metrics_batch(K, np.ones((3, 3)))


def test_batched_negative_eigenvalue_error_names_the_group() -> None:
    K = np.stack([np.eye(4), np.diag([-1.0, 1.0, 1.0, 1.0])])
    with pytest.raises(ValueError, match=r"K\[1\] is not positive semi-definite: eigenvalue -1"):
        spectral_metrics_batch(K, np.ones((2, 4)))


def test_batched_bad_shapes_and_values_are_named_errors() -> None:
    batch = spectral_metrics_batch
    with pytest.raises(ValueError, match=r"K must be a stack of G square R x R matrices"):
        batch(np.eye(3), np.ones(3))
    with pytest.raises(ValueError, match=r"K must be a stack .* got shape \(2, 2, 3\)"):
        batch(np.ones((2, 2, 3)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"weights must be shaped \[G, R\]=\[2, 2\], got shape"):
        batch(np.stack([np.eye(2)] * 2), np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"K\[1\] contains NaN or inf"):
        batch(np.stack([np.eye(2), np.full((2, 2), np.nan)]), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"weights\[1\] contains NaN or inf"):
        batch(np.stack([np.eye(2)] * 2), [[1.0, 1.0], [1.0, np.inf]])
    with pytest.raises(TypeError, match="weights must be real"):
        batch(np.stack([np.eye(2)] * 2), np.ones((2, 2)) * 1j)
    with pytest.raises(ValueError, match=r"diag\(weights\[1\]\) Psi\[1\] exceed the float range"):
        batch(np.stack([np.eye(3), np.eye(3) * 1e308]), [[1.0, 1.0, 1.0], [1e308, -1e308, 0.0]])
