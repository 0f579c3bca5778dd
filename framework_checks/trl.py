"""TRL's own code (1.16.0: ``trl/trainer/grpo_trainer.py``, ``rloo_trainer.py``, ``utils.py``).

Advantages: the block of ``GRPOTrainer._generate_and_score_completions`` (and the same block of
``RLOOTrainer``) that turns ``rewards_per_func`` into advantages, executed as TRL wrote it.
Losses: ``GRPOTrainer._compute_loss`` and ``RLOOTrainer._compute_loss`` on a stub trainer
(:class:`TrlCode.trainer`) whose attributes are TRL's defaults, with the per-token log-probs
given; the weights are read off by autograd (:func:`framework_checks.adapter.loss_weights`).
"""

from __future__ import annotations

import math
import types
from collections import defaultdict
from functools import partial
from typing import Any

import numpy as np

from .adapter import FrameworkCode, loss_weights, torch_dtype
from .extract import exec_defs, source_block
from .source import SourceTree

__all__ = ["TrlCode", "load"]

#: The lines of the trainers' advantage computation (from the first to the last).
ADVANTAGE_BLOCK = ("unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
                   "advantages = torch.nan_to_num(advantages, nan=0.0)")

#: ``GRPOTrainer`` attributes ``_compute_loss`` reads, at TRL's defaults (beta 0: no KL term).
TRAINER_DEFAULTS: dict[str, Any] = {
    "top_entropy_quantile": 1.0,
    "off_policy_mask_threshold": None,
    "importance_sampling_level": "token",
    "beta": 0.0,
    "epsilon_low": 0.2,
    "epsilon_high": 0.2,
    "use_vllm": False,
    "vllm_importance_sampling_correction": False,
    "current_gradient_accumulation_steps": 1,
    "_entropy_bonus_enabled": False,
    "aux_loss_enabled": False,
}
#: ``GRPOConfig`` fields ``_compute_loss`` reads, at TRL's defaults.
CONFIG_DEFAULTS: dict[str, Any] = {
    "delta": None,
    "sapo_temperature_pos": 1.0,
    "sapo_temperature_neg": 1.05,
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
    "use_bias_correction_kl": False,
    "steps_per_generation": 1,
}


