"""The probability-of-success (PoS) dynamics of KL-regularised GRPO with binary rewards.

Mroueh, "Reinforcement Learning with Verifiable Rewards: GRPO's Effective Loss, Dynamics, and
Success Amplification" (arXiv 2503.06639, v4 numbering). With a binary reward, the population
advantage of the previous iterate ``pi_{n-1}`` (PoS ``p = p_{n-1}``) takes two values,
``+w_plus(p)`` on successes and ``-w_minus(p)`` on failures (Eq. 4 and Eq. 13):

* ``normalisation="mean_std"`` (GRPO, mean and variance): ``w_plus = (1-p) / sqrt(p(1-p) + eps)``,
  ``w_minus = p / sqrt(p(1-p) + eps)``, so ``Omega = w_plus + w_minus = (p(1-p) + eps)^(-1/2)``;
* ``normalisation="mean_only"`` (Dr. GRPO): ``w_plus = 1 - p``, ``w_minus = p``, ``Omega = 1``.

The maximiser of ``E_pi A - beta KL(pi || anchor)`` over every policy is the exponential tilt of the
anchor (:mod:`grpo_theory.tilted_policies`), whose PoS obeys, in log-odds ``L = logit(p)``,

    ``L_n = logit(p_anchor) + Omega(p_{n-1}) / beta``                         (Thm 8, with 1/beta)

Anchors: the reference (``alpha = 1``: Thm 2, ``h_{eps, p_ref}``), the previous iterate
(``alpha = 0``: Mirror GRPO, Thm 4), or their normalised geometric mean (``0 < alpha < 1``,
two-KL, Thm 9), for which ``L_n = alpha L_ref + (1 - alpha) L_{n-1} + Delta_R + Omega / beta``;
the Renyi correction ``Delta_R`` is 0 along the iteration started at ``pi_0 = pi_ref`` (a tilt by a
function of the reward keeps the success- and failure-conditionals of ``pi_ref``; see
:func:`grpo_theory.tilted_policies.renyi_correction`), which this module's scalar recursions
assume.

Everything is computed in log-odds (so ``1 - p`` is kept to full precision near 1). Fixed points
come with certified brackets (:func:`fixed_points`). NumPy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "NORMALISATIONS",
    "logit",
    "sigmoid",
    "success_weights",
    "omega",
    "pos_update",
    "pos_update_derivative",
    "PosTrajectory",
    "pos_trajectory",
    "pos_trajectories",
    "FixedPoint",
    "FixedPoints",
    "fixed_points",
    "orbit_kinds",
    "omega_logit_derivative_bound",
]

Normalisation = Literal["mean_std", "mean_only"]
NORMALISATIONS: tuple[str, ...] = ("mean_std", "mean_only")


# --- checks -------------------------------------------------------------------------------------
def _real(x: float, name: str, *, low: float, low_open: bool, high: float = math.inf,
          high_open: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number, got {x!r}")
    v = float(x)
    bad_low = v <= low if low_open else v < low
    bad_high = v >= high if high_open else v > high
    if math.isnan(v) or bad_low or bad_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lo}{low}, {high}{hi}, got {x!r}")
    return v


def _probs(p: object, name: str = "p") -> np.ndarray:
    a = np.asarray(p, dtype=np.float64)
    if not np.all((a >= 0.0) & (a <= 1.0)):  # NaN fails too
        raise ValueError(f"{name} must be in [0, 1], got {a.tolist()!r}")
    return a


def _normalisation(n: str) -> str:
    if n not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {n!r}")
    return n


# --- log-odds -----------------------------------------------------------------------------------
def logit(p: object) -> np.ndarray:
    """``log(p / (1 - p))`` elementwise; ``-inf`` at 0 and ``+inf`` at 1.

    >>> float(logit(0.5)), float(logit(0.0))
    (0.0, -inf)
    """
    a = _probs(p)
    with np.errstate(divide="ignore"):
        return np.log(a) - np.log1p(-a)


def sigmoid(x: object) -> np.ndarray:
    """``1 / (1 + exp(-x))`` elementwise, overflow-free (``sigmoid(+-inf) = 1, 0``).

    >>> float(sigmoid(0.0)), float(sigmoid(-np.inf))
    (0.5, 0.0)
    """
    z = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(z)):
        raise ValueError("sigmoid: x has NaN")
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _bernoulli_variance_of_logit(L: np.ndarray) -> np.ndarray:
    """``p (1 - p)`` at ``p = sigmoid(L)``, accurate for large ``|L|``:
    ``e^-|L| / (1 + e^-|L|)^2``."""
    e = np.exp(-np.abs(L))
    return e / (1.0 + e) ** 2


# --- weights (Eq. 4, Eq. 13) ---------------------------------------------------------------------
def _eps(eps: object) -> np.ndarray:
    e = np.asarray(eps, dtype=np.float64)
    if not np.all(e >= 0) or not np.all(np.isfinite(e)):
        raise ValueError(f"eps must be finite and >= 0, got {e.tolist()!r}")
    return e


def _beta(beta: object) -> np.ndarray:
    b = np.asarray(beta, dtype=np.float64)
    if not np.all(b > 0) or not np.all(np.isfinite(b)):
        raise ValueError(f"beta must be finite and > 0, got {b.tolist()!r}")
    return b


def success_weights(p: object, *, eps: float, normalisation: Normalisation = "mean_std"
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(w_plus(p), w_minus(p))``: the population advantage of a success is ``+w_plus`` and of a
    failure ``-w_minus`` (arXiv 2503.06639, Eq. 4 for ``mean_std``, Eq. 13 for ``mean_only``).

    Args:
        p: PoS of the previous iterate, in ``[0, 1]`` (array-like, broadcast).
        eps: the variance stabiliser ``varepsilon >= 0`` (ignored by ``mean_only``; broadcast
            with ``p``); ``eps = 0`` needs ``0 < p < 1`` for ``mean_std``.
        normalisation: ``"mean_std"`` (default, GRPO) or ``"mean_only"`` (Dr. GRPO).

    Returns:
        two float64 arrays of the shape of ``p``.

    >>> [float(w) for w in success_weights(0.5, eps=0.0)]
    [1.0, 1.0]
    """
    a = _probs(p)
    n = _normalisation(normalisation)
    e = _eps(eps)
    if n == "mean_only":
        return 1.0 - a, a.copy()
    var = a * (1.0 - a) + e
    if np.any(var == 0):
        raise ValueError("success_weights: eps = 0 with p in {0, 1} gives 0/0 (the group has no "
                         "variance); pass eps > 0 or 0 < p < 1")
    s = np.sqrt(var)
    return (1.0 - a) / s, a / s


