"""verl's KL options through its own code (0.9.1).

* In the loss (``actor.use_kl_loss=True``, ``kl_loss_type``): the ``if config.use_kl_loss:``
  block of ``verl/workers/utils/losses.py`` (``kl_penalty`` then ``agg_loss`` with the actor's
  ``loss_agg_mode``, times ``kl_loss_coef``), executed as verl wrote it with ``core_algos``'s own
  ``kl_penalty`` (the ``"+"`` variants: value of the named estimator, gradient of k2, by a
  straight-through trick) and ``agg_loss``.
* In the reward (``algorithm.use_kl_in_reward=True``, ``kl_penalty``): ``apply_kl_penalty`` of
  ``verl/trainer/ppo/ray_trainer.py`` (the estimator at the rollout's ``old_log_probs``,
  subtracted per token from ``token_level_scores``), then ``compute_grpo_outcome_advantage``
  (which sums the token rewards into one sequence score before the group normalisation), so it
  is a group setting.

Defaults (``kl_loss_type``, ``kl_loss_coef``, ``loss_agg_mode``, ``kl_penalty``,
``norm_adv_by_std_in_grpo``) are read from ``verl/workers/config/actor.py`` and
``verl/trainer/config/algorithm.py``.
"""

from __future__ import annotations

import types
from functools import partial
from typing import Any

import numpy as np

from .extract import ConfigStub, exec_defs, source_block
from .kl_audit import BETA, KLGroupSetting, KLOptions, KLSetting, autograd_coefficients
from .kl_source import dataclass_default
from .source import SourceTree
from .verl import VerlCode

__all__ = ["kl_options", "VerlKL", "AGG_MODES"]

LOSSES = "verl/workers/utils/losses.py"
TRAINER = "verl/trainer/ppo/ray_trainer.py"
ACTOR_CONFIG = "verl/workers/config/actor.py"
ALGO_CONFIG = "verl/trainer/config/algorithm.py"
KL_LOSS_BLOCK = ("if config.use_kl_loss:", 'metrics["kl_coef"] = config.kl_loss_coef')

#: verl ``loss_agg_mode`` -> ``grpo_theory.aggregation`` mode (fixed-width batches).
AGG_MODES = {"token-mean": "token_mean", "seq-mean-token-mean": "sequence_mean",
             "seq-mean-token-sum": "sequence_sum", "token-sum": "token_sum"}

#: ``kl_loss_type`` / ``kl_penalty`` value -> (estimator, straight-through k2 gradient).
ESTIMATORS: dict[str, tuple[str, bool]] = {
    "kl": ("k1", False), "abs": ("abs", False), "mse": ("k2", False),
    "low_var_kl": ("k3", False), "k1+": ("k1", True), "abs+": ("abs", True),
    "low_var_kl+": ("k3", True), "full": ("", False),
}


