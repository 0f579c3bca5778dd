"""How TRL, verl and OpenRLHF name and default our estimators, with reference re-implementations.

:data:`CONVENTIONS` maps each framework setting to our registry estimator, its options and the
loss aggregation of :mod:`grpo_theory.aggregation`. The ``reference_*`` functions re-implement
each framework's formula in torch, in our own words, with the framework's flat batch layout, so
tests can check that ``compute_advantages(estimator, rewards.view(P, R), **options)`` reproduces
it. Sources (read at the commits below; cite file and function):

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
    "reference_trl_grpo_advantages",
    "reference_verl_grpo_outcome_advantages",
    "reference_verl_rloo_outcome_advantages",
    "reference_openrlhf_shaped_rewards",
    "reference_loss",
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
    _agg(
        "TRL",
        'GRPOConfig(loss_type="dapo")',
        "token_mean",
        _TRL,
        is_default=True,
        notes="normalised by active tokens of the global batch",
    ),
    _agg("TRL", 'GRPOConfig(loss_type="bnpo")', "token_mean", _TRL, notes="local batch"),
    _agg("TRL", 'GRPOConfig(loss_type="grpo")', "sequence_mean", _TRL),
    _agg(
        "TRL",
        'GRPOConfig(loss_type="dr_grpo")',
        "dr_grpo",
        _TRL,
        notes="max_tokens = max_completion_length",
    ),
    _agg(
        "TRL",
        'GRPOConfig(loss_type="cispo")',
        "cispo",
        _TRL,
        notes="ratio capped at epsilon_high itself: weight x min(1, epsilon_high) "
        "(x 0.2 with the default epsilon_high = epsilon = 0.2)",
    ),
    _agg("TRL", 'GRPOConfig(loss_type="sapo")', "sapo", _TRL, notes="gate slope 1 at ratio 1"),
    _agg(
        "TRL",
        'GRPOConfig(loss_type="luspo", importance_sampling_level="sequence")',
        "luspo",
        _TRL,
    ),
    _agg("TRL", 'GRPOConfig(loss_type="vespo")', "vespo", _TRL, notes="phi(1) = 1, detached"),
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


# --- reference re-implementations (torch; flat batch layouts as in each framework) --------------
def reference_trl_grpo_advantages(
    rewards: Any, *, num_generations: int, scale_rewards: str = "group"
) -> Any:
    """TRL's GRPO advantages for a flat ``[B]`` reward vector, prompt-major groups.

    ``A = r - mean_group``, divided by ``std + 1e-4`` unless ``scale_rewards="none"``; ``std`` is
    Bessel-corrected over the group (``"group"``) or over the whole batch (``"batch"``).
    """
    import torch

    r = torch.as_tensor(rewards, dtype=torch.float64)
    grouped = r.view(-1, num_generations)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale_rewards == "none":
        return centred
    if scale_rewards == "group":
        sd = grouped.std(dim=1, unbiased=True).repeat_interleave(num_generations)
    elif scale_rewards == "batch":
        sd = r.std(unbiased=True).expand_as(r)
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    return centred / (sd + 1e-4)


def _groups(index: Any) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    for pos, key in enumerate(list(index)):
        out.setdefault(key.item() if hasattr(key, "item") else key, []).append(pos)
    return out


def reference_verl_grpo_outcome_advantages(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any,
    *,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> Any:
    """verl's outcome GRPO advantage: score = sum of token rewards, grouped by ``index``.

    One-sample groups get mean 0 and std 1; otherwise mean and ``torch.std`` (ddof 1) of the
    group; the scalar is broadcast over the response mask. Returns ``[B, T]``.
    """
    import torch

    scores = torch.as_tensor(token_level_rewards, dtype=torch.float64).sum(dim=-1)
    out = scores.clone()
    for members in _groups(index).values():
        s = scores[members]
        mean, sd = (torch.tensor(0.0, dtype=s.dtype), torch.tensor(1.0, dtype=s.dtype))
        if len(members) > 1:
            mean, sd = s.mean(), s.std()
        out[members] = (s - mean) / (sd + epsilon) if norm_adv_by_std_in_grpo else s - mean
    return out[:, None] * torch.as_tensor(response_mask, dtype=torch.float64)


def reference_verl_rloo_outcome_advantages(
    token_level_rewards: Any, response_mask: Any, index: Any
) -> Any:
    """verl's RLOO: ``n/(n-1) (score - group mean)`` for groups of ``n > 1``; ``[B, T]``."""
    import torch

    scores = torch.as_tensor(token_level_rewards, dtype=torch.float64).sum(dim=-1)
    out = scores.clone()
    for members in _groups(index).values():
        n = len(members)
        if n > 1:
            s = scores[members]
            out[members] = s * n / (n - 1) - s.mean() * n / (n - 1)
    return out[:, None] * torch.as_tensor(response_mask, dtype=torch.float64)


def reference_openrlhf_shaped_rewards(
    rewards: Any, *, n_samples_per_prompt: int, estimator: str
) -> Any:
    """OpenRLHF's per-sample reward shaping (before per-token returns), flat ``[B]``.

    ``rloo``: ``r - (sum_group - r) / (n - 1)``; ``dr_grpo`` and ``reinforce_baseline``:
    ``r - mean``; ``group_norm``: ``(r - mean) / (std + 1e-9)`` (``torch.std``, ddof 1).
    (``reinforce_baseline`` is then whitened over the batch's tokens; not done here.)
    """
    import torch

    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1, n_samples_per_prompt)
    if estimator == "rloo":
        out = r - (r.sum(-1, keepdim=True) - r) / (n_samples_per_prompt - 1)
    elif estimator in ("dr_grpo", "reinforce_baseline"):
        out = r - r.mean(-1, keepdim=True)
    elif estimator == "group_norm":
        out = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)
    else:
        raise ValueError(f"unsupported OpenRLHF estimator {estimator!r}")
    return out.reshape(-1)


def reference_loss(
    per_token_loss: Any, mask: Any, *, framework: str, mode: str, max_tokens: int | None = None
) -> Any:
    """A framework's reduction of a ``[B, T]`` per-token loss to a scalar (one process).

    ``framework="trl"``: ``mode`` in ``grpo`` (mean over sequences of the per-sequence token
    mean, lengths clamped at 1), ``bnpo``/``dapo`` (sum / tokens), ``dr_grpo``
    (sum / (B max_tokens)). ``framework="verl"``: ``token-mean``, ``seq-mean-token-mean``,
    ``seq-mean-token-sum``, ``seq-mean-token-sum-norm`` (sum / max_tokens).
    """
    import torch

    x = torch.as_tensor(per_token_loss)
    m = torch.as_tensor(mask, dtype=x.dtype)
    tok = (x * m).sum(-1)
    n = m.sum(-1)
    key = (framework, mode)
    if key == ("trl", "grpo"):
        return (tok / n.clamp(min=1.0)).mean()
    if key in (("trl", "bnpo"), ("trl", "dapo"), ("verl", "token-mean")):
        return (x * m).sum() / m.sum().clamp(min=1.0)
    if key == ("trl", "dr_grpo"):
        return (x * m).sum() / (x.shape[0] * max_tokens)
    if key == ("verl", "seq-mean-token-mean"):
        return (tok / (n + 1e-8)).sum() / (n > 0).sum()
    if key == ("verl", "seq-mean-token-sum"):
        return tok.sum() / (n > 0).sum()
    if key == ("verl", "seq-mean-token-sum-norm"):
        return tok.sum() / max_tokens
    raise ValueError(f"unknown reduction {key}")