def omega(p: object, *, eps: float, normalisation: Normalisation = "mean_std") -> np.ndarray:
    """``Omega(p) = w_plus(p) + w_minus(p)``: ``(p(1-p) + eps)^(-1/2)`` (``mean_std``) or 1
    (``mean_only``) (arXiv 2503.06639, Prop. 1 and Sec. 5).

    >>> float(omega(0.5, eps=0.0)), float(omega(0.2, eps=0.0, normalisation="mean_only"))
    (2.0, 1.0)
    """
    wp, wm = success_weights(p, eps=eps, normalisation=normalisation)
    if normalisation == "mean_only":
        return np.ones_like(wp)
    a = _probs(p)
    return 1.0 / np.sqrt(a * (1.0 - a) + _eps(eps))


def _omega_of_logit(L: np.ndarray, eps: float, normalisation: str) -> np.ndarray:
    if normalisation == "mean_only":
        return np.ones_like(L)
    v = _bernoulli_variance_of_logit(L) + eps
    return 1.0 / np.sqrt(v)


def _omega_logit_slope(L: np.ndarray, eps: float, normalisation: str) -> np.ndarray:
    """``d Omega(sigmoid(L)) / dL = -(1/2) (v + eps)^(-3/2) v (1 - 2 sigmoid(L))``."""
    if normalisation == "mean_only":
        return np.zeros_like(L)
    v = _bernoulli_variance_of_logit(L)
    return -0.5 * (v + eps) ** -1.5 * v * (1.0 - 2.0 * sigmoid(L))


