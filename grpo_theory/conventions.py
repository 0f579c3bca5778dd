"""How TRL, verl and OpenRLHF name and default our estimators.

:data:`CONVENTIONS` maps each framework setting to our registry estimator, its options and the
loss aggregation of :mod:`grpo_theory.aggregation`. The torch re-implementations of each
framework's formula that the tests compare against live with the tests
(``tests/framework_refs.py``), not in the core.
Every row cites the released version and file it was read in (``source``): TRL 1.16.0
(``trl/trainer/grpo_trainer.py``, ``rloo_trainer.py``, ``utils.py``, ``grpo_config.py``), verl
0.9.1 (``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``) and OpenRLHF 0.11.2
(``openrlhf/trainer/ppo_utils/experience_maker.py``, ``openrlhf/models/loss.py``); the wheels carry
no git commit. ``grpo-audit frameworks`` (the ``framework_checks`` package) runs those files'
own functions against each row; ``docs/conventions.md`` has the table and the differences
(constant float32 groups, overflow, NaN rewards, empty completions, policy losses at ratio 1).
Older releases differ (e.g. TRL's ``scale_rewards`` was a bool; OpenRLHF once whitened ``rloo``
too; an older verl commit made ``seq-mean-token-sum-norm`` ``P R`` times ``dr_grpo``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .aggregation import POLICY_LOSSES

__all__ = [
    "Convention",
    "CONVENTIONS",
    "TrlLossType",
    "TRL_LOSS_TYPES",
    "TRL_LOSS_AGGREGATION",
    "conventions_markdown",
]


@dataclass(frozen=True)
class Convention:
    """One framework setting and its equivalent in this library."""

    framework: str
    setting: str
    estimator: str | None
    options: dict[str, Any] = field(default_factory=dict)
    std_correction: str = "-"
    eps: float | None = None
    std_scope: str = "-"
    aggregation: str | None = None
    is_default: bool = False
    notes: str = ""
    source: str = ""


_TRL = "TRL 1.16.0 trl/trainer/grpo_trainer.py"
_TRL_RLOO = "TRL 1.16.0 trl/trainer/rloo_trainer.py"
_VERL = "verl 0.9.1 verl/trainer/ppo/core_algos.py"
_ORL = "OpenRLHF 0.11.2 openrlhf/trainer/ppo_utils/experience_maker.py"
_ORL_LOSS = "OpenRLHF 0.11.2 openrlhf/models/loss.py (PolicyLoss, aggregate_loss)"
_SKIP = "sequences counted: non-empty only (empty_completions='skip')"


def _agg(framework: str, setting: str, aggregation: str, source: str, **kw: Any) -> Convention:
    return Convention(framework, setting, None, {}, aggregation=aggregation, source=source, **kw)


@dataclass(frozen=True)
class TrlLossType:
    """One value of TRL 1.16.0's ``GRPOConfig(loss_type=...)`` and how this library reads it
    (``trl/trainer/grpo_trainer.py``, ``_compute_loss``; ``trl/trainer/grpo_config.py``).

    Attributes:
        loss_type: the ``GRPOConfig.loss_type`` value.
        aggregation: the :mod:`grpo_theory.aggregation` mode of a loss whose per-token term is
            PPO's clipped ratio (``None`` for the policy losses, whose mode at ratio 1 is that
            of :data:`grpo_theory.aggregation.POLICY_LOSSES`).
        policy_loss: the key of :data:`~grpo_theory.aggregation.POLICY_LOSSES` for a loss that
            replaces the clipped ratio (``None`` otherwise).
        policy_options: the options of :func:`~grpo_theory.aggregation.policy_loss_weights` at
            TRL's defaults (CISPO: ``epsilon_high = epsilon = 0.2``).
        normaliser_scope: what the loss's normaliser counts: ``"micro_batch"`` (the tokens or
            sequences of the micro-batch the loss is computed on) or ``"generation_batch"``
            (the active tokens of the whole generation batch, ``num_items_in_batch``).
        config: the other ``GRPOConfig`` options the loss type needs (LUSPO: a sequence-level
            importance ratio).
        is_default: TRL's default ``loss_type``.
        notes: what the row of :data:`CONVENTIONS` says beside it.
    """

    loss_type: str
    aggregation: str | None
    normaliser_scope: str
    policy_loss: str | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    is_default: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        if (self.aggregation is None) == (self.policy_loss is None):
            raise ValueError(f"{self.loss_type}: give exactly one of aggregation, policy_loss")
        if self.policy_loss is not None and self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"{self.loss_type}: unknown policy loss {self.policy_loss!r}")
        if self.normaliser_scope not in ("micro_batch", "generation_batch"):
            raise ValueError(f"{self.loss_type}: unknown scope {self.normaliser_scope!r}")

    @property
    def mode(self) -> str:
        """The aggregation mode whose weights the loss has at ratio 1."""
        return self.aggregation or POLICY_LOSSES[str(self.policy_loss)][0]

    @property
    def setting(self) -> str:
        """The ``GRPOConfig(...)`` that selects it, as the conventions table and the framework
        audit name it."""
        extra = "".join(f', {k}="{v}"' for k, v in self.config.items())
        return f'GRPOConfig(loss_type="{self.loss_type}"{extra})'


TRL_LOSS_TYPES: dict[str, TrlLossType] = {
    lt.loss_type: lt
    for lt in (
        TrlLossType("dapo", "token_mean", "generation_batch", is_default=True,
                    notes="normalised by active tokens of the global batch"),
        TrlLossType("bnpo", "token_mean", "micro_batch", notes="local batch"),
        TrlLossType("grpo", "sequence_mean", "micro_batch"),
        TrlLossType("dr_grpo", "dr_grpo", "micro_batch",
                    notes="max_tokens = max_completion_length"),
        TrlLossType("cispo", None, "generation_batch", policy_loss="cispo",
                    policy_options={"epsilon_high": 0.2},
                    notes="ratio capped at epsilon_high itself: weight x min(1, epsilon_high) "
                    "(x 0.2 with the default epsilon_high = epsilon = 0.2)"),
        TrlLossType("sapo", None, "micro_batch", policy_loss="sapo",
                    notes="gate slope 1 at ratio 1"),
        TrlLossType("luspo", None, "micro_batch", policy_loss="luspo",
                    config={"importance_sampling_level": "sequence"}),
        TrlLossType("vespo", None, "generation_batch", policy_loss="vespo",
                    notes="phi(1) = 1, detached"),
    )
}
"""TRL's loss types, the one table: the conventions rows, the framework audit, the in-training
geometry (:data:`TRL_LOSS_AGGREGATION`) and the tests read it."""

TRL_LOSS_AGGREGATION: dict[str, tuple[str, str]] = {
    name: (lt.mode, lt.normaliser_scope) for name, lt in TRL_LOSS_TYPES.items()
}
"""``loss_type -> (aggregation mode at ratio 1, normaliser scope)``, from :data:`TRL_LOSS_TYPES`."""


CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "TRL",
        'GRPOConfig(scale_rewards="group")',
        "grpo_std",
        {"ddof": 1, "eps": 1e-4, "std_scope": "group"},
        "ddof=1 (nanstd, Bessel)",
        1e-4,
        "group",
        None,
        True,
        "NaN rewards excluded, advantage 0: nan_excluding_advantages",
        _TRL,
    ),
    Convention(
        "TRL",
        'GRPOConfig(scale_rewards="batch")',
        "grpo_std",
        {"ddof": 1, "eps": 1e-4, "std_scope": "batch"},
        "ddof=1",
        1e-4,
        "batch",
        None,
        False,
        "group mean, std of the whole (global) batch",
        _TRL,
    ),
    Convention(
        "TRL",
        'GRPOConfig(scale_rewards="none")',
        "grpo",
        {},
        notes="Dr.GRPO advantage",
        source=_TRL,
    ),
    Convention(
        "TRL",
        'GRPOConfig(multi_objective_aggregation="normalize_then_sum")',
        None,
        {},
        "ddof=1",
        1e-4,
        "group, then batch",
        notes="GDPO: gdpo_advantages(rewards_per_func [P, R, K])",
        source=_TRL,
    ),
    Convention("TRL", "RLOOConfig()", "rloo", {}, is_default=True, source=_TRL_RLOO),
    Convention(
        "TRL",
        "RLOOConfig(normalize_advantages=True)",
        "rloo_normalized",
        {"eps": 1e-4},
        "ddof=1",
        1e-4,
        "batch",
        notes="rloo, then (A - mean) / (std + 1e-4) over the batch",
        source=_TRL_RLOO,
    ),
    _agg("TRL", "RLOOTrainer loss", "sequence_sum", _TRL_RLOO, notes="per-sequence ratio, mean"),
    *(_agg("TRL", lt.setting, lt.policy_loss or lt.aggregation, _TRL, is_default=lt.is_default,
           notes=lt.notes) for lt in TRL_LOSS_TYPES.values()),
    _agg(
        "TRL",
        'GRPOConfig(importance_sampling_level="sequence", loss_type="grpo")',
        "gspo",
        _TRL,
        notes="GSPO; with dapo/bnpo/dr_grpo the weights stay those of the loss_type",
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=True",
        "grpo_std",
        {"ddof": 1, "eps": 1e-6, "std_scope": "group"},
        "ddof=1 (torch.std)",
        1e-6,
        "group",
        None,
        True,
        "one-sample group: mean 0, std 1 (we need R >= 2; grouped_advantages(singleton='raw'))",
        _VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=False",
        "grpo",
        {},
        notes="Dr.GRPO advantage",
        source=_VERL,
    ),
    Convention("verl", "algorithm.adv_estimator=rloo", "rloo", {}, source=_VERL),
    Convention(
        "verl",
        "algorithm.adv_estimator=reinforce_plus_plus (gamma=1)",
        "reinforce_plus_plus",
        {"eps": 1e-8},
        "ddof=1 over tokens",
        1e-8,
        "batch (tokens)",
        notes="no baseline; masked_whiten: pass lengths",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=reinforce_plus_plus_baseline",
        "reinforce_plus_plus_baseline",
        {"eps": 1e-8},
        "ddof=1 over tokens",
        1e-8,
        "batch (tokens)",
        notes="group mean, then masked_whiten: pass lengths",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=opo",
        "opo",
        {},
        notes="length-weighted group baseline: pass lengths",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=gpg",
        "gpg",
        {"f_norm": 1.0},
        notes="alpha = batch size / nonzero rewards (couples groups)",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=grpo_passk",
        "grpo_passk",
        {"normalize_std": True, "eps": 1e-6},
        "ddof=1 (torch.std)",
        1e-6,
        "group",
        notes="only the unique best: (r_max - r_2nd) / (std + eps)",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=remax",
        None,
        {},
        notes="remax_advantages(greedy_rewards=...): needs the greedy rollout's reward",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=optimal_token_baseline",
        None,
        {},
        notes="optimal_token_baseline_advantages: needs token probabilities and sum pi^2",
        source=_VERL,
    ),
    Convention(
        "verl",
        "algorithm.adv_estimator=gdpo",
        None,
        {},
        "ddof=1",
        1e-6,
        "group, then batch (tokens)",
        notes="grpo_std per reward key, weighted sum, masked_whiten",
        source=_VERL,
    ),
    _agg(
        "verl",
        "actor.loss_agg_mode=token-mean",
        "token_mean",
        _VERL + " (agg_loss)",
        is_default=True,
    ),
    _agg("verl", "actor.loss_agg_mode=token-sum", "token_sum", _VERL + " (agg_loss)"),
    _agg(
        "verl",
        "actor.loss_agg_mode=seq-mean-token-mean",
        "sequence_mean",
        _VERL + " (agg_loss)",
        notes=_SKIP + "; divides by L_i + 1e-8",
    ),
    _agg(
        "verl",
        "actor.loss_agg_mode=seq-mean-token-sum",
        "sequence_sum",
        _VERL + " (agg_loss)",
        notes=_SKIP,
    ),
    _agg(
        "verl",
        "actor.loss_agg_mode=seq-mean-token-sum-norm",
        "dr_grpo",
        _VERL + " (agg_loss)",
        notes="max_tokens = loss_scale_factor (default: padded response width); " + _SKIP,
    ),
    _agg(
        "verl",
        "actor.policy_loss.loss_mode=gspo",
        "gspo",
        _VERL,
        notes="sg-trick ratio: at ratio 1 the weights of loss_agg_mode (default token-mean)",
    ),
    _agg(
        "verl",
        "actor.policy_loss.loss_mode=sapo",
        "sapo",
        _VERL,
        notes="forces seq-mean-token-mean; " + _SKIP,
    ),
    _agg(
        "verl",
        "actor.policy_loss.loss_mode=cispo",
        "cispo",
        _VERL,
        notes="clip to [1 - eps, 1 + eps]: factor 1 at ratio 1; keeps loss_agg_mode",
    ),
    Convention(
        "OpenRLHF",
        "--algo.advantage.estimator group_norm",
        "grpo_std",
        {"ddof": 1, "eps": 1e-9, "std_scope": "group"},
        "ddof=1 (torch.std)",
        1e-9,
        "group",
        None,
        False,
        "no batch whitening afterwards",
        _ORL,
    ),
    Convention(
        "OpenRLHF",
        "--algo.advantage.estimator dr_grpo",
        "grpo",
        {},
        notes="mean subtraction only; loss aggregation unchanged (token mean)",
        source=_ORL,
    ),
    Convention("OpenRLHF", "--algo.advantage.estimator rloo", "rloo", {}, source=_ORL),
    Convention(
        "OpenRLHF",
        "--algo.advantage.estimator reinforce_baseline",
        "reinforce_baseline",
        {"eps": 1e-8},
        "ddof=0 over tokens",
        1e-8,
        "batch (tokens)",
        notes="group mean, then token whitening, var.clamp(min=1e-8): pass lengths",
        source=_ORL,
    ),
    Convention(
        "OpenRLHF",
        "--algo.advantage.estimator flash_reinforce",
        "flash_reinforce",
        {},
        "-",
        None,
        "batch",
        notes="r - mean of the whole rollout batch; no whitening",
        source=_ORL,
    ),
    _agg(
        "OpenRLHF",
        "token_level_loss=True (PolicyLoss default)",
        "token_mean",
        _ORL_LOSS,
        is_default=True,
    ),
    _agg("OpenRLHF", "token_level_loss=False", "sequence_mean", _ORL_LOSS, notes=_SKIP),
    _agg(
        "OpenRLHF",
        'policy_loss_type="gspo"',
        "gspo",
        _ORL_LOSS,
        notes="forces token_level_loss=False; " + _SKIP,
    ),
)
"""Framework settings -> (estimator, options, aggregation); ``is_default`` marks defaults."""


def conventions_markdown() -> str:
    """The :data:`CONVENTIONS` table as Markdown (used by ``docs/conventions.md``)."""
    cols = ["framework", "setting", "our estimator", "options", "std", "eps", "scope"]
    cols += ["aggregation", "default", "notes", "source (version, file)"]
    head = "| " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * len(cols)]
    for c in CONVENTIONS:
        opts = ", ".join(f"{k}={v}" for k, v in c.options.items()) or "-"
        lines.append(
            f"| {c.framework} | `{c.setting}` | {c.estimator or '-'} | {opts} | "
            f"{c.std_correction} | "
            f"{c.eps if c.eps is not None else '-'} | {c.std_scope} | {c.aggregation or '-'} | "
            f"{'yes' if c.is_default else ''} | {c.notes} | {c.source} |"
        )
    return "\n".join(lines) + "\n"
