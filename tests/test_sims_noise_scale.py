"""``sims.noise_scale``: the noise-scale estimators against a toy world where ``tr(Sigma)`` and
``|mu|^2`` are known exactly (seeded, ``|estimate - exact| <= 4 SE``), and the world's exact
moments against brute-force enumeration."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from grpo_theory.diagnostics import noise_scale_parts, step_diagnostics
from sims._stats import Z_THRESHOLD
from sims.noise_scale import NoiseScaleWorld, check_noise_scale, default_world

K_SE = 4.0  # the stated threshold


def test_the_stated_threshold_is_the_packages() -> None:
    assert Z_THRESHOLD == K_SE


@pytest.mark.parametrize("n_groups", [2, 3, 8])
def test_each_part_is_unbiased_and_b_simple_consistent_within_4_se(n_groups: int) -> None:
    checks = check_noise_scale(default_world(), n_groups=n_groups, steps=20_000,
                               rng=np.random.default_rng(n_groups), k=K_SE)
    assert [c.k for c in checks] == [K_SE] * 3
    for c in checks:
        assert c.passed, (c.name, c.estimate, c.exact, c.se, c.z)
        assert abs(c.estimate - c.exact) <= K_SE * c.se
    # the exact SEs are the spread of the estimates (the sample SE agrees within 5 %)
    for c in checks[:2]:
        assert c.details["sample_se"] == pytest.approx(c.se, rel=0.05)


def test_the_same_check_refutes_the_naive_estimate_that_ignores_the_noise() -> None:
    # |G|^2 taken for |mu|^2 is biased by tr(Sigma) / n: the rule must see it
    from sims._stats import mean_se
    from sims.results import make_check

    w = default_world()
    _, T = w.sample_parts(4, 20_000, np.random.default_rng(1))
    est, se = mean_se(T)
    naive = make_check("naive |G|^2", estimate=est, exact=w.exact.mu_sq, se=se, n=T.size,
                       se_from="sample")
    assert not naive.passed and naive.z > K_SE
    assert est == pytest.approx(w.exact.mu_sq + w.exact.trace_sigma / 4, rel=0.02)


def test_the_toy_world_has_the_parts_of_a_grpo_step() -> None:
    ex = default_world().exact
    assert ex.mu_sq > 0 and ex.trace_sigma > 0
    assert 1.0 < ex.b_simple < 10.0  # a few prompts per step already see the signal
    assert ex.snr(8) == pytest.approx(8 / ex.b_simple)


def _tiny() -> NoiseScaleWorld:
    rng = np.random.default_rng(3)
    return NoiseScaleWorld(features=rng.normal(size=(2, 2, 3)), theta=np.array([0.3, -0.2, 0.5]),
                           rewards=np.array([[1.0, 0.0], [0.0, 1.0]]),
                           lengths=np.array([[1, 2], [3, 4]]), group_size=2)


def _support(w: NoiseScaleWorld) -> tuple[np.ndarray, np.ndarray]:
    """Every group's ``x_g`` and its probability, by explicit loops (no vectorisation)."""
    P, A, _ = w.features.shape
    xs, ps = [], []
    for p in range(P):
        for a in product(range(A), repeat=w.group_size):
            r = np.array([[w.rewards[p, i] for i in a]])
            adv = r - r.mean()  # grpo
            x = sum(adv[0, j] * w.scores[p, a[j]] for j in range(len(a))) / w.group_size
            xs.append(x)
            ps.append(np.prod([w.probs[p, i] for i in a]) / P)
    return np.array(xs), np.array(ps)


def test_exact_moments_equal_explicit_enumeration() -> None:
    w = _tiny()
    x, p = _support(w)
    mu = p @ x
    sigma = sum(pi * np.outer(xi - mu, xi - mu) for xi, pi in zip(x, p, strict=True))
    np.testing.assert_allclose(w.exact.mu, mu, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(w.exact.sigma, sigma, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n", [2, 3])
def test_exact_estimator_variances_equal_the_law_of_n_groups(n: int) -> None:
    w = _tiny()
    x, p = _support(w)
    vals, probs = [], []
    for idx in product(range(len(p)), repeat=n):
        xs = x[list(idx)]
        G = xs / n
        S, T = float((G * G).sum()), float((G.sum(axis=0) ** 2).sum())
        vals.append([float(v) for v in noise_scale_parts(S, T, num_groups=n)])
        probs.append(np.prod(p[list(idx)]))
    v, q = np.array(vals), np.array(probs)
    mean = q @ v
    cov = (q[:, None] * (v - mean)).T @ (v - mean)
    ex = w.exact
    assert mean == pytest.approx([ex.mu_sq, ex.trace_sigma], rel=1e-10)  # unbiased, exactly
    var_mu, var_tr, c = ex.estimator_moments(n)
    assert [var_mu, var_tr, c] == pytest.approx([cov[0, 0], cov[1, 1], cov[0, 1]], rel=1e-9)


def test_a_sampled_step_through_step_diagnostics_gives_the_same_parts() -> None:
    w = default_world()
    rows, L, r = w.sample_rows(6, np.random.default_rng(5))
    K = np.einsum("gid,gjd->gij", rows, rows)
    total = float(np.linalg.norm(rows.sum(axis=(0, 1))))
    d = step_diagnostics(K, tokens=L, rewards=r, total_grad_norm=total, rtol=0.0)
    S = float(((rows.sum(axis=1)) ** 2).sum())
    mu, tr = noise_scale_parts(S, total**2, num_groups=6)
    assert d["noise/mu_sq"] == pytest.approx(float(mu), rel=1e-12)
    assert d["noise/trace_sigma"] == pytest.approx(float(tr), rel=1e-12)
    # dead groups (all solved or none) are exactly the zero-row groups
    k = (r > 0.5).sum(axis=1)
    assert d["dead_groups/count"] == float(np.sum((k == 0) | (k == w.group_size)))


def test_a_bad_world_is_one_clear_line() -> None:
    w = _tiny()
    with pytest.raises(ValueError, match="lengths must be whole token counts >= 1"):
        NoiseScaleWorld(w.features, w.theta, w.rewards, np.zeros((2, 2)), 2)
    with pytest.raises(ValueError, match="group_size must be an int >= 2"):
        NoiseScaleWorld(w.features, w.theta, w.rewards, w.lengths, 1)
    with pytest.raises(ValueError, match="exceeds ENUMERATION_MAX"):
        NoiseScaleWorld(w.features, w.theta, w.rewards, w.lengths, 16)
    with pytest.raises(ValueError, match="steps must be >= 2"):
        check_noise_scale(w, n_groups=2, steps=1, rng=np.random.default_rng(0))