def omega_logit_derivative_bound(eps: float) -> float:
    """``sup_L |d Omega(sigmoid(L)) / dL|`` for ``mean_std``: ``(1/2) max_{0 <= v <= 1/4}
    v (v + eps)^(-3/2)``, attained at ``v = 2 eps`` (or ``v = 1/4`` when ``2 eps > 1/4``):
    ``3^(-3/2) eps^(-1/2)`` for ``eps <= 1/8``. The Lipschitz constant behind :func:`fixed_points`.

    >>> round(omega_logit_derivative_bound(1e-4), 4)
    19.245
    """
    e = _real(eps, "eps", low=0.0, low_open=True)
    v = min(2.0 * e, 0.25)
    return 0.5 * v * (v + e) ** -1.5


# --- the PoS map -------------------------------------------------------------------------------
def _logit_map(L_prev: np.ndarray, L_ref: object, *, beta: object, eps: object, alpha: float,
               normalisation: str) -> np.ndarray:
    """``alpha L_ref + (1 - alpha) L_prev + Omega(sigmoid(L_prev)) / beta`` (alpha = 0:
    no reference term; alpha = 1: no previous-iterate term, so infinities never meet 0 * inf)."""
    out = _omega_of_logit(L_prev, eps, normalisation) / beta
    if alpha > 0:
        out = out + alpha * np.asarray(L_ref)
    if alpha < 1:
        out = out + (1.0 - alpha) * L_prev
    return out


def pos_update(p_prev: object, *, p_anchor: object, beta: float, eps: float,
               normalisation: Normalisation = "mean_std") -> np.ndarray:
    """One PoS step: ``sigmoid(logit(p_anchor) + Omega(p_prev) / beta)`` (arXiv 2503.06639,
    Thm 8 with the KL weight ``beta`` restored; Thm 2 with ``p_anchor = p_ref``, Thm 4 with
    ``p_anchor = p_prev``, Sec. 5 with ``normalisation="mean_only"``).

    Args:
        p_prev: PoS of ``pi_{n-1}`` (sets the weights), in ``[0, 1]``.
        p_anchor: PoS of the KL anchor, in ``[0, 1]`` (0 and 1 are absorbing).
        beta: KL weight, ``> 0``.
        eps: variance stabiliser, ``>= 0`` (all four broadcast).
        normalisation: ``"mean_std"`` or ``"mean_only"``.

    >>> round(float(pos_update(0.5, p_anchor=0.5, beta=1.0, eps=0.0)), 6)  # sigmoid(2)
    0.880797
    """
    b = _beta(beta)
    n = _normalisation(normalisation)
    om = omega(p_prev, eps=eps, normalisation=n)
    return sigmoid(logit(p_anchor) + om / b)


def pos_update_derivative(p: object, *, p_ref: float, beta: float, eps: float) -> np.ndarray:
    """``h'(p)`` of ``h(p) = sigmoid(logit(p_ref) + Omega_eps(p) / beta)`` (mean_std), by the chain
    rule: ``h (1 - h) Omega'(p) / beta`` with ``Omega'(p) = -(1 - 2p) / (2 (p(1-p) + eps)^(3/2))``
    (arXiv 2503.06639, Prop. 1 (ii)).

    >>> abs(float(pos_update_derivative(0.5, p_ref=0.3, beta=1.0, eps=0.1)))
    0.0
    """
    a = _probs(p)
    h = pos_update(a, p_anchor=p_ref, beta=beta, eps=eps)
    d_omega = -(1.0 - 2.0 * a) / (2.0 * (a * (1.0 - a) + eps) ** 1.5)
    return h * (1.0 - h) * d_omega / beta


