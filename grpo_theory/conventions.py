"""How TRL, verl and OpenRLHF name and default our estimators.

:data:`CONVENTIONS` maps each framework setting to our registry estimator, its options and the
loss aggregation of :mod:`grpo_theory.aggregation`. The torch re-implementations of each
framework's formula that the tests compare against live with the tests
(``tests/framework_refs.py``), not in the core.
Sources (read at the commits below; cite file and function):

* TRL ``huggingface/trl`` @ ``f2cd577``: ``trl/trainer/grpo_trainer.py``
  (``GRPOTrainer._generate_and_score_completions``: group mean via ``view(-1, num_generations)``,
  ``nanstd`` with Bessel's correction, ``advantages / (std_rewards + 1e-4)``; ``_compute_loss``:
  ``loss_type`` reductions), ``trl/trainer/grpo_config.py`` (``scale_rewards="group"``,
  ``loss_type="dapo"`` defaults), ``trl/trainer/utils.py`` (``nanstd``).
* verl ``volcengine/verl`` @ ``b178a3c``: ``verl/trainer/ppo/core_algos.py``
  (``compute_grpo_outcome_advantage``: ``torch.std`` (ddof 1), ``epsilon=1e-6``,
  ``norm_adv_by_std_in_grpo=True``; a one-sample group gets mean 0, std 1;
  ``compute_rloo_outcome_advantage``; ``agg_loss``), ``verl/trainer/config/actor/actor.yaml``
  (``loss_agg_mode: token-mean``).
* OpenRLHF ``OpenRLHF/OpenRLHF`` @ ``3c3be62``: ``openrlhf/trainer/ppo_utils/experience_maker.py``
  (reward shaping: ``group_norm`` ``(r - mean) / (std + 1e-9)`` with ``torch.std`` (ddof 1),
  ``rloo``, ``dr_grpo``/``reinforce_baseline`` mean subtraction; batch whitening only for
  ``gae``, ``reinforce``, ``reinforce_baseline``), ``openrlhf/cli/train_ppo_ray.py``
  (``--algo.advantage.estimator``, default ``gae``), ``openrlhf/models/loss.py``
  (``aggregate_loss``, ``token_level_loss=True`` default).

Older releases differ (e.g. TRL's ``scale_rewards`` was a bool; OpenRLHF once whitened ``rloo``
too); the table records the commits above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Convention",
    "CONVENTIONS",
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


_TRL = "huggingface/trl trl/trainer/grpo_trainer.py"
_VERL = "volcengine/verl verl/trainer/ppo/core_algos.py"
_ORL = "OpenRLHF/OpenRLHF openrlhf/trainer/ppo_utils/experience_maker.py"

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
        "zero-std group -> 0/(0+1e-4) = 0",
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
        "-",
        None,
        "-",
        None,
        False,
        "Dr.GRPO advantage",
        _TRL,
    ),
    Convention(
        "TRL",
        'GRPOConfig(loss_type="dapo")',
        None,
        {},
        aggregation="token_mean",
        is_default=True,
        notes="normalised by active tokens of the global batch",
        source=_TRL,
    ),
    Convention(
        "TRL",
        'GRPOConfig(loss_type="bnpo")',
        None,
        {},
        aggregation="token_mean",
        notes="tokens of the local batch",
        source=_TRL,
    ),
    Convention(
        "TRL", 'GRPOConfig(loss_type="grpo")', None, {}, aggregation="sequence_mean", source=_TRL
    ),
    Convention(
        "TRL",
        'GRPOConfig(loss_type="dr_grpo")',
        None,
        {},
        aggregation="dr_grpo",
        notes="max_tokens = max_completion_length",
        source=_TRL,
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
        "one-sample group: mean 0, std 1 (we need R >= 2)",
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
        "actor.loss_agg_mode=token-mean",
        None,
        aggregation="token_mean",
        is_default=True,
        source=_VERL + " (agg_loss)",
    ),
    Convention(
        "verl",
        "actor.loss_agg_mode=seq-mean-token-mean",
        None,
        aggregation="sequence_mean",
        source=_VERL + " (agg_loss)",
    ),
    Convention(
        "verl",
        "actor.loss_agg_mode=seq-mean-token-sum",
        None,
        aggregation="sequence_sum",
        source=_VERL + " (agg_loss)",
    ),
    Convention(
        "verl",
        "actor.loss_agg_mode=seq-mean-token-sum-norm",
        None,
        aggregation="dr_grpo",
        notes="sum / loss_scale_factor: our dr_grpo times P*R",
        source=_VERL,
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
        None,
        {},
        notes="grpo, then token-weighted batch whitening (not a registry estimator)",
        source=_ORL,
    ),
    Convention(
        "OpenRLHF",
        "token_level_loss=True (PolicyLoss default)",
        None,
        aggregation="token_mean",
        is_default=True,
        source="OpenRLHF/OpenRLHF openrlhf/models/loss.py (aggregate_loss)",
    ),
    Convention(
        "OpenRLHF",
        "token_level_loss=False",
        None,
        aggregation="sequence_mean",
        source="OpenRLHF/OpenRLHF openrlhf/models/loss.py (aggregate_loss)",
    ),
)
"""Framework settings -> (estimator, options, aggregation); ``is_default`` marks defaults."""


def conventions_markdown() -> str:
    """The :data:`CONVENTIONS` table as Markdown (used by ``docs/conventions.md``)."""
    cols = ["framework", "setting", "our estimator", "options", "std", "eps", "scope"]
    cols += ["aggregation", "default", "notes"]
    head = "| " + " | ".join(cols) + " |"
    lines = [head, "|" + "---|" * 10]
    for c in CONVENTIONS:
        opts = ", ".join(f"{k}={v}" for k, v in c.options.items()) or "-"
        lines.append(
            f"| {c.framework} | `{c.setting}` | {c.estimator or '-'} | {opts} | "
            f"{c.std_correction} | "
            f"{c.eps if c.eps is not None else '-'} | {c.std_scope} | {c.aggregation or '-'} | "
            f"{'yes' if c.is_default else ''} | {c.notes} |"
        )
    return "\n".join(lines) + "\n"
