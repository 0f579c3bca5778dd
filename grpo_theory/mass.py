"""FADE gradient masses (arXiv 2607.01490): the weight put on successes and on failures.

For binary rewards, one group's empirical masses are

    ``m_S = sum_{i : r_i = 1} A_i``,   ``m_F = sum_{i : r_i = 0} |A_i|``,

and the policy gradient decomposes as ``m_S g_S - m_F g_F`` (``g_S``, ``g_F`` the mean scores of
successes and failures). Every zero-sum (group-centred) estimator has ``m_S = m_F`` in every
group; AsymGRPO(delta) has ``m_F = m_S / delta``; REINFORCE (``b = 0``) has ``m_F = 0``.

Expected mass curves over the solve rate ``p`` (i.i.d. Bernoulli(p) rewards), exact by enumeration
over ``k ~ Binomial(R, p)``:

    ``E m_S(p) = sum_k Bin(k; R, p) k a_S(k)``,
    ``E m_F(p) = sum_k Bin(k; R, p) (R - k) |a_F(k)|``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import to_float64
from ._validate import as_rewards, check_R, is_exact_number, real_option
from .bernoulli import advantage_value_table, binom_pmf, group_outcomes

__all__ = ["gradient_mass", "expected_mass_bernoulli"]


def gradient_mass(
    advantages: Any, rewards: Any, *, success_threshold: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group FADE masses ``(m_S, m_F)``.

    Args:
        advantages: ``[P, R]`` advantages.
        rewards: ``[P, R]`` rewards; binary ``{0, 1}`` unless ``success_threshold`` is given.
        success_threshold: if given, a rollout is a success when ``reward >= threshold``
            (default None: rewards must be exactly 0 or 1).

    Returns:
        ``(m_S, m_F)``, two float64 arrays shaped ``[P]``.

    >>> m_s, m_f = gradient_mass([[0.5, -0.5, -0.5, 0.5]], [[1, 0, 0, 1]])
    >>> m_s.tolist(), m_f.tolist()
    ([1.0], [1.0])
    """
    r = to_float64(as_rewards(rewards))
    a = to_float64(as_rewards(advantages, name="advantages"))
    if a.shape != r.shape:
        raise ValueError(f"advantages shape {a.shape} does not match rewards shape {r.shape}")
    if success_threshold is None:
        if not np.all((r == 0) | (r == 1)):
            raise ValueError("rewards must be binary {0, 1} (or pass success_threshold)")
        succ = r == 1
    else:
        succ = r >= real_option(success_threshold, "success_threshold")
    m_s = np.where(succ, a, 0.0).sum(axis=1)
    m_f = np.where(~succ, np.abs(a), 0.0).sum(axis=1)
    return m_s, m_f


def expected_mass_bernoulli(estimator: str, *, R: int, p: Any, **opts: Any) -> tuple[Any, Any]:
    """Expected masses ``(E m_S, E m_F)`` of one group under i.i.d. Bernoulli(p) rewards.

    Args:
        estimator: registry name.
        R: group size.
        p: solve rate: exact (sympy/Fraction) for exact results, a float, or a float array
            (vectorised curve).
        **opts: estimator options.

    Returns:
        ``(E m_S, E m_F)``: sympy for exact ``p``, floats for a float, arrays for an array.

    >>> from fractions import Fraction
    >>> expected_mass_bernoulli("grpo", R=2, p=Fraction(1, 2))
    (1/4, 1/4)
    """
    R = check_R(R)
    s, f = advantage_value_table(estimator, R=R, **opts)
    if is_exact_number(p):
        import sympy as sp

        _, pmf = group_outcomes(R=R, p=p)
        ms = sum((pmf[k] * k * s[k] for k in range(1, R + 1)), sp.Integer(0))
        mf = sum((pmf[k] * (R - k) * abs(f[k]) for k in range(R)), sp.Integer(0))
        return sp.simplify(ms), sp.simplify(mf)
    parr = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(parr)) or np.any((parr < 0) | (parr > 1)):
        raise ValueError(f"p must be in [0, 1], got {p}")
    k = np.arange(R + 1)
    pmf = binom_pmf(k[:, None], R, parr.reshape(1, -1))  # [R+1, n]
    sv = np.array([0.0] + [float(s[j]) for j in range(1, R + 1)])
    fv = np.array([abs(float(f[j])) for j in range(R)] + [0.0])
    ms = (pmf * (k * sv)[:, None]).sum(axis=0).reshape(parr.shape)
    mf = (pmf * ((R - k) * fv)[:, None]).sum(axis=0).reshape(parr.shape)
    if parr.ndim == 0:
        return float(ms), float(mf)
    return ms, mf