@dataclass(frozen=True)
class PosTrajectory:
    """``p_0 .. p_n`` of a scalar PoS recursion, kept in log-odds.

    Attributes:
        logit: ``[n+1]`` log-odds ``L_k`` (``+-inf`` for PoS 1 / 0).
        p: ``[n+1]`` PoS ``sigmoid(L_k)``.
        one_minus_p: ``[n+1]`` ``1 - p_k`` to full precision (``sigmoid(-L_k)``).
    """

    logit: np.ndarray
    p: np.ndarray
    one_minus_p: np.ndarray


def pos_trajectories(p_ref: object, *, beta: object, eps: object, n_steps: int,
                     alpha: float = 1.0, normalisation: Normalisation = "mean_std",
                     p_start: object = None) -> np.ndarray:
    """Log-odds ``L_0 .. L_n`` of the PoS iterates for many parameter sets at once
    (``p_ref``, ``beta``, ``eps``, ``p_start`` broadcast to ``[N]``), KL anchor
    ``pi_ref^alpha pi_{n-1}^(1-alpha)`` (normalised), Renyi correction 0 (start at
    ``pi_0 = pi_ref``, or any ``pi_0`` with ``pi_ref``'s success- and failure-conditionals):

    ``L_n = alpha L_ref + (1 - alpha) L_{n-1} + Omega(p_{n-1}) / beta``

    (arXiv 2503.06639: ``alpha = 1`` Thm 2, ``alpha = 0`` Mirror GRPO Thm 4, ``0 < alpha < 1``
    Thm 9; ``normalisation="mean_only"`` the Dr. GRPO rows of Table 1). PoS 0 and 1 are
    absorbing (a tilt cannot create or remove mass): such entries keep ``L = -+inf``.

    Args:
        p_ref: reference PoS in ``[0, 1]``.
        beta: KL weight ``> 0``.
        eps: variance stabiliser (``> 0`` for ``mean_std`` where a PoS can be 0 or 1).
        n_steps: number of steps ``n >= 0``.
        alpha: weight of the reference in the KL mix, ``0 <= alpha <= 1`` (default 1).
        normalisation: ``"mean_std"`` (default) or ``"mean_only"``.
        p_start: ``p_0`` (default ``p_ref``, the paper's ``pi_0 = pi_ref``).

    Returns:
        ``[n_steps + 1, N]`` float64 log-odds.

    >>> pos_trajectories([0.5, 0.5], beta=[1.0, 2.0], eps=0.0, n_steps=1,
    ...                  normalisation="mean_only").round(6).tolist()
    [[0.0, 0.0], [1.0, 0.5]]
    """
    pr, b, e, p0 = np.broadcast_arrays(*(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in
                                         (p_ref, beta, eps, p_ref if p_start is None else p_start)))
    if pr.ndim != 1:
        raise ValueError("p_ref, beta, eps and p_start must broadcast to one dimension")
    _probs(pr, "p_ref")
    _probs(p0, "p_start")
    _beta(b)
    _eps(e)
    a = _real(alpha, "alpha", low=0.0, low_open=False, high=1.0)
    n = _normalisation(normalisation)
    if isinstance(n_steps, bool) or not isinstance(n_steps, int | np.integer) or n_steps < 0:
        raise ValueError(f"n_steps must be an integer >= 0, got {n_steps!r}")
    if n == "mean_std" and np.any((e == 0) & ((p0 == 0) | (p0 == 1))):
        raise ValueError("eps = 0 with a PoS in {0, 1}: the weights are 0/0; pass eps > 0")
    L_ref = logit(pr)
    out = np.empty((int(n_steps) + 1, pr.size))
    out[0] = logit(p0)
    live = np.isfinite(out[0]) & (np.isfinite(L_ref) | (a == 0))
    for k in range(1, int(n_steps) + 1):
        out[k] = out[k - 1]
        if live.any():
            out[k, live] = _logit_map(out[k - 1, live], L_ref[live], beta=b[live], eps=e[live],
                                      alpha=a, normalisation=n)
    return out


