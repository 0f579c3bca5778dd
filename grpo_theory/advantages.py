"""Group advantage estimators as pure functions of a reward matrix.

Every estimator takes ``rewards`` shaped ``[num_prompts, group_size]`` (``P x R``; NumPy
array-like or ``torch.Tensor``) and returns advantages of the same shape and backend. Options are
keyword-only, and every convention that changes the mathematics (ddof, eps, the scope of the std,
the zero-variance rule) is a parameter with its default stated.

Notation: for group ``p`` with rewards ``r_1..r_R``, ``mean = (1/R) sum_j r_j`` and
``c_i = r_i - mean``.

Each estimator is registered in :mod:`grpo_theory.registry` (float form, exact form for binary
rewards, options with defaults, linear weights, source) at the end of this module:

===============  ==================================================  ==========================
name             advantage ``A_i``                                   source
===============  ==================================================  ==========================
``grpo``         ``r_i - mean``                                      seed paper, Eq. (15)
``grpo_std``     ``(r_i - mean) / (std + eps)``                      Shao et al. 2024, Sec 4.1.2
``dr_grpo``      ``r_i - mean`` (the change is in the aggregation)   Liu et al. 2025 (Dr.GRPO)
``rloo``         ``r_i - (1/(R-1)) sum_{j != i} r_j``                Ahmadian et al. 2024
``reinforce``    ``r_i - b`` (``b = 0`` by default)                  Williams 1992
``asym_grpo``    ``c_i`` if ``c_i >= 0`` else ``c_i / delta``        FADE (arXiv 2607.01490)
``power_alpha``  ``(1 - mean)^(alpha - 1) * c_i``                    FADE (arXiv 2607.01490)
``fade``         ``asym_grpo(delta)`` applied to ``power_alpha``     FADE (arXiv 2607.01490)
===============  ==================================================  ==========================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from ._validate import (
    as_rewards,
    check_group_size,
    is_torch,
    real_option,
    to_exact,
)
from .registry import (
    EstimatorSpec,
    RegistryView,
    get_estimator,
    register_estimator,
    validate_options,
)

__all__ = [
    "grpo_advantages",
    "grpo_std_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_advantages",
    "asym_grpo_advantages",
    "power_alpha_advantages",
    "fade_advantages",
    "fade_alpha_schedule",
    "fade_delta_schedule",
    "ESTIMATORS",
    "get_estimator",
    "compute_advantages",
    "zero_variance_groups",
]

Array = Any  # np.ndarray or torch.Tensor


# --- backend helpers (numpy or torch, chosen by the input) -------------------------------------
def _mean(x: Array, axis: int | None) -> Array:
    if is_torch(x):
        return x.mean() if axis is None else x.mean(dim=axis, keepdim=True)
    return x.mean() if axis is None else x.mean(axis=axis, keepdims=True)


def _std(x: Array, axis: int | None, ddof: int) -> Array:
    if is_torch(x):
        return (
            x.std(correction=ddof)
            if axis is None
            else x.std(dim=axis, correction=ddof, keepdim=True)
        )
    return x.std(ddof=ddof) if axis is None else x.std(axis=axis, ddof=ddof, keepdims=True)


def _scaled_std(x: Array, axis: int | None, ddof: int) -> Array:
    """Std of ``x`` computed as ``s * std(x / s)``, ``s = max |x|``: no under/overflow in squares.

    (Tiny spreads such as ``[4e-233, 0]`` would otherwise square to 0 and give std = 0.)
    """
    if is_torch(x):
        s = x.abs().amax() if axis is None else x.abs().amax(dim=axis, keepdim=True)
    else:
        s = np.abs(x).max() if axis is None else np.abs(x).max(axis=axis, keepdims=True)
    safe = _where(s > 0, s, s * 0.0 + 1.0)
    return safe * _std(x / safe, axis, ddof)


def _where(cond: Array, a: Array, b: Array) -> Array:
    if is_torch(cond):
        import torch

        return torch.where(cond, a, b)
    return np.where(cond, a, b)


def _constant_rows(x: Array) -> Array:
    """``[P, 1]`` bool: rows whose entries are exactly equal (max == min)."""
    if is_torch(x):
        return x.amax(dim=1, keepdim=True) == x.amin(dim=1, keepdim=True)
    return x.max(axis=1, keepdims=True) == x.min(axis=1, keepdims=True)


def _pow2_scale(x: Array, axis: int | None) -> Array:
    """A power of two ``k`` with ``k <= max|x| < 2k`` along ``axis`` (``1/2`` for all zeros).

    Dividing by a power of two is exact, so ``(x / k - mean(x / k)) * k`` equals ``x - mean(x)``
    bit for bit whenever the latter does not overflow, and cannot overflow in the sums when it
    would (finite rewards near ``1.8e308``): the scaled form used by every centred estimator.
    """
    if is_torch(x):
        import torch

        s = x.abs().amax() if axis is None else x.abs().amax(dim=axis, keepdim=True)
        _, e = torch.frexp(s.double())
        return torch.ldexp(torch.ones_like(s, dtype=torch.float64), e - 1).to(x.dtype)
    s = np.abs(x).max() if axis is None else np.abs(x).max(axis=axis, keepdims=True)
    _, e = np.frexp(s)
    return np.ldexp(np.ones_like(s), e - 1)


def _centred(r: Array) -> Array:
    """``r_i - mean`` per row, in the scaled form of :func:`_pow2_scale`; exact zeros for a
    constant row (the float mean of equal values can differ from them by one ulp: ``0.1`` three
    times would give ``-1.39e-17``)."""
    k = _pow2_scale(r, 1)
    u = r / k
    c = (u - _mean(u, 1)) * k
    return _where(_constant_rows(r), r * 0.0, c)


def _all_finite(x: Array) -> bool:
    if is_torch(x):
        import torch

        return bool(torch.isfinite(x).all())
    return bool(np.isfinite(x).all())


def _check_out(A: Array, estimator: str, why: str) -> Array:
    """``A`` if every entry is finite, else ``ValueError`` naming the cause (no silent inf)."""
    if not _all_finite(A):
        raise ValueError(
            f"{estimator}: the advantages overflow the float range ({why}); "
            "rescale the rewards or change the option"
        )
    return A


def _as_param(
    value: Any, like: Array, name: str, *, positive: bool = False
) -> Array:
    """Validate a scalar or per-prompt ``[P]`` option and broadcast it to a ``[P, 1]`` column.

    The value is checked as float64 (real, finite, ``> 0`` if ``positive``) before it is cast to
    the rewards' backend and dtype (so bfloat16 rewards work), naming ``name`` in every error.
    """
    if isinstance(value, str | bytes | bool) or value is None:
        raise TypeError(f"{name} must be a real number or [num_prompts] array, got {value!r}")
    if is_torch(value):
        if value.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (no values)")
        v64 = value.detach().cpu().double().numpy()
    else:
        try:
            v64 = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(
                f"{name} must be a real number or [num_prompts] array, got {value!r}"
            ) from None
    if not np.all(np.isfinite(v64)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and np.any(v64 <= 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if v64.ndim not in (0, 1) or (v64.ndim == 1 and v64.shape[0] != like.shape[0]):
        raise ValueError(
            f"{name} must be a scalar or shaped [num_prompts]={like.shape[0]}, "
            f"got shape {tuple(v64.shape)}"
        )
    if is_torch(like):
        import torch

        v = torch.as_tensor(v64, dtype=like.dtype, device=like.device)
    else:
        v = v64
    return v if v.ndim == 0 else v[:, None]


def zero_variance_groups(rewards: Array) -> np.ndarray:
    """Boolean mask ``[P]``: groups whose rewards are all equal (std = 0, so ``c_i = 0`` for all i).

    Args:
        rewards: ``[P, R]`` rewards.

    Returns:
        ``np.ndarray`` of bool, shape ``[P]``.
    """
    r = as_rewards(rewards)
    z = _constant_rows(r)[:, 0]
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
    return _check_out(_centred(r), "grpo", "|r_i - mean| exceeds the largest float")


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
    return _check_out(_centred(r), "dr_grpo", "|r_i - mean| exceeds the largest float")


def grpo_std_advantages(
    rewards: Array,
    *,
    ddof: int = 1,
    eps: float = 0.0,
    std_scope: Literal["group", "batch"] = "group",
    on_zero_std: Literal["zero", "raise"] = "zero",
) -> Array:
    """Std-normalised GRPO advantages as published by Shao et al. (2024, DeepSeekMath, Sec. 4.1.2).

    ``A_i = (r_i - mean) / (std + eps)`` with ``mean`` the group mean and ``std`` the standard
    deviation of the group (``std_scope="group"``) or of the whole batch (``"batch"``, TRL's
    ``scale_rewards="batch"``).

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
    R = r.shape[1]
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
    # Scaled form (exact powers of two, see _pow2_scale): the result is scale-free, so it is
    # computed on r / k and never multiplied back; bit-identical to the plain formula whenever
    # that does not overflow, finite for rewards near the float limit.
    k = _pow2_scale(r, 1 if std_scope == "group" else None)
    u = r / k
    centred = u - _mean(u, 1)
    std = (
        _scaled_std(centred, 1, ddof)
        if std_scope == "group"
        else _scaled_std(u - _mean(u, None), None, ddof)
    )
    eps_k = eps / k  # eps in the units of u
    # A group is zero-variance when its rewards are exactly equal. Detect that with max == min,
    # not std == 0: the float mean of equal values (e.g. 0.1 three times) can differ from them by
    # one ulp, which would make std ~1e-17 and the advantages ~1 instead of 0.
    zero = _constant_rows(r)
    # 0/0 happens where the denominator is 0: a constant group under the group std, and only a
    # constant batch under the batch std (a constant group then gets 0 / batch std = 0).
    undefined = zero
    if std_scope == "batch":
        batch_constant = bool(r.max() == r.min())
        zero = zero | batch_constant
        undefined = zero & batch_constant
    zero_np = np.asarray(undefined.cpu() if is_torch(undefined) else undefined).reshape(-1)
    if zero_np.any() and on_zero_std == "raise" and eps == 0:
        groups = np.flatnonzero(np.broadcast_to(zero_np, (r.shape[0],))).tolist()
        raise ValueError(
            f"grpo_std: zero-variance group(s) {groups} (all rewards equal) with eps=0: "
            "the advantage is 0/0. Pass eps>0, or on_zero_std='zero' to return 0 for them."
        )
    denom = _where(zero, std * 0.0 + 1.0, std + eps_k)
    return _where(zero, centred * 0.0, centred / denom)


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
    k = _pow2_scale(r, 1)  # scaled form: no overflow in the sum (see _pow2_scale)
    u = r / k
    total = u.sum(1, keepdim=True) if is_torch(u) else u.sum(axis=1, keepdims=True)
    A = _where(_constant_rows(r), r * 0.0, (u - (total - u) / (R - 1)) * k)
    return _check_out(A, "rloo", "|r_i - leave-one-out mean| exceeds the largest float")


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
    return _check_out(r - baseline, "reinforce", f"r_i - baseline with baseline={baseline!r}")


