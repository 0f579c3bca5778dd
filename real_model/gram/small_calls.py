"""Small module calls: which are small, and keeping them for one batched term after the backward.

A *small* call costs more in the fixed price of its ~10 tensor operations (tens of microseconds
each on CPU) than in arithmetic. With ``EngineOptions(batch_small_calls=True)`` (default) the
capture keeps a small call's tensors in its pass (:class:`real_model.gram.state.SmallCalls`) and
:func:`flush` adds all their terms at once (:func:`real_model.gram.small_terms.add_small_calls`):
the same Gram up to float rounding. A small Linear keeps the host's own ``dW`` (never
``weight_grads="rows"``). Calls on batch-first rows are recorded by the forward hook
(:func:`record_small`; packed rows: :func:`record_packed`, the modules small at the pass's token
count known up front, :func:`small_now`) and read after the backward (:func:`read_recorded`);
calls that reach the backward's hooks are deferred there (:func:`defer_linear`,
:func:`defer_embedding`, :func:`defer_norm`, :func:`add_rows_gram`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from . import norms as norm_forms
from .kernels import flat_gram
from .packed import PackedRows
from .small_terms import PassCalls, add_small_calls
from .state import Pass, check_rows, fail, guard

__all__ = [
    "SMALL_CALL_ELEMENTS",
    "SMALL_CALL_TOKENS",
    "SMALL_CALL_KERNEL_RATIO",
    "SMALL_CALL_KEPT",
    "small_now",
    "small_layout",
    "defer_linear",
    "defer_embedding",
    "defer_norm",
    "record_small",
    "record_packed",
    "read_recorded",
    "add_rows_gram",
    "flush",
]

SMALL_CALL_ELEMENTS = 1 << 16
"""A call is small when what its term reads holds at most this many entries (a Linear's ``N
(d_in + d_out)``, an embedding's ``N d``, a leaf's rows ``n p``; ``benchmarks/bench_verl_geometry.py
--small-calls``)."""

SMALL_CALL_TOKENS = 512
"""Most tokens ``N`` of a small Linear call: its ``[N, N]`` token kernels are formed whole
(``benchmarks/bench_verl_geometry.py --small-calls``)."""

SMALL_CALL_KERNEL_RATIO = 40
"""A Linear call is also small when ``N^2 (d_in + d_out) <= 40 n d_in d_out``: its token kernels
cost less than its per-row gradients (crossover ~60-130, ``benchmarks/bench_linear_gram.py
--packed``)."""

SMALL_CALL_KEPT = 1 << 22
"""Most entries ``N (d_in + d_out)`` a batched Linear call keeps until :func:`flush` (16 MiB
float32; ``benchmarks/bench_verl_geometry.py --kernel-ratio``)."""


def _most_small_tokens(width: int) -> int:
    """The most tokens of a small call reading ``width`` entries per token: ``N <=
    SMALL_CALL_TOKENS`` and ``N width <= SMALL_CALL_ELEMENTS``."""
    return min(SMALL_CALL_TOKENS, SMALL_CALL_ELEMENTS // max(1, width))


def _most_small_linear_tokens(d_in: int, d_out: int, rows: int) -> int:
    """The most tokens ``N`` of a small call of a ``d_in -> d_out`` Linear over ``rows`` rows:
    ``N <= SMALL_CALL_TOKENS``, ``N (d_in + d_out) <= SMALL_CALL_KEPT``, and either ``N (d_in +
    d_out) <= SMALL_CALL_ELEMENTS`` or ``N^2 (d_in + d_out) <= SMALL_CALL_KERNEL_RATIO rows d_in
    d_out`` (:data:`SMALL_CALL_KERNEL_RATIO`).

    >>> _most_small_linear_tokens(64, 64, 4)  # 65536 // 128 = 512 tokens by size alone
    512
    >>> _most_small_linear_tokens(256, 512, 4)  # by size 85; by cost isqrt(40*4*256*512 // 768)
    165
    """
    width = max(1, d_in + d_out)
    by_cost = math.isqrt(SMALL_CALL_KERNEL_RATIO * max(0, rows) * d_in * d_out // width)
    return min(SMALL_CALL_TOKENS, SMALL_CALL_KEPT // width,
               max(SMALL_CALL_ELEMENTS // width, by_cost))


def small_now(p: Pass) -> None:
    """Packed rows: the modules whose every call in this pass is small (``p.small.now``:
    module -> kind), from the pass's token count; ``None`` otherwise."""
    packed = p.packed
    if packed is not None and p.engine.options.batch_small_calls:
        p.small.now = {name: kind for name, (kind, most)
                       in small_token_limits(p, packed.n).items() if packed.tokens <= most}


