"""Input validation shared by every public function of :mod:`grpo_theory`.

All checks raise :class:`ValueError` (or :class:`TypeError`) with a message that names the
problem: the argument, the offending shape or value, and what was expected. No function of the
library returns a silent NaN for bad input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_rewards", "is_torch", "check_group_size", "check_finite"]


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

        x = rewards if torch.is_floating_point(rewards) else rewards.to(torch.get_default_dtype())
    else:
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