def asym_grpo_advantages(rewards: Array, *, delta: float | Array = 1.0) -> Array:
    """AsymGRPO(delta) of the FADE framework (arXiv 2607.01490, as summarised in our notes).

    ``A_i = c_i`` if ``c_i >= 0`` else ``c_i / delta``, ``c_i = r_i - mean``. For binary rewards
    the negative side is exactly the failures. ``delta = 1`` is :func:`grpo_advantages`;
    ``delta < 1`` puts more mass on failures (``m_F = m_S / delta``).

    Args:
        rewards: ``[P, R]`` rewards, ``R >= 2``.
        delta: scalar or ``[P]``, ``delta > 0``. Default 1.

    Returns:
        ``[P, R]`` advantages.
    """
    r = as_rewards(rewards)
    check_group_size(r.shape[1], minimum=2, estimator="asym_grpo")
    d = _as_param(delta, r, "delta", positive=True)
    c = _centred(r)
    A = _where(c >= 0, c, c / d)
    return _check_out(A, "asym_grpo", f"c_i / delta with delta={delta!r}")


def power_alpha_advantages(rewards: Array, *, alpha: float | Array = 1.0) -> Array:
    """Power-alpha advantages of the FADE framework (arXiv 2607.01490, as summarised).

    ``A_i = (1 - mean)^(alpha - 1) * (r_i - mean)``, defined for rewards in ``[0, 1]``.
    ``alpha = 1`` is :func:`grpo_advantages`; ``alpha > 1`` shrinks the signal of easy prompts
    (``mean -> 1``). A group with ``mean = 1`` has ``c_i = 0`` and gets advantage 0 for every alpha.

    Args:
        rewards: ``[P, R]`` rewards in ``[0, 1]``, ``R >= 2``.
        alpha: scalar or ``[P]``. Default 1.

    Returns:
        ``[P, R]`` advantages.
    """
    r = as_rewards(rewards)
    check_group_size(r.shape[1], minimum=2, estimator="power_alpha")
    lo, hi = (float(r.min()), float(r.max()))
    if lo < 0 or hi > 1:
        raise ValueError(f"power_alpha needs rewards in [0, 1], got range [{lo}, {hi}]")
    a = _as_param(alpha, r, "alpha")
    m = _mean(r, 1)
    c = _centred(r)
    base = 1.0 - m
    safe_base = _where(base > 0, base, base + 1.0)
    factor = _where(base > 0, safe_base ** (a - 1.0), safe_base * 0.0)
    return _check_out(factor * c, "power_alpha", f"(1 - mean)^(alpha - 1) with alpha={alpha!r}")


