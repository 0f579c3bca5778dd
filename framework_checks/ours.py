"""The ``grpo_theory`` side of the framework checks: per framework setting, the function of this
library that the conventions (``grpo_theory.conventions``) say is equivalent, and its label.

:data:`ADVANTAGE_MAP`: setting -> (label, ``f(rewards [P, R], lengths [P, R]) -> [P, R]``);
:data:`LOSS_MAP`: setting -> (label, ``f(lengths [P, R], width) -> [P, R]`` per-sequence weights
at ratio 1). TRL's loss types come from the one table, ``TRL_LOSS_TYPES``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import grpo_theory as gt
from grpo_theory.aggregation import aggregation_weights, policy_loss_weights
from grpo_theory.conventions import TRL_LOSS_TYPES, TrlLossType

__all__ = ["ADVANTAGE_MAP", "LOSS_MAP"]

Ours = tuple[str, Callable[..., np.ndarray]]


# --- advantages -----------------------------------------------------------------------------------
def registry_estimator(r: np.ndarray, L: np.ndarray, *, name: str, options: dict[str, Any]
                       ) -> np.ndarray:
    """``compute_advantages(name, r, **options)`` (lengths unused)."""
    return np.asarray(gt.compute_advantages(name, r, **options), dtype=np.float64)


def nan_excluding(r: np.ndarray, L: np.ndarray, *, name: str, options: dict[str, Any]
                  ) -> np.ndarray:
    """TRL's NaN rule around a registry estimator (lengths unused)."""
    return gt.nan_excluding_advantages(name, r, **options)


def with_lengths(r: np.ndarray, L: np.ndarray, *, fn: Callable[..., np.ndarray]) -> np.ndarray:
    """An estimator that takes the completion lengths: ``fn(r, lengths=L)``."""
    return fn(r, lengths=L)


def gdpo_one_function(r: np.ndarray, L: np.ndarray) -> np.ndarray:
    """GDPO with one reward function (TRL's ``normalize_then_sum`` on ``[P, R, 1]``)."""
    return gt.gdpo_advantages(r[..., None])


def scored_whiten(a: np.ndarray, ok: np.ndarray, *, eps: float) -> np.ndarray:
    """Sequence-level whitening (``std + eps``, ddof 1) of the scored entries; 0 elsewhere."""
    out = np.zeros_like(a)
    if ok.sum() >= 2:
        out[ok] = gt.whiten(a[ok][None, :], ddof=1, eps=eps, eps_mode="add_std")[0]
    return out


def trl_rloo_normalized(r: np.ndarray, L: np.ndarray) -> np.ndarray:
    """TRL RLOO with ``normalize_advantages``: NaN-excluding RLOO, then batch whitening."""
    a = gt.nan_excluding_advantages("rloo", r)
    return scored_whiten(a, ~np.isnan(r), eps=1e-4)


def verl_gdpo_one_key(r: np.ndarray, L: np.ndarray) -> np.ndarray:
    """verl's GDPO with one reward key: ``grpo_std(eps=1e-6)``, then token whitening."""
    a = gt.compute_advantages("grpo_std", r, ddof=1, eps=1e-6)
    return np.asarray(gt.whiten(a, lengths=L, ddof=1, eps=1e-8, eps_mode="add_var"))


def _est(name: str, **options: Any) -> Callable[..., np.ndarray]:
    return partial(registry_estimator, name=name, options=options)


def _nan(name: str, **options: Any) -> Callable[..., np.ndarray]:
    return partial(nan_excluding, name=name, options=options)


_G4 = {"ddof": 1, "eps": 1e-4}  # TRL's grpo_std

