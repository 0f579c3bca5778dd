"""Exact training diagnostics of one GRPO step, from the Grams of its per-rollout gradient rows.

**Setting.** The step's gradient is ``G = sum_i g_i``, a sum of per-rollout rows ``g_i in R^d``:
each row is the rollout's whole contribution to the host's gradient (advantage, loss aggregation
and every constant scale included, so that ``sum_i g_i`` *is* the gradient the optimizer sees).
The rollouts come in ``n`` groups (prompts) of ``R``; group ``g`` has the gradient
``G_g = sum_{i in g} g_i`` and the Gram ``K_g = [<g_i, g_j>]_{i, j in g}`` (``[R, R]``). Nothing
here needs a row: every diagnostic is a function of the ``K_g``, the rows' token counts, the
rewards, the host's total norm ``|G|`` and, for the cosines, the Grams of whole passes.

**Diagnostics** (keys of :func:`step_diagnostics`; ``[n, R]`` arrays from :func:`group_arrays`):

* per-rollout gradient norm ``|g_i| = sqrt(K_g[i, i])``; per-group gradient norm
  ``|G_g| = sqrt(1^T K_g 1)`` (``|sum_i g_i|^2 = sum_ij <g_i, g_j>``);
* **dead groups**: ``tr K_g = sum_i |g_i|^2 <= dead_atol`` (default ``0``: every row exactly
  zero). The rule reads the rows, not the rewards: a zero advantage makes a row ``0 * score``,
  which is exactly 0 in any precision, so a group the host gives no gradient is counted exactly;
  a constant-reward group that the host still gives round-off advantages (TRL's float32 mean of
  ``[123.456] * 12`` gives ``A = -0.13``) is *live*, with its (small) norm reported. No threshold
  on a reward std enters. Reported: their count and their share of the groups, of the rollouts
  and of the tokens;
* the **gradient noise scale** with prompts (groups) as the units (McCandlish, Kaplan, Amodei
  et al. 2018, "An Empirical Model of Large-Batch Training", arXiv 1812.06162, Sec. 2.2 and
  App. A.1): ``B_simple = tr(Sigma) / |mu|^2``, both parts and the step's signal-to-noise ratio
  (:func:`noise_scale_parts`, :func:`gradient_noise_scale`; derivation there);
* the **gradient mass by solve rate**: the share of ``sum_g |G_g|^2`` carried by the groups with
  ``k`` of ``R`` rollouts solved (reward ``> success_threshold``), ``k = 0..R``;
* **alignment between groups**: over *all* groups, the norm-weighted mean cosine
  ``sum_{g != h} <G_g, G_h> / sum_{g != h} |G_g| |G_h| = (|G|^2 - sum_g |G_g|^2) /
  ((sum_g |G_g|)^2 - sum_g |G_g|^2)`` (exact from the host's ``|G|``: no cross block needed);
  and, where one pass formed the Gram of several whole groups' rows (``pass_grams``), every
  pairwise cosine ``cos(G_g, G_h) = 1_g^T K 1_h / (|G_g| |G_h|)`` within that pass (its mean,
  minimum, maximum and number of pairs). Scope: only pairs of groups whose rows were in one
  Gram; pairs across passes or processes are in the weighted mean above, not in the pairs.

**Merge rule.** Each process (or micro-batch of whole groups) computes :func:`group_sums` of its
own groups: additive scalars (sums over groups) plus a few maxima and minima
(:data:`MERGE_RULES`); :func:`merge_group_sums` combines them (sum, max, min: an all-reduce of
two or three float vectors), and :func:`diagnostics_from_sums` turns the merged sums, the host's
global ``|G|`` and the number of groups into the final scalars. Rows are never gathered. A group
must be measured whole by one Gram (its ``|G_g|^2`` needs every ``<g_i, g_j>`` of the group).

**Round-off rule** (as :mod:`grpo_theory.spectral`): Grams must be finite and symmetric to
within ``PSD_RTOL * max|K_g|``; a negative diagonal entry or ``1^T K_g 1`` within round-off
(``>= -PSD_RTOL * max|K_g|``, resp. ``>= -PSD_RTOL * R * tr K_g``) is set to 0, anything more
negative is an error naming the group. Undefined values are NaN *and* say why:
``noise/status`` (codes in :data:`NOISE_STATUS`), ``alignment/pass_pairs = 0``, ``groups`` and
``dead_groups/count``; :func:`diagnostics_notes` turns them into sentences.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._backend import to_float64
from ._validate import real_option

__all__ = [
    "NOISE_STATUS",
    "MERGE_RULES",
    "DEFAULT_NOISE_RTOL",
    "NoiseScale",
    "rollout_grad_norms",
    "group_grad_sq_norms",
    "dead_groups",
    "group_inner_products",
    "group_gradient_cosines",
    "noise_scale_parts",
    "gradient_noise_scale",
    "solve_rate_mass",
    "group_arrays",
    "group_sums",
    "merge_group_sums",
    "diagnostics_from_sums",
    "step_diagnostics",
    "diagnostics_notes",
]

PSD_RTOL = 1e-5  # the admitted relative round-off of a Gram (grpo_theory.spectral.PSD_RTOL)
#: Default relative precision of ``|G|^2`` and ``sum_g |G_g|^2`` (float32 accumulations).
DEFAULT_NOISE_RTOL = 1e-6

#: ``noise/status`` codes: 0 when ``B_simple`` and the SNR are defined, else why not.
NOISE_STATUS: dict[int, str] = {
    0: "defined",
    1: "fewer than 2 groups: the spread between groups needs two",
    2: "no total gradient norm given",
    3: "no gradient: every group is dead (|G|^2 = sum_g |G_g|^2 = 0)",
    4: "|mu|^2 estimate <= 0 (or within the inputs' precision of 0): the groups' gradients "
       "cancel on average (no detectable signal); B_simple is not defined, the SNR is reported",
    5: "tr(Sigma) estimate <= 0 (or within the inputs' precision of 0): the groups' gradients "
       "do not spread (all equal), or the total |G|^2 exceeds n * sum_g |G_g|^2, which no "
       "sum of these groups can (the norm is not of their sum: clipped, another scale, "
       "groups missing, or its precision)",
}

#: How each key of :func:`group_sums` merges across processes and micro-batches (missing keys:
#: the rule's identity, 0 / -inf / +inf).
MERGE_RULES: dict[str, str] = {
    "groups": "sum",
    "rollouts": "sum",
    "tokens": "sum",
    "dead_groups": "sum",
    "dead_rollouts": "sum",
    "dead_tokens": "sum",
    "rollout_norm_sum": "sum",
    "rollout_sq_sum": "sum",
    "rollout_norm_max": "max",
    "group_norm_sum": "sum",
    "group_sq_sum": "sum",
    "group_norm_max": "max",
    "nonzero_groups": "sum",
    "pass_pairs": "sum",
    "pass_cos_sum": "sum",
    "pass_cos_max": "max",
    "pass_cos_min": "min",
}
_MASS_KEY = re.compile(r"^(mass|groups)_solved_(\d+)_of_(\d+)$")
_IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf}


# --- input checks ---------------------------------------------------------------------------------
def _grams(grams: Any, name: str = "grams") -> np.ndarray:
    """``grams`` as a checked float64 ``[n, R, R]`` stack (a sequence of ``[R, R]`` is stacked)."""
    if isinstance(grams, list | tuple):
        if not grams:
            raise ValueError(f"{name} is empty: no group to diagnose")
        parts = [to_float64(k) for k in grams]
        shapes = {p.shape for p in parts}
        if len(shapes) != 1:
            raise ValueError(
                f"{name} must all be R x R with one R (pad a short group with zero rows), got "
                f"shapes {sorted(shapes)}"
            )
        k = np.stack(parts)
    else:
        k = to_float64(grams)
    if k.ndim != 3 or k.shape[1] != k.shape[2] or k.shape[0] == 0 or k.shape[1] == 0:
        raise ValueError(f"{name} must be a stack of n square R x R Grams [n, R, R], got shape "
                         f"{k.shape}")
    bad = ~np.isfinite(k).reshape(k.shape[0], -1).all(axis=1)
    if bad.any():
        raise ValueError(f"{name}[{int(np.argmax(bad))}] contains NaN or inf")
    scale = np.abs(k).reshape(k.shape[0], -1).max(axis=1)
    asym = np.abs(k - k.transpose(0, 2, 1)).reshape(k.shape[0], -1).max(axis=1)
    bad = asym > PSD_RTOL * scale
    if bad.any():
        g = int(np.argmax(bad))
        raise ValueError(f"{name}[{g}] is not symmetric (max |K - K^T| = {asym[g]:.3g}, "
                         f"max |K| = {scale[g]:.3g}): not a Gram of rows")
    return k


def _group_table(x: Any, name: str, shape: tuple[int, int], *, nan_ok: bool = False
                 ) -> np.ndarray:
    a = to_float64(x)
    if a.shape != shape:
        raise ValueError(f"{name} must be shaped [n, R] = {list(shape)} like the Grams, got "
                         f"{list(a.shape)}")
    bad = np.isinf(a) if nan_ok else ~np.isfinite(a)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} contains a non-finite value ({a[idx]}) at index {idx}")
    return a


def _tokens(tokens: Any, shape: tuple[int, int]) -> np.ndarray:
    t = _group_table(tokens, "tokens", shape)
    if np.any(t < 0) or np.any(t != np.round(t)):
        idx = tuple(int(i) for i in np.argwhere((t < 0) | (t != np.round(t)))[0])
        raise ValueError(f"tokens must be whole counts >= 0, got {t[idx]} at index {idx}")
    return t


# --- per-rollout and per-group quantities -----------------------------------------------------
def _diagonals(k: np.ndarray, name: str = "grams") -> np.ndarray:
    d = np.einsum("gii->gi", k).copy()
    scale = np.abs(k).reshape(k.shape[0], -1).max(axis=1)
    low = d.min(axis=1)
    bad = low < -PSD_RTOL * scale
    if bad.any():
        g = int(np.argmax(bad))
        raise ValueError(f"{name}[{g}] has a negative diagonal entry {low[g]:.3g} (max |K| = "
                         f"{scale[g]:.3g}): a squared norm cannot be negative")
    return np.maximum(d, 0.0)  # round-off rule (module docstring)


def rollout_grad_norms(grams: Any) -> np.ndarray:
    """Per-rollout gradient norms ``|g_i| = sqrt(K_g[i, i])``.

    Args:
        grams: ``[n, R, R]`` Grams of the rows of ``n`` groups (or a sequence of ``[R, R]``).

    Returns:
        ``[n, R]`` float64.

    >>> rollout_grad_norms([[[4.0, 0.0], [0.0, 9.0]]]).tolist()
    [[2.0, 3.0]]
    """
    return np.sqrt(_diagonals(_grams(grams)))


def group_grad_sq_norms(grams: Any) -> np.ndarray:
    """Per-group squared gradient norms ``|G_g|^2 = |sum_{i in g} g_i|^2 = 1^T K_g 1``.

    A value ``>= -PSD_RTOL * R * tr K_g`` below 0 is round-off of a cancelling group and is 0;
    a more negative one is an error naming the group (``|1^T K 1| <= R tr K`` for any Gram).

    Args:
        grams: ``[n, R, R]``.

    Returns:
        ``[n]`` float64, ``>= 0``.

    >>> group_grad_sq_norms([[[1.0, -1.0], [-1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]]).tolist()
    [0.0, 4.0]
    """
    return _group_sq(_grams(grams))


def _group_sq(k: np.ndarray, name: str = "grams") -> np.ndarray:
    s = k.sum(axis=(1, 2))
    tr = _diagonals(k, name).sum(axis=1)
    bad = s < -PSD_RTOL * k.shape[1] * tr
    if bad.any():
        g = int(np.argmax(bad))
        raise ValueError(f"{name}[{g}] has 1^T K 1 = {s[g]:.3g} < 0 (tr K = {tr[g]:.3g}): not "
                         "a Gram of rows")
    return np.maximum(s, 0.0)


def dead_groups(grams: Any, *, dead_atol: float = 0.0) -> np.ndarray:
    """Groups whose gradient contribution is zero: ``tr K_g = sum_i |g_i|^2 <= dead_atol``.

    With the default ``dead_atol = 0`` a group is dead exactly when every one of its rows is the
    zero vector (after the round-off rule of the module docstring), which is what a zero
    advantage produces in any floating-point precision (``0 * score = 0``). A group whose rows are
    nonzero but cancel (``G_g = 0``, ``tr K_g > 0``) is *not* dead: its rollouts still move the
    parameters in opposite directions; its ``|G_g|`` is reported as such.

    Args:
        grams: ``[n, R, R]``.
        dead_atol: absolute tolerance on ``tr K_g`` (squared-gradient units), ``>= 0``; default 0.

    Returns:
        ``[n]`` bool.

    >>> dead_groups([np.zeros((2, 2)), np.eye(2)]).tolist()
    [True, False]
    """
    tol = real_option(dead_atol, "dead_atol", minimum=0.0)
    return _diagonals(_grams(grams)).sum(axis=1) <= tol


def group_inner_products(pass_gram: Any, *, group_size: int) -> np.ndarray:
    """``<G_g, G_h> = 1_g^T K 1_h`` for the whole groups of one pass.

    Args:
        pass_gram: ``[p R, p R]`` Gram of the rows of ``p`` whole groups formed in one pass, rows
            ordered group by group (rows ``g R .. g R + R - 1`` are group ``g``'s).
        group_size: ``R``.

    Returns:
        ``[p, p]``: the Gram of the group gradients (its diagonal is ``|G_g|^2``).

    >>> group_inner_products(np.eye(4), group_size=2).tolist()
    [[2.0, 0.0], [0.0, 2.0]]
    """
    R = _group_size(group_size)
    k = _grams(to_float64(pass_gram)[None], "pass_gram")[0]
    m = k.shape[0]
    if m % R:
        raise ValueError(f"pass_gram is {m} x {m}: not a whole number of groups of "
                         f"group_size={R}")
    p = m // R
    return k.reshape(p, R, p, R).sum(axis=(1, 3))


def _group_size(group_size: Any) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int | np.integer) \
            or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    return int(group_size)


def group_gradient_cosines(pass_gram: Any, *, group_size: int) -> np.ndarray:
    """Cosines between the gradients of the whole groups of one pass.

    ``cos(G_g, G_h) = <G_g, G_h> / (|G_g| |G_h|)`` from :func:`group_inner_products`. Scope:
    only the groups whose rows are in ``pass_gram`` (groups of other passes or processes have no
    cross block here). A pair with a zero-gradient group has no cosine: NaN, *by definition*
    (the entries with ``|G_g| = 0``; :func:`group_sums` counts only the defined pairs).

    Args:
        pass_gram: ``[p R, p R]`` (see :func:`group_inner_products`).
        group_size: ``R``.

    Returns:
        ``[p, p]``, 1 on the diagonal of live groups.

    >>> c = group_gradient_cosines([[1.0, 0.5], [0.5, 1.0]], group_size=1)
    >>> c.round(3).tolist()
    [[1.0, 0.5], [0.5, 1.0]]
    """
    c = group_inner_products(pass_gram, group_size=group_size)
    sq = np.maximum(np.diag(c), 0.0)
    norm = np.sqrt(sq)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = c / np.outer(norm, norm)
    live = sq > 0
    cos[~(live[:, None] & live[None, :])] = np.nan
    return cos


# --- the gradient noise scale ---------------------------------------------------------------------
def noise_scale_parts(group_sq_sum: Any, total_sq: Any, *, num_groups: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased estimates of ``|mu|^2`` and ``tr(Sigma)`` with groups (prompts) as the units.

    **Model.** The ``n`` groups of a step are i.i.d. draws (a prompt, then its ``R`` rollouts), and
    the step's gradient is their sum, ``G = sum_g G_g``. In the units of the step, group ``g``'s
    estimate of the gradient is ``x_g = n G_g`` (so ``G = mean_g x_g``); let
    ``mu = E[x_g] = E[G]`` (the expected step gradient) and ``Sigma = Cov(x_g)`` (the covariance
    of one group's estimate). Then ``E|G|^2 = |mu|^2 + tr(Sigma) / n``: McCandlish et al. 2018
    (arXiv 1812.06162), Eq. 2.6 / App. A.1, with a group as the "example" and ``B = n``.

    **Estimators** (their App. A.1 uses two batch sizes, ``|G_Bsmall|^2`` and ``|G_Bbig|^2``;
    here the small batches are the single groups, averaged, and the big batch is the step):

    * ``S_1 = mean_g |x_g|^2 = n sum_g |G_g|^2`` has ``E S_1 = |mu|^2 + tr(Sigma)``;
    * ``S_n = |G|^2`` has ``E S_n = |mu|^2 + tr(Sigma) / n``.

    Solving the two linear equations (McCandlish's ``(B_big |G_big|^2 - B_small |G_small|^2) /
    (B_big - B_small)`` and ``(|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)`` at
    ``B_small = 1``, ``B_big = n``)::

        |mu|^2_hat    = (n S_n - S_1) / (n - 1) = n / (n - 1) * (|G|^2 - sum_g |G_g|^2)
        tr(Sigma)_hat = (S_1 - S_n) / (1 - 1/n) = n / (n - 1) * (n sum_g |G_g|^2 - |G|^2)

    Both are unbiased: ``|G|^2 - sum_g |G_g|^2 = sum_{g != h} <G_g, G_h>``, whose expectation is
    ``n (n - 1) |mu|^2 / n^2`` (independent groups); ``tr(Sigma)_hat`` is the trace of the sample
    covariance ``(1 / (n - 1)) sum_g |x_g - mean x|^2``. Only two scalars are needed: the sum of
    the per-group squared norms (additive across processes) and the host's global ``|G|^2``.
    ``|mu|^2_hat`` can be negative (an unbiased estimate of a small quantity); it is returned as
    computed, never clamped. ``tr(Sigma)_hat >= 0`` whenever ``|G|^2`` is the norm of the sum of
    these groups (Cauchy-Schwarz: ``|sum_g G_g|^2 <= n sum_g |G_g|^2``).

    The step's loss normalisation is held fixed (a token-mean ``1 / sum tokens`` couples the
    groups slightly; the estimators are then unbiased given that normalisation).

    Args:
        group_sq_sum: ``sum_g |G_g|^2`` (scalar or array, elementwise with ``total_sq``).
        total_sq: ``|G|^2``, the host's total gradient norm squared (same scale as the rows).
        num_groups: ``n >= 2``.

    Returns:
        ``(|mu|^2_hat, tr(Sigma)_hat)``, float64 arrays of the broadcast shape.

    >>> mu, tr = noise_scale_parts(2.0, 4.0, num_groups=2)  # two equal groups: no noise
    >>> float(mu), float(tr)
    (4.0, 0.0)
    """
    n = _num_groups(num_groups, minimum=2)
    s = np.asarray(group_sq_sum, dtype=np.float64)
    t = np.asarray(total_sq, dtype=np.float64)
    f = n / (n - 1.0)
    return f * (t - s), f * (n * s - t)


def _num_groups(num_groups: Any, *, minimum: int) -> int:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int | np.integer) \
            or num_groups < minimum:
        raise ValueError(f"num_groups must be an int >= {minimum}, got {num_groups!r}")
    return int(num_groups)


@dataclass(frozen=True)
class NoiseScale:
    """The gradient noise scale of one step (groups as the units; :func:`noise_scale_parts`).

    Attributes:
        mu_sq: ``|mu|^2_hat`` (may be ``<= 0``; NaN when not computable: status 1, 2).
        trace_sigma: ``tr(Sigma)_hat`` (NaN when not computable).
        b_simple: ``tr(Sigma)_hat / |mu|^2_hat`` in groups (prompts): the batch at which the
            step's noise equals its signal. NaN unless ``status == 0``.
        snr: ``|mu|^2_hat / (tr(Sigma)_hat / n) = n / B_simple``: the signal-to-noise ratio of the
            step's gradient ``E|mu|^2 / E|G - mu|^2``. NaN unless ``status`` is 0 or 4.
        status: a code of :data:`NOISE_STATUS` (0: defined).
        reason: ``NOISE_STATUS[status]``.
    """

    mu_sq: float
    trace_sigma: float
    b_simple: float
    snr: float
    status: int
    reason: str


def gradient_noise_scale(group_sq_sum: float, total_sq: float | None, *, num_groups: int,
                         rtol: float = DEFAULT_NOISE_RTOL) -> NoiseScale:
    """``B_simple = tr(Sigma) / |mu|^2`` and the SNR of a step, saying why when undefined.

    Estimates from :func:`noise_scale_parts` (McCandlish et al. 2018, arXiv 1812.06162, App. A.1;
    groups as the units). The ratio of the two unbiased parts is consistent, not unbiased
    (McCandlish et al. note the same): average the parts over steps before dividing.

    Args:
        group_sq_sum: ``sum_g |G_g|^2`` over all ``n`` groups of the step.
        total_sq: the host's ``|G|^2`` (the squared norm of the gradient that is the sum of these
            groups' rows, before clipping), or None when the host gave none (status 2).
        num_groups: ``n >= 1``.
        rtol: the relative precision of ``|G|^2`` and ``sum_g |G_g|^2`` (default ``1e-6``: norms
            accumulated in float32). An estimate within ``n / (n - 1) * rtol * max(|G|^2,
            n sum_g |G_g|^2)`` of 0 is not resolved from 0 at that precision and counts as
            ``<= 0`` for the status (the value itself is reported as computed).

    >>> gradient_noise_scale(3.0, 4.0, num_groups=3).b_simple  # |mu|^2 1.5, tr(Sigma) 7.5
    5.0
    >>> gradient_noise_scale(3.0, 2.0, num_groups=3).status  # |mu|^2 -1.5
    4
    """
    n = _num_groups(num_groups, minimum=1)
    s = real_option(group_sq_sum, "group_sq_sum", minimum=0.0)
    nan = math.nan
    if n < 2:
        return _noise(nan, nan, nan, nan, 1)
    if total_sq is None:
        return _noise(nan, nan, nan, nan, 2)
    t = real_option(total_sq, "total_sq", minimum=0.0)
    if s == 0.0 and t == 0.0:
        return _noise(0.0, 0.0, nan, nan, 3)
    tol = real_option(rtol, "rtol", minimum=0.0, maximum=1.0) * n / (n - 1.0) * max(t, n * s)
    mu, tr = (float(v) for v in noise_scale_parts(s, t, num_groups=n))
    if tr <= tol:
        return _noise(mu, tr, nan, nan, 5)
    snr = mu / (tr / n)
    if mu <= tol:
        return _noise(mu, tr, nan, snr, 4)
    return _noise(mu, tr, tr / mu, snr, 0)


def _noise(mu: float, tr: float, b: float, snr: float, status: int) -> NoiseScale:
    return NoiseScale(mu, tr, b, snr, status, NOISE_STATUS[status])


# --- mass by solve rate -----------------------------------------------------------------------
def solve_rate_mass(group_sq: Any, rewards: Any, *, success_threshold: float = 0.5
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Gradient mass by the group's solve rate: ``sum_{g : k_g = k} |G_g|^2`` for ``k = 0..R``.

    ``k_g = #{i : r_gi > success_threshold}`` (a NaN reward, TRL's unscorable completion, is not
    a success). The shares (:func:`step_diagnostics`, ``mass_share/...``) divide by
    ``sum_g |G_g|^2``: which solve rates carry the step's per-group gradient energy (the quantity
    behind "gradient mass moves to extreme prompts"). The shares of ``|G|^2`` itself would need
    every cross-group inner product; the per-group energies are additive across processes.

    Args:
        group_sq: ``[n]`` per-group ``|G_g|^2``.
        rewards: ``[n, R]``.
        success_threshold: a rollout is solved when its reward exceeds this; default 0.5.

    Returns:
        ``(mass [R + 1], groups [R + 1])``: the energy and the number of groups at each ``k``.

    >>> m, c = solve_rate_mass([1.0, 4.0], [[1, 0], [1, 1]])
    >>> m.tolist(), c.tolist()
    ([0.0, 1.0, 4.0], [0, 1, 1])
    """
    sq = to_float64(group_sq).reshape(-1)
    r = to_float64(rewards)
    if r.ndim != 2 or r.shape[0] != sq.size:
        raise ValueError(f"rewards must be shaped [n, R] with n = {sq.size} groups, got "
                         f"{list(r.shape)}")
    r = _group_table(r, "rewards", r.shape, nan_ok=True)
    return _mass_by_solved(sq, _solved(r, success_threshold), r.shape[1])


def _solved(r: np.ndarray, success_threshold: float) -> np.ndarray:
    thr = real_option(success_threshold, "success_threshold")
    with np.errstate(invalid="ignore"):
        return (r > thr).sum(axis=1)


def _mass_by_solved(sq: np.ndarray, solved: np.ndarray, R: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    return (np.bincount(solved, weights=sq, minlength=R + 1),
            np.bincount(solved, minlength=R + 1))


# --- one step: arrays, additive sums, merge, final scalars -------------------------------------
def group_arrays(grams: Any, *, tokens: Any, rewards: Any, success_threshold: float = 0.5,
                 dead_atol: float = 0.0) -> dict[str, np.ndarray]:
    """Per-rollout and per-group diagnostics of ``n`` groups (for per-group records).

    Args:
        grams: ``[n, R, R]`` Grams ``K_g`` of the gradient rows (a rollout with no gradient, e.g.
            an empty completion, is a zero row: pad, never drop, so that ``R`` is the group size).
        tokens: ``[n, R]`` loss-mask token counts of the rollouts.
        rewards: ``[n, R]`` (NaN allowed: unscorable, not a success).
        success_threshold: solved when the reward exceeds this; default 0.5.
        dead_atol: see :func:`dead_groups`; default 0 (exactly zero rows).

    Returns:
        ``rollout_grad_norm [n, R]``, ``group_grad_sq [n]``, ``group_grad_norm [n]``,
        ``dead [n]`` (bool), ``solved [n]`` (int ``k``), ``tokens [n, R]``.
    """
    k = _grams(grams)
    n, R, _ = k.shape
    t = _tokens(tokens, (n, R))
    r = _group_table(rewards, "rewards", (n, R), nan_ok=True)
    tol = real_option(dead_atol, "dead_atol", minimum=0.0)
    diag = _diagonals(k)
    sq = _group_sq(k)
    return {
        "rollout_grad_norm": np.sqrt(diag),
        "group_grad_sq": sq,
        "group_grad_norm": np.sqrt(sq),
        "dead": diag.sum(axis=1) <= tol,
        "solved": _solved(r, success_threshold),
        "tokens": t,
    }


def group_sums(grams: Any, *, tokens: Any, rewards: Any, pass_grams: Sequence[Any] = (),
               success_threshold: float = 0.5, dead_atol: float = 0.0) -> dict[str, float]:
    """The additive sums of one process's (or micro-batch's) whole groups: merge, never gather.

    Keys: those of :data:`MERGE_RULES` and, for ``k = 0..R``, ``mass_solved_{k}_of_{R}``
    (``sum |G_g|^2`` of the groups with ``k`` solved) and ``groups_solved_{k}_of_{R}`` (their
    number), all summed when merged. Every value is a float.

    Args:
        grams, tokens, rewards, success_threshold, dead_atol: see :func:`group_arrays`.
        pass_grams: Grams of the rows of whole groups formed in one pass each (``[p R, p R]``,
            rows group by group; :func:`group_inner_products`), for the pairwise cosines. Default
            none: ``pass_pairs = 0``.

    >>> s = group_sums([np.eye(2)], tokens=[[3, 4]], rewards=[[1.0, 0.0]])
    >>> s["groups"], s["group_sq_sum"], s["mass_solved_1_of_2"]
    (1.0, 2.0, 2.0)
    """
    a = group_arrays(grams, tokens=tokens, rewards=rewards,
                     success_threshold=success_threshold, dead_atol=dead_atol)
    n, R = a["rollout_grad_norm"].shape
    norms, dead = a["rollout_grad_norm"], a["dead"]
    out = {
        "groups": float(n),
        "rollouts": float(n * R),
        "tokens": float(a["tokens"].sum()),
        "dead_groups": float(dead.sum()),
        "dead_rollouts": float(dead.sum() * R),
        "dead_tokens": float(a["tokens"][dead].sum()),
        "rollout_norm_sum": float(norms.sum()),
        "rollout_sq_sum": float((norms**2).sum()),
        "rollout_norm_max": float(norms.max()),
        "group_norm_sum": float(a["group_grad_norm"].sum()),
        "group_sq_sum": float(a["group_grad_sq"].sum()),
        "group_norm_max": float(a["group_grad_norm"].max()),
        "nonzero_groups": float((a["group_grad_sq"] > 0).sum()),
    }
    out.update(_pass_sums(pass_grams, R))
    mass, count = _mass_by_solved(a["group_grad_sq"], a["solved"], R)
    for k in range(R + 1):
        out[f"mass_solved_{k}_of_{R}"] = float(mass[k])
        out[f"groups_solved_{k}_of_{R}"] = float(count[k])
    return out


def _pass_sums(pass_grams: Sequence[Any], R: int) -> dict[str, float]:
    if isinstance(pass_grams, np.ndarray) and pass_grams.ndim == 2:
        raise ValueError("pass_grams is a sequence of pass Grams; wrap one Gram in a list")
    vals: list[np.ndarray] = []
    for j, kp in enumerate(pass_grams):
        try:
            cos = group_gradient_cosines(kp, group_size=R)
        except ValueError as exc:
            raise ValueError(f"pass_grams[{j}]: {exc}") from None
        iu = np.triu_indices(cos.shape[0], 1)
        c = cos[iu]
        vals.append(c[np.isfinite(c)])
    c = np.concatenate(vals) if vals else np.zeros(0)
    return {
        "pass_pairs": float(c.size),
        "pass_cos_sum": float(c.sum()),
        "pass_cos_max": float(c.max()) if c.size else -math.inf,
        "pass_cos_min": float(c.min()) if c.size else math.inf,
    }


def _rule(key: str) -> str:
    if key in MERGE_RULES:
        return MERGE_RULES[key]
    if _MASS_KEY.match(key):
        return "sum"
    raise ValueError(f"unknown group-sums key {key!r} (keys: MERGE_RULES and "
                     "mass_solved_{k}_of_{R} / groups_solved_{k}_of_{R})")


def merge_group_sums(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Merge :func:`group_sums` of disjoint sets of whole groups (processes, micro-batches).

    Each key merges by its rule (:data:`MERGE_RULES`; the ``*_solved_*`` keys sum); a key absent
    from a part counts as the rule's identity (0, ``-inf``, ``+inf``), so parts with different
    group sizes merge too. The result equals :func:`group_sums` of all the groups at once
    (sums up to float addition order).

    >>> a = group_sums([np.eye(2)], tokens=[[1, 1]], rewards=[[1.0, 0.0]])
    >>> merge_group_sums([a, a])["group_sq_sum"]
    4.0
    """
    out: dict[str, float] = {}
    for part in parts:
        for key, v in part.items():
            rule = _rule(key)
            cur = out.get(key, _IDENTITY[rule])
            x = float(v)
            out[key] = cur + x if rule == "sum" else (max(cur, x) if rule == "max"
                                                       else min(cur, x))
    if not out:
        raise ValueError("merge_group_sums needs at least one part")
    return out


