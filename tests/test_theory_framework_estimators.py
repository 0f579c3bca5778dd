"""The estimators the frameworks ship (grpo_theory.FRAMEWORK_ESTIMATORS, whiten, GDPO, OTB,
ReMax, ragged groups): hand-checked cases and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import grpo_theory as gt
from grpo_theory import (
    FRAMEWORK_ESTIMATORS,
    compute_advantages,
    flash_reinforce_advantages,
    gdpo_advantages,
    gpg_advantages,
    grouped_advantages,
    grpo_passk_advantages,
    nan_excluding_advantages,
    opo_advantages,
    optimal_token_baseline_advantages,
    reinforce_baseline_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    remax_advantages,
    rloo_normalized_advantages,
    whiten,
)
from grpo_theory.aggregation import aggregation_weights, policy_loss_weights

S = 1 / math.sqrt(2)


# --- exact hand-checked cases ---
def test_whiten_hand_checked_each_eps_mode() -> None:
    # mean 2, Bessel var 2 -> +-1/sqrt2; eps enters as var+eps, max(var, eps), std+eps
    x = [[1.0, 3.0]]
    assert np.allclose(whiten(x, eps=0.0), [[-S, S]])
    assert np.allclose(whiten(x, eps=2.0, eps_mode="add_var"), [[-0.5, 0.5]])
    assert np.allclose(whiten(x, eps=4.0, ddof=0, eps_mode="clamp_var"), [[-0.5, 0.5]])
    assert np.allclose(
        whiten(x, eps=1.0, ddof=1, eps_mode="add_std"), [[-1 / (2**0.5 + 1), 1 / (2**0.5 + 1)]]
    )
    # token weights: lengths [3, 1] -> mean 1.5, biased var 0.75
    w = whiten(x, lengths=[[3, 1]], ddof=0, eps=0.0, eps_mode="clamp_var")
    assert np.allclose(w, [[-0.5 / 0.75**0.5, 1.5 / 0.75**0.5]])
    assert np.all(whiten([[2.0, 2.0]], eps=0.0) == 0.0)


def test_whiten_is_scale_free_at_extreme_scales() -> None:
    for s in (1e-300, 1e-150, 1e150, 1e300):
        assert np.allclose(whiten([[s, -s]], eps=0.0), [[S, -S]])


def test_remax_subtracts_the_greedy_reward() -> None:
    assert remax_advantages([[1.0, 0.0]], greedy_rewards=[1.0]).tolist() == [[0.0, -1.0]]
    per_sample = remax_advantages([[1.0, 0.0]], greedy_rewards=[[0.5, 0.0]])
    assert per_sample.tolist() == [[0.5, 0.0]]
    with pytest.raises(ValueError, match="greedy_rewards"):
        remax_advantages([[1.0, 0.0]], greedy_rewards=[1.0, 2.0, 3.0])


def test_reinforce_plus_plus_hand_checked() -> None:
    assert np.allclose(reinforce_plus_plus_advantages([[1.0, 0.0]], eps=0.0), [[S, -S]])
    # baseline variant: centred [.5, -.5, 0, 0], Bessel var over 4 = 1/6
    a = reinforce_plus_plus_baseline_advantages([[1.0, 0.0], [1.0, 1.0]], eps=0.0)
    assert np.allclose(a, [[0.5 * 6**0.5, -0.5 * 6**0.5], [0.0, 0.0]])


def test_openrlhf_reinforce_baseline_and_flash_reinforce_hand_checked() -> None:
    assert np.allclose(reinforce_baseline_advantages([[1.0, 0.0]], eps=0.0), [[1.0, -1.0]])
    # the 1e-8 floor: a tiny spread is divided by 1e-4, not by its own std
    tiny = reinforce_baseline_advantages([[1e-6, 0.0]])
    assert np.allclose(tiny, [[5e-3, -5e-3]])
    assert flash_reinforce_advantages([[1.0], [0.0]]).tolist() == [[0.5], [-0.5]]
    assert flash_reinforce_advantages([[3.0, 3.0]]).tolist() == [[0.0, 0.0]]


def test_opo_length_weighted_baseline() -> None:
    assert opo_advantages([[1.0, 0.0]], lengths=[[1, 3]]).tolist() == [[0.75, -0.25]]
    r = np.random.default_rng(0).normal(size=(3, 5))
    assert np.allclose(opo_advantages(r), compute_advantages("grpo", r))
    L = np.random.default_rng(1).integers(1, 9, (3, 5))
    assert np.allclose((L * opo_advantages(r, lengths=L)).sum(axis=1), 0.0)  # sum L_i A_i = 0
    assert opo_advantages([[2.0]]).tolist() == [[2.0]]  # one-sample group: baseline 0
    with pytest.raises(ValueError, match="total completion length 0"):
        opo_advantages([[1.0, 0.0]], lengths=[[0, 0]])


def test_gpg_alpha_is_batch_size_over_nonzero_rewards() -> None:
    assert gpg_advantages([[1.0, 0.0, 0.0, 0.0]]).tolist() == [[3.0, -1.0, -1.0, -1.0]]
    # alpha couples the groups: 8 rewards, 2 nonzero -> alpha 4
    a = gpg_advantages([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], f_norm=2.0)
    assert np.allclose(a, 4 * np.array([[0.75, -0.25, -0.25, -0.25]] * 2) / 2)
    assert gpg_advantages([[0.0, 0.0]]).tolist() == [[0.0, 0.0]]


def test_grpo_passk_only_the_unique_best_gets_signal() -> None:
    assert grpo_passk_advantages([[0.0, 1.0, 0.0]], normalize_std=False).tolist() == [[0, 1, 0]]
    # std of [1,0,0,0] (ddof 1) = 1/2
    a = grpo_passk_advantages([[1.0, 0.0, 0.0, 0.0]], eps=0.0)
    assert np.allclose(a, [[2.0, 0.0, 0.0, 0.0]])
    assert grpo_passk_advantages([[1.0, 1.0, 0.0]]).tolist() == [[0.0, 0.0, 0.0]]  # tie
    with pytest.raises(ValueError, match="group_size >= 2"):
        grpo_passk_advantages([[1.0]])


def test_rloo_normalized_is_whitened_rloo() -> None:
    assert np.allclose(rloo_normalized_advantages([[1.0, 0.0]], eps=0.0), [[S, -S]])
    r = np.random.default_rng(1).normal(size=(4, 3))
    ref = whiten(compute_advantages("rloo", r), ddof=1, eps=1e-4, eps_mode="add_std")
    assert np.allclose(rloo_normalized_advantages(r), ref)


def test_gdpo_normalises_each_function_then_the_batch() -> None:
    assert gdpo_advantages([[[1.0, 0.0], [0.0, 1.0]]], group_eps=0, batch_eps=0).tolist() == [
        [0, 0]
    ]
    # one function: per-group z then batch whitening -> +-1/sqrt2 for [1, 0]
    assert np.allclose(gdpo_advantages([[[1.0], [0.0]]], group_eps=0, batch_eps=0), [[S, -S]])
    # NaN: an unscored completion gets 0 and drops out of the statistics
    a = gdpo_advantages([[[1.0], [np.nan], [0.0]]], group_eps=0, batch_eps=0)
    assert np.allclose(a, [[S, 0.0, -S]])


def test_optimal_token_baseline_hand_checked() -> None:
    # pi = 0.5, sum pi^2 = 0.5 -> w = 0.5 per token; A (L=2, r=1), B (L=1, r=0)
    r = np.zeros((1, 2, 2))
    r[0, 0, 1], r[0, 1, 0] = 1.0, 0.0
    m = np.array([[[1, 1], [1, 0]]], dtype=float)
    pi = np.full((1, 2, 2), 0.5)
    adv = optimal_token_baseline_advantages(r, m, pi, pi, eps=0.0)
    # B_0 = (1*0.5 + 0*0.5) / 1 = 0.5; position 1 of A is beyond B's length: zero tail -> B = 0
    assert np.allclose(adv, [[[0.5, 1.0], [-0.5, 0.0]]])
    no_tail = optimal_token_baseline_advantages(r, m, pi, pi, eps=0.0, handle_zero_tail=False)
    assert np.allclose(no_tail, [[[0.5, 0.0], [-0.5, 0.0]]])


def test_grouped_advantages_handle_unequal_groups_and_singletons() -> None:
    out = grouped_advantages("grpo", [1.0, 0.0, 6.0, 0.0, 0.0], [7, 7, 3, 3, 3])
    assert out.tolist() == [0.5, -0.5, 4.0, -2.0, -2.0]
    with pytest.raises(ValueError, match="one sample"):
        grouped_advantages("grpo", [1.0, 2.0, 3.0], [0, 0, 1])
    assert grouped_advantages("grpo", [1.0, 2.0, 3.0], [0, 0, 1], singleton="zero")[2] == 0.0
    assert grouped_advantages("rloo", [1.0, 2.0, 3.0], [0, 0, 1], singleton="raw")[2] == 3.0


def test_nan_excluding_matches_the_scored_subgroup() -> None:
    a = nan_excluding_advantages("grpo_std", [[1.0, np.nan, 0.0, 1.0]], ddof=1)
    ref = compute_advantages("grpo_std", [[1.0, 0.0, 1.0]], ddof=1)[0]
    assert np.allclose(a[0, [0, 2, 3]], ref) and a[0, 1] == 0.0
    assert nan_excluding_advantages("grpo", [[np.nan, np.nan]]).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="inf"):
        nan_excluding_advantages("grpo", [[np.inf, 0.0]])


# --- registry and backends ---
@pytest.mark.parametrize("name", FRAMEWORK_ESTIMATORS)
def test_framework_estimators_are_registered_and_keep_the_torch_backend(name: str) -> None:
    r = np.random.default_rng(2).integers(0, 2, (3, 4)).astype(float)
    a = np.asarray(compute_advantages(name, r))
    t = compute_advantages(name, torch.tensor(r, dtype=torch.float64))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.shape == (3, 4)
    assert np.allclose(t.numpy(), a)
    assert np.all(np.isfinite(a))


# --- loss aggregations ---------------------------------------------------------------------------
def test_token_sum_and_empty_completions_rules() -> None:
    L = [[0, 2], [1, 3]]
    assert aggregation_weights(L, mode="token_sum").tolist() == [[1, 1], [1, 1]]
    assert aggregation_weights(L, mode="sequence_sum").tolist() == [[0.25] * 2] * 2
    skip = aggregation_weights(L, mode="sequence_sum", empty_completions="skip")
    assert np.allclose(skip, [[0, 1 / 3], [1 / 3, 1 / 3]])
    dr = aggregation_weights(L, mode="dr_grpo", max_tokens=4, empty_completions="skip")
    assert np.allclose(dr, [[0, 1 / 12], [1 / 12, 1 / 12]])


def test_policy_loss_weights_hand_checked() -> None:
    L = [[1, 3]]
    assert policy_loss_weights(L, loss="cispo").tolist() == [[0.25, 0.25]]
    assert np.allclose(policy_loss_weights(L, loss="cispo", epsilon_high=0.2), [[0.05, 0.05]])
    assert policy_loss_weights(L, loss="cispo", epsilon_high=5.0).tolist() == [[0.25, 0.25]]
    assert np.allclose(policy_loss_weights(L, loss="sapo"), [[0.5, 1 / 6]])
    assert np.allclose(policy_loss_weights(L, loss="gspo"), [[0.5, 1 / 6]])
    assert policy_loss_weights(L, loss="luspo").tolist() == [[0.5, 0.5]]
    assert policy_loss_weights(L, loss="vespo").tolist() == [[0.25, 0.25]]
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss_weights(L, loss="ppo")
    with pytest.raises(ValueError, match="only used by loss='cispo'"):
        policy_loss_weights(L, loss="sapo", epsilon_high=1.0)


@pytest.mark.parametrize("name", __import__("grpo_theory").estimator_names())
def test_batch_coupled_flag_is_true_iff_other_groups_change_a_groups_advantages(name: str) -> None:
    from grpo_theory import estimator_spec

    spec = estimator_spec(name)
    R = max(4, spec.min_group_size)
    rng = np.random.default_rng(5)
    g = np.array([[1.0, 0.0, 0.0, 1.0] + [0.0] * (R - 4)])
    other = rng.random((3, R))
    alone = np.asarray(compute_advantages(name, g, **spec.check_options))[0]
    batch = np.asarray(compute_advantages(name, np.vstack([g, other]), **spec.check_options))[0]
    assert (not np.allclose(alone, batch, rtol=1e-12, atol=1e-12)) == spec.batch_coupled


def test_sims_leave_batch_coupled_estimators_out() -> None:
    from grpo_theory import estimator_names
    from sims.exact import ESTIMATOR_SPECS

    coupled = set(estimator_names(batch_coupled=True))
    assert coupled == {
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "gpg",
        "reinforce_baseline",
        "flash_reinforce",
        "rloo_normalized",
    }
    assert not coupled & set(ESTIMATOR_SPECS)
    assert {"opo", "grpo_passk"} <= set(ESTIMATOR_SPECS)


@pytest.mark.parametrize(
    ("name", "opts", "err", "match"),
    [
        ("reinforce_plus_plus", {"eps": float("nan")}, ValueError, "eps must be finite"),
        ("reinforce_plus_plus_baseline", {"eps": -1.0}, ValueError, "eps must be >= 0"),
        ("reinforce_baseline", {"eps": "1e-8"}, TypeError, "eps must be a real number"),
        ("gpg", {"f_norm": float("inf")}, ValueError, "f_norm must be finite"),
        ("gpg", {"f_norm": 0.0}, ValueError, "f_norm must be nonzero"),
        ("grpo_passk", {"eps": True}, TypeError, "eps must be a real number"),
        ("grpo_passk", {"normalize_std": 1}, TypeError, "normalize_std must be a bool"),
        ("rloo_normalized", {"eps": float("-inf")}, ValueError, "eps must be finite"),
        ("opo", {"lengths": [[1, 2]]}, ValueError, "lengths shape"),
    ],
)
def test_bad_options_are_errors_naming_the_option(
    name: str, opts: dict, err: type, match: str
) -> None:
    with pytest.raises(err, match=match):
        compute_advantages(name, [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], **opts)


def test_huge_finite_rewards_do_not_overflow_in_the_framework_estimators() -> None:
    r = np.array([[1.7e308, -1.7e308, 0.0], [1.0, 0.0, 0.0]])
    for name in FRAMEWORK_ESTIMATORS:
        if name in ("gpg", "rloo_normalized"):  # 1.5 * 1.7e308: not representable, refused
            with pytest.raises(ValueError, match="not representable|overflow"):
                compute_advantages(name, r)
            continue
        a = np.asarray(compute_advantages(name, r))
        assert np.all(np.isfinite(a)), name


# --- bad input -----------------------------------------------------------------------------------
def test_gdpo_refuses_non_finite_weights_by_name():
    rewards = [[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]
    with pytest.raises(ValueError, match="weights must be finite"):
        gt.gdpo_advantages(rewards, weights=[float("nan"), 1.0])
    with pytest.raises(ValueError, match="weights must be finite"):
        gt.gdpo_advantages(rewards, weights=[float("inf"), 1.0])
