"""Advantage estimators and options that TRL, verl and OpenRLHF ship, as pure functions.

Each function states the framework, version and file it follows. They are written from the
mathematics (not copied), in float64, with the library's conventions: rewards shaped
``[num_prompts, group_size]`` (``P x R``), keyword-only options with stated defaults, clear errors
for bad input. Where the framework's float arithmetic differs from the exact formula (eps
placements, ``torch.std`` of a constant float32 group, variance overflow) the function computes
the formula and ``grpo-audit frameworks`` measures the difference (see ``docs/conventions.md``).

Sources (read in the released wheels):

* verl 0.9.1 (``verl-0.9.1-py3-none-any.whl``), ``verl/trainer/ppo/core_algos.py``:
  ``compute_remax_outcome_advantage``, ``compute_reinforce_plus_plus_outcome_advantage``,
  ``compute_reinforce_plus_plus_baseline_outcome_advantage``, ``compute_opo_outcome_advantage``,
  ``compute_gpg_outcome_advantage``, ``compute_grpo_passk_outcome_advantage``,
  ``compute_optimal_token_baseline_advantage``, ``compute_gdpo_outcome_advantage``;
  ``verl/utils/torch_functional.py`` (``masked_whiten``: Bessel over tokens, ``rsqrt(var + 1e-8)``).
* OpenRLHF 0.11.2 (``openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl``),
  ``openrlhf/trainer/ppo_utils/experience_maker.py``
  (``RemoteExperienceMaker.compute_advantages_and_returns``: ``reinforce_baseline`` = group mean
  then token whitening with ``var.clamp(min=1e-8).rsqrt()``, ddof 0; ``flash_reinforce`` =
  reward minus the rollout-batch mean, no whitening).
* TRL 1.16.0 (``trl/trainer/rloo_trainer.py``: ``normalize_advantages``;
  ``trl/trainer/grpo_trainer.py``: ``multi_objective_aggregation="normalize_then_sum"`` (GDPO),
  NaN rewards excluded by ``nanmean``/``nanstd`` and their advantage set to 0).

Inputs beyond outcome rewards are explicit arguments: ReMax needs the greedy rollout's reward
(``greedy_rewards``), OPO and the token-whitening estimators the completion lengths
(``lengths``), the optimal token baseline token-level probabilities. All of verl's outcome
estimators here assume ``gamma = 1`` (verl's default), so every token of a completion carries the
same advantage and a per-sequence value describes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from ._backend import centred, scaled_std
from ._validate import check_finite, check_group_size, check_lengths, is_torch, real_option
from .registry import EstimatorSpec, register_estimator

__all__ = [
    "whiten",
    "remax_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "opo_advantages",
    "gpg_advantages",
    "grpo_passk_advantages",
    "reinforce_baseline_advantages",
    "flash_reinforce_advantages",
    "rloo_normalized_advantages",
    "gdpo_advantages",
    "optimal_token_baseline_advantages",
    "grouped_advantages",
    "nan_excluding_advantages",
    "FRAMEWORK_ESTIMATORS",
    "exact_grpo_passk",
    "exact_opo",
]

Array = Any
EpsMode = Literal["add_var", "clamp_var", "add_std"]


# --- helpers ------------------------------------------------------------------------------------
def _to_np(x: Any, name: str, *, ndim: int | None = 2, finite: bool = True) -> np.ndarray:
    if is_torch(x):
        x = x.detach().cpu().double().numpy()
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be numeric array-like, got {type(x)!r}") from exc
    if ndim is not None and a.ndim != ndim:
        shape = "[num_prompts, group_size]" if ndim == 2 else f"{ndim}-D"
        raise ValueError(f"{name} must be {shape}, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} has an empty axis: shape {a.shape}")
    if finite:
        check_finite(a, name=name)
    return a


def _like(out: np.ndarray, like: Any) -> Any:
    """Return ``out`` in the backend (and float dtype/device) of ``like``; refuse overflow."""
    if not np.all(np.isfinite(out)):
        raise ValueError(
            "the advantages are not representable in float64 (they overflow: rescale the rewards)"
        )
    if is_torch(like):
        import torch

        dtype = like.dtype if torch.is_floating_point(like) else torch.get_default_dtype()
        return torch.as_tensor(out, dtype=dtype, device=like.device)
    return out


def _scaled_moments(x: np.ndarray, w: np.ndarray, ddof: int) -> tuple[float, float, float]:
    """Weighted mean, ``scale`` and ``var / scale^2`` of ``x`` (weights ``w``), overflow-free.

    ``var = sum w (x - mean)^2 / sum w * N / (N - ddof)``, ``N = sum w``; computed on ``x / s``
    with ``s = max |x - mean|`` so that squares of huge or tiny values neither over- nor underflow.
    """
    N = float(w.sum())
    s0 = float(np.max(np.abs(x[w > 0]))) if np.any(w > 0) else 0.0
    s0 = s0 if s0 > 0 else 1.0
    mean = s0 * float((w * (x / s0)).sum() / N)
    c = x - mean
    s = float(np.max(np.abs(c[w > 0])))
    if s == 0:
        return mean, 1.0, 0.0
    v = float((w * (c / s) ** 2).sum() / N) * N / (N - ddof)
    return mean, s, v


def whiten(
    advantages: Array,
    *,
    lengths: Array | None = None,
    ddof: int = 1,
    eps: float = 1e-8,
    eps_mode: EpsMode = "add_var",
) -> Array:
    """Batch (token) whitening, the composable last step of several framework estimators.

    ``A'_i = (A_i - mu) / d`` over the whole batch, where each sequence counts with weight
    ``L_i`` (its completion tokens: token-level whitening, as verl and OpenRLHF do on per-token
    advantages that are constant along a completion) or 1 (``lengths=None``: sequence-level, as TRL
    RLOO's ``normalize_advantages``). ``mu = sum L_i A_i / N``, ``N = sum L_i``,
    ``var = sum L_i (A_i - mu)^2 / (N - ddof)`` and

    * ``eps_mode="add_var"``: ``d = sqrt(var + eps)`` (verl 0.9.1 ``masked_whiten``: ddof 1,
      eps 1e-8);
    * ``eps_mode="clamp_var"``: ``d = sqrt(max(var, eps))`` (OpenRLHF 0.11.2: ddof 0, eps 1e-8);
    * ``eps_mode="add_std"``: ``d = sqrt(var) + eps`` (TRL 1.16.0 ``normalize_advantages``: ddof 1,
      eps 1e-4).

    A batch whose (weighted) values are all equal gets 0. Sequences with ``L_i = 0`` do not enter
    the statistics (they have no tokens); their value is still returned by the same formula.

    Args:
        advantages: ``[P, R]`` per-sequence advantages.
        lengths: ``[P, R]`` completion lengths, or ``None`` (weight 1 each).
        ddof: delta degrees of freedom of the variance, counted in tokens. Default 1 (verl).
        eps: the stabiliser. Default 1e-8 (verl and OpenRLHF).
        eps_mode: where ``eps`` enters (see above). Default ``"add_var"`` (verl).

    Returns:
        ``[P, R]`` whitened advantages (same backend as ``advantages``).

    >>> whiten([[1.0, 3.0]], eps=0.0).tolist()
    [[-0.7071067811865475, 0.7071067811865475]]
    >>> w = whiten([[1.0, 3.0]], lengths=[[3, 1]], ddof=0, eps=0.0, eps_mode="clamp_var")
    >>> w.round(6).tolist()
    [[-0.57735, 1.732051]]
    """
    a = _to_np(advantages, "advantages")
    w = np.ones_like(a) if lengths is None else check_lengths(
        lengths, shape=a.shape, like="advantages")
    eps = real_option(eps, "eps", minimum=0.0)
    if isinstance(ddof, bool) or not isinstance(ddof, int | np.integer):
        raise TypeError(f"ddof must be an int, got {type(ddof).__name__} {ddof!r}")
    if eps_mode not in ("add_var", "clamp_var", "add_std"):
        raise ValueError(f"eps_mode must be 'add_var', 'clamp_var' or 'add_std', got {eps_mode!r}")
    if ddof < 0:
        raise ValueError(f"ddof must be >= 0, got {ddof}")
    N = float(w.sum())
    if N <= ddof:
        raise ValueError(
            f"whiten needs more than ddof={ddof} tokens in the batch, got {N:g} "
            "(the variance is undefined)"
        )
    mean, s, v = _scaled_moments(a, w, ddof)
    c = a - mean
    if v == 0:
        return _like(np.zeros_like(a), advantages)
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        # eps in units of s^2 (inf: the variance is negligible next to eps)
        t = np.float64(0.0) if eps == 0 else np.float64(eps) / np.float64(s) ** 2
    if eps_mode == "add_var":
        d = s * np.sqrt(v + t) if np.isfinite(t) else np.sqrt(eps)
    elif eps_mode == "clamp_var":
        d = s * np.sqrt(max(v, t)) if np.isfinite(t) else np.sqrt(eps)
    else:
        d = s * np.sqrt(v) + eps
    return _like(c / d, advantages)


# --- estimators on [P, R] rewards -----------------------------------------------------------------
def remax_advantages(rewards: Array, *, greedy_rewards: Array) -> Array:
    """ReMax (Li et al. 2023, arXiv 2310.10505): ``A_i = r_i - b_p``, ``b_p`` the greedy reward.

    verl 0.9.1 ``compute_remax_outcome_advantage``: the baseline is the reward of the prompt's
    greedy (argmax) decoding, which the trainer generates separately. It is not a function of the
    sampled rewards, so it is an input here (``greedy_rewards``), and ReMax is not a registry
    estimator.

    Args:
        rewards: ``[P, R]`` rewards, any ``R >= 1``.
        greedy_rewards: ``[P]`` (one per prompt) or ``[P, R]`` (verl's per-sample layout).

    Returns:
        ``[P, R]`` advantages.

    >>> remax_advantages([[1.0, 0.0]], greedy_rewards=[1.0]).tolist()
    [[0.0, -1.0]]
    """
    r = _to_np(rewards, "rewards")
    b = _to_np(greedy_rewards, "greedy_rewards", ndim=None)
    if b.shape == (r.shape[0],):
        b = b[:, None]
    elif b.shape != r.shape:
        raise ValueError(
            f"greedy_rewards must be shaped [num_prompts]={r.shape[0]} or like rewards "
            f"{r.shape}, got {b.shape}"
        )
    return _like(r - b, rewards)


def reinforce_plus_plus_advantages(
    rewards: Array, *, lengths: Array | None = None, eps: float = 1e-8
) -> Array:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262) as verl 0.9.1 computes it (``gamma = 1``).

    ``compute_reinforce_plus_plus_outcome_advantage``: the return of every token is the outcome
    reward (no baseline, no groups), then ``masked_whiten`` over every token of the batch:
    ``A_i = (r_i - mu) / sqrt(var + eps)``, token-weighted, Bessel over the token count
    (:func:`whiten` with ``ddof=1, eps_mode="add_var"``).

    Args:
        rewards: ``[P, R]`` rewards (any ``R >= 1``; groups play no role).
        lengths: ``[P, R]`` completion lengths (token weights); ``None`` = equal lengths.
        eps: added to the variance. Default 1e-8 (verl).

    Returns:
        ``[P, R]`` advantages.

    >>> reinforce_plus_plus_advantages([[1.0, 0.0]], eps=0.0).tolist()
    [[0.7071067811865475, -0.7071067811865475]]
    """
    r = _to_np(rewards, "rewards")
    return _like(whiten(r, lengths=lengths, ddof=1, eps=eps, eps_mode="add_var"), rewards)


def reinforce_plus_plus_baseline_advantages(
    rewards: Array, *, lengths: Array | None = None, eps: float = 1e-8
) -> Array:
    """REINFORCE++-baseline as verl 0.9.1 computes it: group mean, then token whitening.

    ``compute_reinforce_plus_plus_baseline_outcome_advantage``: ``c_i = r_i - mean_group`` (a
    one-sample group has mean 0), broadcast over tokens, then ``masked_whiten`` (ddof 1 over
    tokens, ``rsqrt(var + 1e-8)``).

    Args:
        rewards: ``[P, R]`` rewards, any ``R >= 1``.
        lengths: ``[P, R]`` completion lengths; ``None`` = equal lengths.
        eps: added to the variance. Default 1e-8 (verl).

    Returns:
        ``[P, R]`` advantages.

    >>> reinforce_plus_plus_baseline_advantages([[1.0, 0.0], [1.0, 1.0]], eps=0.0).tolist()
    [[1.224744871391589, -1.224744871391589], [0.0, 0.0]]
    """
    r = _to_np(rewards, "rewards")
    return _like(whiten(centred(r, singleton="keep"), lengths=lengths, ddof=1, eps=eps), rewards)


def reinforce_baseline_advantages(
    rewards: Array, *, lengths: Array | None = None, eps: float = 1e-8
) -> Array:
    """OpenRLHF 0.11.2 ``--algo.advantage.estimator reinforce_baseline``.

    ``compute_advantages_and_returns``: ``c_i = r_i - mean_group``, per-token returns (``gamma =
    1``), then whitening over the batch's tokens with the biased variance and
    ``var.clamp(min=1e-8).rsqrt()`` (:func:`whiten` with ``ddof=0, eps_mode="clamp_var"``).

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2`` (OpenRLHF asserts ``n_samples_per_prompt > 1``).
        lengths: ``[P, R]`` completion lengths; ``None`` = equal lengths.
        eps: the variance floor. Default 1e-8 (OpenRLHF).

    Returns:
        ``[P, R]`` advantages.

    >>> reinforce_baseline_advantages([[1.0, 0.0]], eps=0.0).tolist()
    [[1.0, -1.0]]
    """
    r = _to_np(rewards, "rewards")
    check_group_size(r.shape[1], minimum=2, estimator="reinforce_baseline")
    c = centred(r, singleton="keep")
    out = whiten(c, lengths=lengths, ddof=0, eps=eps, eps_mode="clamp_var")
    return _like(out, rewards)


def flash_reinforce_advantages(rewards: Array) -> Array:
    """OpenRLHF 0.11.2 ``flash_reinforce``: ``A_i = r_i - (mean of the whole rollout batch)``.

    ``compute_advantages_and_returns``: "baseline = mean over the whole rollout batch (the
    single-rollout regime has no prompt group), no whitening". The baseline uses every prompt, so
    it is coupled across groups (and includes ``r_i`` itself).

    Args:
        rewards: ``[P, R]`` rewards, any shape with at least one entry.

    Returns:
        ``[P, R]`` advantages; they sum to 0 over the batch.

    >>> flash_reinforce_advantages([[1.0], [0.0]]).tolist()
    [[0.5], [-0.5]]
    """
    r = _to_np(rewards, "rewards")
    if r.max() == r.min():
        return _like(np.zeros_like(r), rewards)
    s = float(np.max(np.abs(r)))
    return _like(r - s * float((r / s).mean()), rewards)


def opo_advantages(rewards: Array, *, lengths: Array | None = None) -> Array:
    """OPO (Hao et al. 2025, arXiv 2505.23585): length-weighted group baseline (verl 0.9.1).

    ``compute_opo_outcome_advantage``: ``A_i = r_i - sum_j L_j r_j / sum_j L_j`` over the group;
    a one-sample group has baseline 0. With equal lengths (``lengths=None``) this is
    :func:`grpo_theory.grpo_advantages`.

    Args:
        rewards: ``[P, R]`` rewards, any ``R >= 1``.
        lengths: ``[P, R]`` completion lengths (an input beyond the rewards); ``None`` = equal.

    Returns:
        ``[P, R]`` advantages.

    Raises:
        ValueError: a group of ``R >= 2`` whose lengths are all 0 (the baseline is 0/0; verl
            returns NaN there).

    >>> opo_advantages([[1.0, 0.0]], lengths=[[1, 3]]).tolist()
    [[0.75, -0.25]]
    """
    r = _to_np(rewards, "rewards")
    if r.shape[1] == 1:
        return _like(r.copy(), rewards)
    if lengths is None:
        return _like(centred(r, singleton="keep"), rewards)
    L = check_lengths(lengths, shape=r.shape)
    tot = L.sum(axis=1, keepdims=True)
    if np.any(tot == 0):
        bad = np.flatnonzero(tot[:, 0] == 0).tolist()
        raise ValueError(
            f"opo: group(s) {bad} have total completion length 0: the length-weighted baseline "
            "is 0/0 (verl returns NaN there)"
        )
    s = np.max(np.abs(r), axis=1, keepdims=True)
    s = np.where(s > 0, s, 1.0)
    base = s * (L * (r / s)).sum(axis=1, keepdims=True) / tot
    const = r.max(axis=1, keepdims=True) == r.min(axis=1, keepdims=True)
    return _like(np.where(const, 0.0, r - base), rewards)


def gpg_advantages(rewards: Array, *, f_norm: float = 1.0) -> Array:
    """GPG (Chu et al. 2025, arXiv 2504.02546) as verl 0.9.1 computes it.

    ``compute_gpg_outcome_advantage``: ``A_i = alpha (r_i - mean_group) / f_norm`` with
    ``alpha = B / max(1, M)``, ``B = P R`` the batch size and ``M`` the number of rewards in the
    whole batch that are nonzero (``torch.count_nonzero``). ``alpha`` couples the groups; a
    one-sample group has mean 0. (verl computes a group std there too, but does not use it.)

    Args:
        rewards: ``[P, R]`` rewards, any ``R >= 1``.
        f_norm: divisor. Default 1.0 (verl's default).

    Returns:
        ``[P, R]`` advantages.

    >>> gpg_advantages([[1.0, 0.0, 0.0, 0.0]]).tolist()
    [[3.0, -1.0, -1.0, -1.0]]
    """
    r = _to_np(rewards, "rewards")
    f_norm = real_option(f_norm, "f_norm")
    if f_norm == 0:
        raise ValueError("f_norm must be nonzero, got 0")
    alpha = r.size / max(1, int(np.count_nonzero(r)))
    return _like(alpha * centred(r, singleton="keep") / f_norm, rewards)


def grpo_passk_advantages(
    rewards: Array, *, normalize_std: bool = True, eps: float = 1e-6
) -> Array:
    """GRPO for Pass@k (Chen et al. 2025, arXiv 2503.19595) as verl 0.9.1 computes it.

    ``compute_grpo_passk_outcome_advantage``: only the best response of a group gets a nonzero
    advantage, ``r_max - r_second_max``, divided by ``std + eps`` (``torch.std``, ddof 1) when
    ``normalize_std`` (verl's ``norm_adv_by_std_in_grpo``, default True). Ties at the maximum
    give 0.

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2``.
        normalize_std: divide by the group std + eps. Default True.
        eps: Default 1e-6 (verl).

    Returns:
        ``[P, R]`` advantages.

    >>> grpo_passk_advantages([[1.0, 0.0, 0.0, 0.0]], normalize_std=False).tolist()
    [[1.0, 0.0, 0.0, 0.0]]
    """
    r = _to_np(rewards, "rewards")
    P, R = r.shape
    check_group_size(R, minimum=2, estimator="grpo_passk")
    eps = real_option(eps, "eps", minimum=0.0)
    if not isinstance(normalize_std, bool):
        raise TypeError(f"normalize_std must be a bool, got {type(normalize_std).__name__}")
    out = np.zeros_like(r)
    top = np.argmax(r, axis=1)
    srt = np.sort(r, axis=1)
    gap = srt[:, -1] - srt[:, -2]
    if normalize_std:
        sd = scaled_std(centred(r), 1, 1)[:, 0]
        gap = np.where(gap > 0, gap / np.where(gap > 0, sd + eps, 1.0), 0.0)
    out[np.arange(P), top] = gap
    return _like(out, rewards)


def rloo_normalized_advantages(rewards: Array, *, eps: float = 1e-4) -> Array:
    """TRL 1.16.0 ``RLOOTrainer`` with ``normalize_advantages=True``.

    ``rloo_trainer.py``: RLOO advantages, then ``(A - mean) / (std + 1e-4)`` over the whole
    generation batch (sequence-level, ddof 1): :func:`whiten` with ``lengths=None, ddof=1,
    eps_mode="add_std"`` applied to :func:`grpo_theory.rloo_advantages`.

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2``.
        eps: added to the std. Default 1e-4 (TRL).

    Returns:
        ``[P, R]`` advantages.

    >>> rloo_normalized_advantages([[1.0, 0.0]], eps=0.0).tolist()
    [[0.7071067811865475, -0.7071067811865475]]
    """
    from .advantages import rloo_advantages

    r = _to_np(rewards, "rewards")
    a = rloo_advantages(r)
    a = np.where(r.max(axis=1, keepdims=True) == r.min(axis=1, keepdims=True), 0.0, a)
    return _like(whiten(a, ddof=1, eps=eps, eps_mode="add_std"), rewards)


# --- multi-reward, token-level, ragged and NaN forms (not [P, R] -> [P, R]) ----------------------
def gdpo_advantages(
    rewards_per_func: Array,
    *,
    weights: Sequence[float] | None = None,
    group_eps: float = 1e-4,
    batch_eps: float = 1e-4,
) -> np.ndarray:
    """GDPO (arXiv 2601.05242): normalise each reward function per group, sum, whiten the batch.

    TRL 1.16.0 ``GRPOConfig(multi_objective_aggregation="normalize_then_sum")``
    (``grpo_trainer.py``): ``z_ik = (r_ik - mean_k) / (std_k + 1e-4)`` per group and function
    (ddof 1), ``s_i = sum_k w_k z_ik``, ``A_i = (s_i - mean(s)) / (std(s) + 1e-4)`` over the batch
    (ddof 1). NaN rewards are excluded from every statistic (``nanmean``/``nanstd``) and a NaN
    ``z_ik`` drops out of the sum; a completion whose every function is NaN gets advantage 0.

    Args:
        rewards_per_func: ``[P, R, K]`` rewards of ``K`` reward functions (NaN = not scored).
        weights: ``K`` weights; default all 1.
        group_eps: added to each per-group std. Default 1e-4 (TRL).
        batch_eps: added to the batch std. Default 1e-4 (TRL).

    Returns:
        ``[P, R]`` float64 advantages.

    >>> gdpo_advantages([[[1.0, 0.0], [0.0, 1.0]]], group_eps=0.0, batch_eps=0.0).tolist()
    [[0.0, 0.0]]
    """
    x = _to_np(rewards_per_func, "rewards_per_func", ndim=3, finite=False)
    if np.any(np.isinf(x)):
        raise ValueError(
            "rewards_per_func contains inf (NaN marks unscored entries; inf is an error)"
        )
    group_eps = real_option(group_eps, "group_eps", minimum=0.0)
    batch_eps = real_option(batch_eps, "batch_eps", minimum=0.0)
    P, R, K = x.shape
    w = np.ones(K) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (K,):
        raise ValueError(f"weights must have one entry per reward function (K={K}), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be finite, got {w.tolist()}")
    z = np.full_like(x, np.nan)
    for p in range(P):
        for k in range(K):
            col = x[p, :, k]
            ok = ~np.isnan(col)
            if ok.sum() >= 2:
                z[p, ok, k] = _std_normalise(col[ok], ddof=1, eps=group_eps)
    unscored = np.all(np.isnan(x), axis=2)
    s = np.nansum(z * w, axis=2)
    flat = s[~unscored]
    out = np.zeros((P, R))
    if flat.size >= 2:
        out[~unscored] = _std_normalise(flat, ddof=1, eps=batch_eps)
    return out


def _std_normalise(v: np.ndarray, *, ddof: int, eps: float) -> np.ndarray:
    """``(v - mean) / (std + eps)`` for a 1-D vector; 0 when all entries are equal."""
    if v.max() == v.min():
        return np.zeros_like(v)
    return whiten(v[None, :], ddof=ddof, eps=eps, eps_mode="add_std")[0]


def optimal_token_baseline_advantages(
    token_rewards: Array,
    mask: Array,
    token_probs: Array,
    sum_pi_squared: Array,
    *,
    is_weights: Array | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> np.ndarray:
    """verl 0.9.1 ``compute_optimal_token_baseline_advantage`` (OTB), per token, per group.

    Needs token-level quantities from the policy (inputs, not rewards): ``pi_t`` the probability
    of each sampled token and ``sum_pi_squared`` (``sum_v pi(v)^2`` at each position). With
    returns-to-go ``G_t`` and ``W_t = sum_{j <= t} m_j w_j``, ``w_j = (1 - 2 pi_j + sum pi^2)
    rho_j^2`` (``rho`` the optional importance weights), each group of ``R`` trajectories gets the
    per-position baseline ``B_t = sum_i G_it W_it m_it / (sum_i W_it m_it + eps)`` and
    ``A_it = (G_it - B_t) m_it``. A one-trajectory group gets ``B = 0``. With
    ``handle_zero_tail`` the positions of a group's unique longest trajectory beyond the
    second-longest length get ``B = 0``.

    Args:
        token_rewards, mask, token_probs, sum_pi_squared: ``[P, R, T]``.
        is_weights: ``[P, R, T]`` or ``None``.
        handle_zero_tail: Default True (verl).
        eps: Default 1e-8 (verl).

    Returns:
        ``[P, R, T]`` float64 advantages.
    """
    r = _to_np(token_rewards, "token_rewards", ndim=3)
    m = _to_np(mask, "mask", ndim=3)
    pi = _to_np(token_probs, "token_probs", ndim=3)
    sp2 = _to_np(sum_pi_squared, "sum_pi_squared", ndim=3)
    for name, a in (("mask", m), ("token_probs", pi), ("sum_pi_squared", sp2)):
        if a.shape != r.shape:
            raise ValueError(f"{name} shape {a.shape} does not match token_rewards {r.shape}")
    G = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
    wt = 1.0 - 2.0 * pi + sp2
    if is_weights is not None:
        wt = wt * _to_np(is_weights, "is_weights", ndim=3) ** 2
    W = np.cumsum(wt * m, -1)
    P, R, T = r.shape
    B = np.zeros_like(G)
    if R > 1:
        B[:] = ((G * W * m).sum(1) / ((W * m).sum(1) + eps))[:, None, :]
        if handle_zero_tail:
            lens = m.sum(-1)
            for p in range(P):
                srt = np.sort(lens[p])
                top = np.flatnonzero(lens[p] == srt[-1])
                if top.size == 1 and srt[-1] > srt[-2]:
                    B[p, top[0], int(srt[-2]) :] = 0.0
    return (G - B) * m


def grouped_advantages(
    estimator: str | Callable[..., Any],
    rewards: Array,
    group_ids: Array,
    *,
    singleton: Literal["raise", "zero", "raw"] = "raise",
    **options: Any,
) -> np.ndarray:
    """Any per-group estimator on groups of unequal size, given a flat batch and group ids.

    verl groups a flat batch by an ``index`` array (``uid``), so groups may differ in size; TRL
    after excluding NaN rewards does too. Each group is passed to ``estimator`` as one row
    ``[1, n_g]`` and the results scattered back. Only estimators whose value for a group depends on
    that group alone are meaningful here (not ``std_scope="batch"``, GPG, the whitening ones).

    Args:
        estimator: registry name or callable ``(rewards [1, n], **options) -> [1, n]``.
        rewards: ``[B]`` flat rewards.
        group_ids: ``[B]`` hashable ids, any order.
        singleton: rule for one-sample groups: ``"raise"`` (default; our estimators need
            ``R >= 2``), ``"zero"`` (advantage 0: TRL, where ``nanstd`` of one value is NaN and
            NaN advantages become 0) or ``"raw"`` (mean 0, std 1: the reward itself, verl's
            ``grpo``/``rloo``; with ``eps`` verl's ``grpo`` divides by ``1 + eps``, not done here).
        **options: passed to the estimator.

    Returns:
        ``[B]`` float64 advantages.

    >>> grouped_advantages("grpo", [1.0, 0.0, 6.0, 0.0, 0.0], [7, 7, 3, 3, 3]).tolist()
    [0.5, -0.5, 4.0, -2.0, -2.0]
    """
    from .registry import get_estimator

    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    r = _to_np(rewards, "rewards", ndim=1)
    ids = list(group_ids.tolist() if hasattr(group_ids, "tolist") else group_ids)
    if len(ids) != r.size:
        raise ValueError(f"group_ids has {len(ids)} entries, rewards has {r.size}")
    if singleton not in ("raise", "zero", "raw"):
        raise ValueError(f"singleton must be 'raise', 'zero' or 'raw', got {singleton!r}")
    members: dict[Any, list[int]] = {}
    for pos, g in enumerate(ids):
        members.setdefault(g, []).append(pos)
    out = np.zeros_like(r)
    for g, idx in members.items():
        if len(idx) == 1:
            if singleton == "raise":
                raise ValueError(
                    f"group {g!r} has one sample; pass singleton='zero' (TRL) or 'raw' (verl)"
                )
            out[idx[0]] = 0.0 if singleton == "zero" else r[idx[0]]
            continue
        out[idx] = np.asarray(fn(r[idx][None, :], **options), dtype=np.float64)[0]
    return out


def nan_excluding_advantages(
    estimator: str | Callable[..., Any], rewards: Array, **options: Any
) -> np.ndarray:
    """TRL 1.16.0's NaN rule as an option for any per-group estimator.

    ``GRPOTrainer``/``RLOOTrainer``: a completion whose reward is NaN (every reward function
    returned ``None``) is left out of its group's mean and std (``nanmean``/``nanstd``, ddof 1 over
    the scored ones) and its advantage is set to 0; a group left with one scored completion gets
    0 too (``nanstd`` of one value is NaN). This runs ``estimator`` on each group's scored rewards
    (:func:`grouped_advantages` with ``singleton="zero"``) and puts 0 at the NaN entries.

    Args:
        estimator: registry name or callable.
        rewards: ``[P, R]`` rewards, NaN marking unscored completions (inf is an error).
        **options: estimator options (e.g. ``ddof=1, eps=1e-4`` for TRL's ``grpo_std``).

    Returns:
        ``[P, R]`` float64 advantages.

    >>> nan_excluding_advantages("grpo", [[1.0, float("nan"), 0.0]]).tolist()
    [[0.5, 0.0, -0.5]]
    """
    x = _to_np(rewards, "rewards", finite=False)
    if np.any(np.isinf(x)):
        raise ValueError("rewards contain inf (NaN marks unscored completions; inf is an error)")
    P, R = x.shape
    ok = ~np.isnan(x)
    out = np.zeros((P, R))
    if ok.any():
        ids = np.repeat(np.arange(P), R).reshape(P, R)[ok]
        out[ok] = grouped_advantages(estimator, x[ok], ids, singleton="zero", **options)
    return out


# --- exact forms for binary rewards (sympy imported lazily) -------------------------------------
def exact_grpo_passk(
    R: int, k: int, *, normalize_std: bool = True, eps: Any = 1e-6
) -> tuple[Any, Any]:
    """Exact ``(a_S, a_F)`` of :func:`grpo_passk_advantages` for ``k`` successes of ``R``.

    Only ``k = 1`` has a unique best: ``a_S = 1 / (std + eps)`` with the Bessel std
    ``sqrt(k (R - k) / (R (R - 1))) = 1 / sqrt(R)``, ``a_F = 0``; every other ``k`` gives 0.

    >>> exact_grpo_passk(4, 1, eps=0)
    (2, 0)
    """
    import sympy as sp

    from ._validate import to_exact

    if R < 2:
        raise ValueError(f"grpo_passk needs R >= 2, got R={R}")
    if k != 1:
        return sp.Integer(0), sp.Integer(0)
    if not normalize_std:
        return sp.Integer(1), sp.Integer(0)
    e = to_exact(eps, name="eps")
    return 1 / (1 / sp.sqrt(R) + e), sp.Integer(0)


def exact_opo(R: int, k: int, *, lengths: Any = None) -> tuple[Any, Any]:
    """Exact ``(a_S, a_F)`` of :func:`opo_advantages` with equal lengths (= GRPO).

    With unequal lengths OPO's value depends on which rollouts succeeded, not only on ``k``, so
    there is no ``(R, k)`` table: ``lengths`` must be ``None``.
    """
    import sympy as sp

    if lengths is not None:
        raise ValueError("opo's exact form needs equal lengths (lengths=None)")
    if R == 1:  # a one-sample group has baseline 0: the advantage is the reward itself
        return sp.Integer(1), sp.Integer(0)
    m = sp.Rational(k, R)
    return 1 - m, -m


def _linear_opo(R: Any, *, lengths: Any = None) -> tuple[Any, Any, Any]:
    if lengths is not None:
        raise ValueError("opo's linear weights are symmetric only for equal lengths (lengths=None)")
    if isinstance(R, int) and R == 1:  # baseline 0 for a one-sample group: A = r
        return 1, 0, 0
    return 1 - 1 / R, -1 / R, 0


_VERL = "verl 0.9.1 verl/trainer/ppo/core_algos.py"
_ORL = "OpenRLHF 0.11.2 openrlhf/trainer/ppo_utils/experience_maker.py"
_SPECS = (
    EstimatorSpec(
        name="reinforce_plus_plus",
        batch_coupled=True,
        fn=reinforce_plus_plus_advantages,
        options={"lengths": None, "eps": 1e-8},
        min_group_size=1,
        source="Hu 2025 (arXiv 2501.03262); "
        + _VERL
        + " compute_reinforce_plus_plus_outcome_advantage",
    ),
    EstimatorSpec(
        name="reinforce_plus_plus_baseline",
        batch_coupled=True,
        fn=reinforce_plus_plus_baseline_advantages,
        options={"lengths": None, "eps": 1e-8},
        min_group_size=1,
        source=_VERL + " compute_reinforce_plus_plus_baseline_outcome_advantage",
    ),
    EstimatorSpec(
        name="opo",
        fn=opo_advantages,
        options={"lengths": None},
        exact=exact_opo,
        linear=_linear_opo,
        min_group_size=1,
        source="Hao et al. 2025 (arXiv 2505.23585); " + _VERL + " compute_opo_outcome_advantage",
    ),
    EstimatorSpec(
        name="gpg",
        batch_coupled=True,
        fn=gpg_advantages,
        options={"f_norm": 1.0},
        check_options={"f_norm": 2.0},
        min_group_size=1,
        source="Chu et al. 2025 (arXiv 2504.02546); " + _VERL + " compute_gpg_outcome_advantage",
    ),
    EstimatorSpec(
        name="grpo_passk",
        fn=grpo_passk_advantages,
        options={"normalize_std": True, "eps": 1e-6},
        check_options={"normalize_std": True, "eps": 0.0},
        exact=exact_grpo_passk,
        source="Chen et al. 2025 (arXiv 2503.19595); "
        + _VERL
        + " compute_grpo_passk_outcome_advantage",
    ),
    EstimatorSpec(
        name="reinforce_baseline",
        batch_coupled=True,
        fn=reinforce_baseline_advantages,
        options={"lengths": None, "eps": 1e-8},
        source=_ORL + " (estimator reinforce_baseline)",
    ),
    EstimatorSpec(
        name="flash_reinforce",
        batch_coupled=True,
        fn=flash_reinforce_advantages,
        min_group_size=1,
        source=_ORL + " (estimator flash_reinforce)",
    ),
    EstimatorSpec(
        name="rloo_normalized",
        batch_coupled=True,
        fn=rloo_normalized_advantages,
        options={"eps": 1e-4},
        check_options={"eps": 0.0},
        source="TRL 1.16.0 trl/trainer/rloo_trainer.py (normalize_advantages=True)",
    ),
)
for _spec in _SPECS:
    register_estimator(_spec)
del _spec

FRAMEWORK_ESTIMATORS: tuple[str, ...] = tuple(s.name for s in _SPECS)
"""Registry names of the framework estimators that take ``[P, R]`` rewards."""