def pos_trajectory(p_ref: float, *, beta: float, eps: float, n_steps: int, alpha: float = 1.0,
                   normalisation: Normalisation = "mean_std") -> PosTrajectory:
    """The PoS iterates ``p_0 = p_ref, ..., p_n`` of :func:`pos_trajectories` for one parameter
    set, as a :class:`PosTrajectory` (log-odds, PoS, and ``1 - p`` to full precision).

    >>> t = pos_trajectory(0.5, beta=1.0, eps=0.0, n_steps=1, normalisation="mean_only")
    >>> [round(float(x), 6) for x in t.logit]
    [0.0, 1.0]
    """
    for name, v in (("p_ref", p_ref), ("beta", beta), ("eps", eps)):
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar (pos_trajectories takes arrays)")
    L = pos_trajectories(p_ref, beta=beta, eps=eps, n_steps=n_steps, alpha=alpha,
                         normalisation=normalisation)[:, 0]
    return PosTrajectory(L, sigmoid(L), sigmoid(-L))


# --- fixed points with certified brackets -------------------------------------------------------
@dataclass(frozen=True)
class FixedPoint:
    """One fixed point ``p* = sigmoid(L*)`` of a PoS map.

    Attributes:
        logit: ``L*`` (midpoint of the bracket).
        bracket: ``(lo, hi)`` in log-odds with ``F(lo) > 0 > F(hi)`` or the reverse, where
            ``F(L) = T(L) - L``: a fixed point lies inside (intermediate value theorem).
        p: ``sigmoid(L*)``; ``one_minus_p``: ``sigmoid(-L*)``.
        multiplier: ``T'(L*)``, equal to ``h'(p*)`` (a smooth change of variable keeps the
            derivative at a fixed point); ``|multiplier| < 1``: attracting.
    """

    logit: float
    bracket: tuple[float, float]
    p: float
    one_minus_p: float
    multiplier: float

    @property
    def attracting(self) -> bool:
        """``|h'(p*)| < 1``."""
        return abs(self.multiplier) < 1.0


@dataclass(frozen=True)
class FixedPoints:
    """Every fixed point of a PoS map in ``(0, 1)``, with the certificate.

    Attributes:
        points: the fixed points, increasing.
        certified: True when every cell of the search interval without a sign change was proved
            root-free by the Lipschitz bound (so no fixed point is missing) and each bracket is a
            strict sign change of width <= ``tol``.
        search_interval: ``(lo, hi)`` in log-odds outside which no fixed point can lie
            (``Omega`` is bounded).
        lipschitz: the bound on ``|F'|`` used.
        cells_checked: number of cells examined.
    """

    points: tuple[FixedPoint, ...]
    certified: bool
    search_interval: tuple[float, float]
    lipschitz: float
    cells_checked: int

    @property
    def p(self) -> np.ndarray:
        """The fixed points' PoS values."""
        return np.array([f.p for f in self.points])


class _MixedMap:
    """``T(L) = alpha L_ref + (1-alpha) L + Omega(sigmoid(L)) / beta`` and ``F = T - L``."""

    def __init__(self, L_ref: float, beta: float, eps: float, alpha: float, normalisation: str):
        self.L_ref, self.beta, self.eps, self.alpha, self.n = L_ref, beta, eps, alpha, normalisation

    def F(self, L: np.ndarray) -> np.ndarray:
        om = _omega_of_logit(L, self.eps, self.n)
        return self.alpha * (self.L_ref - L) + om / self.beta

    def slope(self, L: float) -> float:
        return (1.0 - self.alpha) + float(_omega_logit_slope(np.array(L), self.eps, self.n)
                                          ) / self.beta