def diagnostics_from_sums(sums: Mapping[str, float], *, total_grad_norm: float | None,
                          num_groups: int | None = None, rtol: float = DEFAULT_NOISE_RTOL
                          ) -> dict[str, float]:
    """The step's diagnostics (flat, stable keys, all floats) from merged :func:`group_sums`.

    Args:
        sums: :func:`merge_group_sums` of every group of the step (or one :func:`group_sums`).
        total_grad_norm: the host's ``|G|``: the global norm of the gradient that is the sum of
            all the rows (after the all-reduce, before clipping), or None.
        num_groups: the step's number of groups, if known: checked equal to ``sums["groups"]``
            (a mismatch means a part is missing from the merge: an error).
        rtol: precision of the norms, for ``noise/status`` (:func:`gradient_noise_scale`).

    Returns:
        See :func:`step_diagnostics`.
    """
    s = {k: float(v) for k, v in sums.items()}
    for key in MERGE_RULES:
        if key not in s:
            raise ValueError(f"sums lacks {key!r}: pass group_sums (or merge_group_sums) output")
    n = int(s["groups"])
    if num_groups is not None and _num_groups(num_groups, minimum=1) != n:
        raise ValueError(f"num_groups={num_groups} but the sums hold {n} groups: a process's or "
                         "micro-batch's sums are missing from the merge (or counted twice)")
    total_sq = None
    if total_grad_norm is not None:
        g = real_option(total_grad_norm, "total_grad_norm", minimum=0.0)
        total_sq = g * g
    nan = math.nan
    S, rolls = s["group_sq_sum"], s["rollouts"]
    ns = gradient_noise_scale(S, total_sq, num_groups=n, rtol=rtol)
    out = {
        "groups": float(n),
        "rollouts": rolls,
        "tokens": s["tokens"],
        "rollout_grad_norm/mean": s["rollout_norm_sum"] / rolls,
        "rollout_grad_norm/rms": math.sqrt(s["rollout_sq_sum"] / rolls),
        "rollout_grad_norm/max": s["rollout_norm_max"],
        "group_grad_norm/mean": s["group_norm_sum"] / n,
        "group_grad_norm/rms": math.sqrt(S / n),
        "group_grad_norm/max": s["group_norm_max"],
        "dead_groups/count": s["dead_groups"],
        "dead_groups/group_share": s["dead_groups"] / n,
        "dead_groups/rollout_share": s["dead_rollouts"] / rolls,
        "dead_groups/token_share": s["dead_tokens"] / s["tokens"] if s["tokens"] > 0 else nan,
        "grad_norm": nan if total_sq is None else math.sqrt(total_sq),
        "noise/mu_sq": ns.mu_sq,
        "noise/trace_sigma": ns.trace_sigma,
        "noise/step_noise_sq": ns.trace_sigma / n,
        "noise/b_simple": ns.b_simple,
        "noise/snr": ns.snr,
        "noise/status": float(ns.status),
        "alignment/weighted_cos": _weighted_cos(s, total_sq),
        "alignment/pass_pairs": s["pass_pairs"],
        "alignment/pass_cos_mean": s["pass_cos_sum"] / s["pass_pairs"] if s["pass_pairs"] else nan,
        "alignment/pass_cos_min": s["pass_cos_min"] if s["pass_pairs"] else nan,
        "alignment/pass_cos_max": s["pass_cos_max"] if s["pass_pairs"] else nan,
    }
    for key in sorted(s, key=_mass_order):
        m = _MASS_KEY.match(key)
        if m and m.group(1) == "mass":
            out[f"mass_share/solved_{m.group(2)}_of_{m.group(3)}"] = s[key] / S if S > 0 else nan
    return out


