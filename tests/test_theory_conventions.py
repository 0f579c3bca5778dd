"""Equivalence: our estimators with the mapped options reproduce TRL / verl / OpenRLHF formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from framework_refs import (
    reference_openrlhf_shaped_rewards,
    reference_trl_grpo_advantages,
    reference_verl_grpo_outcome_advantages,
    reference_verl_rloo_outcome_advantages,
)

from grpo_theory import (
    CONVENTIONS,
    ESTIMATORS,
    compute_advantages,
    conventions_markdown,
)
from grpo_theory.aggregation import AGGREGATION_MODES, POLICY_LOSSES


def _rewards(seed: int, P: int = 5, R: int = 6, binary: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 2, (P, R)).astype(float) if binary else rng.normal(size=(P, R))
    r[0] = 1.0  # a zero-variance group: every framework must give 0 there
    return r


def _conv(framework: str, setting_part: str):  # noqa: ANN202
    hits = [c for c in CONVENTIONS if c.framework == framework and setting_part in c.setting]
    assert len(hits) == 1, (framework, setting_part)
    return hits[0]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("binary", [False, True])
def test_trl_scale_rewards_reproduced(scale: str, binary: bool) -> None:
    r = _rewards(1, binary=binary)
    P, R = r.shape
    ref = reference_trl_grpo_advantages(
        torch.tensor(r.reshape(-1)), num_generations=R, scale_rewards=scale
    )
    c = _conv("TRL", f'scale_rewards="{scale}"')
    ours = np.asarray(compute_advantages(c.estimator, r, **c.options))
    np.testing.assert_allclose(ours.reshape(-1), ref.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm", [True, False])
def test_verl_grpo_reproduced_with_interleaved_index(norm: bool) -> None:
    r = _rewards(2, binary=True)
    P, R = r.shape
    rng = np.random.default_rng(0)
    order = rng.permutation(P * R)  # verl groups by an index array, not by position
    flat, index = r.reshape(-1)[order], np.repeat(np.arange(P), R)[order]
    T = 4
    tok = np.zeros((P * R, T))
    tok[:, -1] = flat  # outcome reward on the last token
    mask = np.ones((P * R, T))
    ref = reference_verl_grpo_outcome_advantages(tok, mask, index, norm_adv_by_std_in_grpo=norm)
    c = _conv("verl", f"norm_adv_by_std_in_grpo={norm}")
    ours = np.asarray(compute_advantages(c.estimator, r, **c.options)).reshape(-1)[order]
    np.testing.assert_allclose(ref.numpy(), np.repeat(ours[:, None], T, 1), rtol=1e-10, atol=1e-12)


def test_verl_rloo_reproduced() -> None:
    r = _rewards(3)
    P, R = r.shape
    index = np.repeat(np.arange(P), R)
    ref = reference_verl_rloo_outcome_advantages(r.reshape(-1, 1), np.ones((P * R, 1)), index)
    ours = np.asarray(compute_advantages(_conv("verl", "adv_estimator=rloo").estimator, r))
    np.testing.assert_allclose(ref.numpy()[:, 0], ours.reshape(-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("est", ["group_norm", "dr_grpo", "rloo"])
def test_openrlhf_reward_shaping_reproduced(est: str) -> None:
    r = _rewards(4, binary=True)
    P, R = r.shape
    ref = reference_openrlhf_shaped_rewards(r.reshape(-1), n_samples_per_prompt=R, estimator=est)
    c = _conv("OpenRLHF", f"estimator {est}")
    ours = np.asarray(compute_advantages(c.estimator, r, **c.options))
    np.testing.assert_allclose(ours.reshape(-1), ref.numpy(), rtol=1e-9, atol=1e-12)


def test_eps_convention_matters_and_is_recorded() -> None:
    # Different eps give measurably different advantages on binary rewards (R=2: std=1/sqrt2).
    r = np.array([[1.0, 0.0]])
    vals = {
        c.framework: float(np.asarray(compute_advantages(c.estimator, r, **c.options))[0, 0])
        for c in CONVENTIONS
        if c.estimator == "grpo_std" and c.std_scope == "group"
    }
    assert set(vals) == {"TRL", "verl", "OpenRLHF"}
    assert vals["OpenRLHF"] > vals["verl"] > vals["TRL"]
    assert vals["TRL"] == pytest.approx(0.5 / (np.sqrt(0.5) + 1e-4), rel=1e-12)


def test_conventions_table_is_consistent() -> None:
    for c in CONVENTIONS:
        assert c.estimator is None or c.estimator in ESTIMATORS
        assert c.aggregation is None or c.aggregation in (*AGGREGATION_MODES, *POLICY_LOSSES)
        assert c.source
    md = conventions_markdown()
    assert md.count("\n") == len(CONVENTIONS) + 2


def test_docs_conventions_page_holds_the_generated_table() -> None:
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "conventions.md"
    assert conventions_markdown() in page.read_text(encoding="utf-8")


def test_trl_loss_types_are_one_table_read_by_the_conventions_rows() -> None:
    from grpo_theory.conventions import TRL_LOSS_AGGREGATION, TRL_LOSS_TYPES

    assert [lt for lt, t in TRL_LOSS_TYPES.items() if t.is_default] == ["dapo"]
    for name, lt in TRL_LOSS_TYPES.items():
        row = _conv("TRL", lt.setting)
        assert row.aggregation == (lt.policy_loss or lt.aggregation)
        assert row.is_default == lt.is_default
        assert TRL_LOSS_AGGREGATION[name] == (lt.mode, lt.normaliser_scope)
        assert lt.mode in AGGREGATION_MODES
    # hand-checked: the policy losses take the mode they reduce to at ratio 1
    assert TRL_LOSS_AGGREGATION["cispo"] == ("token_mean", "generation_batch")
    assert TRL_LOSS_AGGREGATION["luspo"] == ("sequence_sum", "micro_batch")
    assert TRL_LOSS_TYPES["luspo"].setting == (
        'GRPOConfig(loss_type="luspo", importance_sampling_level="sequence")')


def test_a_trl_loss_type_names_exactly_one_of_aggregation_and_policy_loss() -> None:
    from grpo_theory.conventions import TrlLossType

    with pytest.raises(ValueError, match="exactly one"):
        TrlLossType("x", "token_mean", "micro_batch", policy_loss="cispo")
    with pytest.raises(ValueError, match="exactly one"):
        TrlLossType("x", None, "micro_batch")
    with pytest.raises(ValueError, match="unknown policy loss"):
        TrlLossType("x", None, "micro_batch", policy_loss="nope")
    with pytest.raises(ValueError, match="unknown scope"):
        TrlLossType("x", "token_mean", "everywhere")
