"""Input validation shared by every public function of :mod:`grpo_theory`.

All checks raise :class:`ValueError` (or :class:`TypeError`) with a message that names the
problem: the argument, the offending shape or value, and what was expected. No function of the
library returns a silent NaN for bad input.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # sympy is imported only where exact/symbolic work is asked for
    import sympy as sp

__all__ = [
    "as_rewards",
    "check_lengths",
    "is_torch",
    "check_group_size",
    "check_finite",
    "to_exact",
    "to_fraction",
    "is_exact_number",
    "check_R",
    "check_p",
    "real_option",
]


def is_torch(x: Any) -> bool:
    """True when ``x`` is a :class:`torch.Tensor` (without importing torch if it is not loaded)."""
    mod = type(x).__module__
    return mod.startswith("torch")


def check_finite(x: Any, *, name: str = "rewards") -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or +-inf, naming where the first one is."""
    if is_torch(x):
        import torch

        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            raise ValueError(f"{name} contains a non-finite value ({float(x[idx])}) at index {idx}")
        return
    arr = np.asarray(x)
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} contains a non-finite value ({arr[idx]}) at index {idx}")


def real_option(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
) -> float:
    """A scalar option as a finite float, naming ``name`` in every error.

    Raises ``TypeError`` for a non-number (a string, an array, bool, None) and ``ValueError`` for
    NaN, +-inf or a value outside ``[minimum, maximum]`` (``> 0`` when ``positive``).

    >>> real_option(1e-4, "eps", minimum=0.0)
    0.0001
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        if not (isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"):
            raise TypeError(
                f"{name} must be a real number, got {type(value).__name__} {value!r}"
            )
    try:
        v = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float: {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value!r}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum:g}, got {value!r}")
    return v


def check_group_size(group_size: int, *, minimum: int, estimator: str) -> None:
    """Raise ``ValueError`` when a group is smaller than ``estimator`` needs."""
    if group_size < minimum:
        raise ValueError(
            f"{estimator} needs group_size >= {minimum}, got group_size={group_size} "
            f"(rewards must be shaped [num_prompts, group_size])"
        )


def as_rewards(rewards: Any, *, name: str = "rewards", ndim: int = 2) -> Any:
    """Validate a reward array and return it as a float array of the same backend.

    Args:
        rewards: array-like or ``torch.Tensor`` shaped ``[num_prompts, group_size]``
            (``ndim=2``) or ``[num_prompts, group_size, num_stages]`` (``ndim=3``).
        name: argument name used in error messages.
        ndim: required number of dimensions.

    Returns:
        ``np.ndarray`` of float64, or a floating ``torch.Tensor`` (float64 kept, integer and
        bool promoted to float32's default dtype) when a tensor was given.

    Raises:
        TypeError: for non-numeric input.
        ValueError: for a wrong number of dimensions, an empty axis, or NaN/inf entries.
    """
    if is_torch(rewards):
        import torch

        if rewards.device.type == "meta":
            raise ValueError(
                f"{name} is a meta tensor (a shape without values); materialise it on a real "
                "device first"
            )
        if rewards.is_complex():
            raise TypeError(f"{name} must be real, got a complex tensor ({rewards.dtype})")
        x = rewards if torch.is_floating_point(rewards) else rewards.to(torch.get_default_dtype())
    else:
        if np.iscomplexobj(rewards):
            raise TypeError(f"{name} must be real, got complex values")
        raw = np.asarray(rewards)
        text = [str(v) for v in raw.flat if isinstance(v, str | bytes)] \
            if raw.dtype.kind in "USO" else []
        if text:
            raise TypeError(f"{name} must be numbers, got text such as {text[0]!r} (numeric "
                            "strings are not converted)")
        try:
            x = np.asarray(rewards, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be numeric array-like, got {type(rewards)!r}") from exc
    shape = tuple(x.shape)
    if len(shape) != ndim:
        expected = (
            "[num_prompts, group_size]" if ndim == 2 else "[num_prompts, group_size, num_stages]"
        )
        raise ValueError(
            f"{name} must be {ndim}-D shaped {expected}, got shape {shape}"
            + (" (wrap a single group as rewards[None, :])" if len(shape) == ndim - 1 else "")
        )
    if any(s == 0 for s in shape):
        raise ValueError(f"{name} has an empty axis: shape {shape}")
    check_finite(x, name=name)
    return x


def check_lengths(
    lengths: Any, *, shape: tuple[int, ...] | None = None, like: str = "rewards"
) -> np.ndarray:
    """Validate completion lengths ``[num_prompts, group_size]`` (token counts): the one check
    used by the loss aggregations and the length-weighted framework estimators.

    Args:
        lengths: array-like or ``torch.Tensor`` of non-negative integers (any numeric dtype).
        shape: when given, the shape ``lengths`` must have (that of the rewards/advantages).
        like: name of the array ``shape`` comes from, for the mismatch message.

    Returns:
        ``[P, R]`` float64 array.

    Raises:
        TypeError: non-numeric or complex input.
        ValueError: not 2-D, an empty axis, NaN/inf, a negative or non-integer value, or a shape
            other than ``shape``.

    >>> check_lengths([[1, 3]]).tolist()
    [[1.0, 3.0]]
    """
    if is_torch(lengths):
        if lengths.is_complex():
            raise TypeError(f"lengths must be real, got a complex tensor ({lengths.dtype})")
        lengths = lengths.detach().cpu().double().numpy()
    if np.iscomplexobj(lengths):
        raise TypeError("lengths must be real, got complex values")
    try:
        L = np.asarray(lengths, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"lengths must be numeric array-like, got {type(lengths)!r}") from exc
    if L.ndim != 2:
        raise ValueError(f"lengths must be 2-D [num_prompts, group_size], got shape {L.shape}")
    if L.size == 0:
        raise ValueError(f"lengths has an empty axis: shape {L.shape}")
    check_finite(L, name="lengths")
    if np.any(L < 0) or np.any(L != np.round(L)):
        raise ValueError("lengths must be non-negative integers (completion token counts)")
    if shape is not None and L.shape != tuple(shape):
        raise ValueError(f"lengths shape {L.shape} does not match {like} shape {tuple(shape)}")
    return L


# --- exact numbers (sympy loaded lazily) ---------------------------------------------------------
def _is_sympy(x: Any) -> bool:
    return type(x).__module__.startswith("sympy")


def to_exact(x: Any, *, name: str = "value") -> sp.Expr:
    """Convert ``x`` to an exact sympy number: ints and Fractions exactly, floats by their repr.

    ``0.1`` becomes ``1/10`` (the decimal the user typed), not the binary double. Imports sympy.

    >>> to_exact(0.1)
    1/10
    """
    import sympy as sp

    if isinstance(x, sp.Basic):
        return x
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a number, got bool")
    if isinstance(x, int | np.integer):
        return sp.Integer(int(x))
    if isinstance(x, Fraction):
        return sp.Rational(x.numerator, x.denominator)
    if isinstance(x, float | np.floating):
        if not math.isfinite(float(x)):
            raise ValueError(f"{name} must be finite, got {x}")
        return sp.Rational(repr(float(x)))
    raise TypeError(f"{name} must be a number or sympy expression, got {type(x)!r}")


def to_fraction(x: Any, *, name: str = "value") -> Fraction:
    """Exact rational value of a number, without sympy: the rule of :func:`to_exact`.

    ints and :class:`~fractions.Fraction` exactly; floats as the decimal they print as
    (``repr``: ``0.1 -> 1/10``, ``0.5 - 0.4 = 0.09999999999999998 -> 9999999999999998/10^17``);
    sympy rationals exactly. Raises for bool, NaN/inf and non-rational sympy numbers.

    >>> to_fraction(0.4)
    Fraction(2, 5)
    """
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a number, got bool")
    if isinstance(x, Fraction):
        return x
    if isinstance(x, int | np.integer):
        return Fraction(int(x))
    if isinstance(x, float | np.floating):
        if not math.isfinite(float(x)):
            raise ValueError(f"{name} must be finite, got {x}")
        return Fraction(repr(float(x)))
    if _is_sympy(x) and getattr(x, "is_Rational", False):
        return Fraction(int(x.p), int(x.q))
    raise TypeError(f"{name} must be an int, float, Fraction or sympy Rational, got {x!r}")


def is_exact_number(x: Any) -> bool:
    """True for sympy objects and Fractions (inputs that ask for exact results)."""
    return isinstance(x, Fraction) or _is_sympy(x)


def check_R(R: Any, minimum: int = 1) -> int:
    """Validate a group size: an int ``>= minimum``; returns it as ``int``."""
    if isinstance(R, bool) or not isinstance(R, int | np.integer):
        raise TypeError(f"R must be an integer, got {type(R).__name__} {R!r}")
    if R < minimum:
        raise ValueError(f"R must be >= {minimum}, got R={R}")
    return int(R)


def check_p(p: Any) -> Any:
    """Return ``p`` as sympy (exact input: sympy/Fraction) or float; raise if outside [0, 1]."""
    if is_exact_number(p):
        q = to_exact(p, name="p")
        if q.is_number and not (0 <= q <= 1):
            raise ValueError(f"p must be in [0, 1], got {p}")
        return q
    try:
        q = float(p)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"p must be a number, got {type(p)!r}") from exc
    if not math.isfinite(q) or not 0.0 <= q <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return q
