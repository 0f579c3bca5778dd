"""Any other small leaf module (norms included): exact per-row gradients, then their Gram.

A leaf module with trainable parameters (no children, at most :data:`GENERIC_MAX_PARAMS`) has
its per-row gradients formed from its captured inputs and output gradient: a norm's closed form
(:mod:`..norms`, checked once per class against the generic path), else per-row vector-Jacobian
products of the module (:func:`generic_per_sample_grads`). Their Gram is added per block, or
with the pass's other small rows at its flush (:func:`real_model.gram.small_calls.add_rows_gram`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from .. import norms as norm_forms
from ..registry import register
from ..small_calls import add_rows_gram, defer_norm
from ..state import Call, Pass, fail, guard, guarded_call

__all__ = ["GENERIC_MAX_PARAMS", "Leaf", "add_leaf", "generic_per_sample_grads"]

GENERIC_MAX_PARAMS = 1 << 20
"""Most parameters of a leaf module the per-row VJPs handle (they form ``[R, params]``)."""


@register(fallback=True)
class Leaf:
    """The rule of any leaf module no other rule covers (norms, scales, biases ...)."""

    kind = "generic"

    @staticmethod
    def check(name: str, module: nn.Module, params: list[str]) -> None:
        n_par = sum(getattr(module, n).numel() for n in params)
        children = next(module.children(), None) is not None
        if not children and n_par <= GENERIC_MAX_PARAMS:
            return
        why = "it has child modules" if children else (
            f"it holds {n_par} parameters (> {GENERIC_MAX_PARAMS} for the per-sample fallback)"
        )
        raise ValueError(
            f"unsupported module type {type(module).__name__} at {name!r} with trainable "
            f"parameters {params}: {why}; the exact Gram handles nn.Linear, nn.Embedding and "
            "small leaf modules (use method='naive', or set requires_grad=False on these "
            "parameters)"
        )

    @staticmethod
    def contribute(p: Pass, call: Call, mod: nn.Module, names: list[str], x: Any,
                   delta: torch.Tensor, host_fn: Any) -> None:
        """One call's per-row gradients (packed rows: a norm's closed form without unpacking
        where it applies) and their Gram."""
        if p.packed is not None and p.packed.is_packed(delta):
            if any(isinstance(v, torch.Tensor) for v in call.held or ()):
                guard(p, call.name, lambda: fail(
                    p, f"module {call.name!r} ({type(mod).__name__}): extra tensor arguments in "
                    "a packed micro-batch (segments): unsupported by the capture"))
                return
            if p.engine.norm_ok.get(type(mod)) is True:
                if host_fn is None:  # input taps: no node of the host's held; one of a re-run
                    try:  # on failure the rows get unpacked, below
                        host_fn = norm_forms.rerun_node(mod, tuple(
                            x if i == call.slot else v for i, v in enumerate(call.held)))
                    except Exception:  # noqa: BLE001
                        host_fn = None
                if host_fn is not None and _norm_on_packed(p, call, mod, names, x, delta,
                                                           host_fn):
                    return
            host_fn = None  # the norm's node holds packed tensors; the rows get unpacked
            x, delta = p.packed.unpack_shared(x), p.packed.unpack(delta)
        args = tuple(x.detach() if i == call.slot else v for i, v in enumerate(call.held))
        guarded_call(p, call.name, mod, functools.partial(
            add_leaf, p, mod, names, args, delta, host_fn=host_fn, name=call.name))


def _norm_on_packed(p: Pass, call: Call, mod: nn.Module, names: list[str], x: torch.Tensor,
                    delta: torch.Tensor, host_fn: Any) -> bool:
    """A norm's closed form on the packed tokens, its rows summed per segment (no unpacking
    of ``x``, ``delta`` or ``z``); ``False`` when it does not apply (the caller unpacks)."""
    assert p.packed is not None
    packed = p.packed
    args = tuple(x.detach() if i == call.slot else v for i, v in enumerate(call.held))

    def add() -> bool:
        if defer_norm(p, call.name, mod, names, delta, host_fn):
            return True
        grads = norm_forms.fast_leaf_grads(mod, names, args, delta, host_fn, R=packed.n,
                                           row_sums=packed.row_sums)
        if grads is not None:
            add_rows_gram(p, grads, call.name)
        return grads is not None

    p.busy = True
    try:  # a recorded failure (None from the guard) ends the call too
        return bool(guard(p, f"module {call.name!r} ({type(mod).__name__})", add) or p.failed)
    finally:
        p.busy = False


def add_leaf(p: Pass, mod: nn.Module, names: list[str], args: tuple, delta: torch.Tensor, *,
             host_fn: Any = None, name: str | None = None) -> None:
    """Per-row gradients of a small leaf module: closed-form norms, else per-row VJPs
    (:func:`generic_per_sample_grads`). The closed form reads the ``z`` of ``weight * z``
    from the host's own autograd node of the call (``host_fn``: held inputs, no input taps)
    or, without it, from a re-run of the module's ``forward`` on the saved input; it is
    checked once per class and process against the generic path
    (:data:`real_model.gram.norms.NORM_CLOSED_FORM_CHECKED`)."""
    assert p.acc is not None
    n, cls, ok = p.n, type(mod), p.engine.norm_ok
    grads = None
    if host_fn is not None and ok.get(cls, True):
        grads = norm_forms.fast_leaf_grads(mod, names, args, delta, host_fn, R=n)
    if grads is None and ok.get(cls, True):
        node = norm_forms.rerun_node(mod, args)
        if node is not None:
            grads = norm_forms.fast_leaf_grads(mod, names, args, delta, node, R=n)
    if grads is not None and cls not in ok:
        ref = generic_per_sample_grads(mod, names, args, delta, R=n)
        tol = 64 * torch.finfo(ref.dtype).eps * float(ref.abs().max())
        verdict = bool((grads.to(ref.dtype) - ref).abs().max() <= tol)
        ok[cls] = verdict
        grads = grads if verdict else ref
    if grads is None:
        grads = generic_per_sample_grads(mod, names, args, delta, R=n)
    add_rows_gram(p, grads, name)


def generic_per_sample_grads(
    module: torch.nn.Module,
    names: list[str],
    args: tuple[Any, ...],
    delta: torch.Tensor,
    *,
    R: int,
) -> torch.Tensor:
    """Exact per-sample gradients of a small leaf module's parameters: ``[R, n_params]``.

    For each rollout ``i``, the vector-Jacobian product of ``module(x_i)`` (the captured input
    row, re-run as a batch of one) with ``delta_i``, w.r.t. the parameters ``names``; vectorised
    with :func:`torch.func.vmap` (a Python loop over rollouts is the fallback for modules that
    ``vmap`` cannot trace).
    """
    from torch.func import functional_call, vjp, vmap

    params = {n: p.detach() for n, p in module.named_parameters(recurse=False) if n in names}
    batched = [isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == R for x in args]

    def one(row_args: tuple[Any, ...], g_row: torch.Tensor) -> dict[str, torch.Tensor]:
        call_args = tuple(
            x.unsqueeze(0) if b else x for x, b in zip(row_args, batched, strict=True)
        )

        def fn(pd: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(module, pd, call_args)

        _, pull = vjp(fn, params)
        return pull(g_row.unsqueeze(0))[0]

    in_dims = (tuple(0 if b else None for b in batched), 0)
    try:
        out = vmap(one, in_dims=in_dims)(tuple(args), delta)
        flat = [out[n].reshape(R, -1) for n in names]
    except Exception:  # noqa: BLE001 - vmap cannot trace every module; loop instead
        rows = []
        for i in range(R):
            row_args = tuple(x[i] if b else x for x, b in zip(args, batched, strict=True))
            g = one(row_args, delta[i])
            rows.append(torch.cat([g[n].reshape(-1) for n in names]))
        return torch.stack(rows)
    return torch.cat(flat, dim=1)
