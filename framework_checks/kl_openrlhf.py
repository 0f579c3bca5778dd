"""OpenRLHF's KL options through its own code (0.11.2).

* In the reward (the default, ``--algo.kl.use_loss`` off): ``compute_approx_kl`` of
  ``openrlhf/models/utils.py`` (``--algo.kl.estimator``, detached, at the rollout's log-probs, as
  ``make_experience`` calls it), then ``compute_advantages_and_returns`` of the experience maker
  (``compute_reward`` adds ``-kl_coef * kl`` per token to the group-normalised outcome reward,
  ``get_cumulative_returns`` sums it to go), then ``PolicyLoss`` (the ratio to the rollout
  policy). With zero outcome rewards the advantage is the KL's alone.
* In the loss (``--algo.kl.use_loss``): the ``if self.args.algo.kl.use_loss:`` block of
  ``PPOActor.training_step`` (``openrlhf/trainer/ray/ppo_actor.py``), executed as written:
  ``compute_approx_kl(..., log_probs_old=..., unbiased_gradient=...)`` then ``aggregate_loss``
  (token mean over the batch whatever ``--actor.loss_agg_mode``), times ``kl_ctl``.

Defaults (``--algo.kl.estimator``, ``--algo.kl.init_coef``, ``--algo.kl.use_loss``,
``--algo.kl.unbiased_gradient``) and ``KL_IS_WEIGHT_CLIP`` are read from the source.
"""

from __future__ import annotations

import types
from functools import partial
from typing import Any

import numpy as np

from .extract import exec_defs, source_block
from .kl_audit import BETA, KLOptions, KLSetting, autograd_coefficients
from .kl_source import argparse_default, module_constant
from .openrlhf import OpenRlhfCode
from .source import SourceTree

__all__ = ["kl_options", "OpenRlhfKL"]

UTILS = "openrlhf/models/utils.py"
ACTOR = "openrlhf/trainer/ray/ppo_actor.py"
CLI = "openrlhf/cli/train_ppo_ray.py"
KL_LOSS_BLOCK = ("if self.args.algo.kl.use_loss:", "kl_loss = 0")


class OpenRlhfKL:
    """OpenRLHF's KL estimator, reward shaping, policy loss and KL-loss block, from source."""

    def __init__(self, tree: SourceTree, dtype: str) -> None:
        import torch

        self.code = OpenRlhfCode(tree, dtype)
        utils = tree.text(UTILS)
        self.ns: dict[str, Any] = {"torch": torch, "Optional": Any, "Union": Any,
                                   "KL_IS_WEIGHT_CLIP": module_constant(utils,
                                                                        "KL_IS_WEIGHT_CLIP")}
        exec_defs(utils, ["compute_approx_kl", "masked_mean"], self.ns)
        self.ns["aggregate_loss"] = self.code.PolicyLoss.forward.__globals__["aggregate_loss"]
        self.kl_block = compile(source_block(tree.text(ACTOR), *KL_LOSS_BLOCK),
                                "<openrlhf kl loss>", "exec")

    def kl_loss(self, logp: Any, ref: Any, old: Any, mask: Any, *, estimator: str,
                unbiased: bool) -> Any:
        """The KL-loss block of ``training_step`` times ``kl_ctl = BETA``."""
        kl_args = types.SimpleNamespace(use_loss=True, init_coef=BETA, estimator=estimator,
                                        unbiased_gradient=unbiased)
        env = dict(self.ns)
        env.update(self=types.SimpleNamespace(args=types.SimpleNamespace(
                       algo=types.SimpleNamespace(kl=kl_args))),
                   action_log_probs=logp, base_action_log_probs=ref,
                   old_action_log_probs=old,
                   experience=types.SimpleNamespace(action_mask=mask, info={}),
                   loss_batch_info={"dp_size": 1, "batch_num_tokens": mask.sum(),
                                    "global_batch_size": (mask.sum(-1) > 0).sum()})
        exec(self.kl_block, env)  # noqa: S102
        return env["kl_loss"] * BETA

    def reward_loss(self, logp: Any, ref: Any, old: Any, mask: Any, *, estimator: str) -> Any:
        """The PPO loss on the advantages of zero outcome rewards shaped by the in-reward KL of
        the rollout (``old``) log-probs."""
        import torch

        B = logp.shape[0]
        kl = self.ns["compute_approx_kl"](old.detach(), ref, kl_estimator=estimator)
        exp = types.SimpleNamespace(rewards=torch.zeros(B, dtype=logp.dtype),
                                    index=list(range(B)), action_mask=mask.bool(),
                                    kl=kl.detach(), info={}, values=None)
        maker = self.code.experience_maker("group_norm", B)
        maker.kl_ctl.value = BETA
        out = self.code.methods["compute_advantages_and_returns"](maker, [exp])
        return self.code.PolicyLoss()(logp, old, out[0].advantages.to(logp.dtype),
                                      action_mask=mask)[0]


def _coefficients(fn: Any, logp: np.ndarray, ref: np.ndarray, old: np.ndarray,
                  lengths: np.ndarray, dtype: Any) -> np.ndarray:
    return autograd_coefficients(fn, logp, ref, old, lengths, dtype=dtype, mode="token_mean")


def kl_options(tree: SourceTree, dtype: str) -> KLOptions:
    """OpenRLHF's estimators k1/k2/k3 in the reward, and in the loss with and without
    ``--algo.kl.unbiased_gradient``."""
    code = OpenRlhfKL(tree, dtype)
    cli = tree.text(CLI)
    defaults = {opt: argparse_default(cli, opt) for opt in (
        "--algo.kl.estimator", "--algo.kl.init_coef", "--algo.kl.use_loss",
        "--algo.kl.unbiased_gradient")}
    defaults["KL_IS_WEIGHT_CLIP"] = code.ns["KL_IS_WEIGHT_CLIP"]
    est0 = defaults["--algo.kl.estimator"]
    out = KLOptions(defaults=defaults)
    for est in ("k1", "k2", "k3"):
        out.settings.append(KLSetting(
            f"--algo.kl.estimator {est} (in the reward)",
            {"estimator": est, "placement": "reward_to_go", "stale": True},
            partial(_coefficients, partial(code.reward_loss, estimator=est)),
            default=est == est0 and not defaults["--algo.kl.use_loss"]))
    for est in ("k1", "k2", "k3"):
        for unbiased in (False, True):
            model: dict[str, Any] = {"estimator": est, "placement": "loss"}
            if unbiased:
                model = {"estimator": est, "placement": "loss_is_k2",
                         "weight_clip": defaults["KL_IS_WEIGHT_CLIP"]}
            out.settings.append(KLSetting(
                f"--algo.kl.use_loss --algo.kl.estimator {est}"
                + (" --algo.kl.unbiased_gradient" if unbiased else ""), model,
                partial(_coefficients, partial(code.kl_loss, estimator=est, unbiased=unbiased))))
    return out