class SingleProcessAccelerator:
    """The ``accelerator`` of one process: gathering and reducing return their input."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x: Any) -> Any:
        return x

    gather_for_metrics = gather

    def reduce(self, x: Any, reduction: str = "sum") -> Any:
        return x


def loss_inputs(logp: Any, mask: Any, A: Any, **extra: Any) -> dict[str, Any]:
    """The batch dict TRL's ``_compute_loss`` reads: dummy one-token prompts, the completion
    mask and advantages, plus ``extra`` entries."""
    import torch

    B, T = logp.shape
    return {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": A,
        **extra,
    }


class TrlCode:
    """TRL's advantage block and loss methods, executed from its source in ``dtype``."""

    def __init__(self, tree: SourceTree, dtype: str) -> None:
        import torch

        g_src = tree.text("trl/trainer/grpo_trainer.py")
        r_src = tree.text("trl/trainer/rloo_trainer.py")
        self.ns: dict[str, Any] = {"torch": torch, "math": math}
        exec_defs(tree.text("trl/trainer/utils.py"), ["nanstd", "nanmin", "nanmax"], self.ns)
        self.grpo_block = compile(source_block(g_src, *ADVANTAGE_BLOCK),
                                  "<trl grpo advantages>", "exec")
        self.rloo_block = compile(source_block(r_src, *ADVANTAGE_BLOCK),
                                  "<trl rloo advantages>", "exec")
        self.dtype = torch_dtype(dtype)
        self.grpo_methods = exec_defs(
            g_src,
            ["_compute_loss", "get_gamma_weights", "get_high_entropy_mask", "get_off_policy_mask"],
            dict(self.ns),
            cls="GRPOTrainer",
        )
        self.rloo_methods = exec_defs(r_src, ["_compute_loss"], dict(self.ns), cls="RLOOTrainer")

    # --- advantages ---------------------------------------------------------------------------
    def _run_block(self, block: Any, trainer: Any, per_func: np.ndarray) -> np.ndarray:
        """Execute an advantage block on ``rewards_per_func [P, R, K]``; advantages ``[P, R]``."""
        import torch

        P, R, K = per_func.shape
        env = dict(self.ns, self=trainer, num_generations=R, device="cpu")
        env["rewards_per_func"] = torch.as_tensor(per_func.reshape(P * R, K), dtype=self.dtype)
        exec(block, env)  # noqa: S102
        return env["advantages"].double().numpy().reshape(P, R)

    def grpo_advantages(
        self,
        rewards: np.ndarray,
        lengths: np.ndarray,
        *,
        scale_rewards: str = "group",
        multi_objective_aggregation: str = "sum_then_normalize",
    ) -> np.ndarray:
        """``GRPOTrainer``'s advantages (rewards ``[P, R]``, or ``[P, R, K]`` per function)."""
        import torch

        r = np.asarray(rewards, dtype=np.float64)
        per_func = r[..., None] if r.ndim == 2 else r
        K = per_func.shape[2]
        trainer = types.SimpleNamespace(
            multi_objective_aggregation=multi_objective_aggregation,
            scale_rewards=scale_rewards,
            reward_weights=torch.ones(K, dtype=torch.float32),
            reward_funcs=[None] * K,
        )
        return self._run_block(self.grpo_block, trainer, per_func)

    def rloo_advantages(
        self, rewards: np.ndarray, lengths: np.ndarray, *, normalize_advantages: bool = False
    ) -> np.ndarray:
        """``RLOOTrainer``'s advantages."""
        import torch

        r = np.asarray(rewards, dtype=np.float64)
        trainer = types.SimpleNamespace(
            reward_weights=torch.ones(1, dtype=torch.float32),
            reward_clip_range=None,
            beta=0.0,
            normalize_advantages=normalize_advantages,
        )
        return self._run_block(self.rloo_block, trainer, r[..., None])

    # --- losses -------------------------------------------------------------------------------
    def trainer(self, logp: Any, **attrs: Any) -> types.SimpleNamespace:
        """A stub ``GRPOTrainer`` at TRL's defaults (:data:`TRAINER_DEFAULTS`, ``attrs`` over
        them) whose model returns ``logp`` as the per-token log-probs."""
        import torch

        s = types.SimpleNamespace(**TRAINER_DEFAULTS)
        s.__dict__.update(
            model=types.SimpleNamespace(training=True),
            accelerator=SingleProcessAccelerator(),
            _metrics=defaultdict(lambda: defaultdict(list)),
            max_completion_length=logp.shape[1],
            get_gamma_weights=self.grpo_methods["get_gamma_weights"],
            args=types.SimpleNamespace(**CONFIG_DEFAULTS),
        )
        s.__dict__.update(attrs)
        s._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
        s.get_high_entropy_mask = types.MethodType(self.grpo_methods["get_high_entropy_mask"], s)
        s.get_off_policy_mask = self.grpo_methods["get_off_policy_mask"]
        return s

    def _grpo_loss_value(self, logp: Any, mask: Any, A: Any, *, loss_type: str,
                         importance_sampling_level: str, epsilon_high: float | None,
                         max_completion_length: int | None) -> Any:
        s = self.trainer(
            logp,
            loss_type=loss_type,
            importance_sampling_level=importance_sampling_level,
            epsilon_high=0.2 if epsilon_high is None else epsilon_high,
            max_completion_length=max_completion_length or logp.shape[1],
        )
        inputs = loss_inputs(logp, mask, A, num_items_in_batch=mask.sum())
        return self.grpo_methods["_compute_loss"](s, None, inputs)

    def grpo_loss(
        self,
        lengths: np.ndarray,
        advantages: np.ndarray,
        *,
        loss_type: str = "dapo",
        importance_sampling_level: str = "token",
        epsilon_high: float | None = None,
        max_completion_length: int | None = None,
    ) -> np.ndarray:
        """Per-sequence weights of ``GRPOTrainer._compute_loss`` with these ``GRPOConfig``
        options, at ratio 1."""
        width = max(int(lengths.max()), 1)
        if max_completion_length is not None:
            width = max(width, max_completion_length)
        value = partial(self._grpo_loss_value, loss_type=loss_type,
                        importance_sampling_level=importance_sampling_level,
                        epsilon_high=epsilon_high, max_completion_length=max_completion_length)
        return loss_weights(value, lengths, advantages, width)

    def _rloo_loss_value(self, logp: Any, mask: Any, A: Any) -> Any:
        inputs = loss_inputs(logp, mask, A, old_logps=(logp.detach() * mask).sum(1))
        return self.rloo_methods["_compute_loss"](self.trainer(logp), None, inputs)

    def rloo_loss(self, lengths: np.ndarray, advantages: np.ndarray, **_: Any) -> np.ndarray:
        """Per-sequence weights of ``RLOOTrainer._compute_loss`` at ratio 1."""
        return loss_weights(self._rloo_loss_value, lengths, advantages,
                            max(int(lengths.max()), 1))


def load(tree: SourceTree, dtype: str) -> FrameworkCode:
    """TRL's advantage settings and loss types, keyed by the config that selects them."""
    code = TrlCode(tree, dtype)
    fc = FrameworkCode("trl", tree.version, tree.origin, tree.commit, dtype)
    for sr in ("group", "batch", "none"):
        fc.advantages[f'GRPOConfig(scale_rewards="{sr}")'] = partial(
            code.grpo_advantages, scale_rewards=sr)
    fc.advantages['GRPOConfig(multi_objective_aggregation="normalize_then_sum")'] = partial(
        code.grpo_advantages, multi_objective_aggregation="normalize_then_sum")
    fc.advantages["RLOOConfig()"] = code.rloo_advantages
    fc.advantages["RLOOConfig(normalize_advantages=True)"] = partial(
        code.rloo_advantages, normalize_advantages=True)
    for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo"):
        fc.losses[f'GRPOConfig(loss_type="{lt}")'] = partial(code.grpo_loss, loss_type=lt)
    fc.losses['GRPOConfig(loss_type="cispo", epsilon_high=5.0)'] = partial(
        code.grpo_loss, loss_type="cispo", epsilon_high=5.0)
    fc.losses['GRPOConfig(loss_type="luspo", importance_sampling_level="sequence")'] = partial(
        code.grpo_loss, loss_type="luspo", importance_sampling_level="sequence")
    fc.losses['GRPOConfig(loss_type="grpo", importance_sampling_level="sequence") (GSPO)'] = (
        partial(code.grpo_loss, loss_type="grpo", importance_sampling_level="sequence"))
    fc.losses["RLOOTrainer loss"] = code.rloo_loss
    return fc
