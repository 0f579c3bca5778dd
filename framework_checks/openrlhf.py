"""OpenRLHF's own code (0.11.2: ``openrlhf/trainer/ppo_utils/experience_maker.py``,
``openrlhf/models/loss.py``, ``openrlhf/models/utils.py``).

Advantages: ``RemoteExperienceMaker.compute_advantages_and_returns`` (and
``get_cumulative_returns``) on a stub experience maker whose arguments select the estimator;
losses: ``PolicyLoss`` from ``loss.py``, executed as a module with its package stubbed.
"""

from __future__ import annotations

import itertools
import types
from functools import partial
from typing import Any

import numpy as np

from .adapter import FrameworkCode, completion_masks, loss_weights, per_sequence, torch_dtype
from .extract import exec_defs, stub_modules
from .source import SourceTree

__all__ = ["OpenRlhfCode", "load"]

ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline", "flash_reinforce")

#: Loss settings -> ``PolicyLoss`` options.
LOSSES: dict[str, dict[str, Any]] = {
    "token_level_loss=True (PolicyLoss default)": {},
    "token_level_loss=False": {"token_level_loss": False},
    'policy_loss_type="gspo"': {"policy_loss_type": "gspo"},
}


def _quiet(*a: Any, **k: Any) -> None:
    return None


class OpenRlhfCode:
    """OpenRLHF's experience-maker methods and ``PolicyLoss``, run on our layout in ``dtype``."""

    def __init__(self, tree: SourceTree, dtype: str) -> None:
        import torch

        ns: dict[str, Any] = {"torch": torch, "itertools": itertools, "List": list,
                              "Tuple": tuple, "Optional": Any, "Union": Any}
        exec_defs(tree.text("openrlhf/models/utils.py"), ["compute_reward", "masked_mean"], ns)
        ns["apply_length_penalties"] = lambda experiences, args: None  # length penalties off
        ns["logger"] = types.SimpleNamespace(warning=_quiet, info=_quiet)
        self.methods = exec_defs(
            tree.text("openrlhf/trainer/ppo_utils/experience_maker.py"),
            ["compute_advantages_and_returns", "get_cumulative_returns"],
            ns,
            cls="RemoteExperienceMaker",
        )
        self.PolicyLoss = self._policy_loss_class(tree.text("openrlhf/models/loss.py"),
                                                  ns["masked_mean"])
        self.dtype = torch_dtype(dtype)

    @staticmethod
    def _policy_loss_class(source: str, masked_mean: Any) -> Any:
        """``loss.py`` executed as ``openrlhf.models.loss`` with its package stubbed."""
        lmod = types.ModuleType("openrlhf.models.loss")
        lmod.__dict__["__package__"] = "openrlhf.models"
        umod = types.ModuleType("openrlhf.models.utils")
        umod.masked_mean = masked_mean  # type: ignore[attr-defined]
        pkg = types.ModuleType("openrlhf")
        pkg.__path__ = []  # type: ignore[attr-defined]
        sub = types.ModuleType("openrlhf.models")
        sub.__path__ = []  # type: ignore[attr-defined]
        with stub_modules({"openrlhf": pkg, "openrlhf.models": sub, "openrlhf.models.utils": umod}):
            exec(compile(source, "openrlhf/models/loss.py", "exec"), lmod.__dict__)  # noqa: S102
        return lmod.PolicyLoss

    def experience_maker(self, estimator: str, group_size: int) -> types.SimpleNamespace:
        """A stub ``RemoteExperienceMaker`` whose arguments select ``estimator`` (gamma 1)."""
        args = types.SimpleNamespace(
            algo=types.SimpleNamespace(advantage=types.SimpleNamespace(
                estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)),
            rollout=types.SimpleNamespace(n_samples_per_prompt=group_size),
            reward=types.SimpleNamespace(clip_range=None),
        )
        maker = types.SimpleNamespace(strategy=types.SimpleNamespace(args=args),
                                      advantage_estimator=estimator,
                                      kl_ctl=types.SimpleNamespace(value=0.0))
        maker.get_cumulative_returns = types.MethodType(self.methods["get_cumulative_returns"],
                                                        maker)
        return maker

    def advantage(self, rewards: np.ndarray, lengths: np.ndarray, *, estimator: str
                  ) -> np.ndarray:
        """``--algo.advantage.estimator <estimator>``'s per-sequence advantage."""
        import torch

        r = np.asarray(rewards, dtype=np.float64)
        P, R = r.shape
        L = np.asarray(lengths).reshape(-1)
        T = max(int(L.max()), 1)
        exp = types.SimpleNamespace(
            rewards=torch.as_tensor(r.reshape(-1), dtype=self.dtype),
            index=list(range(P * R)),
            action_mask=completion_masks(L, T).bool(),
            kl=torch.zeros(P * R, T, dtype=self.dtype),
            info={},
            values=None,
        )
        out = self.methods["compute_advantages_and_returns"](
            self.experience_maker(estimator, R), [exp])
        return per_sequence(out[0].advantages, lengths)

    @staticmethod
    def _loss_value(policy_loss: Any, logp: Any, mask: Any, A: Any) -> Any:
        return policy_loss(logp, logp.detach(), A[:, None] * mask, action_mask=mask)[0]

    def policy_loss(self, lengths: np.ndarray, advantages: np.ndarray, *,
                    options: dict[str, Any], **_: Any) -> np.ndarray:
        """Per-sequence weights of ``PolicyLoss(**options)`` at ratio 1."""
        value = partial(self._loss_value, self.PolicyLoss(**options))
        return loss_weights(value, lengths, advantages, max(int(lengths.max()), 1))


def load(tree: SourceTree, dtype: str) -> FrameworkCode:
    """OpenRLHF's advantage estimators and loss modes, keyed by the option that selects them."""
    code = OpenRlhfCode(tree, dtype)
    fc = FrameworkCode("openrlhf", tree.version, tree.origin, tree.commit, dtype)
    for est in ESTIMATORS:
        fc.advantages[f"--algo.advantage.estimator {est}"] = partial(code.advantage,
                                                                     estimator=est)
    for setting, options in LOSSES.items():
        fc.losses[setting] = partial(code.policy_loss, options=options)
    return fc
