"""The records of a capture: what its passes share (:class:`Engine`), one pass (:class:`Pass`).

A capture's configuration (model, plan, options, scratch buffers) is shared by every pass that
runs on the same hooks (``GramCapture.handover``); each forward + backward has its own
:class:`Pass`: its rows, Gram blocks, per-module counts, the calls it keeps, and its failures.
The per-layer rules and the small-call deferral are functions of a :class:`Pass`.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .kernels import Scratch, default_chunk_size
from .options import EngineOptions
from .packed import PackedRows

__all__ = ["GramCaptureError", "Call", "Blocks", "select_rows", "validate_blocks", "Engine",
           "SmallCalls", "Pass", "fail", "guard", "guarded_call", "check_rows", "in_backward",
           "problems"]


def in_backward() -> bool:
    """Whether autograd is running a backward on this thread (checkpoint recomputation)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


class GramCaptureError(ValueError):
    """The capture could not attribute the gradient per row (the message says why)."""


@dataclass
class Call:
    """One call of a trainable module whose output needs a gradient."""

    name: str
    kind: str
    held: Any = None  # embedding ids, or a generic module's arguments (tap slot = None)
    slot: int = 0  # position of the tapped input among the arguments
    delta: torch.Tensor | None = None
    x: torch.Tensor | None = None  # the input, held (input_taps off: no tap node)
    out_fn: Any = None  # a held generic call's output node, the host's (see add_leaf)


class Blocks:
    """float64 Gram blocks of the rows: ``K_b`` ``[n_b, n_b]`` for each row block ``b``."""

    def __init__(self, n: int, blocks: list[list[int]] | None, device: torch.device) -> None:
        self.n = n
        groups = [list(range(n))] if blocks is None else blocks
        self.index: list[slice | torch.Tensor] = []
        for rows in groups:
            bad = [r for r in rows if not 0 <= r < n]
            if bad:
                raise GramCaptureError(f"block rows {bad} are outside the batch's {n} rows")
            if rows == list(range(rows[0], rows[0] + len(rows))):
                self.index.append(slice(rows[0], rows[0] + len(rows)))
            else:
                self.index.append(torch.tensor(rows, dtype=torch.long, device=device))
        self.K = [torch.zeros(len(r), len(r), dtype=torch.float64, device=device) for r in groups]

    def each(self) -> Iterator[tuple[int, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]]:
        """``(b, K_b, sel)`` with ``sel(t)`` the rows of block ``b`` of a row-first tensor."""
        for b, (idx, K) in enumerate(zip(self.index, self.K, strict=True)):
            yield b, K, functools.partial(select_rows, idx=idx)


def select_rows(t: torch.Tensor, *, idx: slice | torch.Tensor) -> torch.Tensor:
    return t[idx] if isinstance(idx, slice) else t.index_select(0, idx.to(t.device))


def validate_blocks(
    blocks: Sequence[Sequence[int]] | None, n: int | None = None
) -> list[list[int]] | None:
    """``blocks`` as lists of ints: each non-empty, without repeated rows (and within ``[0, n)``
    when ``n`` is given); ``None`` stays ``None`` (the full Gram)."""
    if blocks is None:
        return None
    out = []
    for b in blocks:
        rows = [int(r) for r in b]
        if not rows:
            raise ValueError("every block needs at least one row")
        if len(set(rows)) != len(rows):
            raise ValueError(f"block {rows} repeats a row")
        if n is not None and not all(0 <= r < n for r in rows):
            raise ValueError(f"block {rows} has rows outside [0, {n})")
        out.append(rows)
    if not out:
        raise ValueError("blocks must hold at least one block (or be None: the full Gram)")
    return out



@dataclass(eq=False)
class Engine:
    """What the passes on one set of hooks share: the model, its plan, the options."""

    model: nn.Module
    plan: Any  # :class:`real_model.gram.plan.Plan`
    options: EngineOptions
    product_dtype: torch.dtype
    strict: bool
    input_taps: bool
    anchor: torch.Tensor  # the input taps' anchor (``GramCapture.grad_inputs``)
    norm_ok: dict[type, bool]  # per norm class: its closed form checked (``norms``)
    tied_embeddings: set[str] = field(default_factory=set)
    embedding_of_head: dict[str, str] = field(default_factory=dict)
    scratch: Scratch = field(default_factory=Scratch)
    chunk_size: int | None = None
    small_limits: dict[int, dict[str, tuple[str, int]]] = field(default_factory=dict)

    @property
    def chunk(self) -> int:
        """Entries of one temporary block (sized at first use, ``default_chunk_size``)."""
        if self.chunk_size is None:
            self.chunk_size = default_chunk_size(self.anchor.device)
        return self.chunk_size

    @property
    def linear_method(self) -> str:
        return self.options.linear_method