def small_layout(p: Pass, t: torch.Tensor, width: int, *, features: bool = True,
                  linear: tuple[int, int] | None = None) -> PackedRows | None:
    """The token layout of a small call whose tokens are ``t``'s leading axes (one trailing
    feature axis, or none: ``features=False``, token ids) and that reads ``width`` entries
    per token: the packed rows, or batch-first rows of ``T`` tokens each as segments;
    ``None`` when the call is not small (:data:`SMALL_CALL_ELEMENTS`,
    :data:`SMALL_CALL_TOKENS`; a Linear's ``linear = (d_in, d_out)`` also by
    :data:`SMALL_CALL_KERNEL_RATIO`) or not on the capture's rows."""
    if not p.engine.options.batch_small_calls or p.n is None:
        return None
    if p.packed is not None and p.packed.is_packed(t):
        layout = p.packed
    else:
        if t.dim() < 1 + features or t.shape[0] != p.n:
            return None
        T = t.numel() // max(1, p.n * (t.shape[-1] if features else 1))
        if T < 1:
            return None
        key = (p.n, T, t.device)
        layout = p.small.uniform_rows.get(key)  # type: ignore[assignment]
        if layout is None:  # batch-first rows of T tokens each, as packed segments
            layout = PackedRows(torch.arange(0, p.n * T + 1, T), t.device)
            p.small.uniform_rows[key] = layout
    most = (_most_small_tokens(width) if linear is None
            else _most_small_linear_tokens(*linear, layout.n))
    return layout if layout.tokens <= most else None


def is_small(tokens: int, width: int) -> bool:
    """A call of ``tokens`` tokens reading ``width`` entries per token is small."""
    return tokens <= _most_small_tokens(width)


def small_linear_dims(p: Pass, name: str) -> tuple[int, int] | None:
    """``(d_in, d_out)`` of module ``name`` when its calls may be batched (a weight-only
    ``nn.Linear``-kind module, not a tied head), else ``None``."""
    mod, kind, names = p.engine.plan.modules[name]
    if kind != "linear" or names != ["weight"] or name in p.engine.embedding_of_head:
        return None
    d_out, d_in = mod.weight.shape
    return int(d_in), int(d_out)


def small_linear_tokens(p: Pass, name: str, x: torch.Tensor) -> PackedRows | None:
    """:func:`small_layout` of a call on input ``x`` of a Linear that may be batched."""
    dims = small_linear_dims(p, name)
    if dims is None or x.dim() < 2:
        return None
    return small_layout(p, x, sum(dims), linear=dims)


def defer_norm(p: Pass, name: str, mod: nn.Module, names: list[str], delta: torch.Tensor,
                host_fn: Any) -> bool:
    """Keep a small packed ``weight * z`` norm call's ``delta`` and ``z`` (read from the
    host's node now: autograd frees it after its backward) for :func:`flush`."""
    lay = small_norm_layout(p, mod, names, delta)
    z = None if lay is None else norm_forms.scaled_norm_factor(mod, delta, host_fn)
    if lay is None or z is None:
        return False
    p.small.norms.append((lay, delta[0, : lay.tokens], z[0, : lay.tokens]))
    p.batched.add(name)
    return True


def small_norm_layout(p: Pass, mod: nn.Module, names: list[str],
                       t: torch.Tensor) -> PackedRows | None:
    """The packed rows, when a norm call whose output (gradient) is ``t`` may be batched: a
    1-d weight only, packed rows, ``t`` packed, ``N 2 d`` small."""
    lay = p.packed
    if (not p.engine.options.batch_small_calls or lay is None or names != ["weight"]
            or mod.weight.dim() != 1 or not lay.is_packed(t)
            or not is_small(lay.tokens, 2 * t.shape[-1])):
        return None
    return lay


