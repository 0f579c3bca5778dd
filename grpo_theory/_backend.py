"""The numpy-or-torch arithmetic every estimator is built from (private to :mod:`grpo_theory`).

Each function takes arrays of either backend (chosen by the input, torch imported only when a
tensor is passed) and returns the same backend. The centring here is the one implementation of
``r_i - mean`` for the whole library (:func:`centred`: scaled by a power of two so that it cannot
overflow, exactly 0 for a constant group), and the array conversion is the one way in and out of
float64 numpy: :func:`to_float64` (plain), :func:`as_float64` (checked), :func:`in_backend_of`
(back to the caller's backend, refusing overflow).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._validate import check_finite, is_torch

__all__ = ["mean", "std", "scaled_std", "where", "constant_rows", "pow2_scale", "centred",
           "all_finite", "check_finite_out", "as_param", "to_float64", "as_float64",
           "in_backend_of"]

Array = Any  # np.ndarray or torch.Tensor


def mean(x: Array, axis: int | None) -> Array:
    """Mean over ``axis`` (kept as a size-1 axis), or of every entry (``axis=None``)."""
    if is_torch(x):
        return x.mean() if axis is None else x.mean(dim=axis, keepdim=True)
    return x.mean() if axis is None else x.mean(axis=axis, keepdims=True)


def std(x: Array, axis: int | None, ddof: int) -> Array:
    """Standard deviation with ``ddof`` over ``axis`` (kept), or of every entry."""
    if is_torch(x):
        return (
            x.std(correction=ddof)
            if axis is None
            else x.std(dim=axis, correction=ddof, keepdim=True)
        )
    return x.std(ddof=ddof) if axis is None else x.std(axis=axis, ddof=ddof, keepdims=True)


def scaled_std(x: Array, axis: int | None, ddof: int) -> Array:
    """Std of ``x`` computed as ``s * std(x / s)``, ``s = max |x|``: no under/overflow in squares.

    (Tiny spreads such as ``[4e-233, 0]`` would otherwise square to 0 and give std = 0.)
    """
    if is_torch(x):
        s = x.abs().amax() if axis is None else x.abs().amax(dim=axis, keepdim=True)
    else:
        s = np.abs(x).max() if axis is None else np.abs(x).max(axis=axis, keepdims=True)
    safe = where(s > 0, s, s * 0.0 + 1.0)
    return safe * std(x / safe, axis, ddof)


def where(cond: Array, a: Array, b: Array) -> Array:
    """``a`` where ``cond``, else ``b`` (``np.where`` / ``torch.where``)."""
    if is_torch(cond):
        import torch

        return torch.where(cond, a, b)
    return np.where(cond, a, b)


def constant_rows(x: Array) -> Array:
    """``[P, 1]`` bool: rows whose entries are exactly equal (max == min)."""
    if is_torch(x):
        return x.amax(dim=1, keepdim=True) == x.amin(dim=1, keepdim=True)
    return x.max(axis=1, keepdims=True) == x.min(axis=1, keepdims=True)


def pow2_scale(x: Array, axis: int | None) -> Array:
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


def centred(r: Array, *, singleton: Literal["zero", "keep"] = "zero") -> Array:
    """``r_i - mean`` per row, in the scaled form of :func:`pow2_scale`; exact zeros for a
    constant row (the float mean of equal values can differ from them by one ulp: ``0.1`` three
    times would give ``-1.39e-17``).

    ``singleton`` is the rule for a one-sample group (``R = 1``): ``"zero"`` (default; its mean
    is its reward) or ``"keep"`` (verl's outcome estimators: a one-sample group has mean 0, so it
    keeps its reward).

    >>> centred(np.array([[1.0, 0.0, 0.0, 1.0]])).tolist()
    [[0.5, -0.5, -0.5, 0.5]]
    """
    if singleton not in ("zero", "keep"):
        raise ValueError(f"singleton must be 'zero' or 'keep', got {singleton!r}")
    if singleton == "keep" and r.shape[1] == 1:
        return r.clone() if is_torch(r) else r.copy()
    k = pow2_scale(r, 1)
    u = r / k
    c = (u - mean(u, 1)) * k
    return where(constant_rows(r), r * 0.0, c)


def all_finite(x: Array) -> bool:
    """True when no entry is NaN or +-inf."""
    if is_torch(x):
        import torch

        return bool(torch.isfinite(x).all())
    return bool(np.isfinite(x).all())


def check_finite_out(A: Array, estimator: str, why: str) -> Array:
    """``A`` if every entry is finite, else ``ValueError`` naming the cause (no silent inf)."""
    if not all_finite(A):
        raise ValueError(
            f"{estimator}: the advantages overflow the float range ({why}); "
            "rescale the rewards or change the option"
        )
    return A


def as_param(
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
        v64 = to_float64(value)
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


def to_float64(x: Any) -> np.ndarray:
    """``x`` (numpy array-like or torch tensor, any device) as a float64 numpy array."""
    if is_torch(x):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


# --- helpers ------------------------------------------------------------------------------------
def as_float64(x: Any, name: str, *, ndim: int | None = 2, finite: bool = True) -> np.ndarray:
    """``x`` as a float64 numpy array, checked: numeric, ``ndim`` axes (default 2:
    ``[num_prompts, group_size]``), no empty axis, and (``finite``) no NaN or inf; errors name
    ``name``."""
    try:
        a = to_float64(x)
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


def in_backend_of(out: np.ndarray, like: Any) -> Any:
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
