"""Exact per-rollout gradient Gram matrix of a causal LM from ONE batched forward + backward.

For a batch of ``R`` rollouts (one row each of ``input_ids``), the trajectory score of rollout ``i``
(seed paper, Eq. 18; the GRPO gradient is ``(1/R) sum_i A_i psi_i``, Eq. 19) is::

    psi_i = grad_theta  sum_t  w_it  log pi_theta(y_it | y_i,<t)        (w = completion_mask)

over ALL trainable parameters ``theta`` (``requires_grad=True``), and

    K_ij = <psi_i, psi_j>,   K in R^{R x R}.

The paper's gradient matrix (Sec. 7.1) has rows ``A_i psi_i^T``, so its Gram is
``G G^T = diag(A) K diag(A)``: its singular values are those of ``G`` without forming ``G``.

``method="exact"`` (default) runs one batched forward and one backward of
``L = sum_i sum_t w_it log pi(y_it | y_i,<t)``. Rollouts do not interact in a causal-LM forward
(each row attends only to itself), so the output gradient ``delta_i`` of every module, restricted
to row ``i``, is exactly the gradient of rollout ``i``'s own term, and per module:

* ``nn.Linear``, ``y = a W^T + b``: ``dW_i = delta_i^T a_i``, hence
  ``<dW_i, dW_j> = sum_{t,t'} (delta_it . delta_jt') (a_it . a_jt')`` (cost ``(RT)^2 (d_in+d_out)``)
  or explicit per-sample gradients chunked over output rows (cost ``R T d_in d_out``), whichever is
  cheaper for the layer's shape; ``db_i = sum_t delta_it``.
* ``nn.Embedding``: ``<dE_i, dE_j> = sum_{t,t'} [id_it == id_jt'] (delta_it . delta_jt')``.
* tied embeddings (``lm_head.weight is embed_tokens.weight``): the parameter's gradient is the sum
  ``H_i + E_i`` of both uses, so the cross terms ``<H_i, E_j> + <E_i, H_j>`` are included.
* norms: closed forms (``out = weight * z`` of RMSNorm, from the ``z`` of a re-run of the norm;
  ``nn.LayerNorm`` and subclasses such as Nemotron's LayerNorm1P), each module class checked once
  per pass against the generic path;
* any other small leaf module: exact per-sample vector-Jacobian products of the module on its
  captured input (:func:`torch.func.vmap`).

The per-layer identities are applied by :class:`real_model.gram.GramCapture` (the same engine
that measures a host's own backward in-run). For Hugging Face causal LMs the pass runs the
backbone and then the head in vocabulary tiles (:func:`real_model.gram.head.head_logprobs`), so
no ``[R, T, V]`` logits tensor exists; the head's Gram (weight, bias, tied cross terms) is added
tile by tile. The backward asks autograd only for what the capture's hooks need
(:meth:`GramCapture.grad_inputs`), so autograd skips the batched weight gradients, which the
per-sample products replace: the cost stays close to one plain forward + backward. Every trainable
parameter must be accounted for exactly once, or a ``ValueError`` names the module. No
``[R, num_parameters]`` buffer is created; Gram entries are accumulated in float64.

:func:`rows_gram` is the bounded-memory second pass for any real token weights (e.g. a trainer's
``dL/d log p``): per-block Grams, as many blocks per forward + backward as a memory budget allows.

``method="naive"`` is the reference: ``R`` separate forward + backward passes (one per rollout),
each ``psi_i`` flattened and stored (at most ``naive_stored`` at once), and ``K`` from float64
chunked dot products. Docs and benchmark: ``docs/real_model_gram.md``,
``benchmarks/bench_gram.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from . import triton as gram_triton
from .capture import GramCapture
from .head import head_logprobs, head_transform
from .kernels import default_chunk_size
from .memory import default_memory_budget, pass_bytes_per_row, pass_fixed_bytes, plan_passes
from .model import (
    causal_lm_parts,
    forward_kwargs,
    fsdp_unsharded_roots,
    grads_kept,
    reentrant_checkpointing,
    token_logprobs,
    trainable_parameters,
)
from .naive import naive_gram
from .options import EngineOptions
from .state import validate_blocks

__all__ = ["trajectory_gram", "rows_gram"]

Method = Literal["exact", "naive"]


def _check_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    wname: str = "completion_mask",
) -> torch.Tensor:
    for name, x in (("input_ids", input_ids), ("attention_mask", attention_mask),
                    (wname, completion_mask)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(f"{name} must be shaped [R, T], got shape {tuple(x.shape)}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 2:
        raise ValueError(
            f"input_ids needs R >= 1 rows and T >= 2 tokens, got {tuple(input_ids.shape)}"
        )
    for name, x in (("attention_mask", attention_mask), (wname, completion_mask)):
        if x.shape != input_ids.shape:
            raise ValueError(
                f"{name} shape {tuple(x.shape)} differs from input_ids shape "
                f"{tuple(input_ids.shape)}"
            )
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    am = attention_mask
    if not bool(((am == 0) | (am == 1)).all()):
        raise ValueError("attention_mask must hold only 0 and 1")
    w = completion_mask.to(torch.float64)
    if not bool(torch.isfinite(w).all()):
        idx = tuple(int(i) for i in torch.nonzero(~torch.isfinite(w))[0])
        raise ValueError(f"{wname} contains a non-finite value at index {idx}")
    if bool((w[:, 0] != 0).any()):
        raise ValueError(
            f"{wname}[:, 0] must be 0: the first token has no conditional log-probability "
            "(put the weights on completion tokens, never on the first prompt token)"
        )
    if bool(((am == 0) & (w != 0)).any()):
        idx = tuple(int(i) for i in torch.nonzero((am == 0) & (w != 0))[0])
        raise ValueError(
            f"{wname} is non-zero on a padding token (attention_mask 0) at {idx}"
        )
    return w



def trajectory_gram(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    method: Method = "exact",
    return_logprobs: bool = False,
    position_ids: Any = "from_mask",
    naive_stored: int | None = None,
    engine: EngineOptions | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Gram matrix ``K_ij = <psi_i, psi_j>`` of the per-rollout trajectory scores.

    ``psi_i = grad_theta sum_t completion_mask[i,t] log pi(input_ids[i,t] | input_ids[i,<t])`` over
    every parameter with ``requires_grad=True`` (seed paper Eq. 18, weighted per token). The
    model is used as it is (call ``model.eval()`` first if it has dropout); its ``.grad``
    fields are not touched.

    Args:
        model: a causal LM returning ``.logits`` ``[R, T, V]`` (Hugging Face style).
        input_ids: ``[R, T]`` token ids, prompt + completion, right or left padded.
        attention_mask: ``[R, T]`` 1 for real tokens, 0 for padding.
        completion_mask: ``[R, T]`` per-token weights (0/1 or float); 0 on prompt and padding
            tokens; column 0 must be 0.
        method: ``"exact"`` (one batched forward + backward, per-layer identities) or ``"naive"``
            (``R`` backward passes and stored flat gradients; the reference).
        return_logprobs: also return the detached per-token log-probabilities ``[R, T]`` float64
            (column 0 is 0; unweighted).
        position_ids: ``"from_mask"`` (default: ``cumsum(attention_mask) - 1``), ``None`` (the
            model's default) or an ``[R, T]`` tensor.
        naive_stored: naive mode only: at most this many flat gradients ``psi_i`` held at once
            (default ``None``: all ``R``); fewer trade memory for recomputation, about
            ``R + R^2 / (2 naive_stored)`` single-rollout backward passes.
        engine: the engine's internal choices (:class:`~real_model.gram.options.EngineOptions`:
            defaults measured; for tests and benchmarks). ``chunk_size`` also bounds the naive
            mode's blocks.

    Returns:
        ``K`` float64 ``[R, R]`` on the device of ``input_ids`` (symmetric), or ``(K, logprobs)``.

    Raises:
        ValueError: malformed inputs, no trainable parameter, or a parameter the exact mode cannot
            attribute per rollout (the message names the module type); ``linear_method="triton"``
            on a non-CUDA device without ``TRITON_INTERPRET=1``.
        ImportError: ``linear_method="triton"`` (exact mode) without triton installed.
    """
    opts = engine if engine is not None else EngineOptions()
    _check_method(method, naive_stored)
    w = _check_inputs(input_ids, attention_mask, completion_mask)
    if method == "exact" and opts.linear_method == "triton":
        gram_triton.require(input_ids.device)  # before the forward: clear, early errors
    if not trainable_parameters(model):
        raise ValueError("model has no parameter with requires_grad=True: psi would be empty")
    if method == "exact":
        K, lp = _gram_pass(model, input_ids, attention_mask, w, position_ids, blocks=None,
                           opts=opts, temperature=1.0, all_logprobs=return_logprobs)
        return (K, lp) if return_logprobs else K
    chunk = (default_chunk_size(input_ids.device) if opts.chunk_size is None
             else int(opts.chunk_size))
    K, lp = naive_gram(model, input_ids, attention_mask, w, chunk, position_ids, naive_stored)
    K = _finite_symmetric(K)
    return (K, lp) if return_logprobs else K


