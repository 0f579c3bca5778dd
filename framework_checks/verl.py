"""verl's own code (0.9.1: ``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``).

``core_algos.py`` is executed whole as a module, with its imports of omegaconf and of verl's
utilities and configs replaced by stubs (:func:`stub_modules_for_core_algos`); the masked
statistics it calls (``masked_whiten`` and friends) are verl's own, executed from
``torch_functional.py``. Rewards are laid out as verl's reward managers write them: the score on
the last token of each response.
"""

from __future__ import annotations

import copy
import types
from functools import partial
from typing import Any

import numpy as np

from .adapter import FrameworkCode, completion_masks, loss_weights, per_sequence, torch_dtype
from .extract import ConfigStub, exec_defs, stub_modules
from .source import FrameworkCodeError, SourceTree

__all__ = ["VerlCode", "load", "AlgoConfig", "ActorConfig"]


class AlgoConfig(ConfigStub):
    """Stands in for ``verl.trainer.config.AlgoConfig``."""


class ActorConfig(ConfigStub):
    """Stands in for ``verl.workers.config.ActorConfig``."""


#: ``ActorConfig`` fields the policy losses read, at verl's defaults.
ACTOR_DEFAULTS: dict[str, Any] = {
    "clip_ratio": 0.2,
    "clip_ratio_low": None,
    "clip_ratio_high": None,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
}


def _absent(*a: Any, **k: Any) -> Any:
    raise FrameworkCodeError("stubbed verl helper called (vectorized estimators not run)")


def stub_modules_for_core_algos(torch_functional: types.ModuleType
                                ) -> dict[str, types.ModuleType]:
    """The modules ``core_algos.py`` imports, as stubs around verl's own ``torch_functional``."""
    names = ("omegaconf", "verl", "verl.utils", "verl.utils.import_utils", "verl.trainer",
             "verl.trainer.config", "verl.workers", "verl.workers.config")
    mods = {n: types.ModuleType(n) for n in names}
    mods["verl.utils.torch_functional"] = torch_functional
    mods["omegaconf"].DictConfig = ConfigStub  # type: ignore[attr-defined]
    mods["verl"].utils = mods["verl.utils"]  # type: ignore[attr-defined]
    mods["verl.utils"].torch_functional = torch_functional  # type: ignore[attr-defined]
    mods["verl.utils"].as_torch_index = _absent  # type: ignore[attr-defined]
    mods["verl.utils"].group_mean_std = _absent  # type: ignore[attr-defined]
    mods["verl.utils.import_utils"].deprecated = (  # type: ignore[attr-defined]
        lambda *a, **k: lambda f: f
    )
    mods["verl.trainer.config"].AlgoConfig = AlgoConfig  # type: ignore[attr-defined]
    mods["verl.workers.config"].ActorConfig = ActorConfig  # type: ignore[attr-defined]
    return mods


