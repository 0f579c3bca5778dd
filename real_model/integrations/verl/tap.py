"""The gradient of verl's loss w.r.t. its log-probabilities, ``u = dL/dlogp``, read by a hook.

A gradient hook on verl's (nested) ``log_probs`` keeps ``u`` per packed token without changing
verl's autograd graph or its gradients; the second passes weight each row's log-probabilities
by it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from .plan import jagged_values

__all__ = ["tap_log_probs"]


# ---------------------------------------------------------------------------------------------
# the per-token loss gradient u = dL/dlogp, captured without changing verl's gradient
# ---------------------------------------------------------------------------------------------
# the per-token loss gradient u = dL/dlogp, captured without changing verl's gradient
def tap_log_probs(model_output: Mapping[str, Any], sink: list) -> None:
    """Append the gradient of verl's loss w.r.t. the nested ``log_probs`` (its ``values()``, one
    entry per packed token) to ``sink`` when the backward reaches them: a gradient hook on the
    jagged tensor's values when the jagged tensor is a view of them (the same numbers, without
    the nested tensor's slower unwrapping), else on the nested tensor itself (verl's autograd
    graph and its outputs unchanged either way)."""
    lp = model_output["log_probs"]
    # a nested tensor's own attributes, read without its __torch_function__ (~5 us each)
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad, nested, grad_fn = lp.requires_grad, lp.is_nested, lp.grad_fn
    if not requires_grad:
        raise ValueError("verl's log-probs need no gradient: nothing to attribute per token")
    values = jagged_values(lp) if nested else None  # a jagged view's: its gradient is plain
    if (values is not None and values.requires_grad and values.grad_fn is not None
            and grad_fn is not None and _feeds(grad_fn, values.grad_fn)):
        lp = values
    lp.register_hook(functools.partial(_keep_values, sink))


def _feeds(node: Any, target: Any) -> bool:
    """Whether autograd node ``node`` passes its gradient straight to ``target`` (the jagged
    view's ``ViewFromJagged`` node reading the values)."""
    return any(nxt is target for nxt, _ in node.next_functions)


def _keep_values(sink: list, grad: torch.Tensor) -> None:
    """Gradient hook: keep the per-token values (a failure leaves ``sink`` short, which the step's
    summary reports; it never raises into verl's backward)."""
    try:
        sink.append((grad.values() if grad.is_nested else grad.reshape(-1)).detach())
    except Exception:  # noqa: BLE001
        pass