def _bisect(m: _MixedMap, lo: float, hi: float, tol: float) -> tuple[float, float]:
    flo = float(m.F(np.array(lo)))
    for _ in range(200):
        if hi - lo <= tol * max(1.0, abs(lo)):
            break
        mid = 0.5 * (lo + hi)
        fm = float(m.F(np.array(mid)))
        if fm == 0.0:
            return mid, mid
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return lo, hi


def fixed_points(p_ref: float, *, beta: float, eps: float, alpha: float = 1.0,
                 normalisation: Normalisation = "mean_std", cells: int = 2048,
                 max_depth: int = 30, tol: float = 1e-13) -> FixedPoints:
    """Every fixed point in ``(0, 1)`` of the PoS map with reference weight ``alpha > 0``,
    ``L = alpha L_ref + (1 - alpha) L + Omega(sigmoid(L)) / beta``, i.e. of
    ``p = sigmoid(logit(p_ref) + Omega(p) / (alpha beta))`` (arXiv 2503.06639: ``alpha = 1`` the
    ``h_{eps, p_ref}`` of Thm 2 and Prop. 1; ``0 < alpha < 1`` Table 1's two-KL fixed point).

    Certified search: a fixed point has ``L* - L_ref`` in ``[Omega_min, Omega_max] / (alpha beta)``
    (``Omega`` is bounded: ``(1/4 + eps)^(-1/2) <= Omega <= eps^(-1/2)``). That interval is cut into
    ``cells`` cells; ``F = T - L`` has ``|F'| <= Lip = alpha + sup|Omega_L| / beta``
    (:func:`omega_logit_derivative_bound`), so a cell with ``F(a), F(b)`` of one sign and
    ``|F(a)| + |F(b)| > Lip (b - a)`` holds no root; other cells are halved (up to ``max_depth``
    times). A sign change is refined by bisection to a bracket of relative width ``tol``.

    Args:
        p_ref: reference PoS, ``0 < p_ref < 1`` (0 and 1 are the fixed points themselves).
        beta: KL weight ``> 0``; eps: ``> 0`` for ``mean_std``.
        alpha: reference weight, ``0 < alpha <= 1`` (``alpha = 0``, Mirror GRPO, has no fixed
            point inside ``(0, 1)``: Thm 5).
        normalisation: ``"mean_std"`` or ``"mean_only"`` (one fixed point, ``L_ref + 1/(alpha
            beta)``).
        cells, max_depth, tol: search resolution.

    Returns:
        :class:`FixedPoints`.

    >>> fp = fixed_points(0.5, beta=1.0, eps=0.0, normalisation="mean_only")
    >>> [round(x.p, 6) for x in fp.points], fp.certified
    ([0.731059], True)
    """
    pr = float(_probs(p_ref, "p_ref"))
    if not 0.0 < pr < 1.0:
        raise ValueError(f"p_ref must be in (0, 1) (0 and 1 are absorbing), got {p_ref!r}")
    b = _real(beta, "beta", low=0.0, low_open=True)
    a = _real(alpha, "alpha", low=0.0, low_open=True, high=1.0)
    n = _normalisation(normalisation)
    e = _real(eps, "eps", low=0.0, low_open=n == "mean_std")
    L_ref = float(logit(pr))
    m = _MixedMap(L_ref, b, e, a, n)
    if n == "mean_only":
        L = L_ref + 1.0 / (a * b)
        return FixedPoints((FixedPoint(L, (L, L), float(sigmoid(L)), float(sigmoid(-L)),
                                       m.slope(L)),), True, (L, L), a, 1)
    lo = L_ref + (0.25 + e) ** -0.5 / (a * b) - 1e-9 * (1 + abs(L_ref))
    hi = L_ref + e**-0.5 / (a * b) + 1e-9 * (1 + abs(L_ref))
    lip = a + omega_logit_derivative_bound(e) / b
    edges = np.linspace(lo, hi, int(cells) + 1)
    left, right = edges[:-1], edges[1:]
    brackets: list[tuple[float, float]] = []
    certified, checked = True, 0
    for depth in range(int(max_depth) + 1):
        fl, fr = m.F(left), m.F(right)
        checked += left.size
        change = (fl > 0) != (fr > 0)
        brackets += [(float(x), float(y)) for x, y in zip(left[change], right[change],
                                                          strict=True)]
        free = ~change & (np.abs(fl) + np.abs(fr) > lip * (right - left))
        open_ = ~change & ~free
        if not open_.any():
            break
        if depth == max_depth:
            certified = False
            break
        mid = 0.5 * (left[open_] + right[open_])
        left, right = np.concatenate([left[open_], mid]), np.concatenate([mid, right[open_]])
    points = []
    for x, y in sorted(set(brackets)):
        blo, bhi = _bisect(m, x, y, tol)
        Ls = 0.5 * (blo + bhi)
        points.append(FixedPoint(Ls, (blo, bhi), float(sigmoid(Ls)), float(sigmoid(-Ls)),
                                 m.slope(Ls)))
    return FixedPoints(tuple(points), certified, (float(lo), float(hi)), float(lip), checked)