def _check_method(method: str, naive_stored: int | None) -> None:
    if method not in ("exact", "naive"):
        raise ValueError(f"method must be 'exact' or 'naive', got {method!r}")
    if naive_stored is not None and int(naive_stored) < 1:
        raise ValueError(f"naive_stored must be a positive integer or None, got {naive_stored!r}")


def _finite_symmetric(K: torch.Tensor) -> torch.Tensor:
    """``(K + K^T) / 2``; ValueError if it holds a non-finite value (overflowed gradients)."""
    K = 0.5 * (K + K.T)
    if not bool(torch.isfinite(K).all()):
        raise ValueError("the Gram matrix holds non-finite values: the model's log-probabilities "
                         "or gradients overflowed (try float32 or float64)")
    return K


def rows_gram(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_weights: torch.Tensor,
    *,
    blocks: Sequence[Sequence[int]] | None = None,
    temperature: float = 1.0,
    position_ids: Any = "from_mask",
    memory_budget_bytes: int | None = None,
    return_logprobs: bool = False,
    engine: EngineOptions | None = None,
) -> Any:
    """Per-block Grams ``K_b = [<g_i, g_j>]_{i,j in b}`` of ``g_i = grad sum_t u_it log pi_it``.

    ``u = token_weights`` (any real per-token weights, e.g. a host's ``dL/d log p``), log-probs at
    ``temperature`` (``log softmax(z / T)``), over every trainable parameter; exact, by forward +
    backward passes inside a :class:`GramCapture`, each over as many whole blocks as
    ``memory_budget_bytes`` allows (``memory.pass_bytes_per_row`` per row, plus
    ``memory.pass_fixed_bytes``); the head runs in vocabulary tiles (no ``[rows, T, V]`` tensor).

    Args:
        model: a causal LM (Hugging Face style; PEFT-wrapped models work), used as it is (its
            mode, hence its dropout, is the caller's: see ``plan.active_dropout_modules``).
        input_ids, attention_mask: ``[R, T]``; token_weights: ``[R, T]`` real weights, 0 on
            padding and in column 0.
        blocks: row-index lists (e.g. the rows of each group); ``None``: the full ``[R, R]`` in
            one pass, whatever the budget.
        temperature: divides the logits (after logit scale and soft-cap).
        position_ids: ``"from_mask"`` (default), ``None`` (the model's default) or ``[R, T]``.
            With explicit positions, columns that are padding in every row of a pass are
            dropped (exact: padding is masked out).
        memory_budget_bytes: peak bytes for one pass (default ``memory.default_memory_budget``).
        return_logprobs: also return the detached log-probs ``[R, T]`` float64 (0 at column 0,
            outside the window of non-zero weights of each pass, and in rows of no block).
        engine: the engine's internal choices, as :func:`trajectory_gram`.

    Returns:
        ``K`` float64 ``[R, R]`` (``blocks=None``) or a list of ``[n_b, n_b]``; with
        ``return_logprobs``, ``(that, logprobs)``.
    """
    opts = engine if engine is not None else EngineOptions()
    w = _check_inputs(input_ids, attention_mask, token_weights, "token_weights")
    if not trainable_parameters(model):
        raise ValueError("model has no parameter with requires_grad=True: the rows are empty")
    if memory_budget_bytes is not None and int(memory_budget_bytes) < 1:
        raise ValueError(f"memory_budget_bytes must be positive, got {memory_budget_bytes!r}")
    R, T = input_ids.shape
    groups = validate_blocks(blocks, R) or [list(range(R))]
    budget = default_memory_budget(input_ids.device) if memory_budget_bytes is None else int(
        memory_budget_bytes)
    per_row = pass_bytes_per_row(model, T)
    max_rows = max(1, (budget - pass_fixed_bytes(opts.chunk_size, input_ids.device)) // per_row)
    passes = [[0]] if blocks is None else plan_passes([len(g) for g in groups], max_rows)
    Ks: list[torch.Tensor | None] = [None] * len(groups)
    lp_all = torch.zeros(R, T, dtype=torch.float64, device=input_ids.device)
    for pas in passes:
        rows = [r for b in pas for r in groups[b]]
        rel, k = [], 0
        for b in pas:
            rel.append(list(range(k, k + len(groups[b]))))
            k += len(groups[b])
        K_pass, lp = _rows_pass(model, input_ids, attention_mask, w, position_ids, rows, rel,
                                opts, float(temperature), return_logprobs)
        for b, Kb in zip(pas, K_pass, strict=True):
            Ks[b] = Kb
        lp_all[rows] = lp
    out = Ks[0] if blocks is None else Ks
    return (out, lp_all) if return_logprobs else out


def _rows_pass(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    pos: Any,
    rows: list[int],
    blocks: list[list[int]],
    opts: EngineOptions,
    temperature: float,
    all_logprobs: bool,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One exact pass over ``rows`` (``blocks`` relative to them); columns that are padding in
    every row are dropped when the positions are explicit (and the first kept column carries no
    weight); returns the block Grams and the log-probs ``[len(rows), T]``."""
    idx = torch.tensor(rows, dtype=torch.long, device=ids.device)
    ids_r, am_r, w_r = ids[idx], am[idx], w[idx]
    if isinstance(pos, torch.Tensor):
        pos_r = pos[idx]
    elif pos is not None:
        pos_r = (am_r.long().cumsum(-1) - 1).clamp(min=0)
    else:
        pos_r = None
    keep = am_r.bool().any(dim=0).nonzero().reshape(-1)
    if pos_r is None or keep.numel() < 2 or bool((w_r[:, keep[0]] != 0).any()):
        keep = torch.arange(ids.shape[1], device=ids.device)
    else:
        pos_r = pos_r[:, keep]
    Ks, lp = _gram_pass(model, ids_r[:, keep], am_r[:, keep], w_r[:, keep], pos_r,
                        blocks=blocks, opts=opts, temperature=temperature,
                        all_logprobs=all_logprobs)
    full = torch.zeros(len(rows), ids.shape[1], dtype=torch.float64, device=ids.device)
    full[:, keep] = lp
    return Ks, full


# --------------------------------------------------------------------------- the exact pass
def _weight_window(w: torch.Tensor, all_logprobs: bool) -> tuple[int, int]:
    """Columns ``[a, b)`` (``a >= 1``) holding every non-zero token weight (all if asked)."""
    T = w.shape[1]
    cols = (w != 0).any(dim=0).nonzero().reshape(-1)
    if all_logprobs or cols.numel() == 0:
        return 1, T
    return max(1, int(cols[0])), int(cols[-1]) + 1


def _pass_logprobs(model: nn.Module, ids: torch.Tensor, am: torch.Tensor, pos: Any,
                   window: tuple[int, int], cap: GramCapture, opts: EngineOptions,
                   temperature: float) -> torch.Tensor:
    """``log pi(ids[:, t] | ids[:, <t])`` for ``t`` in the window, ``[R, b - a]``, with graph.

    Hugging Face causal LMs: the backbone's last hidden state and the head in vocabulary tiles
    (:func:`head_logprobs`, the head's Gram added by the capture; no ``[R, T, V]`` tensor).
    Other models: their full logits (:func:`token_logprobs`).
    """
    a, b = window
    parts = causal_lm_parts(model)
    if parts is None:
        return token_logprobs(model, ids, am, position_ids=pos, temperature=temperature)[:, a:b]
    out = parts.backbone(input_ids=ids, **forward_kwargs(parts.backbone, am, pos))
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    lp, _ = head_logprobs(
        h[:, a - 1 : b - 1], parts.head.weight, parts.head.bias, ids[:, a:b],
        transform=head_transform(parts.lm, temperature), vocab_tile=opts.vocab_tile,
        capture=cap, param_grads=False,  # the pass wants dh and the Gram, never dW
    )
    return lp


def _gram_pass(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    pos: Any,
    *,
    blocks: Sequence[Sequence[int]] | None,
    opts: EngineOptions,
    temperature: float,
    all_logprobs: bool,
) -> tuple[Any, torch.Tensor]:
    """One forward + backward of ``L = sum_it w_it log pi(y_it)`` inside a :class:`GramCapture`.

    Returns ``(K or [K_b], logprobs [R, T] float64)`` (log-probs are 0 outside the window of
    non-zero weights unless ``all_logprobs``). A problem of the capture raises
    ``GramCaptureError`` after the backward has run to the end (never from inside it).
    The backward asks autograd only for what the capture needs
    (:meth:`GramCapture.grad_inputs`), so the batched weight gradients are never formed; under
    reentrant checkpointing (no ``autograd.grad``) it runs ``.backward()`` and restores
    ``.grad``.
    """
    # not strict: a problem is recorded and raised by ``cap.result()`` AFTER the backward, so
    # the forward and backward always run to the end; under FSDP every process then runs the
    # same collectives (all-gathers of the parameters) whatever failed on one of them
    window = _weight_window(w, all_logprobs)
    with fsdp_unsharded_roots(model):  # FSDP2: before the capture reads the parameters
        cap = GramCapture(model, blocks=blocks, engine=opts)
        with torch.enable_grad(), cap:
            lp = _pass_logprobs(model, ids, am, pos, window, cap, opts, temperature)
            loss = (lp * w[:, window[0] : window[1]].to(lp.dtype)).sum()
            if loss.requires_grad:
                if reentrant_checkpointing(model):
                    with grads_kept(model):
                        loss.backward()
                else:
                    torch.autograd.grad(loss, cap.grad_inputs(), allow_unused=True)
    full = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
    full[:, window[0] : window[1]] = lp.detach().to(torch.float64)
    return cap.result(), full