class VerlKL:
    """verl's KL loss block and in-reward penalty, executed from its source."""

    def __init__(self, tree: SourceTree, dtype: str) -> None:
        import torch

        self.code = VerlCode(tree, dtype)
        C = self.code.C
        self.kl_block = compile(source_block(tree.text(LOSSES), *KL_LOSS_BLOCK),
                                "<verl kl loss>", "exec")
        self.ns: dict[str, Any] = {"torch": torch, "DataProto": object,
                                   "core_algos": types.SimpleNamespace(**C),
                                   "masked_mean": C["verl_F"].masked_mean}
        exec_defs(tree.text(TRAINER), ["apply_kl_penalty"], self.ns)

    def kl_loss(self, logp: Any, ref: Any, old: Any, mask: Any, *, kl_loss_type: str,
                loss_agg_mode: str) -> Any:
        """The KL loss block (times ``kl_loss_coef = BETA``) on per-token log-probs."""
        env = {
            "config": ConfigStub(use_kl_loss=True, kl_loss_type=kl_loss_type,
                                 loss_agg_mode=loss_agg_mode, kl_loss_coef=BETA,
                                 global_batch_info={}),
            "data": {"ref_log_prob": ref}, "log_prob": logp, "response_mask": mask.bool(),
            "policy_loss": 0.0, "metrics": {}, "metric_aggregation": None,
            "Metric": lambda **k: None, "kl_penalty": self.code.C["kl_penalty"],
            "agg_loss": self.code.C["agg_loss"],
        }
        exec(self.kl_block, env)  # noqa: S102
        return env["policy_loss"]

    def coefficients(self, logp: np.ndarray, ref: np.ndarray, old: np.ndarray,
                     lengths: np.ndarray, dtype: Any, *, kl_loss_type: str,
                     loss_agg_mode: str) -> np.ndarray:
        fn = partial(self.kl_loss, kl_loss_type=kl_loss_type, loss_agg_mode=loss_agg_mode)
        return autograd_coefficients(fn, logp, ref, old, lengths, dtype=dtype,
                                     mode=AGG_MODES[loss_agg_mode])

    def reward_advantages(self, rewards: np.ndarray, old: np.ndarray, ref: np.ndarray,
                          beta: float, *, kl_penalty: str, norm_adv_by_std_in_grpo: bool
                          ) -> np.ndarray:
        """``apply_kl_penalty`` then ``compute_grpo_outcome_advantage`` on ``M`` groups of ``G``
        responses (float64), the score on the last token; the per-sequence advantage."""
        import torch

        M, G, T = old.shape
        tok = torch.zeros(M * G, T, dtype=torch.float64)
        tok[:, -1] = torch.as_tensor(rewards.reshape(-1))
        mask = torch.ones(M * G, T, dtype=torch.float64)
        batch = _Batch(token_level_scores=tok, response_mask=mask,
                       old_log_probs=torch.as_tensor(old.reshape(M * G, T)),
                       ref_log_prob=torch.as_tensor(ref.reshape(M * G, T)))
        batch.batch_size = (M * G,)
        ctrl = types.SimpleNamespace(value=beta, update=lambda **k: None)
        data, _ = self.ns["apply_kl_penalty"](types.SimpleNamespace(batch=batch), ctrl,
                                              kl_penalty=kl_penalty)
        out = self.code.C["compute_grpo_outcome_advantage"](
            token_level_rewards=data.batch["token_level_rewards"], response_mask=mask,
            index=np.repeat(np.arange(M), G), norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        return out[0][:, 0].double().numpy().reshape(M, G)


class _Batch(dict):
    """``DataProto.batch`` stand-in: a dict with a ``batch_size``."""

    batch_size: tuple[int, ...] = (0,)


def kl_options(tree: SourceTree, dtype: str) -> KLOptions:
    """verl's in-loss KL types and its in-reward penalties with the GRPO estimator."""
    code = VerlKL(tree, dtype)
    actor, algo = tree.text(ACTOR_CONFIG), tree.text(ALGO_CONFIG)
    defaults = {
        "actor.kl_loss_type": dataclass_default(actor, "ActorConfig", "kl_loss_type"),
        "actor.kl_loss_coef": dataclass_default(actor, "ActorConfig", "kl_loss_coef"),
        "actor.loss_agg_mode": dataclass_default(actor, "ActorConfig", "loss_agg_mode"),
        "algorithm.kl_penalty": dataclass_default(algo, "AlgoConfig", "kl_penalty"),
        "algorithm.norm_adv_by_std_in_grpo": dataclass_default(algo, "AlgoConfig",
                                                               "norm_adv_by_std_in_grpo"),
    }
    agg = defaults["actor.loss_agg_mode"]
    out = KLOptions(defaults=defaults)
    for name, (est, plus) in ESTIMATORS.items():
        model = ({"estimator": est, "placement": "loss_k2_gradient" if plus else "loss"}
                 if est else {})
        out.settings.append(KLSetting(
            f"actor.use_kl_loss=True, kl_loss_type={name}", model,
            partial(code.coefficients, kl_loss_type=name, loss_agg_mode=agg),
            mode=AGG_MODES[agg], default=name == defaults["actor.kl_loss_type"]))
    from grpo_theory.conventions import CONVENTIONS

    verl_grpo = next(c for c in CONVENTIONS if c.framework == "verl"
                     and c.setting.startswith("algorithm.adv_estimator=grpo, "
                                              "norm_adv_by_std_in_grpo=True"))
    for name in ("kl", "abs", "mse", "low_var_kl", "low_var_kl+"):
        est = ESTIMATORS[name][0]
        for by_std in (True, False):
            ours = ("grpo_std", dict(verl_grpo.options)) if by_std else ("grpo", {})
            text = f"algorithm.use_kl_in_reward=True, kl_penalty={name}, adv_estimator=grpo"
            if by_std != defaults["algorithm.norm_adv_by_std_in_grpo"]:
                text += f", norm_adv_by_std_in_grpo={by_std}"
            if not by_std and name not in ("kl",):
                continue
            out.groups.append(KLGroupSetting(
                text, est, partial(code.reward_advantages, kl_penalty=name,
                                   norm_adv_by_std_in_grpo=by_std), ours,
                default=(name == defaults["algorithm.kl_penalty"]
                         and by_std == defaults["algorithm.norm_adv_by_std_in_grpo"])))
    return out
