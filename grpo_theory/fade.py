"""The FADE family (arXiv 2607.01490): AsymGRPO(delta), Power-alpha and their composition, FADE.

With ``c_i = r_i - mean``:

* ``asym_grpo``: ``A_i = c_i`` if ``c_i >= 0`` else ``c_i / delta`` (the sign axis:
  ``m_F = m_S / delta``);
* ``power_alpha``: ``A_i = (1 - mean)^(alpha - 1) c_i`` (the difficulty axis);
* ``fade``: ``asym_grpo(delta)`` applied to ``power_alpha`` (both).

``alpha`` and ``delta`` are usually scheduled from training statistics
(:func:`fade_alpha_schedule`, :func:`fade_delta_schedule`; constants as reported by secondary
sources, unconfirmed). The gradient masses ``(m_S, m_F)`` these estimators trade off are
:mod:`grpo_theory.mass`. Exact forms for binary rewards (``exact_*``) sit beside the estimators.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import as_param, centred, check_finite_out, mean, where
from ._validate import as_rewards, check_group_size, to_exact
from .outcome_baselines import exact_centred

__all__ = [
    "asym_grpo_advantages",
    "power_alpha_advantages",
    "fade_advantages",
    "fade_alpha_schedule",
    "fade_delta_schedule",
    "exact_asym_grpo",
    "exact_power_alpha",
    "exact_fade",
]

Array = Any  # np.ndarray or torch.Tensor


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
    d = as_param(delta, r, "delta", positive=True)
    c = centred(r)
    with np.errstate(over="ignore"):  # an overflow is refused by check_finite_out, by name
        A = where(c >= 0, c, c / d)
    return check_finite_out(A, "asym_grpo", f"c_i / delta with delta={delta!r}")


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
    a = as_param(alpha, r, "alpha")
    m = mean(r, 1)
    c = centred(r)
    base = 1.0 - m
    safe_base = where(base > 0, base, base + 1.0)
    with np.errstate(over="ignore", invalid="ignore"):  # refused by check_finite_out, by name
        A = where(base > 0, safe_base ** (a - 1.0), safe_base * 0.0) * c
    return check_finite_out(A, "power_alpha",
                            f"(1 - mean)^(alpha - 1) with alpha={alpha!r}")


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
    d = as_param(delta, p, "delta", positive=True)
    A = where(p >= 0, p, p / d)
    return check_finite_out(A, "fade", f"A_i / delta with alpha={alpha!r}, delta={delta!r}")


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


def _exact_delta(delta: Any) -> Any:
    d = to_exact(delta, name="delta")
    if not d > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    return d


def exact_asym_grpo(R: int, k: int, *, delta: Any = 1.0) -> tuple[Any, Any]:
    d = _exact_delta(delta)
    cs, cf = exact_centred(R, k)
    return cs, (cf if cf >= 0 else cf / d)


def exact_power_alpha(R: int, k: int, *, alpha: Any = 1.0) -> tuple[Any, Any]:
    import sympy as sp

    a = to_exact(alpha, name="alpha")
    base = 1 - sp.Rational(k, R)
    f = sp.Integer(0) if base == 0 else base ** (a - 1)
    cs, cf = exact_centred(R, k)
    return f * cs, f * cf


def exact_fade(R: int, k: int, *, alpha: Any = 1.0, delta: Any = 1.0) -> tuple[Any, Any]:
    d = _exact_delta(delta)
    s, f = exact_power_alpha(R, k, alpha=alpha)
    return s, (f if f >= 0 else f / d)