def fade_advantages(
    rewards: Array, *, alpha: float | Array = 1.0, delta: float | Array = 1.0
) -> Array:
    """FADE advantages: Power-alpha composed with AsymGRPO(delta) (arXiv 2607.01490).

    ``A_i = f * c_i`` if ``c_i >= 0`` else ``f * c_i / delta``, ``f = (1 - mean)^(alpha - 1)``.
    ``alpha`` and ``delta`` are usually scheduled: :func:`fade_alpha_schedule`,
    :func:`fade_delta_schedule` (schedule constants unconfirmed; see ``docs/conventions.md``).

    Args:
        rewards: ``[P, R]`` rewards in ``[0, 1]``, ``R >= 2``.
        alpha: scalar or ``[P]``.
        delta: scalar or ``[P]``, ``> 0``.

    Returns:
        ``[P, R]`` advantages.
    """
    p = power_alpha_advantages(rewards, alpha=alpha)
    d = _as_param(delta, p, "delta", positive=True)
    A = _where(p >= 0, p, p / d)
    return _check_out(A, "fade", f"A_i / delta with alpha={alpha!r}, delta={delta!r}")


def fade_alpha_schedule(solve_rate: float | np.ndarray) -> np.ndarray:
    """FADE's alpha from a (moving-average) solve rate: ``clip(3 (1 - p) / (2 p), 1, 3)``.

    ``p = 0`` gives 3 (the limit). Constants as reported by secondary sources (unconfirmed).
    """
    p = np.asarray(solve_rate, dtype=np.float64)
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError(f"solve_rate must be in [0, 1], got {solve_rate}")
    with np.errstate(divide="ignore"):
        raw = np.where(p > 0, 3.0 * (1.0 - p) / (2.0 * np.where(p > 0, p, 1.0)), np.inf)
    return np.clip(raw, 1.0, 3.0)


