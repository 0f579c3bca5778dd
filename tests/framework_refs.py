"""Torch re-implementations of TRL, verl and OpenRLHF formulas, used only as test references.

Each function re-implements one framework's formula in our own words, with the framework's flat
batch layout, so tests can check that ``compute_advantages(estimator, rewards.view(P, R),
**options)`` reproduces it. The sources (repository, commit, file and function) are listed in
:mod:`grpo_theory.conventions`. Not part of the library's API: moved out of ``grpo_theory``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "reference_trl_grpo_advantages",
    "reference_verl_grpo_outcome_advantages",
    "reference_verl_rloo_outcome_advantages",
    "reference_openrlhf_shaped_rewards",
    "reference_loss",
]


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
    ``seq-mean-token-sum``, ``seq-mean-token-sum-norm`` (verl 0.9.1 ``agg_loss``:
    sum / non-empty sequences / max_tokens, ``max_tokens`` = ``loss_scale_factor``), ``token-sum``.
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
        return tok.sum() / (n > 0).sum() / max_tokens
    if key == ("verl", "token-sum"):
        return (x * m).sum()
    raise ValueError(f"unknown reduction {key}")