ADVANTAGE_MAP: dict[str, Ours] = {
    'GRPOConfig(scale_rewards="group")': (
        "nan_excluding_advantages('grpo_std', ddof=1, eps=1e-4)", _nan("grpo_std", **_G4)),
    'GRPOConfig(scale_rewards="batch")': (
        "grpo_std(ddof=1, eps=1e-4, std_scope='batch')",
        _est("grpo_std", std_scope="batch", **_G4)),
    'GRPOConfig(scale_rewards="none")': ("nan_excluding_advantages('grpo')", _nan("grpo")),
    'GRPOConfig(multi_objective_aggregation="normalize_then_sum")': (
        "gdpo_advantages(rewards[..., None])", gdpo_one_function),
    "RLOOConfig()": ("nan_excluding_advantages('rloo')", _nan("rloo")),
    "RLOOConfig(normalize_advantages=True)": ("rloo_normalized (NaN-excluding)",
                                              trl_rloo_normalized),
    "algorithm.adv_estimator=grpo": ("grpo_std(ddof=1, eps=1e-6)",
                                     _est("grpo_std", ddof=1, eps=1e-6)),
    "algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=False": ("grpo", _est("grpo")),
    "algorithm.adv_estimator=rloo": ("rloo", _est("rloo")),
    "algorithm.adv_estimator=reinforce_plus_plus": (
        "reinforce_plus_plus(lengths)", partial(with_lengths,
                                                fn=gt.reinforce_plus_plus_advantages)),
    "algorithm.adv_estimator=reinforce_plus_plus_baseline": (
        "reinforce_plus_plus_baseline(lengths)",
        partial(with_lengths, fn=gt.reinforce_plus_plus_baseline_advantages)),
    "algorithm.adv_estimator=opo": ("opo(lengths)", partial(with_lengths,
                                                            fn=gt.opo_advantages)),
    "algorithm.adv_estimator=gpg": ("gpg", _est("gpg")),
    "algorithm.adv_estimator=grpo_passk": ("grpo_passk", _est("grpo_passk")),
    "algorithm.adv_estimator=gdpo (one reward key)": ("grpo_std(eps=1e-6) then whiten(lengths)",
                                                      verl_gdpo_one_key),
    "--algo.advantage.estimator group_norm": ("grpo_std(ddof=1, eps=1e-9)",
                                              _est("grpo_std", ddof=1, eps=1e-9)),
    "--algo.advantage.estimator dr_grpo": ("grpo", _est("grpo")),
    "--algo.advantage.estimator rloo": ("rloo", _est("rloo")),
    "--algo.advantage.estimator reinforce_baseline": (
        "reinforce_baseline(lengths)", partial(with_lengths,
                                               fn=gt.reinforce_baseline_advantages)),
    "--algo.advantage.estimator flash_reinforce": ("flash_reinforce", _est("flash_reinforce")),
}


# --- losses ---------------------------------------------------------------------------------------
def aggregation(L: np.ndarray, width: int, *, mode: str, options: dict[str, Any]) -> np.ndarray:
    """``aggregation_weights(L, mode=mode, **options)``; ``dr_grpo``'s ``max_tokens`` is the
    padded width."""
    kw = dict(options)
    if mode == "dr_grpo":
        kw["max_tokens"] = width
    return aggregation_weights(L, mode=mode, **kw)  # type: ignore[arg-type]


def policy(L: np.ndarray, width: int, *, loss: str, options: dict[str, Any]) -> np.ndarray:
    """``policy_loss_weights(L, loss=loss, **options)`` (width unused)."""
    return policy_loss_weights(L, loss=loss, **options)


def _agg(mode: str, **options: Any) -> Callable[..., np.ndarray]:
    return partial(aggregation, mode=mode, options=options)


def _pol(loss: str, **options: Any) -> Ours:
    label = f"policy_loss_weights({loss!r}" + "".join(
        f", {k}={v!r}" for k, v in options.items()) + ")"
    return label, partial(policy, loss=loss, options=options)


def trl_loss(lt: TrlLossType) -> Ours:
    """The equivalent of one of TRL's loss types (``grpo_theory.conventions.TRL_LOSS_TYPES``)."""
    if lt.policy_loss is not None:
        return _pol(lt.policy_loss, **lt.policy_options)
    mode = str(lt.aggregation)
    return ("dr_grpo(max_tokens=width)" if mode == "dr_grpo" else mode), _agg(mode)


_SKIP = {"empty_completions": "skip"}
_SEQ_MEAN_SKIP = ("sequence_mean(empty_completions='skip')", _agg("sequence_mean", **_SKIP))

LOSS_MAP: dict[str, Ours] = {
    **{lt.setting: trl_loss(lt) for lt in TRL_LOSS_TYPES.values()},
    'GRPOConfig(loss_type="cispo", epsilon_high=5.0)': _pol("cispo", epsilon_high=5.0),
    'GRPOConfig(loss_type="grpo", importance_sampling_level="sequence") (GSPO)': _pol("gspo"),
    "RLOOTrainer loss": ("sequence_sum", _agg("sequence_sum")),
    "actor.loss_agg_mode=token-mean": ("token_mean", _agg("token_mean")),
    "actor.loss_agg_mode=token-sum": ("token_sum", _agg("token_sum")),
    "actor.loss_agg_mode=seq-mean-token-mean": _SEQ_MEAN_SKIP,
    "actor.loss_agg_mode=seq-mean-token-sum": (
        "sequence_sum(empty_completions='skip')", _agg("sequence_sum", **_SKIP)),
    "actor.loss_agg_mode=seq-mean-token-sum-norm": (
        "dr_grpo(max_tokens=loss_scale_factor=width, empty_completions='skip')",
        _agg("dr_grpo", **_SKIP)),
    "policy_loss=gspo, token-mean": ("token_mean", _agg("token_mean")),
    "policy_loss=gspo, seq-mean-token-mean": _SEQ_MEAN_SKIP,
    "policy_loss=sapo (any loss_agg_mode)": _pol("sapo", **_SKIP),
    "policy_loss=cispo, token-mean": _pol("cispo"),
    "token_level_loss=True (PolicyLoss default)": ("token_mean", _agg("token_mean")),
    "token_level_loss=False": _SEQ_MEAN_SKIP,
    'policy_loss_type="gspo"': _pol("gspo", **_SKIP),
}