def _mass_order(key: str) -> tuple[int, int, str]:
    m = _MASS_KEY.match(key)
    return (int(m.group(3)), int(m.group(2)), key) if m else (0, 0, key)


def _weighted_cos(s: Mapping[str, float], total_sq: float | None) -> float:
    """``(|G|^2 - sum |G_g|^2) / ((sum |G_g|)^2 - sum |G_g|^2)``: the ``|G_g| |G_h|``-weighted
    mean cosine over pairs of different groups (NaN without ``|G|`` or two groups with
    ``G_g != 0``)."""
    den = s["group_norm_sum"] ** 2 - s["group_sq_sum"]
    if total_sq is None or s["nonzero_groups"] < 2 or not den > 0:
        return math.nan
    return (total_sq - s["group_sq_sum"]) / den


def step_diagnostics(grams: Any, *, tokens: Any, rewards: Any, total_grad_norm: float | None,
                     num_groups: int | None = None, pass_grams: Sequence[Any] = (),
                     success_threshold: float = 0.5, dead_atol: float = 0.0,
                     rtol: float = DEFAULT_NOISE_RTOL) -> dict[str, float]:
    """Every diagnostic of a step whose groups are all here (one process): a flat dict of floats.

    ``diagnostics_from_sums(group_sums(...), ...)``; with several processes or micro-batches,
    call :func:`group_sums` on each, :func:`merge_group_sums`, then :func:`diagnostics_from_sums`.

    The keys (the logs prefix them: ``geometry/...`` in TRL, ``actor/geometry/...`` in verl):

    * ``groups``, ``rollouts``, ``tokens``;
    * ``rollout_grad_norm/{mean,rms,max}`` (over all rollouts, dead ones included),
      ``group_grad_norm/{mean,rms,max}`` (``|G_g|``);
    * ``dead_groups/{count,group_share,rollout_share,token_share}``;
    * ``grad_norm`` (the host's ``|G|``, NaN if not given);
    * ``noise/{mu_sq,trace_sigma,step_noise_sq,b_simple,snr,status}``
      (:func:`gradient_noise_scale`; ``step_noise_sq = tr(Sigma) / n = E|G - mu|^2``);
    * ``alignment/weighted_cos`` (all groups), ``alignment/pass_{pairs,cos_mean,cos_min,
      cos_max}`` (pairs within a pass);
    * ``mass_share/solved_{k}_of_{R}`` for ``k = 0..R``.

    Args:
        grams: ``[n, R, R]`` Grams ``K_g`` of the per-rollout gradient rows of each group.
        tokens: ``[n, R]`` token counts; rewards: ``[n, R]``.
        total_grad_norm: the host's ``|G|`` (see :func:`diagnostics_from_sums`), or None.
        num_groups: checked equal to ``n`` when given.
        pass_grams, success_threshold, dead_atol: see :func:`group_sums`.
        rtol: see :func:`gradient_noise_scale`.

    Returns:
        The keys above, each a float.

    >>> d = step_diagnostics(np.stack([np.eye(2), np.zeros((2, 2))]), tokens=[[2, 3], [4, 5]],
    ...                      rewards=[[1, 0], [1, 1]], total_grad_norm=2.0**0.5)
    >>> d["dead_groups/count"], d["dead_groups/token_share"], d["noise/status"]
    (1.0, 0.6428571428571429, 4.0)
    """
    sums = group_sums(grams, tokens=tokens, rewards=rewards, pass_grams=pass_grams,
                      success_threshold=success_threshold, dead_atol=dead_atol)
    return diagnostics_from_sums(sums, total_grad_norm=total_grad_norm, num_groups=num_groups,
                                 rtol=rtol)


