"""Closed-form per-row gradients of norm layers, recognised from the autograd node, not by class.

* ``out = weight * z`` (RMSNorm family: any module whose output node is a ``MulBackward0`` that
  saved the module's weight and a ``z`` of the output's shape): ``g_i = sum_t delta_it * z_it``;
* ``nn.LayerNorm`` and subclasses (Nemotron's LayerNorm1P): ``g_i(weight) = sum_t delta_it *
  xhat_it``, ``g_i(bias) = sum_t delta_it``.

The leaf rule (:mod:`.layers.leaf`) tries these before the generic per-row VJP, checking each module
class once per process against it (:data:`NORM_CLOSED_FORM_CHECKED`). A new norm of either form
needs nothing here; another form is one more branch of :func:`fast_leaf_grads`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["NORM_CLOSED_FORM_CHECKED", "scaled_norm_factor", "fast_leaf_grads", "rerun_node"]

NORM_CLOSED_FORM_CHECKED: dict[type, bool] = {}
"""Verdict per norm class: does its closed-form per-row gradient (:func:`fast_leaf_grads`) match
the generic per-row VJP? Checked at the class's first use in this process (a property of the
class's ``forward`` code, not of one batch): a trainer builds one capture per micro-batch, and
re-checking with the generic path in each was a large part of a small step's overhead."""


def rerun_node(mod: nn.Module, args: tuple) -> Any:
    """The autograd node of a re-run of ``mod.forward(*args)`` (no hooks), for a norm's closed
    form where the host's own node of the call is not held; ``None`` when the output has none.
    The tensor inputs require grad in the re-run, as in the host's forward, so that autograd
    saves both factors of ``weight * z`` (the closed form reads them)."""
    rerun = tuple(a.detach().requires_grad_(a.is_floating_point())
                  if isinstance(a, torch.Tensor) else a for a in args)
    with torch.enable_grad():
        out = mod.forward(*rerun)
    return out.grad_fn if isinstance(out, torch.Tensor) else None


def scaled_norm_factor(module: torch.nn.Module, delta: torch.Tensor,
                       grad_fn: Any) -> torch.Tensor | None:
    """The ``z`` of ``out = weight * z`` (RMSNorm family), detached, read from the output's
    autograd node ``grad_fn`` (a ``MulBackward0`` that saved the module's weight itself and a
    ``z`` shaped as ``delta`` whose trailing axes are the weight's); ``None`` when the node is
    not that product. Per row, ``dL_i/dweight = sum_t delta_it * z_it``."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or type(grad_fn).__name__ != "MulBackward0":
        return None
    try:
        pair = (grad_fn._saved_self, grad_fn._saved_other)
    except (AttributeError, RuntimeError):
        return None
    for wv, z in (pair, pair[::-1]):
        if not (isinstance(wv, torch.Tensor) and isinstance(z, torch.Tensor)
                and wv.shape == w.shape and wv.data_ptr() == w.data_ptr()):
            continue
        k = w.dim()
        if k and z.shape == delta.shape and tuple(z.shape[delta.dim() - k:]) == tuple(w.shape):
            return z.detach()
    return None


def fast_leaf_grads(
    module: torch.nn.Module,
    names: list[str],
    args: tuple[Any, ...],
    delta: torch.Tensor,
    grad_fn: Any,
    *,
    R: int,
    row_sums: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Closed-form per-sample gradients of common norm layers, or ``None`` if not applicable.

    * ``out = weight * z`` (RMSNorm family; recognised from the autograd node of the output, a
      ``MulBackward0`` that saved the weight itself and a ``z`` of the output's shape):
      ``g_i = sum_t delta_it * z_it``, with the very ``z`` autograd saved (``grad_fn`` may be
      the host's own node of the call: no re-run of the module).
    * ``nn.LayerNorm`` and subclasses with an affine weight (and bias):
      ``g_i(weight) = sum_t delta_it * xhat_it``, ``g_i(bias) = sum_t delta_it``, with
      ``xhat = layer_norm(x)`` without affine terms (the ``+1`` of LayerNorm1P does not change it).

    ``row_sums`` maps a tensor laid out as ``delta`` to its per-row sums over positions,
    ``[R, ...]`` (packed rows: sums over each row's tokens); default: batch-first ``delta``,
    ``t.reshape(R, -1, n).sum(dim=1)``. The caller checks each module class once per call
    against :func:`generic_per_sample_grads`.
    """
    if row_sums is None:
        def row_sums(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(R, -1, t.shape[-1]).sum(dim=1)

    if names == ["weight"] and type(grad_fn).__name__ == "MulBackward0":
        z = scaled_norm_factor(module, delta, grad_fn)
        if z is None:
            return None
        return row_sums((delta * z).flatten(delta.dim() - module.weight.dim()))
    if (
        isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine
        and len(args) == 1 and isinstance(args[0], torch.Tensor)
        and set(names) <= {"weight", "bias"} and delta.shape == args[0].shape
    ):
        k = len(module.normalized_shape)
        xhat = torch.nn.functional.layer_norm(args[0], module.normalized_shape, None, None,
                                              module.eps)
        parts = {"weight": row_sums((delta * xhat.to(delta.dtype)).flatten(delta.dim() - k)),
                 "bias": row_sums(delta.flatten(delta.dim() - k))}
        return torch.cat([parts[k] for k in names], dim=1)
    return None
