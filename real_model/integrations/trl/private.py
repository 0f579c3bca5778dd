"""Every private name of TRL the geometry touches, and every patch of TRL, in this one module.

Pinned: TRL 1.16.0 (:data:`PINNED`). :data:`TRAINER_PRIVATE` lists the ``GRPOTrainer``
members (methods the mixin overrides or calls, attributes it reads or swaps) and
:data:`MODULE_PRIVATE` the module-level names; ``tests/test_real_trl_geometry.py`` checks that
each exists in the installed TRL. When TRL moves, this is the file to read and change. The
rest of the integration reaches TRL's internals only through the functions below:

* :func:`buffered_inputs`, :func:`micro_step`, :func:`metrics_buffer`,
  :func:`logged_advantages`: trainer state read;
* :func:`token_logps` and :class:`logps_replaced`: TRL's per-token log-prob function, called or
  replaced for one call of its loss (:class:`loss_state` keeps what that loss changes);
* :func:`own_loss`: whether the trainer's loss is TRL's own;
* :class:`group_shuffle`: ``shuffle_sequence_dict`` replaced by a shuffle of whole groups;
* :class:`fused_head`: TRL's ``_ChunkedLogProbFunction`` intercepted so that a Gram capture sees
  its fused head; the token mask is read from the calling frame (``sys._getframe``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PINNED", "TRAINER_PRIVATE", "MODULE_PRIVATE", "buffered_inputs", "micro_step",
           "metrics_buffer", "logged_advantages", "token_logps", "logps_replaced", "own_loss",
           "loss_state", "group_shuffle", "fused_head"]

PINNED = "1.16.0"
"""The TRL version these names are checked against (``pyproject.toml``'s ``trl`` extra)."""

TRAINER_PRIVATE = (
    "_calculate_rewards",  # overridden: TRL's gathered rewards per reward function
    "_generate_and_score_completions",  # overridden: each row of the generation batch tagged
    "_prepare_inputs",  # overridden: where a micro-step starts
    "_get_per_token_logps_and_entropies",  # called (values) and replaced (u of its loss)
    "_compute_loss",  # compared with TRL's own (whether u depends on the log-prob values)
    "_buffered_inputs",  # read: the generation batch's micro-batches
    "_step",  # read: the micro-step counter
    "_metrics",  # read and written: TRL's metric buffer
    "_entropy_window_stats",  # saved and restored around TRL's loss
    "_last_world_entropy",  # saved and restored around TRL's loss
    "_logs",  # read: the advantages of the latest generation batch (real trl-train)
    "_get_grad_norm",  # transformers' Trainer, overridden: the step's pre-clip gradient norm
)
"""``GRPOTrainer`` members the integration uses (methods or instance attributes)."""

MODULE_PRIVATE = (
    "trl.trainer.utils._ChunkedLogProbFunction",  # the fused head's kernel, intercepted
    "trl.trainer.utils.add_fused_lm_head",  # its caller ``_fused_forward`` holds ``mask``
    "trl.trainer.grpo_trainer.shuffle_sequence_dict",  # replaced by a group shuffle
)
"""Module-level TRL names the integration uses (``module.name``)."""

_LOSS_ATTRS = ("_entropy_window_stats", "entropy_coef", "_last_world_entropy")


def buffered_inputs(trainer: Any) -> list[dict[str, Any]]:
    """The micro-batches TRL cut the current generation batch into."""
    return trainer._buffered_inputs


def micro_step(trainer: Any) -> int:
    """TRL's micro-step counter (``_step``)."""
    return int(trainer._step)


def metrics_buffer(trainer: Any) -> Any:
    """TRL's metric buffer of training (``_metrics["train"]``: name -> list of values)."""
    return trainer._metrics["train"]


def logged_advantages(trainer: Any) -> list[float]:
    """The advantages of TRL's latest generation batch, every process's rows in group order
    (``_logs["advantages"]``)."""
    return [float(a) for a in trainer._logs["advantages"]]


def token_logps(trainer: Any, *args: Any, **kwargs: Any) -> Any:
    """TRL's ``_get_per_token_logps_and_entropies(model, ids, mask, logits_to_keep, ...)``."""
    return trainer._get_per_token_logps_and_entropies(*args, **kwargs)


class logps_replaced:  # noqa: N801 - a context manager used like a function
    """TRL's per-token log-prob function replaced on the trainer by ``fn`` for the block (or
    until :meth:`undo`); ``fn`` receives TRL's own bound function first
    (``fn(original, *args, **kwargs)``)."""

    NAME = "_get_per_token_logps_and_entropies"

    def __init__(self, trainer: Any, fn: Callable[..., Any]) -> None:
        self.trainer = trainer
        original = getattr(type(trainer), self.NAME).__get__(trainer)
        self.fn = lambda *a, **k: fn(original, *a, **k)

    def __enter__(self) -> logps_replaced:
        setattr(self.trainer, self.NAME, self.fn)
        return self

    def undo(self) -> None:
        """Restore TRL's own function (idempotent)."""
        if self.trainer.__dict__.get(self.NAME) is self.fn:
            del self.trainer.__dict__[self.NAME]

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def own_loss(trainer: Any) -> bool:
    """Whether the trainer's loss is TRL's own ``GRPOTrainer`` loss (no subclass override)."""
    import trl

    return (type(trainer).compute_loss is trl.GRPOTrainer.compute_loss
            and type(trainer)._compute_loss is trl.GRPOTrainer._compute_loss)


class loss_state:  # noqa: N801 - a context manager used like a function
    """Snapshot and restore what TRL's ``compute_loss`` changes besides the loss (metrics,
    adaptive-entropy window) and put the model in train mode (TRL's loss reads the mode)."""

    def __init__(self, trainer: Any) -> None:
        self.tr = trainer

    def __enter__(self) -> None:
        m = self.tr._metrics
        self.metrics = {mode: {k: list(v) for k, v in buf.items()} for mode, buf in m.items()}
        self.attrs = {a: getattr(self.tr, a) for a in _LOSS_ATTRS if hasattr(self.tr, a)}
        self.mode = bool(self.tr.model.training)
        self.tr.model.train()

    def __exit__(self, *exc: Any) -> None:
        for mode, buf in self.tr._metrics.items():
            buf.clear()
            buf.update(self.metrics.get(mode, {}))
        for a, v in self.attrs.items():
            setattr(self.tr, a, v)
        self.tr.model.train(self.mode)


class group_shuffle:  # noqa: N801 - a context manager used like a function
    """TRL's ``shuffle_sequence_dict`` replaced, for the block, by ``shuffle(seq_dict)``."""

    def __init__(self, shuffle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.shuffle = shuffle

    def __enter__(self) -> None:
        import trl.trainer.grpo_trainer as host

        self.host, self.original = host, host.shuffle_sequence_dict
        host.shuffle_sequence_dict = self.shuffle

    def __exit__(self, *exc: Any) -> None:
        self.host.shuffle_sequence_dict = self.original


class _TrlFusedHead:
    """Stand-in for ``trl.trainer.utils._ChunkedLogProbFunction`` while :class:`fused_head` is
    active: ``apply`` runs TRL's own function unchanged (the host's values and gradients are
    TRL's) and hands its inputs and outputs to the capture's fused-head hook. The token mask is
    the local ``mask`` of the caller, TRL's ``_fused_forward``."""

    _ARGS = ("hidden", "weight", "bias", "targets", "temperature", "chunk_size",
             "final_logit_softcapping", "logit_scale", "outputs")

    def __init__(self, capture: Any, original: Any) -> None:
        self.hook = capture.fused_head_hook()  # follows the capture's handovers
        self.route = capture._route
        self.original = original

    @property
    def capture(self) -> Any:
        """The capture the fused head reports to now."""
        return self.route[0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        from ...gram import HeadTransform

        out = self.original.apply(*args, **kwargs)
        caller = sys._getframe(1)
        mask = caller.f_locals.get("mask") if caller.f_code.co_name == "_fused_forward" else None
        bound = dict(zip(self._ARGS, args, strict=False)) | kwargs
        transform = HeadTransform(
            temperature=float(bound["temperature"]),
            logit_scale=float(bound.get("logit_scale", 1.0)),
            softcap=bound.get("final_logit_softcapping"),
        )
        self.hook(out, bound["hidden"], bound["weight"], bound["bias"], bound["targets"],
                  transform, mask, int(bound["chunk_size"]))
        return out


class fused_head:  # noqa: N801 - a context manager used like a function
    """TRL's fused head (``model(..., labels=..., fused_lm_head=True)`` after
    ``add_fused_lm_head``) reports to ``capture`` for the block: its
    ``_ChunkedLogProbFunction`` is intercepted (only when TRL is imported), so the head's Gram
    is added tile by tile although the ``lm_head`` module is never called."""

    def __init__(self, capture: Any) -> None:
        self.capture = capture
        self.saved: tuple[Any, Any] | None = None

    def __enter__(self) -> fused_head:
        utils = sys.modules.get("trl.trainer.utils")
        original = getattr(utils, "_ChunkedLogProbFunction", None)
        if original is None:
            return self
        if isinstance(original, _TrlFusedHead):
            raise RuntimeError("another GramCapture is already active around TRL's fused head")
        self.saved = (utils, original)
        utils._ChunkedLogProbFunction = _TrlFusedHead(self.capture, original)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            utils, original = self.saved
            utils._ChunkedLogProbFunction = original
            self.saved = None


def checked_names(trl_module: Any) -> Mapping[str, bool]:
    """Each listed private name -> whether the installed TRL has it (for the pin test)."""
    import importlib

    out = {f"GRPOTrainer.{n}": _has_member(trl_module.GRPOTrainer, n) for n in TRAINER_PRIVATE}
    for dotted in MODULE_PRIVATE:
        mod, name = dotted.rsplit(".", 1)
        out[dotted] = hasattr(importlib.import_module(mod), name)
    return out


def _has_member(cls: type, name: str) -> bool:
    """A method or class attribute of ``cls``, or an instance attribute its ``__init__`` (or
    the methods that set it) assigns (``self.<name> =`` in the class's source)."""
    import inspect

    if hasattr(cls, name):
        return True
    return any(f"self.{name} =" in inspect.getsource(c) or f"self.{name}:" in inspect.getsource(c)
               for c in cls.__mro__ if c.__module__.startswith("trl."))
