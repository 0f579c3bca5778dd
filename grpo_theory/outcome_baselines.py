"""Outcome baselines: the advantage as the outcome reward minus a baseline, ``A_i = r_i - b``.

The estimators differ in the baseline ``b`` (rewards ``[num_prompts, group_size]``, ``P x R``;
``mean`` is the group mean, ``c_i = r_i - mean``):

====================  =================================================  =======================
estimator             baseline ``b`` for rollout ``i``                   source
====================  =================================================  =======================
``grpo``              the group mean (includes ``r_i``)                  seed paper, Eq. (15)
``dr_grpo``           the group mean (Dr.GRPO's change is the loss)      Liu et al. 2025, Sec. 3.2
``rloo``              the mean of the other ``R - 1`` rewards            Ahmadian et al. 2024
``reinforce``         a constant (0 by default)                          Williams 1992
``remax``             the reward of the prompt's greedy decoding         Li et al. 2023; verl
``opo``               the length-weighted group mean                     Hao et al. 2025; verl
``flash_reinforce``   the mean of the whole rollout batch                OpenRLHF 0.11.2
``gpg``               the group mean, times ``B / #nonzero rewards``     Chu et al. 2025; verl
``grpo_passk``        the second-best reward, for the best rollout only  Chen et al. 2025; verl
====================  =================================================  =======================

Each estimator's exact form for binary rewards (``exact_*``: ``(a_S, a_F)`` for ``k`` successes of
``R``, sympy imported inside) and, for the linear ones, its weights (``linear_*``:
``A_i = alpha r_i + beta sum_{j != i} r_j + c``) sit beside it; :mod:`grpo_theory.advantages`
registers them. Std-normalised and whitened forms are in :mod:`grpo_theory.normalisation`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import (
    as_float64,
    centred,
    check_finite_out,
    constant_rows,
    in_backend_of,
    pow2_scale,
    scaled_std,
    where,
)
from ._validate import as_rewards, check_group_size, check_lengths, is_torch, real_option, to_exact

__all__ = [
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_advantages",
    "remax_advantages",
    "opo_advantages",
    "flash_reinforce_advantages",
    "gpg_advantages",
    "grpo_passk_advantages",
    "zero_variance_groups",
    "exact_centred",
    "exact_grpo",
    "exact_rloo",
    "exact_reinforce",
    "exact_opo",
    "exact_grpo_passk",
    "linear_grpo",
    "linear_rloo",
    "linear_reinforce",
    "linear_opo",
]

Array = Any  # np.ndarray or torch.Tensor


def zero_variance_groups(rewards: Array) -> np.ndarray:
    """Boolean mask ``[P]``: groups whose rewards are all equal (std = 0, so ``c_i = 0`` for all i).

    Args:
        rewards: ``[P, R]`` rewards.

    Returns:
        ``np.ndarray`` of bool, shape ``[P]``.
    """
    r = as_rewards(rewards)
    z = constant_rows(r)[:, 0]
    return z.cpu().numpy() if is_torch(z) else z


# --- estimators -----------------------------------------------------------------------------------
def grpo_advantages(rewards: Array) -> Array:
    """Mean-centred GRPO advantages, the seed paper's Eq. (15).

    ``A_i = r_i - v_hat_R``, ``v_hat_R = (1/R) sum_j r_j`` (Eq. 14). The group mean includes
    rollout ``i``'s own reward, so ``E[A_i | r_i] = (R-1)/R (r_i - E r)`` for i.i.d. rewards.

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2``.

    Returns:
        ``[P, R]`` advantages (same backend as ``rewards``); each row sums to zero.

    >>> grpo_advantages([[1.0, 0.0, 0.0, 1.0]]).tolist()
    [[0.5, -0.5, -0.5, 0.5]]
    """
    r = as_rewards(rewards)
    check_group_size(r.shape[1], minimum=2, estimator="grpo")
    return check_finite_out(centred(r), "grpo", "|r_i - mean| exceeds the largest float")


def dr_grpo_advantages(rewards: Array) -> Array:
    """Dr.GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-like training", arXiv
    2503.20783, Sec. 3.2 and Fig. 1: ``A~_i = R_i - mean(R)``; Eq. 3 there is GRPO's objective).

    ``A_i = r_i - mean``: identical to :func:`grpo_advantages`. Dr.GRPO's other change, dropping
    the per-sequence length normalisation in favour of a constant, is a *loss aggregation*
    choice: see :mod:`grpo_theory.aggregation`.

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2``.

    Returns:
        ``[P, R]`` advantages.
    """
    r = as_rewards(rewards)
    check_group_size(r.shape[1], minimum=2, estimator="dr_grpo")
    return check_finite_out(centred(r), "dr_grpo", "|r_i - mean| exceeds the largest float")


def rloo_advantages(rewards: Array) -> Array:
    """RLOO (leave-one-out) advantages (Kool et al. 2019; Ahmadian et al. 2024, Eq. 7).

    ``A_i = r_i - (1/(R-1)) sum_{j != i} r_j = R/(R-1) (r_i - mean)``. The baseline of rollout
    ``i`` does not use ``r_i``, so ``E[A_i psi_i] = grad J`` exactly.

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2``.

    Returns:
        ``[P, R]`` advantages; rows sum to zero.

    >>> rloo_advantages([[1.0, 0.0, 0.0]]).tolist()
    [[1.0, -0.5, -0.5]]
    """
    r = as_rewards(rewards)
    R = r.shape[1]
    check_group_size(R, minimum=2, estimator="rloo")
    k = pow2_scale(r, 1)  # scaled form: no overflow in the sum (see pow2_scale)
    u = r / k
    total = u.sum(1, keepdim=True) if is_torch(u) else u.sum(axis=1, keepdims=True)
    with np.errstate(over="ignore"):  # an overflow is refused by check_finite_out, by name
        A = where(constant_rows(r), r * 0.0, (u - (total - u) / (R - 1)) * k)
    return check_finite_out(A, "rloo", "|r_i - leave-one-out mean| exceeds the largest float")


def reinforce_advantages(rewards: Array, *, baseline: float = 0.0) -> Array:
    """REINFORCE weights (Williams 1992): ``A_i = r_i - b`` with a constant baseline.

    Args:
        rewards: ``[P, R]`` rewards, any ``R >= 1``.
        baseline: the constant ``b``. Default 0 (no baseline).

    Returns:
        ``[P, R]`` weights.
    """
    r = as_rewards(rewards)
    baseline = real_option(baseline, "baseline")
    with np.errstate(over="ignore"):  # an overflow is refused by check_finite_out, by name
        A = r - baseline
    return check_finite_out(A, "reinforce", f"r_i - baseline with baseline={baseline!r}")


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
    r = as_float64(rewards, "rewards")
    b = as_float64(greedy_rewards, "greedy_rewards", ndim=None)
    if b.shape == (r.shape[0],):
        b = b[:, None]
    elif b.shape != r.shape:
        raise ValueError(
            f"greedy_rewards must be shaped [num_prompts]={r.shape[0]} or like rewards "
            f"{r.shape}, got {b.shape}"
        )
    return in_backend_of(r - b, rewards)


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
    r = as_float64(rewards, "rewards")
    if r.shape[1] == 1:
        return in_backend_of(r.copy(), rewards)
    if lengths is None:
        return in_backend_of(centred(r, singleton="keep"), rewards)
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
    return in_backend_of(np.where(const, 0.0, r - base), rewards)


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
    r = as_float64(rewards, "rewards")
    if r.max() == r.min():
        return in_backend_of(np.zeros_like(r), rewards)
    s = float(np.max(np.abs(r)))
    with np.errstate(over="ignore"):  # an overflow is refused by in_backend_of, by name
        A = r - s * float((r / s).mean())
    return in_backend_of(A, rewards)


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
    r = as_float64(rewards, "rewards")
    f_norm = real_option(f_norm, "f_norm")
    if f_norm == 0:
        raise ValueError("f_norm must be nonzero, got 0")
    alpha = r.size / max(1, int(np.count_nonzero(r)))
    with np.errstate(over="ignore"):  # an overflow is refused by in_backend_of, by name
        A = alpha * centred(r, singleton="keep") / f_norm
    return in_backend_of(A, rewards)


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
    r = as_float64(rewards, "rewards")
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
    return in_backend_of(out, rewards)


# --- exact forms for binary rewards: (a_S(k), a_F(k)) in a group of R with k successes -----------
# sympy is imported inside each form (only exact work pays for it). Each returns the advantage of
# a success and of a failure; the value for a rollout kind that does not exist is ignored.
def exact_centred(R: int, k: int) -> tuple[Any, Any]:
    """``(1 - k/R, -k/R)``: the centred reward of a success and of a failure."""
    import sympy as sp

    m = sp.Rational(k, R)
    return 1 - m, -m


def exact_grpo(R: int, k: int) -> tuple[Any, Any]:
    return exact_centred(R, k)


def exact_rloo(R: int, k: int) -> tuple[Any, Any]:
    import sympy as sp

    cs, cf = exact_centred(R, k)
    f = sp.Rational(R, R - 1)
    return f * cs, f * cf


def exact_reinforce(R: int, k: int, *, baseline: Any = 0.0) -> tuple[Any, Any]:
    b = to_exact(baseline, name="baseline")
    return 1 - b, -b


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

    if R < 2:
        raise ValueError(f"grpo_passk needs R >= 2, got R={R}")
    if k != 1:
        return sp.Integer(0), sp.Integer(0)
    if not normalize_std:
        return sp.Integer(1), sp.Integer(0)
    e = to_exact(eps, name="eps")
    return 1 / (1 / sp.sqrt(R) + e), sp.Integer(0)


# --- linear weights (alpha, beta, c) of A_i = alpha r_i + beta sum_{j != i} r_j + c -------------
# R may be an int, a Fraction or a sympy symbol: arithmetic only.
def linear_grpo(R: Any) -> tuple[Any, Any, Any]:
    return 1 - 1 / R, -1 / R, 0


def linear_rloo(R: Any) -> tuple[Any, Any, Any]:
    return 1, -1 / (R - 1), 0


def linear_reinforce(R: Any, *, baseline: Any = 0.0) -> tuple[Any, Any, Any]:
    return 1, 0, -baseline


def linear_opo(R: Any, *, lengths: Any = None) -> tuple[Any, Any, Any]:
    if lengths is not None:
        raise ValueError("opo's linear weights are symmetric only for equal lengths (lengths=None)")
    if isinstance(R, int) and R == 1:  # baseline 0 for a one-sample group: A = r
        return 1, 0, 0
    return 1 - 1 / R, -1 / R, 0
