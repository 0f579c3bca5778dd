"""Std normalisation and whitening: centred rewards divided by a standard deviation.

* Per group: ``grpo_std``, ``A_i = (r_i - mean) / (std + eps)`` (Shao et al. 2024, DeepSeekMath,
  Sec. 4.1.2), with the std of the group or of the batch (TRL's ``scale_rewards``).
* Over the batch's tokens: :func:`whiten` (``A' = (A - mu) / d``, each sequence weighted by its
  length; ``d`` with the eps of verl's ``masked_whiten``, OpenRLHF's clamp or TRL's ``std + eps``),
  the last step of REINFORCE++ and REINFORCE++-baseline (verl 0.9.1), OpenRLHF's
  ``reinforce_baseline`` and TRL RLOO's ``normalize_advantages``.

Every form is computed overflow-free (powers of two or the largest entry factored out of the
squares) and gives 0 for a group (or batch) whose values are all equal.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._backend import (
    as_float64,
    centred,
    constant_rows,
    in_backend_of,
    mean,
    pow2_scale,
    scaled_std,
    to_float64,
    where,
)
from ._validate import as_rewards, check_group_size, check_lengths, real_option, to_exact
from .outcome_baselines import exact_centred, rloo_advantages

__all__ = [
    "grpo_std_advantages",
    "whiten",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "reinforce_baseline_advantages",
    "rloo_normalized_advantages",
    "exact_grpo_std",
]

Array = Any  # np.ndarray or torch.Tensor


def grpo_std_advantages(
    rewards: Array,
    *,
    ddof: int = 1,
    eps: float = 0.0,
    std_scope: Literal["group", "batch"] = "group",
    on_zero_std: Literal["zero", "raise"] = "zero",
    eps_mode: Literal["add_std", "add_var"] = "add_std",
) -> Array:
    """Std-normalised GRPO advantages as published by Shao et al. (2024, DeepSeekMath, Sec. 4.1.2).

    ``A_i = (r_i - mean) / (std + eps)`` with ``mean`` the group mean and ``std`` the standard
    deviation of the group (``std_scope="group"``) or of the whole batch (``"batch"``, TRL's
    ``scale_rewards="batch"``). With ``eps_mode="add_var"`` the stabiliser enters under the root,
    ``A_i = (r_i - mean) / sqrt(var + eps)``: with ``ddof=0`` and binary rewards this is the
    stabilised whitened reward of Mroueh (arXiv 2503.06639 v4, Eq. 4 with the plug-in
    ``p_hat = k/R``, Algorithm 1), ``(1 - p_hat) / sqrt(p_hat (1 - p_hat) + eps)`` for a success
    and ``-p_hat / sqrt(p_hat (1 - p_hat) + eps)`` for a failure.

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2`` (``R >= ddof + 1``).
        ddof: delta degrees of freedom of the std. Default 1 (``torch.std``'s default, which TRL,
            verl and OpenRLHF use); the DeepSeekMath paper does not say which.
        eps: added to the std before dividing. Default 0.0 (the published formula); TRL uses
            1e-4, verl 1e-6, OpenRLHF 1e-9.
        std_scope: ``"group"`` (default) or ``"batch"``.
        on_zero_std: rule for a group whose std is 0 (all rewards equal) when ``eps == 0``.
            ``"zero"`` (default) returns advantage 0 for that group: every centred reward is
            exactly 0, and 0 is the limit of ``0 / (0 + eps)`` as ``eps -> 0`` and what every
            framework with ``eps > 0`` returns. ``"raise"`` raises ``ValueError`` naming the groups.
        eps_mode: where ``eps`` enters: ``"add_std"`` (default, ``std + eps``: the published
            formula's stabiliser as TRL places it) or ``"add_var"`` (``sqrt(var + eps)``: verl's
            ``masked_whiten``, and arXiv 2503.06639's Eq. 4).

    Returns:
        ``[P, R]`` advantages. A group with nonzero std has ``sum_i A_i = 0`` and, with ``eps = 0``,
        ``sum_i A_i^2 = R - ddof``.

    Raises:
        ValueError: bad shape, NaN/inf, ``R < 2``, or a zero-variance group with
            ``on_zero_std="raise"`` and ``eps == 0``.

    >>> grpo_std_advantages([[1.0, 0.0]], ddof=0).tolist()
    [[1.0, -1.0]]
    >>> grpo_std_advantages([[1.0, 1.0]]).tolist()
    [[0.0, 0.0]]
    """
    r = as_rewards(rewards)
    eps = _check_std_options(r.shape[1], ddof=ddof, eps=eps, std_scope=std_scope,
                             on_zero_std=on_zero_std, eps_mode=eps_mode)
    # Scaled form (exact powers of two, see pow2_scale): the result is scale-free, so it is
    # computed on r / k and never multiplied back; bit-identical to the plain formula whenever
    # that does not overflow, finite for rewards near the float limit.
    k = pow2_scale(r, 1 if std_scope == "group" else None)
    u = r / k
    c = u - mean(u, 1)
    if std_scope == "group":
        std = scaled_std(c, 1, ddof)
    else:
        std = scaled_std(u - mean(u, None), None, ddof)
    zero, undefined = _zero_variance(r, std_scope)
    if on_zero_std == "raise" and eps == 0 and bool(np.any(to_float64(undefined))):
        rows = np.broadcast_to(to_float64(undefined).reshape(-1), (r.shape[0],))
        raise ValueError(
            f"grpo_std: zero-variance group(s) {np.flatnonzero(rows).tolist()} (all rewards "
            "equal) with eps=0: the advantage is 0/0. Pass eps>0, or on_zero_std='zero' to "
            "return 0 for them."
        )
    eps_k = eps / k  # eps in the units of u
    # add_var: sqrt(var + eps) in the units of u, var / k^2 + eps / k^2
    stab = (std**2 + eps_k / k) ** 0.5 if eps_mode == "add_var" else std + eps_k
    denom = where(zero, std * 0.0 + 1.0, stab)
    return where(zero, c * 0.0, c / denom)


def _check_std_options(R: int, *, ddof: Any, eps: Any, std_scope: Any, on_zero_std: Any,
                       eps_mode: Any) -> float:
    """Validate :func:`grpo_std_advantages`' options for groups of ``R``; ``eps`` as a float."""
    if isinstance(ddof, bool) or not isinstance(ddof, int | np.integer):
        raise TypeError(f"ddof must be an integer, got {ddof!r}")
    if ddof < 0:
        raise ValueError(f"ddof must be >= 0, got {ddof}")
    check_group_size(R, minimum=max(2, ddof + 1), estimator="grpo_std")
    eps = real_option(eps, "eps", minimum=0.0)
    if std_scope not in ("group", "batch"):
        raise ValueError(f"std_scope must be 'group' or 'batch', got {std_scope!r}")
    if on_zero_std not in ("zero", "raise"):
        raise ValueError(f"on_zero_std must be 'zero' or 'raise', got {on_zero_std!r}")
    if eps_mode not in ("add_std", "add_var"):
        raise ValueError(f"eps_mode must be 'add_std' or 'add_var', got {eps_mode!r}")
    return eps


def _zero_variance(r: Array, std_scope: str) -> tuple[Array, Array]:
    """``(zero, undefined)`` ``[P, 1]`` masks: the groups whose advantage is 0, and those where
    it is 0/0 (the denominator is 0).

    A group is zero-variance when its rewards are exactly equal, detected with max == min, not
    std == 0: the float mean of equal values (e.g. 0.1 three times) can differ from them by one
    ulp, which would make std ~1e-17 and the advantages ~1 instead of 0. Under the group std a
    constant group is 0/0; under the batch std only a constant batch is (a constant group then
    gets 0 / batch std = 0).
    """
    zero = constant_rows(r)
    if std_scope != "batch":
        return zero, zero
    batch_constant = bool(r.max() == r.min())
    zero = zero | batch_constant
    return zero, zero & batch_constant


def exact_grpo_std(
    R: int,
    k: int,
    *,
    ddof: int = 1,
    eps: Any = 0.0,
    std_scope: str = "group",
    on_zero_std: str = "zero",
    eps_mode: str = "add_std",
) -> tuple[Any, Any]:
    """Exact ``(a_S, a_F)`` of :func:`grpo_std_advantages` for ``k`` successes of ``R`` (one
    group: ``std_scope="group"`` only)."""
    import sympy as sp

    if isinstance(ddof, bool) or not isinstance(ddof, int):
        raise TypeError(f"ddof must be an int, got {ddof!r}")
    if std_scope != "group":
        raise ValueError(
            "std_scope='batch' depends on the other groups of the batch; exact enumeration of one "
            "group supports std_scope='group' only"
        )
    if ddof < 0 or R < max(2, ddof + 1):
        raise ValueError(
            f"grpo_std needs ddof >= 0 and R >= max(2, ddof+1), got R={R}, ddof={ddof}"
        )
    e = to_exact(eps, name="eps")
    if e < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if on_zero_std not in ("zero", "raise"):
        raise ValueError(f"on_zero_std must be 'zero' or 'raise', got {on_zero_std!r}")
    if eps_mode not in ("add_std", "add_var"):
        raise ValueError(f"eps_mode must be 'add_std' or 'add_var', got {eps_mode!r}")
    cs, cf = exact_centred(R, k)
    if k in (0, R):
        if on_zero_std == "raise" and e == 0:
            raise ValueError(
                f"grpo_std: the group with k={k} of R={R} successes has zero variance and eps=0: "
                "0/0. Use on_zero_std='zero' (advantage 0) or eps>0."
            )
        return sp.Integer(0), sp.Integer(0)
    var = sp.Rational(k * (R - k), R) / (R - ddof)
    d = sp.sqrt(var + e) if eps_mode == "add_var" else sp.sqrt(var) + e
    return cs / d, cf / d


EpsMode = Literal["add_var", "clamp_var", "add_std"]


def _scaled_moments(x: np.ndarray, w: np.ndarray, ddof: int) -> tuple[float, float, float]:
    """Weighted mean, ``scale`` and ``var / scale^2`` of ``x`` (weights ``w``), overflow-free.

    ``var = sum w (x - mean)^2 / sum w * N / (N - ddof)``, ``N = sum w``; computed on ``x / s``
    with ``s = max |x - mean|`` so that squares of huge or tiny values neither over- nor underflow.
    """
    N = float(w.sum())
    s0 = float(np.max(np.abs(x[w > 0]))) if np.any(w > 0) else 0.0
    s0 = s0 if s0 > 0 else 1.0
    mean = s0 * float((w * (x / s0)).sum() / N)
    # a spread |x - mean| beyond the float range gives s = inf and v = NaN: the caller's result
    # is then not finite and refused ("not representable"), without a warning
    with np.errstate(over="ignore", invalid="ignore"):
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
    a = as_float64(advantages, "advantages")
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
    with np.errstate(over="ignore"):  # refused by in_backend_of below when not finite
        c = a - mean
    if v == 0:
        return in_backend_of(np.zeros_like(a), advantages)
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        # eps in units of s^2 (inf: the variance is negligible next to eps)
        t = np.float64(0.0) if eps == 0 else np.float64(eps) / np.float64(s) ** 2
    if eps_mode == "add_var":
        d = s * np.sqrt(v + t) if np.isfinite(t) else np.sqrt(eps)
    elif eps_mode == "clamp_var":
        d = s * np.sqrt(max(v, t)) if np.isfinite(t) else np.sqrt(eps)
    else:
        d = s * np.sqrt(v) + eps
    return in_backend_of(c / d, advantages)


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
    r = as_float64(rewards, "rewards")
    return in_backend_of(whiten(r, lengths=lengths, ddof=1, eps=eps, eps_mode="add_var"), rewards)


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
    r = as_float64(rewards, "rewards")
    c = centred(r, singleton="keep")
    return in_backend_of(whiten(c, lengths=lengths, ddof=1, eps=eps), rewards)


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
    r = as_float64(rewards, "rewards")
    check_group_size(r.shape[1], minimum=2, estimator="reinforce_baseline")
    c = centred(r, singleton="keep")
    out = whiten(c, lengths=lengths, ddof=0, eps=eps, eps_mode="clamp_var")
    return in_backend_of(out, rewards)


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
    r = as_float64(rewards, "rewards")
    a = rloo_advantages(r)
    a = np.where(r.max(axis=1, keepdims=True) == r.min(axis=1, keepdims=True), 0.0, a)
    return in_backend_of(whiten(a, ddof=1, eps=eps, eps_mode="add_std"), rewards)