def fade_delta_schedule(entropy: float | np.ndarray, *, target: float) -> np.ndarray:
    """FADE's delta from a (moving-average) token entropy: ``clip(1 + H - H_target, 0.3, 1)``."""
    h = np.asarray(entropy, dtype=np.float64)
    if not np.all(np.isfinite(h)) or not np.isfinite(target):
        raise ValueError("entropy and target must be finite")
    return np.clip(1.0 + h - target, 0.3, 1.0)


# --- exact forms for binary rewards: (a_S(k), a_F(k)) in a group of R with k successes -----------
# sympy is imported inside each form (only exact work pays for it). Each returns the advantage of
# a success and of a failure; the value for a rollout kind that does not exist is ignored.
def _exact_centred(R: int, k: int) -> tuple[Any, Any]:
    """``(1 - k/R, -k/R)``: the centred reward of a success and of a failure."""
    import sympy as sp

    m = sp.Rational(k, R)
    return 1 - m, -m


def _exact_grpo(R: int, k: int) -> tuple[Any, Any]:
    return _exact_centred(R, k)


def _exact_rloo(R: int, k: int) -> tuple[Any, Any]:
    import sympy as sp

    cs, cf = _exact_centred(R, k)
    f = sp.Rational(R, R - 1)
    return f * cs, f * cf


def _exact_reinforce(R: int, k: int, *, baseline: Any = 0.0) -> tuple[Any, Any]:
    b = to_exact(baseline, name="baseline")
    return 1 - b, -b


def _exact_grpo_std(
    R: int,
    k: int,
    *,
    ddof: int = 1,
    eps: Any = 0.0,
    std_scope: str = "group",
    on_zero_std: str = "zero",
) -> tuple[Any, Any]:
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
    cs, cf = _exact_centred(R, k)
    if k in (0, R):
        if on_zero_std == "raise" and e == 0:
            raise ValueError(
                f"grpo_std: the group with k={k} of R={R} successes has zero variance and eps=0: "
                "0/0. Use on_zero_std='zero' (advantage 0) or eps>0."
            )
        return sp.Integer(0), sp.Integer(0)
    std = sp.sqrt(sp.Rational(k * (R - k), R) / (R - ddof))
    return cs / (std + e), cf / (std + e)


def _exact_delta(delta: Any) -> Any:
    d = to_exact(delta, name="delta")
    if not d > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    return d


