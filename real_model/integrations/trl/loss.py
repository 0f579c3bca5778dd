"""TRL's per-token loss gradient ``u = dL/dlogp`` from TRL's own ``compute_loss``, not re-derived.

For a micro-batch, the per-token log-probabilities are made a leaf ``x`` (TRL's per-token
log-prob function returns it for the call, with TRL's real entropies detached), TRL's own
``compute_loss`` runs, and ``u = dL/dx`` by ``autograd.grad``: the rows' gradients ``g_i =
sum_t u_it grad log pi_it`` then sum to TRL's gradient for every loss type and option, with no
hand-derived normaliser (:func:`segment_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import private
from .rows import Generation

__all__ = ["eval_mode", "values_needed", "logp_values", "segment_weights", "loss_gradient"]


class eval_mode:  # noqa: N801 - a context manager used like a function
    """``model.eval()`` for the block, the previous mode restored after."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.was_training = bool(model.training)

    def __enter__(self) -> Any:
        self.model.eval()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self.model.train(self.was_training)


def values_needed(tr: Any, chunk: Mapping[str, Any]) -> bool:
    """Whether TRL's per-token loss gradient depends on the log-prob values themselves.

    Not when the ratio is ``exp(x - x.detach()) = 1`` (no stored old log-probs), ``beta = 0``,
    no entropy mask, no off-policy mask and TRL's own ``compute_loss``: then ``u`` is the
    same for any ``x`` and the forward is skipped.
    """
    return not (private.own_loss(tr) and chunk.get("old_per_token_logps") is None
                and float(tr.beta) == 0.0 and float(tr.top_entropy_quantile) >= 1.0
                and tr.off_policy_mask_threshold is None)


def logp_values(tr: Any, chunk: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``(logps, entropies, aux)`` of a chunk at the current weights, as TRL computes them."""
    import torch

    C = chunk["completion_ids"].shape[1]
    if not values_needed(tr, chunk):
        z = torch.zeros(chunk["completion_ids"].shape, dtype=torch.float32,
                        device=chunk["completion_ids"].device)
        aux = z.new_zeros(()) if getattr(tr, "aux_loss_enabled", False) else None
        return z, z, aux
    ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
    am = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
    with torch.no_grad(), eval_mode(tr.model):
        lp, ent, aux = private.token_logps(
            tr, tr.model, ids, am, C, compute_entropy=True,
            compute_aux_loss=bool(getattr(tr, "aux_loss_enabled", False)))
    return lp.detach(), ent.detach(), None if aux is None else aux.detach()


def segment_weights(tr: Any, gen: Generation, prep: Mapping[str, Any]) -> Any:
    """``u [B, C]`` (float64) of a segment's micro-batches from TRL's own ``compute_loss`` on
    leaves (a micro-batch used ``k`` times in the step counts ``k`` times)."""
    import torch

    U = torch.zeros(gen.batch["completion_ids"].shape, dtype=torch.float64)
    if not prep["u_chunks"]:  # every row is measured in-run (u from the step itself)
        return U
    chunks = private.buffered_inputs(tr)
    with private.loss_state(tr):
        for j in prep["u_chunks"]:
            lp, ent, aux = prep["values"][j]
            leaf = lp.clone().requires_grad_(True)
            u = loss_gradient(tr, chunks[j], leaf, ent, aux)
            U[torch.as_tensor(gen.chunk_rows[j])] += prep["counts"][j] * u.double().cpu()
    return U


def loss_gradient(tr: Any, chunk: Mapping[str, Any], leaf: Any, ent: Any, aux: Any) -> Any:
    """``dL/dleaf`` of TRL's own ``compute_loss`` with the per-token log-probs ``leaf``."""
    import torch

    def logps(original: Any, model: Any, input_ids: Any, attention_mask: Any,
              logits_to_keep: int, *args: Any, compute_entropy: bool = False,
              compute_aux_loss: bool = False, **kw: Any) -> tuple[Any, Any, Any]:
        if tuple(input_ids.shape[:1]) != tuple(leaf.shape[:1]) or logits_to_keep != leaf.shape[1]:
            raise RuntimeError("geometry: TRL's loss scored a batch other than the micro-batch")
        return leaf, (ent if compute_entropy else None), (aux if compute_aux_loss else None)

    with private.logps_replaced(tr, logps):
        loss = tr.compute_loss(tr.model, chunk)
    if not loss.requires_grad:
        return torch.zeros_like(leaf, dtype=torch.float64)
    (u,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf) if u is None else u.detach()