def defer_embedding(p: Pass, name: str, mod: nn.Module, ids: torch.Tensor,
                     delta: torch.Tensor) -> bool:
    """Keep a small (untied) embedding call's ids and ``delta`` for :func:`flush`: its term
    ``S ([id_t = id_t'] * (delta delta^T)) S^T`` (tokens at ``padding_idx`` left out)."""
    if name in p.engine.tied_embeddings or not isinstance(ids, torch.Tensor):
        return False
    layout = small_layout(p, ids, delta.shape[-1], features=False)
    if layout is None:
        return False
    N = layout.tokens
    flat = ids[0, :N] if layout is p.packed else ids.reshape(N)
    g = delta[0, :N] if layout is p.packed else delta.reshape(N, -1)
    pad = getattr(mod, "padding_idx", None)
    keep = None if pad is None else (flat != pad)
    p.small.embedding.append((layout, flat, g, keep))
    p.batched.add(name)
    return True


def defer_linear(p: Pass, name: str, x: torch.Tensor, delta: torch.Tensor) -> bool:
    """Keep a small Linear call's ``(a, delta)`` on its tokens for :func:`flush`."""
    layout = small_linear_tokens(p, name, x)
    if layout is None:
        return False
    N = layout.tokens
    if layout is p.packed:
        a, g = x.detach()[0, :N], delta[0, :N]
    else:
        a, g = x.detach().reshape(N, -1), delta.reshape(N, -1)
    p.small.linear.append((layout, a, g))
    p.batched.add(name)
    return True


def record_small(p: Pass, name: str, mod: nn.Module, args: tuple, kwargs: dict,
                  out: Any) -> bool:
    """Forward hook of a small call on batch-first rows (no input taps; packed rows:
    :func:`record_packed`): keep its input and output, and have autograd keep the output's
    gradient (``retain_grad``: no Python hook in the backward); :func:`flush` reads it.
    Small: a Linear or untied embedding call as :func:`small_layout` (a norm is batched on
    packed rows only). ``False`` (nothing done): the usual per-call path, which also
    reports any problem of the call."""
    if (kwargs or len(args) != 1 or not isinstance(out, torch.Tensor)
            or not out.requires_grad or not isinstance(args[0], torch.Tensor)
            or p.failed):
        return False
    x = args[0]
    kind = p.engine.plan.modules[name][1]
    try:  # on any doubt, the usual path (which reports what is wrong)
        check_rows(p, name, x)
        if kind == "linear":
            layout = small_linear_tokens(p, name, x) if x.is_floating_point() else None
        elif kind == "embedding":
            layout = None if name in p.engine.tied_embeddings else small_layout(
                p, x, out.shape[-1], features=False)
        else:
            layout = None
        if layout is None:
            return False
        check_rows(p, name, out)
    except Exception:  # noqa: BLE001
        return False
    keep_recorded(p, name, kind, layout, x, out, None)
    return True


def record_packed(p: Pass, name: str, kind: str, mod: nn.Module, args: tuple, kwargs: dict,
                   out: Any) -> bool:
    """:func:`record_small` on packed rows, for a module of ``kind`` whose calls are small
    at this pass's token count (``p.small.now``)."""
    if (kwargs or len(args) != 1 or p.failed or not torch.is_grad_enabled()
            or not isinstance(out, torch.Tensor) or not out.requires_grad):
        return False
    x = args[0]
    N = p.packed.tokens  # type: ignore[union-attr]
    if (not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[0] != 1
            or x.shape[1] < N or out.dim() < 2 or out.shape[0] != 1 or out.shape[1] < N):
        return False
    z = None
    if kind == "generic":
        if (p.engine.norm_ok.get(type(mod)) is not True or not x.is_floating_point()
                or out.shape[-1] != mod.weight.shape[0]):
            return False
        z = norm_forms.scaled_norm_factor(mod, out, out.grad_fn)
        if z is None:
            return False
    elif kind == "linear" and not x.is_floating_point():
        return False
    if p.n is None:
        try:
            check_rows(p, name, x)
        except Exception:  # noqa: BLE001 - the usual path reports it
            return False
    keep_recorded(p, name, kind, p.packed, x, out, z)
    return True


def keep_recorded(p: Pass, name: str, kind: str, layout: Any, x: torch.Tensor,
                   out: torch.Tensor, z: torch.Tensor | None) -> None:
    """Keep a small call's input and output, and have autograd keep the output's gradient
    (``retain_grad``: no Python hook in the backward); :func:`read_recorded` reads it."""
    out.retain_grad()
    p.small.recorded.append((name, kind, layout, x.detach(), out, out._version, z))
    p.called[name] += 1
    p.batched.add(name)