def _exact_asym(R: int, k: int, *, delta: Any = 1.0) -> tuple[Any, Any]:
    d = _exact_delta(delta)
    cs, cf = _exact_centred(R, k)
    return cs, (cf if cf >= 0 else cf / d)


def _exact_power(R: int, k: int, *, alpha: Any = 1.0) -> tuple[Any, Any]:
    import sympy as sp

    a = to_exact(alpha, name="alpha")
    base = 1 - sp.Rational(k, R)
    f = sp.Integer(0) if base == 0 else base ** (a - 1)
    cs, cf = _exact_centred(R, k)
    return f * cs, f * cf


def _exact_fade(R: int, k: int, *, alpha: Any = 1.0, delta: Any = 1.0) -> tuple[Any, Any]:
    d = _exact_delta(delta)
    s, f = _exact_power(R, k, alpha=alpha)
    return s, (f if f >= 0 else f / d)


# --- linear weights (alpha, beta, c) of A_i = alpha r_i + beta sum_{j != i} r_j + c -------------
# R may be an int, a Fraction or a sympy symbol: arithmetic only.
def _linear_grpo(R: Any) -> tuple[Any, Any, Any]:
    return 1 - 1 / R, -1 / R, 0


def _linear_rloo(R: Any) -> tuple[Any, Any, Any]:
    return 1, -1 / (R - 1), 0


def _linear_reinforce(R: Any, *, baseline: Any = 0.0) -> tuple[Any, Any, Any]:
    return 1, 0, -baseline


# --- the registry entries (order = the order sims experiments loop over) ------------------------
_SHAO = "Shao et al. 2024 (DeepSeekMath), Sec. 4.1.2"
_FADE = "FADE (arXiv 2607.01490), as summarised in docs/conventions.md"
for _spec in (
    EstimatorSpec(
        name="grpo",
        fn=grpo_advantages,
        exact=_exact_grpo,
        linear=_linear_grpo,
        source="seed paper arXiv 2606.29238, Eq. (15)",
    ),
    EstimatorSpec(
        name="grpo_std",
        fn=grpo_std_advantages,
        options={"ddof": 1, "eps": 0.0, "std_scope": "group", "on_zero_std": "zero"},
        check_options={"ddof": 1, "eps": 0.0},
        exact=_exact_grpo_std,
        source=_SHAO,
    ),
    EstimatorSpec(
        name="dr_grpo",
        fn=dr_grpo_advantages,
        exact=_exact_grpo,
        linear=_linear_grpo,
        source="Liu et al. 2025 (Dr.GRPO, arXiv 2503.20783), Sec. 3.2 and Fig. 1",
    ),
    EstimatorSpec(
        name="rloo",
        fn=rloo_advantages,
        exact=_exact_rloo,
        linear=_linear_rloo,
        source="Kool et al. 2019; Ahmadian et al. 2024, Eq. (7)",
    ),
    EstimatorSpec(
        name="reinforce",
        fn=reinforce_advantages,
        options={"baseline": 0.0},
        check_options={"baseline": 0.0},
        exact=_exact_reinforce,
        linear=_linear_reinforce,
        min_group_size=1,
        source="Williams 1992",
    ),
    EstimatorSpec(
        name="asym_grpo",
        fn=asym_grpo_advantages,
        options={"delta": 1.0},
        check_options={"delta": 0.5},
        exact=_exact_asym,
        source=_FADE,
    ),
    EstimatorSpec(
        name="power_alpha",
        fn=power_alpha_advantages,
        options={"alpha": 1.0},
        check_options={"alpha": 2.0},
        exact=_exact_power,
        source=_FADE,
    ),
    EstimatorSpec(
        name="fade",
        fn=fade_advantages,
        options={"alpha": 1.0, "delta": 1.0},
        check_options={"alpha": 2.0, "delta": 0.5},
        exact=_exact_fade,
        source=_FADE,
    ),
):
    register_estimator(_spec)
del _spec

ESTIMATORS: Mapping[str, Callable[..., Array]] = RegistryView("fn")
"""Read-only live view ``name -> float form`` of :mod:`grpo_theory.registry`."""


def compute_advantages(name: str, rewards: Array, **options: Any) -> Array:
    """Advantages ``[P, R]`` of the registered estimator ``name`` with ``options``.

    Unknown options raise ``ValueError`` naming them (see :func:`grpo_theory.estimator_spec`
    for each estimator's options and defaults).
    """
    validate_options(name, options)
    return get_estimator(name)(rewards, **options)


# The framework estimators (TRL, verl, OpenRLHF) register themselves after the built-ins.
from . import framework_estimators as _framework_estimators  # noqa: E402, F401