@dataclass(eq=False)
class SmallCalls:
    """The small calls one pass keeps for its flush (:mod:`real_model.gram.small_calls`)."""

    linear: list[tuple[Any, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    embedding: list[tuple[Any, torch.Tensor, torch.Tensor, Any]] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    norms: list[tuple[Any, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    recorded: list[tuple] = field(default_factory=list)  # output gradients read at flush
    now: dict[str, str] | None = None  # packed rows: module -> kind, if its calls are small
    uniform_rows: dict[tuple[int, int, torch.device], PackedRows] = field(default_factory=dict)

    def pending(self) -> bool:
        return bool(self.recorded or self.linear or self.embedding or self.rows or self.norms)


@dataclass(eq=False)
class Pass:
    """One forward + backward over ``n`` rows: Gram blocks, counts, kept calls, failures."""

    engine: Engine
    blocks: list[list[int]] | None
    packed: PackedRows | None
    index: int = 0  # passes before this one on the same hooks
    n: int | None = None
    acc: Blocks | None = None
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    called: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    errors: list[str] = field(default_factory=list)
    failed: bool = False
    tied_rows: dict[str, torch.Tensor] = field(default_factory=dict)
    tied_values: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    open: dict[str, list[Call]] = field(default_factory=lambda: defaultdict(list))
    pending: dict[str, Call] = field(default_factory=dict)  # rows calls opened by the pre-hook
    from_rows: set[str] = field(default_factory=set)  # modules whose dW came from the rows
    batched: set[str] = field(default_factory=set)  # modules whose small calls were batched
    small: SmallCalls = field(default_factory=SmallCalls)
    busy: bool = False
    exited: bool = False
    live: int = 0  # tapped calls whose graph is alive
    roots: list[torch.Tensor] = field(default_factory=list)
    attr: str = ""  # the attribute by which a tapped input carries its call


def fail(p: Pass, message: str) -> None:
    """Record a problem; skip all later work (raise instead under ``strict``)."""
    p.errors.append(message)
    p.failed = True
    if p.engine.strict:
        raise GramCaptureError(message)


def guard(p: Pass, what: str, fn: Callable[..., Any], *args: Any, module: bool = False) -> Any:
    """Run ``fn(*args)``; any exception becomes a recorded problem (re-raised under ``strict``)
    named by ``what`` (``module=True``: the module ``what``; the message is formatted only on
    failure, so per-call guards cost no string)."""
    try:
        return fn(*args)
    except GramCaptureError as e:
        if p.engine.strict:
            raise
        fail(p, str(e))
    except Exception as e:  # noqa: BLE001 - never stop the host's step (see the capture)
        label = f"module {what!r}" if module else what
        fail(p, f"{label}: {type(e).__name__}: {e}")
    return None


def check_rows(p: Pass, name: str, x: torch.Tensor) -> None:
    """Check that ``x`` is batch-first over the ``n`` rows (fixing ``n`` at the first call),
    or, with ``segments``, one packed sequence of them."""
    if p.packed is not None and p.packed.is_packed(x):
        dim, rows = 2, p.packed.n
    else:
        dim, rows = x.dim(), (int(x.shape[0]) if x.dim() else 0)
    if p.n is None:
        if dim < 2:
            raise GramCaptureError(f"module {name!r} got an input of shape "
                                   f"{tuple(x.shape)}: the rows must be its first axis")
        p.n = rows
        p.acc = Blocks(p.n, p.blocks, p.engine.anchor.device)
    elif dim < 2 or rows != p.n:
        mod = p.engine.plan.modules[name][0]
        raise GramCaptureError(
            f"module {name!r} ({type(mod).__name__}) was called with an input of shape "
            f"{tuple(x.shape)} whose first axis is not the n={p.n} rows; the capture "
            "needs batch-first per-row inputs (one capture per forward + backward)")


def guarded_call(p: Pass, name: str, mod: nn.Module, fn: Callable[[], Any]) -> None:
    """Add a module call's term ``fn()`` with the pass busy (the capture's hooks ignore the
    forwards it runs), a failure recorded against the module."""
    p.busy = True
    try:
        guard(p, f"module {name!r} ({type(mod).__name__})", fn)
    finally:
        p.busy = False


def problems(p: Pass, coverage: dict[str, int]) -> list[str]:
    """The pass's recorded errors, else its coverage problems: a trainable module counted 0 or
    more than 1 times (``coverage``: module -> contributions), each named with its parameters."""
    if p.errors:  # later work was skipped: coverage would only echo the first failure
        return list(p.errors)
    if p.n is None:
        return ["no trainable module was called with gradients enabled inside the capture"]
    out: list[str] = []
    for name, count in coverage.items():
        mod, _, pnames = p.engine.plan.modules[name]
        what = f"module {name!r} ({type(mod).__name__}) with trainable parameters {pnames}"
        if count == 0 and not p.called.get(name):
            out.append(f"{what} was never called in the forward inside the capture (with "
                       "gradients enabled): its parameters may be used outside its forward, "
                       "which the exact Gram cannot attribute (use method='naive', or set "
                       "requires_grad=False on them)")
        elif count == 0:
            out.append(f"{what} was called but added no contribution: its output never "
                       "received a gradient in the backward (not on the loss's path, or its "
                       "hook was removed); set requires_grad=False on parameters the loss "
                       "does not use")
        elif count > 1:
            out.append(f"{what} was counted {count} times: it was called {count} times in "
                       "one forward (weight reuse, or one capture around several forwards); "
                       "the exact Gram needs each trainable module once per row")
    return out
