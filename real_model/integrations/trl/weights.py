"""What TRL's loss is made of: hand-derived row weights, and the terms the rows do not hold.

:func:`trl_row_weights` derives by hand the weight ``c_i`` of each row in TRL's loss at ratio 1,
``beta = 0`` (``u_it = -c_i A_i m_it``; ``grpo_theory.aggregation``): the tests' independent
second route to the ``u`` the integration takes from TRL's own autograd.
:func:`structure_issues` names the terms of TRL's loss outside the log-probabilities (not in
the rows ``g_i``), :func:`structure_notes` the options worth a note in each record, and
:func:`active_dropout` the dropout a second pass leaves out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_theory.aggregation import aggregation_weights
from grpo_theory.conventions import TRL_LOSS_AGGREGATION  # loss_type -> (mode, normaliser scope)

__all__ = ["TRL_LOSS_AGGREGATION", "SUPPORTED_LOSS_TYPES", "trl_row_weights",
           "structure_issues", "structure_notes", "active_dropout", "entropy_bonus",
           "second_pass_only"]


SUPPORTED_LOSS_TYPES = tuple(TRL_LOSS_AGGREGATION)


def trl_row_weights(
    lengths: Any,
    chunk_index: Any,
    *,
    loss_type: str,
    num_chunks: int,
    gradient_accumulation_steps: int,
    num_processes: int,
    num_items_in_batch: float | None = None,
    max_completion_length: int | None = None,
    epsilon_high: float | None = None,
) -> np.ndarray:
    """Hand-derived row weights ``c_i`` of TRL's loss at ratio 1, ``beta = 0``.

    The optimizer's gradient (summed over ``gradient_accumulation_steps`` micro-batches, averaged
    over ``num_processes`` replicas) is then ``-sum c_i A_i psi_i``, i.e. TRL's per-token loss
    gradient is ``u[i,t] = -c_i A_i m_it``. ``B_c`` rows and ``N_c`` loss tokens in the
    micro-batch of row ``i``, ``GA`` accumulation steps, ``S`` chunks, ``W`` processes, ``N``
    loss tokens of the generation batch over all processes, ``L_i`` row ``i``'s loss tokens::

        grpo, sapo      c_i = 1 / (W GA B_c L_i)    aggregation "sequence_mean" of the micro-batch
        bnpo            c_i = 1 / (W GA N_c)        "token_mean" of the micro-batch
        dr_grpo         c_i = 1 / (W GA B_c Lmax)   "dr_grpo", Lmax = max_completion_length
        dapo, vespo     c_i = S / (GA N)            "token_mean" of the global generation batch
        cispo           c_i = min(1, eps_high) S / (GA N)
        luspo           c_i = 1 / (W GA B_c)        "sequence_sum" of the micro-batch

    Args:
        lengths: ``[B]`` loss tokens per local row.
        chunk_index: ``[B]`` micro-batch (``0 .. num_chunks-1``) that TRL put each row in.
        loss_type: one of :data:`SUPPORTED_LOSS_TYPES`.
        num_chunks: ``steps_per_generation``.
        gradient_accumulation_steps: TRL's ``current_gradient_accumulation_steps``.
        num_processes: data-parallel world size ``W``.
        num_items_in_batch: ``N`` (dapo, vespo, cispo).
        max_completion_length: ``Lmax`` of dr_grpo.
        epsilon_high: TRL's ``epsilon_high`` (cispo).

    Returns:
        ``[B]`` float64 weights ``c_i``.

    >>> trl_row_weights([2, 4], [0, 0], loss_type="grpo", num_chunks=1,
    ...                 gradient_accumulation_steps=1, num_processes=1).tolist()
    [0.25, 0.125]
    """
    L, k, (GA, W, S) = _check_row_weight_inputs(
        lengths, chunk_index, loss_type=loss_type,
        counts=(gradient_accumulation_steps, num_processes, num_chunks))
    mode, scope = TRL_LOSS_AGGREGATION[loss_type]
    if scope == "generation_batch":
        return _generation_batch_weights(L, loss_type=loss_type, S=S, GA=GA,
                                         num_items_in_batch=num_items_in_batch,
                                         epsilon_high=epsilon_high)
    return _micro_batch_weights(L, k, mode=mode, S=S, GA=GA, W=W,
                                max_completion_length=max_completion_length)


def _check_row_weight_inputs(
    lengths: Any, chunk_index: Any, *, loss_type: str, counts: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """Checked ``L`` ``[B]`` float64, ``k`` ``[B]``, ``(GA, W, S)`` of :func:`trl_row_weights`."""
    if loss_type not in TRL_LOSS_AGGREGATION:
        raise ValueError(
            f"loss_type {loss_type!r} is not supported; TRL 1.16 loss types handled: "
            f"{SUPPORTED_LOSS_TYPES}"
        )
    L = np.asarray(lengths, dtype=np.float64).reshape(-1)
    k = np.asarray(chunk_index).reshape(-1)
    if L.shape != k.shape:
        raise ValueError(f"lengths {L.shape} and chunk_index {k.shape} must have the same shape")
    GA, W, S = (int(x) for x in counts)
    if min(GA, W, S) < 1:
        raise ValueError("num_chunks, gradient_accumulation_steps, num_processes must be >= 1")
    if k.size and (k.min() < 0 or k.max() >= S):
        raise ValueError(f"chunk_index must lie in [0, {S}), got {k.min()}..{k.max()}")
    return L, k, (GA, W, S)


def _generation_batch_weights(L: np.ndarray, *, loss_type: str, S: int, GA: int,
                              num_items_in_batch: float | None,
                              epsilon_high: float | None) -> np.ndarray:
    """``c_i = S / (GA N)`` (dapo, vespo), times ``min(1, eps_high)`` for cispo: ``[B]`` float64."""
    c = np.zeros_like(L)
    if num_items_in_batch is None or not num_items_in_batch > 0:
        if num_items_in_batch is not None and L.sum() == 0:
            return c
        raise ValueError(f"loss_type {loss_type!r} needs num_items_in_batch > 0")
    c[:] = S / (GA * float(num_items_in_batch))
    if loss_type == "cispo":
        eh = 1.0 if epsilon_high is None else float(epsilon_high)
        c *= min(1.0, eh)
    return c


def _micro_batch_weights(L: np.ndarray, k: np.ndarray, *, mode: str, S: int, GA: int, W: int,
                         max_completion_length: int | None) -> np.ndarray:
    """``c_i = w_i / (GA W)`` with ``w`` the aggregation weights of row ``i``'s micro-batch
    (``aggregation_weights`` over the rows ``k == j``): ``[B]`` float64."""
    c = np.zeros_like(L)
    for j in range(S):
        rows = np.nonzero(k == j)[0]
        if rows.size == 0:
            continue
        Lc = L[rows][None, :]
        if mode == "token_mean" and Lc.sum() == 0:
            continue  # TRL clamps the normaliser at 1; every term is 0 anyway
        mt = None
        if mode == "dr_grpo":
            if max_completion_length is None:
                raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
            mt = int(max_completion_length)
        c[rows] = aggregation_weights(Lc, mode=mode, max_tokens=mt)[0] / (GA * W)
    return c


def structure_issues(args: Any, *, aux_loss: bool = False, multimodal: bool = False) -> list[str]:
    """Terms of TRL's loss that are NOT in the rows ``g_i = sum_t u_it grad log pi_it``.

    With none of them, the rows sum to TRL's gradient exactly (any loss type and option).

    Args:
        args: the trainer's ``GRPOConfig`` (any object with its attributes).
        aux_loss: the trainer adds a MoE router auxiliary loss.
        multimodal: the batch carries image inputs (the second pass scores text only).
    """
    out = []
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    if float(g("entropy_coef", 0.0) or 0.0) != 0.0 or g("use_adaptive_entropy", False):
        out.append("the entropy bonus adds a gradient outside the log-probabilities; the rows "
                   "are those of the policy term only")
    if aux_loss:
        out.append("the MoE router auxiliary loss adds a gradient outside the log-probabilities")
    if multimodal:
        out.append("image inputs: the geometry pass scores text-only models")
    return out


def structure_notes(args: Any) -> list[str]:
    """Options that leave the rows exact but are worth knowing (JSONL ``notes``)."""
    out = []
    if int(getattr(args, "num_iterations", 1) or 1) > 1:
        out.append(f"num_iterations={args.num_iterations}: every inner step is measured at its "
                   "own weights (TRL's clipped, importance-weighted loss)")
    spg = getattr(args, "steps_per_generation", None)
    ga = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    if spg is not None and int(spg) > ga:
        out.append(f"steps_per_generation={spg} > gradient_accumulation_steps={ga}: a group's "
                   "rows are spread over optimizer steps; each step measures the rows present")
    if getattr(args, "bf16", False) or getattr(args, "fp16", False):
        out.append("mixed-precision autocast: TRL's gradient is of the autocast forward, the "
                   "Grams of the model's own precision (they agree to that precision only)")
    return out


def active_dropout(model: Any) -> list[str]:
    """Names of the dropout that is active when ``model`` trains (modules and config fields).

    Modules: every ``torch.nn`` dropout module with ``p > 0`` (PEFT's ``lora_dropout`` included).
    Config: every float field of ``model.config`` (and its text config) whose name contains
    ``dropout``, ``pdrop`` or ``jitter`` and is ``> 0`` (HF attention / hidden dropout, MoE router
    jitter, applied functionally in train mode).
    """
    from torch import nn

    drop = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)
    out = [f"{name} (p={mod.p})" for name, mod in model.named_modules()
           if isinstance(mod, drop) and float(mod.p) > 0]
    cfgs = []
    cfg = getattr(model, "config", None)
    if cfg is not None:
        cfgs.append(cfg)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else None
        if text is not None and text is not cfg:
            cfgs.append(text)
    for c in cfgs:
        for key, val in sorted(vars(c).items()):
            low = key.lower()
            if (any(s in low for s in ("dropout", "pdrop", "jitter"))
                    and isinstance(val, float) and val > 0):
                out.append(f"config.{key}={val}")
    return out


def entropy_bonus(args: Any) -> bool:
    """TRL's loss has an entropy bonus (a gradient outside the log-probabilities)."""
    return (float(getattr(args, "entropy_coef", 0.0) or 0.0) != 0.0
            or bool(getattr(args, "use_adaptive_entropy", False)))


def second_pass_only(issue: str) -> bool:
    """An issue of the second pass only: in-run rows are TRL's own (its dropout masks, its
    entropy bonus)."""
    return issue.startswith(("dropout is active", "the entropy bonus"))
