"""The model side of a Gram pass: log-probabilities, the backbone / head split, FSDP2, temperature.

:func:`token_logprobs` scores ``[R, T]`` tokens through the full logits; :func:`causal_lm_parts`
splits a Hugging Face causal LM as the tiled head needs it; :class:`TemperatureScaled` divides a
model's logits by a sampling temperature (the full-logits route of a host's second pass);
the FSDP2 helpers unshard the outermost modules for a pass and reshard after it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

__all__ = [
    "trainable_parameters",
    "model_device",
    "forward_kwargs",
    "token_logprobs",
    "CausalLMParts",
    "causal_lm_parts",
    "TemperatureScaled",
    "reentrant_checkpointing",
    "grads_kept",
    "reshard_fsdp",
    "fsdp_sharded",
    "fsdp_unsharded_roots",
]


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` for every distinct parameter with ``requires_grad=True``."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (its local shard's under FSDP2: a ``DTensor``
    parameter), where its inputs go. A model without parameters is a ``ValueError``."""
    p = next(model.parameters(), None)
    if p is None:
        raise ValueError(f"{type(model).__name__} has no parameters: it has no device")
    return (p.to_local() if hasattr(p, "to_local") else p).device


def forward_kwargs(model: nn.Module, attention_mask: torch.Tensor, position_ids: Any) -> dict:
    kw: dict[str, Any] = {"attention_mask": attention_mask}
    try:
        sig = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic callables
        sig = {}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values())

    def accepts(name: str) -> bool:  # wrappers such as PEFT's pass **kwargs to the model
        return name in sig or var_kw

    if accepts("use_cache"):
        kw["use_cache"] = False
    if isinstance(position_ids, str):
        if position_ids != "from_mask":
            raise ValueError(
                f"position_ids must be 'from_mask', None or a tensor, got {position_ids!r}"
            )
        if accepts("position_ids"):
            kw["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    elif position_ids is not None:
        kw["position_ids"] = position_ids
    return kw


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    position_ids: Any = "from_mask",
    temperature: float = 1.0,
) -> torch.Tensor:
    """``log pi(input_ids[i,t] | input_ids[i,<t])`` shaped ``[R, T]`` (column 0 is 0), with graph.

    The full-logits route (``[R, T, V]``; the naive reference and models without a separable
    head use it). Logits are upcast to float32 when the model computes in a lower precision
    (float64 is kept) and divided by ``temperature``. ``position_ids="from_mask"`` (default)
    passes ``cumsum(attention_mask) - 1`` so that a left-padded row scores exactly like the
    unpadded sequence; ``None`` lets the model decide.
    """
    out = model(input_ids=input_ids, **forward_kwargs(model, attention_mask, position_ids))
    logits = out.logits if hasattr(out, "logits") else out[0]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    tok = lp.gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(tok[:, :1]), tok], dim=1)


@dataclass(frozen=True)
class CausalLMParts:
    """A Hugging Face causal LM split as a fused head splits it: ``backbone(...)`` returns
    ``last_hidden_state`` ``[R, T, d]``; ``head`` is the ``nn.Linear`` of the output embeddings;
    ``lm`` is the model whose config gives the head transform (:func:`.head.head_transform`)."""

    lm: nn.Module
    backbone: nn.Module
    head: nn.Linear


def causal_lm_parts(model: nn.Module) -> CausalLMParts | None:
    """The backbone / head split of a (PEFT-wrapped) Hugging Face causal LM, or ``None``.

    ``None`` when the model exposes no ``nn.Linear`` output embedding or no separate
    ``base_model`` (e.g. a wrapper computing its own logits): callers then use the full logits.
    """
    lm = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    try:
        head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    except (NotImplementedError, AttributeError):
        head = None
    backbone = getattr(lm, "base_model", None)
    if not isinstance(head, nn.Linear) or not isinstance(backbone, nn.Module) or backbone is lm:
        return None
    return CausalLMParts(lm=lm, backbone=backbone, head=head)


def reentrant_checkpointing(model: nn.Module) -> bool:
    """Whether a Hugging Face layer will run reentrant activation checkpointing (which
    ``torch.autograd.grad`` does not support)."""
    for mod in model.modules():
        if getattr(mod, "gradient_checkpointing", False) and mod.training:
            fn = getattr(mod, "_gradient_checkpointing_func", None)
            kw = getattr(fn, "keywords", None) or {}
            if kw.get("use_reentrant", True):
                return True
    return False


@contextlib.contextmanager
def grads_kept(model: nn.Module) -> Iterator[None]:
    """Restore every trainable parameter's ``.grad`` afterwards (a full ``.backward()`` inside)."""
    params = [p for _, p in trainable_parameters(model)]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g


def reshard_fsdp(model: nn.Module) -> None:
    """Reshard every FSDP2 module (``torch.distributed.fsdp.FSDPModule``) of ``model``.

    Call after a Gram pass on an FSDP2 model: its backward asks for no parameter gradient, so
    FSDP's post-backward resharding may not run, and stale unsharded weights would then serve
    the next forward after the optimizer step. No-op without FSDP2 modules; every process of
    the FSDP group must call it (resharding frees, it does not communicate).
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _fsdp_roots(model: nn.Module) -> list[nn.Module]:
    """The outermost FSDP2 modules of ``model`` (none without FSDP2)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    roots: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule) and not any(
                name == r or name.startswith(r + ".") or r == "" for r, _ in roots):
            roots.append((name, m))
    return [m for _, m in roots]


def fsdp_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 modules (parameters sharded across processes): then every
    forward of a Gram pass is collective (an all-gather per module), and all processes must run
    the same passes."""
    return bool(_fsdp_roots(model))


@contextlib.contextmanager
def fsdp_unsharded_roots(model: nn.Module) -> Iterator[None]:
    """FSDP2: the outermost FSDP modules' own parameters (the embedding, final norm and LM head
    of a causal LM wrapped per layer) unsharded for the block, every FSDP module resharded after.

    The tiled pass calls the backbone and reads the head's weight outside the root's forward,
    where FSDP would otherwise leave them sharded (``DTensor``); unsharded before the capture is
    built, a tied head and embedding are one tensor again, so the tie's cross terms are found.
    Collective (an all-gather per root): every process must run the same passes.
    """
    roots = _fsdp_roots(model)
    try:
        for r in roots:
            r.unshard()  # type: ignore[operator]
        yield
    finally:
        if roots:
            reshard_fsdp(model)


class TemperatureScaled(nn.Module):
    """``model`` whose logits are divided by ``temperature`` (hosts score ``log softmax(z / T)``).

    The division is outside every submodule, so a capture's per-module hooks see the same
    modules and parameters; autograd carries the ``1/T`` into their output gradients.
    """

    def __init__(self, model: Any, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.temperature = float(temperature)

    def forward(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None,
                use_cache: bool | None = None) -> Any:
        kw = {"attention_mask": attention_mask, "use_cache": False}
        if position_ids is not None:
            kw["position_ids"] = position_ids
        out = self.model(input_ids=input_ids, **kw)
        logits = out.logits if hasattr(out, "logits") else out[0]
        return SimpleNamespace(logits=logits / self.temperature)