def orbit_kinds(p_ref: object, *, beta: object, eps: object, alpha: float = 1.0,
                n_steps: int = 4000, tol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Long-run behaviour of the PoS iterates from ``p_0 = p_ref`` (arXiv 2503.06639, App. C.2,
    Fig. 5), for many parameter sets at once (``p_ref``, ``beta``, ``eps`` broadcast; every
    ``p_ref`` in ``(0, 1)``): after ``n_steps`` steps of
    ``L_n = alpha L_ref + (1 - alpha) L_{n-1} + Omega_eps(p_{n-1}) / beta``, ``"fixed point"``
    when the last two log-odds agree to ``tol`` (relative), ``"period 2"`` when ``L_n = L_{n-2}``
    and ``L_{n-1} = L_{n-3}`` but not ``L_{n-1}``, else ``"other"``.

    Returns:
        ``(kinds, last)``: ``[N]`` strings and ``[N, 2]`` PoS ``(p_{n-1}, p_n)``.

    >>> kinds, last = orbit_kinds([0.3, 0.001], beta=[1.0, 5.0], eps=1e-5)
    >>> kinds.tolist()
    ['fixed point', 'period 2']
    """
    pr, b, e = (np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (p_ref, beta, eps))
    pr, b, e = np.broadcast_arrays(pr, b, e)
    if pr.ndim != 1 or not np.all((pr > 0) & (pr < 1)):
        raise ValueError("p_ref must be 1-D with every entry in (0, 1)")
    if not (np.all(b > 0) and np.all(e > 0)):
        raise ValueError("beta and eps must be > 0")
    a = _real(alpha, "alpha", low=0.0, low_open=False, high=1.0)
    if isinstance(n_steps, bool) or not isinstance(n_steps, int | np.integer) or n_steps < 4:
        raise ValueError(f"n_steps must be an integer >= 4, got {n_steps!r}")
    L4 = pos_trajectories(pr, beta=b, eps=e, n_steps=int(n_steps), alpha=a)[-4:]
    scale = np.maximum(1.0, np.abs(L4[-1]))
    fixed = np.abs(L4[-1] - L4[-2]) <= tol * scale
    two = (~fixed & (np.abs(L4[-1] - L4[-3]) <= tol * scale)
           & (np.abs(L4[-2] - L4[-4]) <= tol * scale))
    kinds = np.where(fixed, "fixed point", np.where(two, "period 2", "other"))
    return kinds, sigmoid(L4[-2:].T)
