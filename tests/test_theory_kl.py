"""grpo_theory.kl: hand-checked estimators and coefficients, the exact targets against finite
differences and the per-state route, the classification of every placement, and the statistical
tier: each estimator's expected gradient against a seeded Monte Carlo (|estimate - exact| <= 4 SE,
the SE from the exact law of the per-response projection)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_theory import kl

K_SE = 4.0  # the statistical tier's k (sims._stats.Z_THRESHOLD)
V, T = 2, 3
N_STATES = (V**T - 1) // (V - 1)


def _world(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    th = 0.8 * rng.standard_normal((N_STATES, V))
    ref = 0.8 * rng.standard_normal((N_STATES, V))
    lp = kl.tabular_token_log_probs(th, vocab=V, length=T)
    lq = kl.tabular_token_log_probs(ref, vocab=V, length=T)
    return {"th": th, "ref": ref, "lp": lp, "lq": lq,
            "S": kl.tabular_token_scores(th, vocab=V, length=T), "P": np.exp(lp.sum(1))}


# --- values and derivatives -----------------------------------------------------------------------
def test_estimators_hand_checked():
    lr = np.array([0.0, 1.0, -2.0])
    assert kl.kl_estimate(lr, estimator="k1").tolist() == [0.0, 1.0, -2.0]
    assert kl.kl_estimate(lr, estimator="k2").tolist() == [0.0, 0.5, 2.0]
    np.testing.assert_allclose(kl.kl_estimate(lr, estimator="k3"),
                               [0.0, math.exp(-1) - 1 + 1, math.exp(2) - 1 - 2], rtol=1e-15)
    assert kl.kl_estimate(lr, estimator="abs").tolist() == [0.0, 1.0, 2.0]
    np.testing.assert_allclose(kl.kl_estimate_derivative(lr, estimator="k3"),
                               1 - np.exp(-lr), rtol=1e-15)
    assert kl.kl_estimate_derivative(lr, estimator="k1").tolist() == [1.0, 1.0, 1.0]


@given(st.floats(-30, 30))
def test_k3_is_non_negative_and_its_derivative_is_dk_dlogpi(lr):
    assert kl.kl_estimate(lr, estimator="k3") >= 0
    h = 1e-6
    for est in ("k1", "k2", "k3"):
        fd = (kl.kl_estimate(lr + h, estimator=est) - kl.kl_estimate(lr - h, estimator=est)) / 2 / h
        assert abs(fd - kl.kl_estimate_derivative(lr, estimator=est)) <= 1e-5 * max(1, abs(fd))


def test_coefficients_hand_checked():
    lr = np.array([[0.5, -1.0]])
    k1 = dict(estimator="k1")
    assert kl.kl_coefficients(lr, placement="reward_to_go", **k1).tolist() == [[-0.5, -1.0]]
    assert kl.kl_coefficients(lr, placement="reward_sum", **k1).tolist() == [[-0.5, -0.5]]
    assert kl.kl_coefficients(lr, placement="loss", **k1).tolist() == [[1.0, 1.0]]
    assert kl.kl_coefficients(lr, placement="loss_k2_gradient", estimator="k3").tolist() == \
        [[0.5, -1.0]]
    # on-policy the token ratio turns k3 into k1 in the reward: k3' + k3 = lr
    np.testing.assert_allclose(
        kl.kl_coefficients(lr, estimator="k3", placement="loss_ratio_weighted"), lr, atol=1e-15)
    # sequence level: one coefficient on every token
    seq = kl.kl_coefficients(lr, estimator="k2", placement="loss", level="sequence")
    assert seq.tolist() == [[-0.5, -0.5]]
    # OpenRLHF's clip of the importance weight
    c = kl.kl_coefficients(lr, estimator="k1", placement="loss_is_k2",
                           log_ratio_old=np.log([[20.0, 0.5]]), weight_clip=10.0)
    np.testing.assert_allclose(c, [[10 * 0.5, 0.5 * -1.0]])
    # masked tokens are left out of every sum
    m = kl.kl_coefficients(lr, estimator="k1", placement="reward_sum", mask=[[1, 0]])
    assert m.tolist() == [[0.5, 0.0]]


@pytest.mark.parametrize("kwargs, match", [
    ({"estimator": "k4", "placement": "loss"}, "unknown KL estimator"),
    ({"estimator": "k1", "placement": "lose"}, "unknown KL placement"),
    ({"estimator": "k1", "placement": "reward_to_go", "level": "sequence"}, "no sequence-level"),
    ({"estimator": "k1", "placement": "loss", "importance": "both"}, "importance must be"),
    ({"estimator": "k1", "placement": "loss", "mask": [[1, 2]]}, "mask must be 0/1"),
])
def test_bad_options_name_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kl.kl_coefficients([[0.1, 0.2]], **kwargs)


def test_non_finite_inputs_and_bad_laws_are_refused():
    with pytest.raises(ValueError, match="NaN or inf"):
        kl.kl_coefficients([[np.nan]], estimator="k1", placement="loss")
    with pytest.raises(ValueError, match="sum to 1"):
        kl.expected_kl_gradient(np.ones((2, 1)), probs=[0.5, 0.4], scores=np.ones((2, 1, 3)))
    with pytest.raises(ValueError, match="scores must be shaped"):
        kl.expected_kl_gradient(np.ones((2, 1)), probs=[0.5, 0.5], scores=np.ones((2, 3)))


# --- the exact targets ----------------------------------------------------------------------------
def test_sequence_targets_equal_finite_differences_of_the_kls():
    w = _world(1)

    def kls(th):
        return np.array(kl.sequence_kl_values(kl.tabular_token_log_probs(th, vocab=V, length=T),
                                              w["lq"]))

    t = kl.kl_gradient_targets(w["lp"], w["lq"], w["S"])
    fd = np.zeros((2, w["th"].size))
    for i in range(w["th"].size):
        e = np.zeros(w["th"].size)
        e[i] = 1e-6
        fd[:, i] = (kls(w["th"] + e.reshape(w["th"].shape))
                    - kls(w["th"] - e.reshape(w["th"].shape))) / 2e-6
    np.testing.assert_allclose(t["reverse_sequence"], fd[0], atol=1e-8)
    np.testing.assert_allclose(t["forward_sequence"], fd[1], atol=1e-8)


def test_token_targets_equal_the_per_state_route():
    w = _world(2)
    t = kl.kl_gradient_targets(w["lp"], w["lq"], w["S"])
    pt = kl.tabular_partial_kl_gradients(w["th"], w["ref"], vocab=V, length=T)
    np.testing.assert_allclose(t["reverse_token"], pt["reverse_token"], atol=1e-14)
    np.testing.assert_allclose(t["forward_token"], pt["forward_token"], atol=1e-14)
    # and the partial gradient is not the sequence one in a world with prefix dependence
    assert np.linalg.norm(t["reverse_token"] - t["reverse_sequence"]) > 1e-3


CLASSES = [
    ({"estimator": "k1", "placement": "loss"}, ("zero",)),
    ({"estimator": "k2", "placement": "loss"}, ("reverse_token",)),
    ({"estimator": "k3", "placement": "loss"}, ("forward_token",)),
    ({"estimator": "k1", "placement": "reward"}, ("reverse_token",)),
    ({"estimator": "k1", "placement": "reward_to_go"}, ("reverse_sequence",)),
    ({"estimator": "k1", "placement": "reward_sum"}, ("reverse_sequence",)),
    ({"estimator": "k3", "placement": "loss_k2_gradient"}, ("reverse_token",)),
    ({"estimator": "k3", "placement": "loss_ratio_weighted"}, ("reverse_token",)),
    ({"estimator": "k2", "placement": "loss", "level": "sequence"}, ("reverse_sequence",)),
    ({"estimator": "k3", "placement": "loss", "level": "sequence"}, ("forward_sequence",)),
    ({"estimator": "k1", "placement": "loss", "level": "sequence"}, ("zero",)),
    ({"estimator": "k3", "placement": "reward_sum"}, ()),
]


@pytest.mark.parametrize("opts, matches", CLASSES, ids=[str(c[0]) for c in CLASSES])
def test_each_placement_delivers_the_gradient_it_is_classified_as(opts, matches):
    w = _world(3)
    t = kl.kl_gradient_targets(w["lp"], w["lq"], w["S"])
    g = kl.expected_kl_gradient(kl.kl_coefficients(w["lp"] - w["lq"], **opts), probs=w["P"],
                                scores=w["S"])
    assert kl.classify_gradient(g, t).matches == matches


def test_classification_flips_when_the_gradient_is_perturbed():
    """Planted error: a target plus a small perturbation is a mix, not the target."""
    w = _world(3)
    t = kl.kl_gradient_targets(w["lp"], w["lq"], w["S"])
    g = t["reverse_sequence"].copy()
    assert kl.classify_gradient(g, t).label == "reverse_sequence"
    g[0] += 1e-3 * np.linalg.norm(g)
    c = kl.classify_gradient(g, t)
    assert c.label == "mix" and c.cos_reverse > 0.99


def test_one_token_world_has_no_partial_gap():
    rng = np.random.default_rng(4)
    th, ref = rng.standard_normal((1, 4)), rng.standard_normal((1, 4))
    lp = kl.tabular_token_log_probs(th, vocab=4, length=1)
    t = kl.kl_gradient_targets(lp, kl.tabular_token_log_probs(ref, vocab=4, length=1),
                               kl.tabular_token_scores(th, vocab=4, length=1))
    np.testing.assert_allclose(t["reverse_token"], t["reverse_sequence"], atol=1e-15)


# --- the statistical tier -------------------------------------------------------------------------
PLACEMENTS = [(e, p, "token") for e in kl.KL_ESTIMATORS for p in kl.KL_PLACEMENTS] + [
    (e, p, "sequence") for e in kl.KL_ESTIMATORS for p in ("loss", "loss_k2_gradient", "reward")]


def test_every_expected_gradient_agrees_with_seeded_monte_carlo_within_4_se():
    """Each (estimator, placement, level), on- and off-policy: the mean of n sampled per-response
    gradients projected on a fixed direction against the exact expectation (SE from the exact
    law of the projection)."""
    w = _world(5)
    rng = np.random.default_rng(43)
    old = w["th"] + 0.4 * rng.standard_normal(w["th"].shape)
    lo = kl.tabular_token_log_probs(old, vocab=V, length=T)
    u = rng.standard_normal(w["S"].shape[2])
    n = 3000
    worst = 0.0
    for est, pl, lvl in PLACEMENTS:
        for q, lro in ((w["P"], None), (np.exp(lo.sum(1)), w["lp"] - lo)):
            c = kl.kl_coefficients(w["lp"] - w["lq"], estimator=est, placement=pl, level=lvl,
                                   log_ratio_old=lro, weight_clip=10.0)
            exact = kl.expected_kl_gradient(c, probs=q, scores=w["S"]) @ u
            per = np.einsum("nt,ntd->nd", c, w["S"]) @ u
            se = math.sqrt(float(q @ (per - q @ per) ** 2) / n)
            cdf = np.cumsum(q)
            cdf[-1] = 1.0
            draw = per[np.searchsorted(cdf, rng.random(n), side="right")]
            z = abs(draw.mean() - exact) / se if se > 0 else abs(draw.mean() - exact) * np.inf
            worst = max(worst, z)
            assert z <= K_SE, (est, pl, lvl, draw.mean(), exact, se)
    assert worst > 0  # the comparison did run on random draws


# --- groups and per-token weights -----------------------------------------------------------------
def test_multisets_give_the_ordered_groups_expectation():
    from grpo_theory import compute_advantages

    rng = np.random.default_rng(6)
    q = rng.dirichlet(np.ones(4))
    r = rng.random(4)
    psi = rng.standard_normal((4, 3))
    out = []
    for ordered in (True, False):
        groups, mult = kl.joint_groups(4, 3, ordered=ordered)
        A = np.asarray(compute_advantages("grpo_std", r[groups], ddof=1, eps=1e-6))
        out.append(kl.expected_group_gradient(A, groups, probs=q, psi=psi, multiplicity=mult))
    np.testing.assert_allclose(out[0], out[1], atol=1e-14)
    assert kl.joint_groups(4, 3, ordered=False)[1].sum() == 4**3


def test_regularised_token_weights_hand_checked():
    A = np.array([[1.0, -0.5]])
    L = np.array([[2, 1]])
    c = np.array([[[0.2, 0.4], [1.0, 9.0]]])
    w = kl.regularised_token_weights(A, L, c, beta=0.5, mode="token_mean")
    np.testing.assert_allclose(w, [[[(1 - 0.1) / 3, (1 - 0.2) / 3], [(-0.5 - 0.5) / 3, 0.0]]])
    with pytest.raises(ValueError, match="beta"):
        kl.regularised_token_weights(A, L, c, beta=-1.0, mode="token_mean")