def small_token_limits(p: Pass, rows: int) -> dict[str, tuple[str, int]]:
    """Module -> (kind, the most packed tokens of ``rows`` rows at which its calls are
    small), for the modules whose calls may be batched: a weight-only Linear (not a tied
    head), an untied embedding, a module with one 1-d ``weight`` (a norm:
    :func:`record_packed` checks its ``weight * z`` form). Formed once per row count for
    the captures that share these hooks."""
    limits = p.engine.small_limits.get(rows)
    if limits is not None:
        return limits
    limits = {}
    for name, (mod, kind, names) in p.engine.plan.modules.items():
        w = getattr(mod, "weight", None)
        if kind == "linear":
            dims = small_linear_dims(p, name)
            if dims is not None:
                limits[name] = (kind, _most_small_linear_tokens(*dims, rows))
            continue
        if kind == "embedding" and name not in p.engine.tied_embeddings:
            width = int(w.shape[-1]) if isinstance(w, torch.Tensor) else None
        elif kind == "generic" and names == ["weight"] and w.dim() == 1:
            width = 2 * int(w.shape[0])
        else:
            width = None
        if width is not None:
            limits[name] = (kind, _most_small_tokens(width))
    p.engine.small_limits[rows] = limits
    return limits


def read_recorded(p: Pass) -> None:
    """The recorded small calls' output gradients, kept as their terms' inputs (a call whose
    output got no gradient is not counted: ``GramCapture.problems`` names it)."""
    recorded, p.small.recorded = p.small.recorded, []
    for name, kind, layout, x, out, version, z in recorded:
        delta = out.grad
        if delta is None or p.failed:
            continue
        out.grad = None
        if out._version != version:
            mod = p.engine.plan.modules[name][0]
            guard(p, name, fail, p, f"module {name!r} ({type(mod).__name__}): its output was "
                  "modified in place after its forward, so the gradient kept for it is not its "
                  "own; use batch_small_calls=False (a hook per call)")
            continue
        p.counts[name] += 1
        N = layout.tokens
        if layout is not p.packed:  # batch-first rows: tokens are the leading axes
            x, delta = x.reshape(N, -1), delta.reshape(N, -1)
        elif x.shape[1] == N and delta.shape[1] == N:  # packed, no padding after the rows
            x, delta, z = x[0], delta[0], None if z is None else z[0]
        else:
            x, delta, z = x[0, :N], delta[0, :N], None if z is None else z[0, :N]
        if kind == "linear":
            p.small.linear.append((layout, x, delta))
        elif kind == "embedding":
            ids = x.reshape(N)
            pad = getattr(p.engine.plan.modules[name][0], "padding_idx", None)
            p.small.embedding.append((layout, ids, delta, None if pad is None else ids != pad))
        else:
            p.small.norms.append((layout, delta, z))


def take_small(p: Pass) -> PassCalls | None:
    """This pass's kept small calls (emptied here), ``None`` when it has failed."""
    calls = PassCalls(n=int(p.n or 0), K=p.acc.K if p.acc else [],
                         index=p.acc.index if p.acc else [],
                         linear=p.small.linear, embedding=p.small.embedding,
                         norms=p.small.norms, rows=p.small.rows)
    p.small.linear, p.small.embedding, p.small.rows, p.small.norms = [], [], [], []
    return None if p.failed or p.acc is None else calls


def flush(p: Pass) -> None:
    """Add the terms of the small calls kept so far (``batch_small_calls``), batched
    (:func:`real_model.gram.small_terms.add_small_calls`); called by ``GramCapture.result``,
    ``problems``, ``coverage`` and ``handover``, or by the host after its backward to free the
    kept tensors early. Idempotent; failures are recorded like any
    other."""
    if not p.small.pending():
        return
    read_recorded(p)
    calls = take_small(p)
    if calls:
        guard(p, "small calls, batched", functools.partial(
            add_small_calls, [calls], chunk_size=p.engine.chunk,
            product_dtype=p.engine.product_dtype, scratch=p.engine.scratch))


def add_rows_gram(p: Pass, grads: torch.Tensor, name: str | None = None) -> None:
    """Each block's Gram of per-row gradients ``grads`` ``[n, p]`` (small ones: at
    :func:`flush`, concatenated with the others)."""
    assert p.acc is not None
    if p.engine.options.batch_small_calls and grads.numel() <= SMALL_CALL_ELEMENTS:
        p.small.rows.append(grads.detach())
        if name is not None:
            p.batched.add(name)
        return
    for _, K, sel in p.acc.each():
        flat_gram(K, sel(grads), p.engine.scratch, product_dtype=p.engine.product_dtype)