def diagnostics_notes(diagnostics: Mapping[str, float]) -> list[str]:
    """Plain sentences for every undefined value of :func:`step_diagnostics` (empty: none).

    >>> diagnostics_notes({"noise/status": 1.0, "groups": 1.0})[0][:35]
    'noise scale and SNR not defined: fe'
    """
    d = diagnostics
    notes = []
    status = int(d.get("noise/status", 0))
    if status:
        what = "B_simple not defined" if status == 4 else "noise scale and SNR not defined"
        notes.append(f"{what}: {NOISE_STATUS[status]} (n = {d.get('groups', math.nan):g}, "
                     f"|mu|^2_hat = {d.get('noise/mu_sq', math.nan):.4g}, tr(Sigma)_hat = "
                     f"{d.get('noise/trace_sigma', math.nan):.4g})")
    if "alignment/pass_pairs" in d and d["alignment/pass_pairs"] == 0:
        notes.append("pass cosines not defined: no pair of live groups shared a Gram pass")
    if "alignment/weighted_cos" in d and math.isnan(d["alignment/weighted_cos"]):
        notes.append("weighted cosine not defined: it needs the host's |G| and two groups with "
                     "a nonzero gradient")
    if any(k.startswith("mass_share/") and math.isnan(v) for k, v in d.items()):
        notes.append("mass shares not defined: sum_g |G_g|^2 = 0 (no group has a gradient)")
    if "dead_groups/token_share" in d and math.isnan(d["dead_groups/token_share"]):
        notes.append("dead token share not defined: the step has no token")
    return notes
