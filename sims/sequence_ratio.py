"""Token ratios against sequence ratios under per-token noise: exact laws and seeded Monte Carlo.

GSPO (arXiv 2507.18071) replaces GRPO's token ratio ``w_t = pi_theta(y_t|.) / pi_old(y_t|.)`` by
the sequence ratio ``s = (pi_theta(y) / pi_old(y))^(1/L) = exp(mean_t log w_t)``; the
un-normalised sequence ratio is ``rho = prod_t w_t``. Model (:class:`NoiseModel`): the token
log-ratios of a response of ``L`` tokens are i.i.d. ``N(drift, sigma^2)`` (independent
fluctuations: an update's effect on unrelated tokens, precision noise, an MoE router's
reshuffle), so that exactly

* ``log w_t ~ N(drift, sigma^2)``, ``log s ~ N(drift, sigma^2 / L)``, ``log rho ~ N(L drift,
  L sigma^2)`` (:func:`log_ratio_laws`);
* the probability that a ratio falls outside a clipping range ``[1 - eps_low, 1 + eps_high]``
  (:func:`clip_probability`);
* the moments of the weight a token's gradient carries under PPO's clipped term,
  ``w 1{w <= 1 + eps}`` for ``A > 0`` and ``w 1{w >= 1 - eps}`` for ``A < 0``
  (:func:`clipped_weight_moments`, lognormal partial moments).

:func:`sample_log_ratios` draws the same model (seeded) for the statistical tier
(``|estimate - exact| <= 4 SE``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["NoiseModel", "log_ratio_laws", "clip_probability", "clipped_weight_moments",
           "lognormal_partial_moment", "sample_log_ratios"]


@dataclass(frozen=True)
class NoiseModel:
    """I.i.d. token log-ratios ``N(drift, sigma^2)`` over ``L`` tokens."""

    sigma: float
    drift: float = 0.0
    length: int = 1

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma) and math.isfinite(self.drift)):
            raise ValueError(f"need sigma >= 0 and finite drift, got {self.sigma}, {self.drift}")
        if int(self.length) != self.length or self.length < 1:
            raise ValueError(f"length must be a positive integer, got {self.length}")


def log_ratio_laws(m: NoiseModel) -> dict[str, tuple[float, float]]:
    """``{"token": (mean, sd), "sequence_normalised": ..., "sequence": ...}`` of ``log w_t``,
    ``log s`` and ``log rho``."""
    L = m.length
    return {"token": (m.drift, m.sigma),
            "sequence_normalised": (m.drift, m.sigma / math.sqrt(L)),
            "sequence": (L * m.drift, m.sigma * math.sqrt(L))}


def _Phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def clip_probability(mean: float, sd: float, *, eps_low: float, eps_high: float) -> float:
    """``P(x outside [1 - eps_low, 1 + eps_high])`` for ``log x ~ N(mean, sd^2)``."""
    lo, hi = math.log1p(-eps_low), math.log1p(eps_high)
    if sd == 0:
        return float(not (lo <= mean <= hi))
    return _Phi((lo - mean) / sd) + 1.0 - _Phi((hi - mean) / sd)


def lognormal_partial_moment(k: int, mean: float, sd: float, *, upper: float | None = None,
                             lower: float | None = None) -> float:
    """``E[x^k 1{lower <= log x <= upper}]`` for ``log x ~ N(mean, sd^2)``:
    ``exp(k mean + k^2 sd^2 / 2) (Phi((upper - mean - k sd^2)/sd) - Phi((lower - ...)/sd))``."""
    full = math.exp(k * mean + 0.5 * k * k * sd * sd)
    if sd == 0:
        inside = ((upper is None or mean <= upper) and (lower is None or mean >= lower))
        return full if inside else 0.0
    u = 1.0 if upper is None else _Phi((upper - mean - k * sd * sd) / sd)
    lo = 0.0 if lower is None else _Phi((lower - mean - k * sd * sd) / sd)
    return full * (u - lo)


def clipped_weight_moments(mean: float, sd: float, *, eps: float, sign: int
                           ) -> dict[str, float]:
    """Mean and variance of the gradient weight of a token under PPO's clipped term
    ``min(w A, clip(w, 1 - eps, 1 + eps) A)``: ``w 1{w <= 1 + eps}`` for ``A > 0`` (``sign=1``),
    ``w 1{w >= 1 - eps}`` for ``A < 0``; and of the unclipped weight ``w``."""
    if sign == 1:
        kw = {"upper": math.log1p(eps)}
    elif sign == -1:
        kw = {"lower": math.log1p(-eps)}
    else:
        raise ValueError(f"sign must be +1 or -1, got {sign}")
    m1 = lognormal_partial_moment(1, mean, sd, **kw)
    m2 = lognormal_partial_moment(2, mean, sd, **kw)
    u1 = lognormal_partial_moment(1, mean, sd)
    u2 = lognormal_partial_moment(2, mean, sd)
    return {"clipped_mean": m1, "clipped_var": m2 - m1 * m1, "unclipped_mean": u1,
            "unclipped_var": u2 - u1 * u1}


def sample_log_ratios(m: NoiseModel, *, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` responses of the model: ``{"token": [n, L], "sequence_normalised": [n],
    "sequence": [n]}`` log-ratios."""
    x = m.drift + m.sigma * rng.standard_normal((int(n), m.length))
    return {"token": x, "sequence_normalised": x.mean(axis=1), "sequence": x.sum(axis=1)}