class VerlCode:
    """verl's ``core_algos`` namespace (``C``), run on our layout in ``dtype``."""

    def __init__(self, tree: SourceTree, dtype: str) -> None:
        import torch

        core = tree.text("verl/trainer/ppo/core_algos.py")
        tf = types.ModuleType("verl.utils.torch_functional")
        tf.__dict__["torch"] = torch
        exec_defs(tree.text("verl/utils/torch_functional.py"),
                  ["masked_sum", "masked_mean", "masked_var", "masked_whiten"], tf.__dict__)
        mod = types.ModuleType("verl_core_algos_from_source")
        mod.__file__ = tree.origin
        with stub_modules(stub_modules_for_core_algos(tf)):
            exec(compile(core, "verl/trainer/ppo/core_algos.py", "exec"), mod.__dict__)  # noqa: S102
        self.C = mod.__dict__
        self.dtype = torch_dtype(dtype)

    def layout(self, rewards: np.ndarray, lengths: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        """``(token_level_rewards, response_mask, index)`` as verl's trainer builds them."""
        import torch

        r = np.asarray(rewards, dtype=np.float64)
        P, R = r.shape
        L = np.asarray(lengths).reshape(-1)
        T = max(int(L.max()), 1)
        mask = completion_masks(L, T).to(self.dtype)
        tok = torch.zeros(P * R, T, dtype=self.dtype)
        # verl's reward managers write the score at index valid_response_length - 1
        # (so an empty completion's score lands on the last, masked, position)
        for i, li in enumerate(L):
            tok[i, int(li) - 1] = float(r.reshape(-1)[i])
        return tok, mask, np.repeat(np.arange(P), R)

    def advantage(self, rewards: np.ndarray, lengths: np.ndarray, *, function: str,
                  options: dict[str, Any]) -> np.ndarray:
        """The per-sequence advantage of ``core_algos.<function>(..., **options)``."""
        tok, mask, index = self.layout(rewards, lengths)
        out = self.C[function](token_level_rewards=tok, response_mask=mask, index=index, **options)
        return per_sequence(out[0], lengths)

    def remax(self, rewards: np.ndarray, lengths: np.ndarray, greedy: np.ndarray) -> np.ndarray:
        """``compute_remax_outcome_advantage`` with the greedy rollouts' rewards ``greedy``."""
        import torch

        tok, mask, _ = self.layout(rewards, lengths)
        b = torch.as_tensor(np.asarray(greedy, dtype=np.float64).reshape(-1), dtype=self.dtype)
        out = self.C["compute_remax_outcome_advantage"](
            token_level_rewards=tok, reward_baselines=b, response_mask=mask
        )
        return per_sequence(out[0], lengths)

    def _policy_loss_value(self, logp: Any, mask: Any, Aseq: Any, *, mode: str, policy: str,
                           config: dict[str, Any]) -> Any:
        fn = self.C["get_policy_loss_fn"](policy)
        out = fn(
            old_log_prob=logp.detach(),
            log_prob=logp,
            advantages=Aseq[:, None] * mask,
            response_mask=mask,
            loss_agg_mode=mode,
            config=ActorConfig(**ACTOR_DEFAULTS, global_batch_info={}, **config),
        )
        return out[0]

    def policy_loss(self, lengths: np.ndarray, advantages: np.ndarray, *, mode: str,
                    policy: str = "vanilla", config: dict[str, Any] | None = None,
                    width: int | None = None) -> np.ndarray:
        """Per-sequence weights of verl's policy loss ``policy`` aggregated by ``mode``."""
        value = partial(self._policy_loss_value, mode=mode, policy=policy, config=config or {})
        return loss_weights(value, lengths, advantages, width or max(int(lengths.max()), 1))


#: Advantage settings -> (``core_algos`` function, its options).
ADVANTAGES: dict[str, tuple[str, dict[str, Any]]] = {
    "algorithm.adv_estimator=grpo": ("compute_grpo_outcome_advantage", {}),
    "algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=False": (
        "compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
    "algorithm.adv_estimator=rloo": ("compute_rloo_outcome_advantage", {}),
    "algorithm.adv_estimator=reinforce_plus_plus": (
        "compute_reinforce_plus_plus_outcome_advantage", {"config": AlgoConfig(gamma=1.0)}),
    "algorithm.adv_estimator=reinforce_plus_plus_baseline": (
        "compute_reinforce_plus_plus_baseline_outcome_advantage", {"config": AlgoConfig()}),
    "algorithm.adv_estimator=opo": ("compute_opo_outcome_advantage", {}),
    "algorithm.adv_estimator=gpg": ("compute_gpg_outcome_advantage", {}),
    "algorithm.adv_estimator=grpo_passk": (
        "compute_grpo_passk_outcome_advantage",
        {"config": AlgoConfig(norm_adv_by_std_in_grpo=True)}),
    "algorithm.adv_estimator=gdpo (one reward key)": ("compute_gdpo_outcome_advantage", {}),
}

#: Loss settings -> (``loss_agg_mode``, policy loss).
LOSSES: dict[str, tuple[str, str]] = {
    **{f"actor.loss_agg_mode={m}": (m, "vanilla") for m in (
        "token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
        "seq-mean-token-sum-norm")},
    "policy_loss=gspo, token-mean": ("token-mean", "gspo"),
    "policy_loss=gspo, seq-mean-token-mean": ("seq-mean-token-mean", "gspo"),
    "policy_loss=sapo (any loss_agg_mode)": ("token-mean", "sapo"),
    "policy_loss=cispo, token-mean": ("token-mean", "cispo"),
}


def load(tree: SourceTree, dtype: str) -> FrameworkCode:
    """verl's advantage estimators and loss modes, keyed by the config that selects them."""
    code = VerlCode(tree, dtype)
    fc = FrameworkCode("verl", tree.version, tree.origin, tree.commit, dtype)
    for setting, (function, options) in ADVANTAGES.items():
        fc.advantages[setting] = partial(code.advantage, function=function,
                                         options=copy.deepcopy(options))
    fc.extras["remax"] = code.remax
    fc.extras["optimal_token_baseline"] = code.C["compute_optimal_token_baseline_advantage"]
    fc.extras["grpo_outcome"] = code.C["compute_grpo_outcome_advantage"]
    fc.extras["agg_loss"] = code.C["agg_loss"]
    for setting, (mode, policy) in LOSSES.items():
        fc.losses[setting] = partial(code.policy_loss, mode=mode, policy=policy)
    return fc
