"""Exact per-rollout gradient geometry inside TRL's ``GRPOTrainer`` (TRL 1.16), from TRL's own loss.

For every optimizer step that is due (``geometry_every``), the geometry is measured at the current
weights (before the step's update) on the micro-batches of THAT step, as TRL buffered them:

* **Per-token loss gradient from TRL's own autograd.** For each micro-batch of the step, the
  per-token log-probabilities are made a leaf ``x`` (TRL's ``_get_per_token_logps_and_entropies``
  returns it for the call, with TRL's real entropies detached), TRL's own ``compute_loss`` runs on
  the micro-batch, and ``u[i,t] = dL/dx[i,t]`` by ``autograd.grad``. Summed over the step's
  micro-batches (a row used twice, e.g. ``num_iterations > 1`` inside one optimizer step, counts
  twice), the rows' gradients

      g_i = sum_t u[i,t] grad_theta log pi_theta(y_it | y_i,<t)

  sum to TRL's gradient of the step (before DDP's average) for every ``loss_type``, ``beta > 0``,
  the vLLM importance-sampling correction, entropy masks, ``delta``, off-policy masks, any inner
  step of ``num_iterations > 1`` and any ``steps_per_generation``, with no hand-derived
  normaliser. Terms of TRL's loss that do not go through the log-probabilities (the entropy bonus,
  a MoE router auxiliary loss) are not in the rows: listed by :func:`structure_issues`.
* **Second pass.** ``<g_i, g_j>`` (the gradient-row Gram ``Kg``) and the score Gram
  ``K_ij = <psi_i, psi_j>``, ``psi_i = grad sum_t m_it log pi_it`` (unit weights on TRL's loss
  mask ``m``; seed paper Eq. 18) come from one exact forward + backward of the rows
  (:func:`real_model.gram.trajectory_gram` with per-token weights ``u``, resp. ``m``; TRL's
  temperature; TRL's position ids); when every row's ``u`` is a multiple ``a_i m_i`` of its mask
  (the on-policy steps of every loss type with ``beta = 0``), one pass gives both,
  ``Kg = diag(a) K diag(a)``. The pass runs the model without dropout (eval mode); active dropout
  is named in the record (:func:`active_dropout`).
* **Metrics** per group (``R = num_generations`` consecutive rows of TRL's global generation
  batch): :func:`real_model.geometry_metrics.group_records` (spectra of the rows ``g_i`` from
  ``Kg``; score geometry, ``cos(S, F)`` and FADE masses from ``K``), aggregated over the step's
  mixed groups (mean, sd, min, max, count) into TRL's log (``geometry/...``) and one JSON line
  per step (``geometry.jsonl``, main process). With one process and the full Gram
  (``grad_norm=True``), ``geometry/grad_norm = sqrt(sum_ij Kg_ij)`` equals TRL's logged
  pre-clipping ``grad_norm``.

Groups whose rows live on several processes are measured on the process holding their first row
(the other rows are sent to it); groups split over optimizer steps (``steps_per_generation >
gradient_accumulation_steps``) are measured on the rows present in the step (``rows_present <
R`` in the record). Any failure inside the geometry is caught on every process, all processes
agree to skip that step's geometry (``geometry/skipped_reason``), and training goes on
(``strict=True`` raises instead, on every process).

Settings: :class:`GeometryConfig`, or the ``geometry_*`` fields of :class:`GeometryGRPOConfig` (a
``trl.GRPOConfig``: TrlParser, YAML, CLI, checkpoints). :class:`GeometryMixin` composes with any
``GRPOTrainer`` subclass; :class:`GeometryGRPOTrainer` is ``GeometryMixin + trl.GRPOTrainer``.
:func:`measure_rows` is the measuring step on plain tensors (no TRL). Docs: ``docs/trl.md``.

The hand-derived row weights of :func:`trl_row_weights` (``grpo_theory.aggregation``) are the
independent second route of the tests at ratio 1 (``beta = 0``): ``u[i,t] = -c_i A_i m_it``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from grpo_theory.aggregation import aggregation_weights
from grpo_theory.conventions import TRL_LOSS_AGGREGATION  # loss_type -> (mode, normaliser scope)
from grpo_theory.spectral import DEFAULT_RTOL

from .geometry_metrics import aggregate_groups, cos_success_failure, group_records

__all__ = [
    "GeometryConfig",
    "GEOMETRY_FIELDS",
    "GEOMETRY_MODES",
    "whole_groups_in_chunk",
    "group_permutation",
    "TRL_LOSS_AGGREGATION",
    "SUPPORTED_LOSS_TYPES",
    "trl_row_weights",
    "structure_issues",
    "structure_notes",
    "active_dropout",
    "GeometryRows",
    "RowsMeasurement",
    "measure_rows",
    "second_pass_shape",
    "group_records",
    "aggregate_groups",
    "cos_success_failure",
    "GeometryMixin",
    "GeometryGRPOConfig",  # noqa: F822 (built lazily by __getattr__: no trl import here)
    "GeometryGRPOTrainer",  # noqa: F822 (built lazily by __getattr__: no trl import here)
    "TemperatureScaled",
]

SUPPORTED_LOSS_TYPES = tuple(TRL_LOSS_AGGREGATION)

# relative tolerance of "u_i is a multiple of the loss mask m_i" (one Gram pass instead of two)
PROPORTIONAL_RTOL = 1e-9

#: Start of the reason given when FSDP2 processes would run different second-pass forwards.
FSDP2_UNEVEN = "FSDP2: the processes would run different second-pass forwards"

#: ``geometry_mode`` values (see :class:`GeometryConfig`).
GEOMETRY_MODES = ("second_pass", "in_run", "auto")


@dataclass(frozen=True)
class GeometryConfig:
    """Options of the in-training geometry (defaults stated).

    Attributes:
        geometry_every: measure at optimizer steps ``0, k, 2k, ...`` (default 1: every step;
            0: off, nothing is hooked).
        jsonl_path: JSONL file of per-step records (default ``<output_dir>/geometry.jsonl``).
        gram_method: ``"exact"`` (default) or ``"naive"`` (:func:`trajectory_gram`).
        rtol: numerical-rank tolerance (default ``1e-6``).
        success_threshold: a rollout is a success when its reward ``> success_threshold``
            (default 0.5; binary rewards).
        log_prefix: prefix of the logged metric names (default ``"geometry/"``).
        keep_groups: write per-group records (weights, norms, singular values) to the JSONL
            (default True).
        strict: raise instead of skipping the step's geometry on any failure, on active
            dropout, or when TRL's loss has terms outside the log-probabilities (default False).
        grad_norm: form the Gram over all of a process's rows in one pass (cross-group terms
            included), so that ``sqrt(sum_ij Kg_ij)`` is the process's gradient norm (default
            True); False forms the groups' diagonal blocks only, in as many passes as
            ``memory_budget_mb`` allows (no ``grad_norm``).
        memory_budget_mb: memory budget of one Gram pass in MiB, whole groups per pass (needs
            ``grad_norm=False``; default None: the engine's default budget).
        mode: where the Gram of the rows ``g_i`` comes from (default ``"second_pass"``):
            ``"second_pass"``: one extra forward + backward over the step's rows (``K`` and
            ``Kg`` of every group, ``grad_norm``); ``"in_run"``: captured from TRL's own forward
            and backward of each micro-batch (:class:`real_model.gram_capture.GramCapture`), for
            the groups whose rows are all in one micro-batch on one process (the others are
            recorded as skipped); ``"auto"``: in-run where possible, the second pass for the other
            groups. In-run gives ``Kg`` (the gradient matrix), and ``K`` only where every row's
            ``u_i`` is a nonzero multiple of its loss mask; no ``grad_norm``. The default keeps
            the score Gram ``K`` of every group and the gradient norm; ``auto`` costs a few
            percent of a step instead of a second pass.
        score_every: with ``mode`` ``"in_run"`` / ``"auto"``, every k-th measured step runs
            the second pass instead (``K`` of every group, zero-weight rows included; default 0:
            never).
        group_order: opt-in: TRL's shuffle of the generation batch before its split into
            micro-batches permutes whole groups instead of rows (:func:`group_permutation`), so
            every group is in one micro-batch when the micro-batch size is a multiple of
            ``num_generations`` (default False: TRL's own row shuffle). It changes TRL's
            gradient of a step where the loss depends on which rows share a micro-batch
            (``bnpo``, ``top_entropy_quantile < 1``, the entropy bonus) or, with
            ``steps_per_generation > gradient_accumulation_steps``, which rows an optimizer step
            holds (every loss type); see ``docs/trl.md``.
        weight_grads: in-run only: who forms each Linear's weight gradient in TRL's backward
            (:class:`real_model.gram_capture.GramCapture`): ``"rows"`` (default) the capture,
            as the sum of the per-row gradients its Gram needs anyway (no second product; TRL's
            gradient equal up to float rounding, ~1e-7 relative in float32), or ``"host"``:
            TRL's own backward (gradient bit-identical with the geometry off; the Linear Grams
            then cost one more product per layer).
        batch_small_calls: in-run only: the terms of small module calls (a few tokens x narrow
            layers, ``real_model.gram_capture.SMALL_CALL_ELEMENTS``; a Linear call also when its
            token kernels cost less than its per-row gradients, ``SMALL_CALL_KERNEL_RATIO``) are
            added together after the micro-batch's backward, batched (a batched Linear keeps
            TRL's own ``dW``); ``False``: each call adds its own in the backward (default True).
    """

    geometry_every: int = 1
    jsonl_path: str | None = None
    gram_method: str = "exact"
    rtol: float = DEFAULT_RTOL
    success_threshold: float = 0.5
    log_prefix: str = "geometry/"
    keep_groups: bool = True
    strict: bool = False
    grad_norm: bool = True
    memory_budget_mb: float | None = None
    mode: str = "second_pass"
    score_every: int = 0
    group_order: bool = False
    weight_grads: str = "rows"
    batch_small_calls: bool = True

    def __post_init__(self) -> None:
        from .gram_capture import WEIGHT_GRADS  # torch only when a config is made

        if self.weight_grads not in WEIGHT_GRADS:
            raise ValueError(f"weight_grads must be one of {WEIGHT_GRADS}, got "
                             f"{self.weight_grads!r}")
        if self.mode not in GEOMETRY_MODES:
            raise ValueError(f"geometry mode must be one of {GEOMETRY_MODES}, got {self.mode!r}")
        if int(self.score_every) < 0:
            raise ValueError(f"score_every must be >= 0 (0: never), got {self.score_every}")
        if int(self.geometry_every) < 0:
            raise ValueError(f"geometry_every must be >= 0 (0: off), got {self.geometry_every}")
        if self.gram_method not in ("exact", "naive"):
            raise ValueError(f"gram_method must be 'exact' or 'naive', got {self.gram_method!r}")
        if not self.rtol > 0:
            raise ValueError(f"rtol must be > 0, got {self.rtol}")
        if self.memory_budget_mb is not None:
            if not self.memory_budget_mb > 0:
                raise ValueError(f"memory_budget_mb must be > 0, got {self.memory_budget_mb}")
            if self.grad_norm:
                raise ValueError("memory_budget_mb splits the Gram pass by groups: it needs "
                                 "grad_norm=False (the gradient norm needs one full pass)")


def _geometry_field_name(attr: str) -> str:
    return attr if attr.startswith("geometry_") else f"geometry_{attr}"


#: ``GeometryGRPOConfig`` field -> :class:`GeometryConfig` attribute.
GEOMETRY_FIELDS: dict[str, str] = {_geometry_field_name(f.name): f.name
                                   for f in fields(GeometryConfig)}

_FIELD_HELP = {
    "geometry_every": "Measure the exact gradient geometry every k optimizer steps (0: off).",
    "jsonl_path": "JSONL file of per-step geometry records (default <output_dir>/geometry.jsonl).",
    "gram_method": "Gram engine: 'exact' (one forward + backward) or 'naive' (per row).",
    "rtol": "Numerical-rank tolerance of the geometry's spectra.",
    "success_threshold": "A rollout is a success when its reward exceeds this.",
    "log_prefix": "Prefix of the geometry metrics in TRL's log.",
    "keep_groups": "Write per-group records to the geometry JSONL.",
    "strict": "Raise instead of skipping the step's geometry on any failure or inexact option.",
    "grad_norm": "Form the full Gram over a process's rows in one pass (gives the gradient norm).",
    "memory_budget_mb": "Memory budget of one geometry Gram pass in MiB (needs "
                        "geometry_grad_norm=False; passes hold whole groups).",
    "mode": "Gram of the rows from: 'second_pass' (an extra forward + backward), 'in_run' "
            "(TRL's own backward; groups whole in one micro-batch), 'auto' (in-run, else "
            "second pass).",
    "score_every": "With geometry_mode in_run/auto: every k-th measured step runs the second "
                   "pass (score Gram of every row; 0: never).",
    "group_order": "Opt-in: shuffle whole groups (not rows) before TRL splits the generation "
                   "batch into micro-batches (changes bnpo's and entropy-based losses' gradient).",
    "weight_grads": "In-run: 'rows' (each Linear's weight gradient as the sum of the per-row "
                    "gradients; equal to TRL's up to float rounding) or 'host' (TRL's own, "
                    "bit-identical; slower).",
    "batch_small_calls": "In-run: add the terms of small module calls (few tokens, narrow "
                         "layers) together after the backward, batched (True) or one by one.",
}


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


# --------------------------------------------------------------------------------------------
# The measuring step on plain tensors (no TRL)


@dataclass
class GeometryRows:
    """The rows of one host step to measure (torch tensors ``[n, T]``, numpy ``[n]``).

    ``weights[i, t]`` is the host's loss gradient ``u`` of token ``t`` of row ``i`` (the weight of
    ``log pi(input_ids[i,t] | input_ids[i,<t])``), ``loss_mask`` the 0/1 loss mask on the same
    positions (score geometry); both 0 on the prompt and on padding. ``local[i]``: the row is in
    this process's gradient (a row sent by another process is measured here but not local).
    """

    input_ids: Any
    attention_mask: Any
    position_ids: Any
    loss_mask: Any
    weights: Any
    rewards: np.ndarray
    advantages: np.ndarray
    group: np.ndarray
    local: np.ndarray
    row: np.ndarray


@dataclass
class RowsMeasurement:
    """What :func:`measure_rows` returns.

    ``groups``: one record per group (``group_records`` fields, ``group``, ``rows``,
    ``rows_present``); ``grams`` / ``row_grams``: ``{group: K}`` and ``{group: Kg}``;
    ``local_grad_sq``: ``||sum_{local i} g_i||^2`` (None without the full Gram);
    ``passes``: Gram passes run; ``proportional``: ``u_i = a_i m_i`` for every row.
    """

    groups: list[dict[str, Any]] = field(default_factory=list)
    grams: dict[int, np.ndarray] = field(default_factory=dict)
    row_grams: dict[int, np.ndarray] = field(default_factory=dict)
    local_grad_sq: float | None = None
    passes: int = 0
    proportional: bool = True


def _row_multiples(weights: Any, mask: Any) -> tuple[np.ndarray, bool]:
    """``a_i`` with ``weights_i = a_i mask_i`` per row, and whether that holds to rounding."""
    import torch

    w = weights.double()
    m = mask.double()
    n_tok = m.sum(dim=1).clamp(min=1.0)
    a = (w * m).sum(dim=1) / n_tok
    resid = (w - a[:, None] * m).abs().max() if w.numel() else torch.tensor(0.0)
    scale = float(w.abs().max()) if w.numel() else 0.0
    return a.cpu().numpy(), bool(float(resid) <= PROPORTIONAL_RTOL * max(scale, 1e-300))


def _gram_pass(model: Any, rows: GeometryRows, weights: Any, sel: np.ndarray,
               blocks: list[list[int]] | None, *, temperature: float,
               config: GeometryConfig) -> list[np.ndarray]:
    """Grams of the rows ``sel`` with per-token ``weights``: the full ``[n, n]`` (``blocks``
    None, one pass) or one matrix per block (positions in ``sel``), float64 numpy.

    ``gram_method="exact"``: :func:`real_model.gram.rows_gram` (log-probs in vocabulary tiles,
    whole blocks per pass within ``memory_budget_mb``); ``"naive"``: the per-row reference of
    :func:`real_model.gram.trajectory_gram`.
    """
    import torch

    from .gram import model_device, rows_gram, trajectory_gram

    # the rows are kept on the CPU (gathered across processes); the pass runs on the model's
    # device
    dev = model_device(model)
    idx = torch.as_tensor(sel, dtype=torch.long, device=rows.input_ids.device)
    ids, am = rows.input_ids[idx].to(dev), rows.attention_mask[idx].to(dev)
    pos, w = rows.position_ids[idx].to(dev), weights[idx].to(dev, torch.float64)
    if config.gram_method == "naive":
        net = model if temperature == 1.0 else TemperatureScaled(model, temperature)
        K = trajectory_gram(net, ids, am, w, method="naive", position_ids=pos)
        K = K.detach().cpu().double().numpy()
        return [K] if blocks is None else [K[np.ix_(b, b)] for b in blocks]
    budget = (None if config.memory_budget_mb is None
              else int(config.memory_budget_mb * 2**20))
    out = rows_gram(model, ids, am, w, blocks=blocks, temperature=temperature,
                    position_ids=pos, memory_budget_bytes=budget)
    mats = [out] if blocks is None else list(out)
    return [m.detach().cpu().double().numpy() for m in mats]


def measure_rows(
    model: Any,
    rows: GeometryRows,
    *,
    config: GeometryConfig,
    temperature: float = 1.0,
    group_size: int,
) -> RowsMeasurement:
    """Grams and per-group records of the rows of one host step (seed paper Eq. 18, Sec. 7.1).

    A group (rows with the same ``rows.group``) is measured when any of its rows has a nonzero
    weight; its rows with an empty loss mask (``psi_i = 0 = g_i``) are left out of its Grams.
    ``K`` uses ``loss_mask`` as token weights, ``Kg`` the host's ``weights``; when every row's
    weights are a multiple ``a_i`` of its mask, ``Kg = diag(a) K diag(a)`` from one pass. With
    ``config.grad_norm`` the Grams span all rows (one pass; ``local_grad_sq`` from the cross-group
    terms), else only the groups' diagonal blocks (passes within ``memory_budget_mb``).

    Args:
        model: the host's (unwrapped) model; measured in its current mode (pass eval).
        rows: :class:`GeometryRows`.
        config: :class:`GeometryConfig` (``gram_method``, ``rtol``, ``success_threshold``,
            ``grad_norm``, ``memory_budget_mb``).
        temperature: the host's sampling temperature (log-probs of ``logits / T``).
        group_size: ``R``, rows per complete group.
    """
    out = RowsMeasurement()
    L = rows.loss_mask.sum(dim=1).cpu().numpy()
    active, sel, blocks = _rows_with_gradient(rows)
    full = bool(config.grad_norm)
    kw = {"temperature": temperature, "config": config}
    if sel.size:
        a, prop = _row_multiples(rows.weights[sel], rows.loss_mask[sel])
        out.proportional = prop
        Ks = _gram_pass(model, rows, rows.loss_mask, sel, None if full else blocks, **kw)
        out.passes = 1
        if prop:
            Kgs = [a[b][:, None] * K * a[b][None, :]
                   for K, b in zip(Ks, [list(range(sel.size))] if full else blocks, strict=True)]
        else:
            Kgs = _gram_pass(model, rows, rows.weights, sel, None if full else blocks, **kw)
            out.passes = 2
        if full:
            loc = rows.local[sel]
            out.local_grad_sq = float(max(Kgs[0][np.ix_(loc, loc)].sum(), 0.0))
            Ks = [Ks[0][np.ix_(b, b)] for b in blocks]
            Kgs = [Kgs[0][np.ix_(b, b)] for b in blocks]
    elif full:
        out.local_grad_sq = 0.0  # no row with a nonzero weight: the gradient is 0
    grams = dict(zip(active, zip(Ks, Kgs, blocks, strict=True), strict=True)) if sel.size else {}
    for g in np.unique(rows.group):
        mine = np.nonzero(rows.group == g)[0]
        rec = _group_record(rows, mine, L, group_size=group_size, config=config)
        rec["has_gradient"] = int(g) in grams
        if int(g) in grams:
            Kb, Kgb, b = grams[int(g)]
            rec.update(_measured_fields(rows, sel[b], Kb, Kgb, a[b] if out.proportional else None,
                                        config=config))
            out.grams[int(g)], out.row_grams[int(g)] = Kb, Kgb
        out.groups.append(rec)
    return out


def _rows_with_gradient(rows: GeometryRows) -> tuple[list[int], np.ndarray, list[list[int]]]:
    """The groups with a nonzero weight (``active``), their rows with a nonempty loss mask
    (``sel``), and each active group's positions in ``sel`` (``blocks``)."""
    L = rows.loss_mask.sum(dim=1).cpu().numpy()
    wmax = rows.weights.abs().amax(dim=1).cpu().numpy()
    active = sorted({int(g) for g in np.unique(rows.group) if np.any(wmax[rows.group == g] > 0)})
    sel = np.nonzero(np.isin(rows.group, active) & (L > 0))[0]
    blocks = [np.nonzero(rows.group[sel] == g)[0].tolist() for g in active]
    return active, sel, blocks


def second_pass_shape(rows: GeometryRows | None, *, grad_norm: bool) -> tuple[int, int] | None:
    """What decides how many forwards :func:`measure_rows` runs with one group per pass: the
    number of Gram passes over the rows (0, 1 or 2) and the number of forwards per pass (one per
    group with a gradient; 1 when ``grad_norm`` forms the full Gram). ``None`` for no rows.

    Under FSDP2 with several processes every forward is collective: the processes compare these
    before the second pass and run it only when all agree (else every process skips the step).
    """
    if rows is None:
        return None
    _, sel, blocks = _rows_with_gradient(rows)
    if not sel.size:
        return (0, 0)
    _, prop = _row_multiples(rows.weights[sel], rows.loss_mask[sel])
    return (1 if prop else 2, 1 if grad_norm else len(blocks))


def _group_record(rows: GeometryRows, mine: np.ndarray, L: np.ndarray, *, group_size: int,
                  config: GeometryConfig) -> dict[str, Any]:
    """The fields of a group that need no Gram (rewards, lengths, advantages, rows present)."""
    r = rows.rewards[mine]
    succ = r > config.success_threshold
    return {
        "group": int(rows.group[mine[0]]),
        "R": int(group_size),
        "rows_present": int(mine.size),
        "rows": [int(x) for x in rows.row[mine]],
        "mixed": bool(succ.any() and not succ.all()),
        "num_success": int(succ.sum()),
        "rewards": [None if not math.isfinite(x) else float(x) for x in r],
        "lengths": [int(x) for x in L[mine]],
        "advantages": [float(x) for x in rows.advantages[mine]],
    }


def _measured_fields(rows: GeometryRows, idx: np.ndarray, K: np.ndarray, Kg: np.ndarray,
                     a: np.ndarray | None, *, config: GeometryConfig) -> dict[str, Any]:
    """Metrics of one measured group (its rows ``idx`` with a nonempty loss mask)."""
    L = rows.loss_mask[idx].sum(dim=1).cpu().numpy()
    r = np.nan_to_num(rows.rewards[idx], nan=-np.inf)
    rec = group_records(K, r, rows.advantages[idx], None, L, rtol=config.rtol,
                        success_threshold=config.success_threshold, row_gram=Kg)
    keep = ("norms", "common_share", "top_eig_share", "cos_within_success",
            "cos_within_failure", "cos_between", "cos_SF", "score_norm_mean",
            "score_norm_success", "score_norm_failure", "m_S", "m_F", "grad_norm",
            "singular_values", "rank", "effective_rank", "entropy_effective_rank",
            "stable_rank", "top1_fraction", "degenerate")
    out = {k: rec[k] for k in keep if k in rec}
    out["measured_rows"] = [int(x) for x in rows.row[idx]]
    out["row_grad_norms"] = [float(math.sqrt(max(x, 0.0))) for x in np.diag(Kg)]
    out["max_rank"] = int(np.count_nonzero(np.diag(Kg) > 0))
    if a is not None:  # u_i = a_i m_i: G = diag(w) Psi with w = -a (TRL's c_i A_i at ratio 1)
        out["weights"] = [float(-x) for x in a]
    return out


# --------------------------------------------------------------------------------------------
# TRL adapter


def _torch_module_base() -> Any:
    import torch

    return torch.nn.Module


class TemperatureScaled(_torch_module_base()):  # type: ignore[misc]
    """``model`` whose logits are divided by ``temperature`` (TRL scores ``log softmax(z / T)``).

    The division is outside every submodule, so :func:`trajectory_gram`'s per-module hooks see
    the same modules and parameters; autograd carries the ``1/T`` into their output gradients.
    """

    def __init__(self, model: Any, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.temperature = float(temperature)

    def forward(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None,
                use_cache: bool | None = None) -> Any:
        from types import SimpleNamespace

        kw = {"attention_mask": attention_mask, "use_cache": False}
        if position_ids is not None:
            kw["position_ids"] = position_ids
        out = self.model(input_ids=input_ids, **kw)
        logits = out.logits if hasattr(out, "logits") else out[0]
        return SimpleNamespace(logits=logits / self.temperature)


def settings_from_args(args: Any) -> GeometryConfig:
    """:class:`GeometryConfig` from the ``geometry_*`` fields of ``args`` (defaults if absent)."""
    kw = {attr: getattr(args, name) for name, attr in GEOMETRY_FIELDS.items()
          if hasattr(args, name)}
    return GeometryConfig(**kw)


class GeometryMixin:
    """Mix into any ``trl.GRPOTrainer`` (subclass) to measure the exact gradient geometry.

    ``class MyTrainer(GeometryMixin, MyGRPOTrainer): ...``. Settings come from the trainer's
    ``args`` when it is a :class:`GeometryGRPOConfig` (``geometry_*`` fields), else from the
    ``geometry=`` keyword (:class:`GeometryConfig`), else the defaults. Hooks (each calls the
    parent unchanged): ``_calculate_rewards`` (TRL's gathered rewards), ``_generate_and_score_
    completions`` (tags each row of the generation batch), ``_prepare_inputs`` (measures at the
    first micro-step of a due optimizer step, and where a new generation batch starts inside it),
    ``log`` (adds ``geometry/skipped_reason``).
    """

    def __init__(self, *args: Any, geometry: GeometryConfig | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = geometry if geometry is not None else settings_from_args(self.args)
        self.geometry_meter = TrlGeometryMeter(self, cfg)

    @property
    def geometry(self) -> GeometryConfig:
        return self.geometry_meter.config

    @property
    def geometry_records(self) -> list[dict[str, Any]]:
        return self.geometry_meter.records

    @property
    def geometry_last(self) -> dict[str, Any] | None:
        return self.geometry_meter.last

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.geometry_meter.rewards = out
        return out

    def _generate_and_score_completions(self, inputs):
        return self.geometry_meter.on_generation(super()._generate_and_score_completions(inputs))

    def _prepare_inputs(self, generation_batch):
        if self.geometry.group_order and self.model.training:
            with _group_shuffle(self):
                inputs = super()._prepare_inputs(generation_batch)
        else:
            inputs = super()._prepare_inputs(generation_batch)
        self.geometry_meter.on_micro_step()
        return inputs

    def training_step(self, model, inputs, num_items_in_batch=None):
        completed = False
        try:
            out = super().training_step(model, inputs, num_items_in_batch)
            completed = True
            return out
        finally:
            self.geometry_meter.after_micro_step(completed=completed)

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        self.geometry_meter.add_log_fields(logs)
        super().log(logs, start_time)


@dataclass
class _Generation:
    """One local generation batch of TRL (rows in TRL's group order) and its chunks."""

    index: int
    batch: dict[str, Any]
    rewards: np.ndarray
    advantages: np.ndarray
    first_row: int
    group_offset: int
    chunk_rows: list[np.ndarray] = field(default_factory=list)


@dataclass
class _StepState:
    """The optimizer step being measured: its segments (rows and ``u``) and any failure."""

    step: int
    t0: float
    segments: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    mode: str = "second_pass"  # this step's geometry_mode
    # in-run: (generation, chunk) -> {group: positions in the chunk} of whole groups
    inrun: dict[tuple[int, int], dict[int, list[int]]] = field(default_factory=dict)
    micro: list[_InRunMicro] = field(default_factory=list)
    finish_at: int | None = None  # micro-step after whose backward the step is measured
    spent: float = 0.0  # in-run modes: seconds of geometry work outside TRL's own step


class TrlGeometryMeter:
    """State and steps of the in-training geometry of one trainer (see :class:`GeometryMixin`).

    Per due optimizer step: at its first micro-step, and where a new generation batch starts
    inside it, the per-token loss gradient ``u`` of the micro-steps to come on the current batch
    (a *segment*) is taken from TRL's own loss; at the step's last segment one Gram pass over
    all the step's rows (the weights do not change inside an optimizer step) gives the records.
    """

    def __init__(self, trainer: Any, config: GeometryConfig) -> None:
        self.trainer = trainer
        self.config = config
        self.records: list[dict[str, Any]] = []
        self.last: dict[str, Any] | None = None
        self.rewards: Any = None
        self._gen: _Generation | None = None
        self._gen_count = 0
        self._new_gen = False
        self._seen_step: int | None = None
        self._micro = 0
        self._state: _StepState | None = None
        self._live: _InRunMicro | None = None
        self._pending_reason: str | None = None
        self._jsonl_ready = False
        self._warned: set[str] = set()
        p = config.jsonl_path
        self.jsonl_path = Path(p) if p else Path(trainer.args.output_dir) / "geometry.jsonl"

    # -- hooks ---------------------------------------------------------------------------------
    def on_generation(self, out: dict[str, Any]) -> dict[str, Any]:
        """Keep TRL's generation batch (rows, rewards, advantages) and tag its rows."""
        import torch

        tr = self.trainer
        rw, self.rewards = self.rewards, None
        if self.config.geometry_every == 0 or not tr.model.training:
            return out
        B = out["completion_ids"].shape[0]
        pi = tr.accelerator.process_index
        rewards = np.full(B, np.nan)
        if rw is not None:
            wts = tr.reward_weights.to(rw.device).unsqueeze(0)
            full = (rw * wts).nansum(dim=1)
            full[torch.isnan(rw).all(dim=1)] = torch.nan
            rewards = full[pi * B : (pi + 1) * B].detach().double().cpu().numpy()
        A = out["advantages"].detach().double().cpu()
        if A.dim() == 2:  # token-level advantages of a subclass: the row's mean over its mask
            m = out["completion_mask"].double().cpu()
            A = (A * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask",
                "num_items_in_batch", "pixel_values", "image_grid_thw")
        groups_per_gen = self._world() * B // int(tr.num_generations) + 1
        self._gen = _Generation(index=self._gen_count, batch={k: out[k] for k in keys if k in out},
                                rewards=rewards, advantages=A.numpy(), first_row=pi * B,
                                group_offset=self._gen_count * groups_per_gen)
        self._gen_count += 1
        self._new_gen = True
        out["geometry_row"] = torch.arange(B, device=out["completion_ids"].device)
        return out

    def on_micro_step(self) -> None:
        """After TRL's ``_prepare_inputs``: take ``u`` where a due step (or its new batch)
        starts; measure at the step's last segment (second pass), or arm the in-run capture of
        this micro-step's forward + backward (``in_run`` / ``auto``; measured after the step's
        last backward, :meth:`after_micro_step`)."""
        tr = self.trainer
        if self.config.geometry_every == 0 or not tr.model.training:
            return
        regenerated, tag_error = _try(self._read_chunk_tags)
        regenerated = bool(regenerated) or tag_error is not None
        step = int(tr.state.global_step)
        first = step != self._seen_step
        self._micro = 0 if first else self._micro + 1
        self._seen_step = step
        if step % self.config.geometry_every != 0 or self._gen is None:
            return
        t0 = time.perf_counter()
        if first or regenerated:
            self._start_segment(step, first, tag_error)
        st = self._state
        if st is not None and st.step == step and st.mode != "second_pass":
            if st.reason is None:
                self._arm_capture(st)
            st.spent += time.perf_counter() - t0

    def _start_segment(self, step: int, first: bool, tag_error: str | None) -> None:
        """A due step, or a new generation batch inside it, starts: collect its segment."""
        tr = self.trainer
        GA = int(tr.current_gradient_accumulation_steps)
        S = int(tr.args.steps_per_generation)
        gen_every = S * int(tr.num_iterations)
        m = int(tr._step)
        remaining = GA - self._micro
        n_micro = min(remaining, gen_every - m % gen_every)
        if first:
            self._state = _StepState(step=step, t0=time.perf_counter(),
                                     mode=self._step_mode(step))
        if self._state is None:  # the step's first micro-step was not seen (e.g. resumed)
            return
        self._collect_segment([(m + k) % S for k in range(n_micro)], tag_error)
        if n_micro == remaining:
            if self._state.mode == "second_pass":
                self._finish_step()
            else:
                self._state.finish_at = GA - 1

    def _step_mode(self, step: int) -> str:
        """``geometry_mode`` of this step (``score_every`` turns a measured step to the second
        pass)."""
        cfg = self.config
        k = int(cfg.score_every)
        if cfg.mode != "second_pass" and k > 0 and (step // cfg.geometry_every) % k == 0:
            return "second_pass"
        return cfg.mode

    def after_micro_step(self, *, completed: bool) -> None:
        """After TRL's ``training_step`` (forward + backward) of a micro-batch: close its in-run
        capture; after the step's last micro-batch, measure and record the step."""
        t0 = time.perf_counter()
        live, self._live = self._live, None
        if live is not None:
            live.close(self.trainer)
        st = self._state
        if st is not None:
            st.spent += time.perf_counter() - t0
        if (completed and st is not None and st.mode != "second_pass"
                and st.finish_at == self._micro and self.trainer.model.training):
            self._finish_step()

    def _arm_capture(self, st: _StepState) -> None:
        """Open the in-run capture around this micro-step's forward + backward for the groups
        whose rows are all in this micro-batch (a micro-batch used once in the step)."""
        tr = self.trainer
        gen = self._gen
        assert gen is not None
        j = int(tr._step) % int(tr.args.steps_per_generation)
        whole = st.inrun.get((gen.index, j))
        if not whole:
            return
        micro = _InRunMicro(gen=gen, chunk=j, groups=whole)
        st.micro.append(micro)
        micro.open(tr, tr.accelerator.unwrap_model(tr.model), config=self.config)
        self._live = micro

    def add_log_fields(self, logs: dict[str, Any]) -> None:
        """Add ``geometry/skipped_reason`` to TRL's log when a step's geometry was skipped."""
        if self._pending_reason is not None and self.trainer.model.training:
            logs[self.config.log_prefix + "skipped_reason"] = self._pending_reason
            self._pending_reason = None

    # -- helpers -------------------------------------------------------------------------------
    def _read_chunk_tags(self) -> bool:
        """After a new generation: which rows of the batch each buffered chunk holds."""
        if not self._new_gen or self._gen is None:
            return False
        self._new_gen = False
        chunks = self.trainer._buffered_inputs
        self._gen.chunk_rows = [ch.pop("geometry_row").cpu().numpy() for ch in chunks]
        if sorted(np.concatenate(self._gen.chunk_rows).tolist()) != list(
            range(self._gen.batch["completion_ids"].shape[0])
        ):
            raise RuntimeError("geometry: TRL's chunks do not partition the generation batch")
        return True

    def _world(self) -> int:
        return int(self.trainer.accelerator.num_processes)

    def _agree(self, payload: Any) -> list[Any]:
        """Every process's ``payload`` (one collective; no collective with one process)."""
        if self._world() == 1:
            return [payload]
        from accelerate.utils import gather_object

        return gather_object([payload])

    def _agreed_reason(self, err: str | None) -> str | None:
        """The first process's failure (the same on every process), or None."""
        reasons = [r for r in self._agree(err) if r]
        return reasons[0] if reasons else None

    def _collect_segment(self, chunks: list[int], pre_error: str | None) -> None:
        """``u`` of the micro-steps ``chunks`` of this step on the current generation batch.

        Collectives, called by every process whatever happened locally: agreement after the
        local preparation, TRL's own loss (TRL's collectives), agreement after it.
        """
        import torch

        st = self._state
        assert st is not None and self._gen is not None
        if st.reason is not None:  # an earlier segment failed on some process: all skip
            return
        gen = self._gen
        with torch.random.fork_rng(devices=_rng_devices()):
            prep, err = (None, pre_error) if pre_error else _try(lambda: self._prepare(chunks))
            st.reason = self._agreed_reason(err)
            if st.reason is not None:
                return
            U, err = _try(lambda: self._token_weights(prep))
            st.reason = self._agreed_reason(err)
        if st.reason is None:
            for j, whole in prep["whole"].items():
                st.inrun[(gen.index, j)] = whole
            st.segments.append({"chunks": chunks, "rows": prep["rows"], "token_weights": U,
                                "generation": gen, "issues": prep["issues"]})

    def _prepare(self, chunks: list[int]) -> dict[str, Any]:
        """Local checks, the whole groups of each micro-batch (in-run modes) and the log-prob
        values TRL's loss needs for the micro-batches whose ``u`` the second pass needs
        (no-grad forward, eval mode)."""
        tr = self.trainer
        gen = self._gen
        st = self._state
        assert gen is not None and st is not None
        multimodal = any(k in gen.batch for k in ("pixel_values", "image_grid_thw"))
        issues = structure_issues(tr.args, aux_loss=bool(getattr(tr, "aux_loss_enabled", False)),
                                  multimodal=multimodal)
        dropout = active_dropout(tr.accelerator.unwrap_model(tr.model))
        if dropout:
            issues.append("dropout is active in TRL's step (" + ", ".join(dropout) + "): the "
                          "geometry is measured without dropout")
        relevant = (issues if st.mode != "in_run"
                    else [i for i in issues if not _second_pass_only(i)])
        if relevant and self.config.strict:
            raise GeometryStrictError("geometry (strict): " + "; ".join(relevant))
        if multimodal:
            raise ValueError("geometry: image inputs are not supported by the Gram pass")
        counts = {j: chunks.count(j) for j in sorted(set(chunks))}
        whole: dict[int, dict[int, list[int]]] = {}
        if st.mode != "second_pass":
            G = int(tr.num_generations)
            for j, c in counts.items():
                found = (whole_groups_in_chunk(gen.chunk_rows[j], first_row=gen.first_row,
                                               group_size=G) if c == 1 else {})
                whole[j] = {gen.group_offset + g: pos for g, pos in found.items()}
        u_chunks = [j for j in counts if st.mode == "second_pass" or (
            st.mode == "auto"
            and sum(map(len, whole.get(j, {}).values())) < len(gen.chunk_rows[j]))]
        vals = {j: self._values(tr._buffered_inputs[j]) for j in u_chunks}
        rows = np.concatenate([gen.chunk_rows[j] for j in counts])
        return {"counts": counts, "values": vals, "rows": np.sort(rows), "issues": issues,
                "whole": whole, "u_chunks": u_chunks}

    def _values_needed(self, chunk: Mapping[str, Any]) -> bool:
        """Whether TRL's per-token loss gradient depends on the log-prob values themselves.

        Not when the ratio is ``exp(x - x.detach()) = 1`` (no stored old log-probs), ``beta = 0``,
        no entropy mask, no off-policy mask and TRL's own ``compute_loss``: then ``u`` is the
        same for any ``x`` and the forward is skipped.
        """
        import trl

        tr = self.trainer
        own = (type(tr).compute_loss is trl.GRPOTrainer.compute_loss
               and type(tr)._compute_loss is trl.GRPOTrainer._compute_loss)
        return not (own and chunk.get("old_per_token_logps") is None and float(tr.beta) == 0.0
                    and float(tr.top_entropy_quantile) >= 1.0
                    and tr.off_policy_mask_threshold is None)

    def _values(self, chunk: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """``(logps, entropies, aux)`` of a chunk at the current weights, as TRL computes them."""
        import torch

        tr = self.trainer
        C = chunk["completion_ids"].shape[1]
        if not self._values_needed(chunk):
            z = torch.zeros(chunk["completion_ids"].shape, dtype=torch.float32,
                            device=chunk["completion_ids"].device)
            aux = z.new_zeros(()) if getattr(tr, "aux_loss_enabled", False) else None
            return z, z, aux
        ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
        am = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
        with torch.no_grad(), _eval_mode(tr.model):
            lp, ent, aux = tr._get_per_token_logps_and_entropies(
                tr.model, ids, am, C, compute_entropy=True,
                compute_aux_loss=bool(getattr(tr, "aux_loss_enabled", False)))
        return lp.detach(), ent.detach(), None if aux is None else aux.detach()

    def _token_weights(self, prep: dict[str, Any]) -> Any:
        """``u [B, C]`` (float64) of the segment from TRL's own ``compute_loss`` on leaves."""
        import torch

        tr = self.trainer
        gen = self._gen
        assert gen is not None
        U = torch.zeros(gen.batch["completion_ids"].shape, dtype=torch.float64)
        if not prep["u_chunks"]:  # every row is measured in-run (u from the step itself)
            return U
        with _TrlLossState(tr):
            for j in prep["u_chunks"]:
                count = prep["counts"][j]
                chunk = tr._buffered_inputs[j]
                lp, ent, aux = prep["values"][j]
                leaf = lp.clone().requires_grad_(True)
                u = _loss_gradient(tr, chunk, leaf, ent, aux)
                U[torch.as_tensor(gen.chunk_rows[j])] += count * u.double().cpu()
        return U

    def _exchange(self, st: _StepState, done: set[tuple[int, int]]
                  ) -> tuple[GeometryRows | None, str | None]:
        """This process's rows to measure by the second pass: its own groups' rows plus those
        sent to it, less the rows ``done`` (``(generation, row)`` measured in-run).

        A group belongs to the process holding its first row; with several processes every
        process takes part in the one exchange (an empty payload after a local failure).
        """
        tr = self.trainer
        pi = tr.accelerator.process_index
        G = int(tr.num_generations)
        parts: list[dict[str, Any]] = []
        sent: list[dict[str, Any]] = []

        def split() -> None:
            for seg in st.segments:
                gen, rows = seg["generation"], seg["rows"]
                rows = rows[[(gen.index, int(r)) not in done for r in rows]]
                B = gen.batch["completion_ids"].shape[0]
                owner = (((gen.first_row + rows) // G) * G) // B
                parts.append(_row_payload(gen, seg["token_weights"], rows[owner == pi], G,
                                          local=True))
                out = _row_payload(gen, seg["token_weights"], rows[owner != pi], G, local=False)
                out["owner"] = owner[owner != pi]
                sent.append(out)

        _, err = _try(split)
        if self._world() > 1:
            for other in self._agree(sent if err is None else None):
                for p in other or []:
                    keep = np.asarray(p["owner"]) == pi
                    if err is None and keep.any():
                        parts.append(_select_payload(p, keep))
        if err is not None:
            return None, err
        return _try(lambda: _assemble_rows(parts))

    def _agree_collective_pass(self, rows: GeometryRows | None, err: str | None
                               ) -> tuple[str | None, bool]:
        """FSDP2 with several processes: a forward of the second pass is collective (an
        all-gather per module), so every process runs the same forwards or none. The processes
        exchange their errors and :func:`second_pass_shape`; unless all agree, every process skips
        the step with one reason. Returns ``(error, collective)``; collective passes measure one
        group per forward (their count then depends only on the agreed shape, not on each
        process's memory or row lengths)."""
        if self._world() == 1:
            return err, False
        from .gram import fsdp_sharded

        tr = self.trainer
        if not fsdp_sharded(tr.accelerator.unwrap_model(tr.model)):
            return err, False
        grad_norm = self.config.mode == "second_pass" and bool(self.config.grad_norm)
        shape, err2 = (None, err) if err is not None else _try(
            lambda: second_pass_shape(rows, grad_norm=grad_norm))
        gathered = self._agree({"err": err2, "shape": shape})
        errors = [p["err"] for p in gathered if p["err"]]
        if errors:
            return errors[0], True
        shapes = [tuple(p["shape"]) for p in gathered]
        if len(set(shapes)) > 1:
            return (f"{FSDP2_UNEVEN} (passes, forwards per pass by process: {shapes}); a "
                    "sharded forward is collective, so no process measured this step"), True
        return None, True

    def _gram(self, rows: GeometryRows, *, one_group_per_pass: bool = False
              ) -> RowsMeasurement:
        tr = self.trainer
        model = tr.accelerator.unwrap_model(tr.model)
        try:
            # in-run modes: the second pass covers some groups only (no process gradient norm)
            cfg = (self.config if self.config.mode == "second_pass"
                   else replace(self.config, grad_norm=False))
            if one_group_per_pass and not cfg.grad_norm:
                cfg = replace(cfg, memory_budget_mb=2.0**-20)  # 1 byte: one group per forward
            with _eval_mode(model), _without_input_require_grads(model):
                return measure_rows(model, rows, config=cfg,
                                    temperature=float(tr.temperature),
                                    group_size=int(tr.num_generations))
        finally:
            from .gram import reshard_fsdp

            reshard_fsdp(model)

    def _step_record(self, st: _StepState) -> dict[str, Any]:
        tr = self.trainer
        return {
            "step": st.step,
            "geometry_mode": self.config.mode,
            "step_mode": st.mode,
            "weight_grads": "host" if st.mode == "second_pass" else self.config.weight_grads,
            "num_processes": self._world(),
            "loss_type": tr.loss_type,
            "num_generations": int(tr.num_generations),
            "num_iterations": int(tr.num_iterations),
            "steps_per_generation": int(tr.args.steps_per_generation),
            "gradient_accumulation_steps": int(tr.current_gradient_accumulation_steps),
            "beta": float(tr.beta),
            "notes": structure_notes(tr.args),
        }

    def _finish_step(self) -> None:
        """The step's Gram pass, then gather, aggregate, log and write its record."""
        import torch

        st, self._state = self._state, None
        assert st is not None
        rec = self._step_record(st)
        if st.reason is not None:
            self._skip(rec, st.reason)
            return
        t_finish = time.perf_counter()
        with torch.random.fork_rng(devices=_rng_devices()):
            inrun, err = _try(lambda: self._inrun_results(st))
            done = inrun["done"] if inrun is not None else set()
            uneven = None  # auto under FSDP2: the second pass dropped on every process
            if st.mode == "in_run":
                meas = RowsMeasurement()
            else:
                rows, err2 = self._exchange(st, done)
                err, collective = self._agree_collective_pass(rows, err or err2)
                if err is not None and err.startswith(FSDP2_UNEVEN) and inrun is not None:
                    # every process saw the same shapes: keep the in-run groups, skip the rest
                    uneven, err = err.replace("no process measured this step",
                                              "no process ran the second pass"), None
                    meas = RowsMeasurement()
                else:
                    meas, err = (_try(lambda: self._gram(rows, one_group_per_pass=collective))
                                 if err is None else (None, err))
        ok = err is None
        local = inrun if (ok and inrun is not None) else {"groups": [], "present": [],
                                                          "failed": {}, "errors": []}
        second = [dict(g, path="second_pass") for g in meas.groups] if ok else []
        gathered = self._agree({
            "err": err, "groups": second + local["groups"],
            "sq": meas.local_grad_sq if ok else None,
            # in-run modes: the geometry's work outside TRL's step (the hooks' time inside it
            # is not separable: see benchmarks/bench_trl_geometry.py)
            "time": (time.perf_counter() - st.t0 if st.mode == "second_pass"
                     else st.spent + time.perf_counter() - t_finish),
            "issues": sorted({i for s in st.segments for i in s["issues"]}),
            "present": local["present"], "failed": local["failed"], "errors": local["errors"],
        })

        reasons = [p["err"] for p in gathered if p["err"]]
        if reasons:
            self._skip(rec, reasons[0])
            return
        groups = [g for p in gathered for g in p["groups"]]
        skipped = (_skipped_groups(gathered, groups, default=uneven)
                   if st.mode == "in_run" or uneven else [])
        issues = sorted({i for p in gathered for i in p["issues"]})
        if not any(g["path"] == "second_pass" for g in groups):
            issues = [i for i in issues if not _second_pass_only(i)]
        sq = [p["sq"] for p in gathered]
        rec.update({
            "exact": not issues,
            "issues": issues,
            "groups_with_gradient": sum(bool(g["has_gradient"]) for g in groups) + len(skipped),
            "groups_measured": sum("grad_norm" in g for g in groups),
            "grad_norm": (math.sqrt(sq[0]) if len(sq) == 1 and sq[0] is not None else None),
            **aggregate_groups(groups),
            "in_run_groups": sum(g["path"] == "in_run" for g in groups),
            "second_pass_groups": sum(g["path"] == "second_pass" for g in groups),
            "skipped_groups": skipped,
            "in_run_errors": sorted({e for p in gathered for e in p["errors"]}),
            "geometry_time_s": float(max(p["time"] for p in gathered)),
        })
        if self.config.keep_groups:
            rec["group_records"] = groups
        self._record(rec)
        self.last = {"step": st.step, "segments": st.segments, "record": rec,
                     "grams": {**meas.grams, **(local.get("grams") or {})},
                     "row_grams": {**meas.row_grams, **(local.get("row_grams") or {})},
                     "passes": meas.passes, "proportional": meas.proportional,
                     "in_run": st.micro}

    def _inrun_results(self, st: _StepState) -> dict[str, Any]:
        """This process's in-run groups: records, Grams, the rows they cover (``done``), the
        groups present and the capture failures (``in_run``: skipped; ``auto``: second pass)."""
        tr = self.trainer
        G = int(tr.num_generations)
        out: dict[str, Any] = {"groups": [], "grams": {}, "row_grams": {}, "done": set(),
                               "failed": {}, "errors": [], "present": []}
        for seg in st.segments:
            gen = seg["generation"]
            out["present"] += sorted({int(g) for g in gen.group_offset
                                      + (gen.first_row + seg["rows"]) // G})
        score_ok = not _entropy_bonus(tr.args)
        for micro in st.micro:
            for seg in st.segments:  # the step's own u (records, a fallback second pass, tests)
                if seg["generation"] is micro.gen and micro.u is not None:
                    rows = micro.gen.chunk_rows[micro.chunk]
                    seg["token_weights"][rows] = micro.u
            if micro.error is not None:
                out["errors"].append(micro.error)
                out["failed"].update({int(g): micro.error for g in micro.groups})
                continue
            for g, pos in micro.groups.items():
                rec, K, Kg = _inrun_group(micro, g, pos, config=self.config, group_size=G,
                                          score_ok=score_ok)
                out["groups"].append(rec)
                if K is not None:
                    out["grams"][g] = K
                if Kg is not None:
                    out["row_grams"][g] = Kg
                rows = micro.gen.chunk_rows[micro.chunk][pos]
                out["done"] |= {(micro.gen.index, int(r)) for r in rows}
        return out

    def _skip(self, rec: dict[str, Any], reason: str) -> None:
        """Every process knows ``reason``: record it, log it; raise under ``strict``."""
        if self.config.strict:
            raise GeometryStrictError(f"geometry of step {rec['step']} failed: {reason}")
        rec.update({"skipped": True, "skipped_reason": reason})
        if reason not in self._warned:
            warnings.warn(f"geometry: step {rec['step']} not measured: {reason}", stacklevel=3)
            self._warned.add(reason)
        self._pending_reason = reason
        self.trainer._metrics["train"][self.config.log_prefix + "skipped"].append(1.0)
        self._write(rec)

    def _record(self, rec: dict[str, Any]) -> None:
        """Push the step's aggregates into TRL's metric buffer and write the JSONL line."""
        pre = self.config.log_prefix
        buf = self.trainer._metrics["train"]
        buf[pre + "skipped"].append(0.0)
        buf[pre + "groups"].append(float(rec["groups"]))
        buf[pre + "mixed_groups"].append(float(rec["mixed_groups"]))
        n = rec["groups_with_gradient"]
        buf[pre + "groups_measured_fraction"].append(
            float(rec["groups_measured"]) / n if n else 1.0)
        buf[pre + "exact"].append(float(rec["exact"]))
        buf[pre + "time_s"].append(float(rec["geometry_time_s"]))
        if rec["grad_norm"] is not None:
            buf[pre + "grad_norm"].append(float(rec["grad_norm"]))
        for name, st in rec["metrics"].items():
            for key in ("mean", "sd", "min", "max", "count"):
                if st[key] is not None:
                    buf[f"{pre}{name}/{key}"].append(float(st[key]))
        self._write(rec)

    def _write(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if not self.trainer.accelerator.is_main_process:
            return
        from .run_io import append_jsonl, read_jsonl, rewrite_jsonl

        path = self.jsonl_path
        if not self._jsonl_ready:
            # a resumed (or repeated) run: drop the records of the steps it is about to redo
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_file():
                keep = [r for r in read_jsonl(path) if int(r.get("step", -1)) < rec["step"]]
                rewrite_jsonl(path, keep)
            self._jsonl_ready = True
        append_jsonl(path, rec)


def whole_groups_in_chunk(chunk_rows: Any, *, first_row: int, group_size: int
                          ) -> dict[int, list[int]]:
    """Groups whose ``R = group_size`` rows are all in one micro-batch of one process.

    Row ``r`` of the local generation batch is global row ``first_row + r``; group ``k`` holds
    the global rows ``k R .. k R + R - 1`` (TRL's order). Returns ``{k: positions}`` with the
    positions of the group's rows in ``chunk_rows`` (the micro-batch's local rows, in its order).

    >>> whole_groups_in_chunk([5, 0, 1, 4, 2, 3], first_row=0, group_size=4)
    {0: [1, 2, 4, 5]}
    """
    rows = np.asarray(chunk_rows, dtype=np.int64).reshape(-1)
    grp = (int(first_row) + rows) // int(group_size)
    out = {}
    for k in np.unique(grp):
        pos = np.nonzero(grp == k)[0]
        if pos.size == int(group_size):
            out[int(k)] = [int(p) for p in pos]
    return out


def group_permutation(batch_size: int, *, first_row: int, group_size: int, rng: Any = None
                      ) -> Any:
    """A random order of the local rows ``0 .. batch_size - 1`` that keeps each group together.

    Local row ``r`` belongs to group ``(first_row + r) // group_size``; the groups are put in a
    random order (``torch.randperm``, generator ``rng``), each group's rows in their order.

    >>> group_permutation(6, first_row=2, group_size=4, rng=None).shape
    torch.Size([6])
    """
    import torch

    label = (int(first_row) + torch.arange(int(batch_size))) // int(group_size)
    groups = torch.unique(label)
    order = groups[torch.randperm(groups.numel(), generator=rng)]
    return torch.cat([torch.nonzero(label == g).reshape(-1) for g in order])


class _group_shuffle:  # noqa: N801 - a context manager used like a function
    """TRL's ``shuffle_sequence_dict`` replaced, for the block, by a shuffle of whole groups."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __enter__(self) -> None:
        import trl.trainer.grpo_trainer as host

        self.host, self.original = host, host.shuffle_sequence_dict
        host.shuffle_sequence_dict = self.shuffle

    def __exit__(self, *exc: Any) -> None:
        self.host.shuffle_sequence_dict = self.original

    def shuffle(self, seq_dict: dict[str, Any]) -> dict[str, Any]:
        """``shuffle_sequence_dict`` of TRL 1.16 with :func:`group_permutation`."""
        import torch

        tr = self.trainer
        B = len(next(v for v in seq_dict.values() if v is not None))
        perm = group_permutation(B, first_row=tr.accelerator.process_index * B,
                                 group_size=int(tr.num_generations))

        def permute(v: Any) -> Any:
            if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
                return v
            if isinstance(v, torch.Tensor):
                return v[perm.to(v.device)]
            return [v[int(i)] for i in perm]

        return {key: permute(val) for key, val in seq_dict.items()}


def _entropy_bonus(args: Any) -> bool:
    """TRL's loss has an entropy bonus (a gradient outside the log-probabilities)."""
    return (float(getattr(args, "entropy_coef", 0.0) or 0.0) != 0.0
            or bool(getattr(args, "use_adaptive_entropy", False)))


def _second_pass_only(issue: str) -> bool:
    """An issue of the second pass only: in-run rows are TRL's own (its dropout masks, its
    entropy bonus)."""
    return issue.startswith(("dropout is active", "the entropy bonus"))


def _skipped_groups(gathered: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]],
                    *, default: str | None = None) -> list[dict[str, Any]]:
    """The groups of the step not measured, with the reason: ``in_run`` mode (groups not whole
    in one micro-batch, or whose capture failed), or ``auto`` when the second pass was dropped
    (``default``: why)."""
    measured = {int(g["group"]) for g in groups}
    failed = {int(k): v for p in gathered for k, v in p["failed"].items()}
    present = sorted({int(k) for p in gathered for k in p["present"]} - measured)
    default = default or ("rows not all in one micro-batch on one process (geometry_mode=auto "
                          "measures such groups by the second pass)")
    return [{"group": k, "reason": failed.get(k, default)} for k in present]


class _InRunMicro:
    """The in-run capture of one micro-batch's forward + backward (TRL's own training step).

    ``groups``: ``{group: positions in the micro-batch}`` of the whole groups captured;
    ``u``: ``[n, C]`` TRL's per-token loss gradient ``dL/dlogp`` of the micro-batch, read by a
    gradient hook on the log-probabilities of the step's own forward (the host's gradients are
    unchanged); ``row_grams``: ``{group: Kg}`` float64 in the group's position order;
    ``error``: why the capture failed (None when it did not).
    """

    def __init__(self, *, gen: _Generation, chunk: int, groups: dict[int, list[int]]) -> None:
        self.gen, self.chunk, self.groups = gen, chunk, groups
        self.capture: Any = None
        self.u: Any = None
        self.error: str | None = None
        self.row_grams: dict[int, np.ndarray] = {}
        self.coverage: dict[str, int] = {}
        self.from_rows: list[str] = []  # Linear modules whose dW the capture formed
        self.batched: list[str] = []  # modules whose small calls were added after the backward
        self._wrapper: Any = None

    def open(self, trainer: Any, model: Any, *, config: GeometryConfig) -> None:
        """Install the capture's hooks and the log-prob gradient hook (errors recorded)."""
        from .gram_capture import GramCapture

        def start() -> None:
            # input taps only under gradient checkpointing (TRL backpropagates with
            # accelerator.backward: the hooks alone see every module; fewer autograd nodes)
            cap = GramCapture(model, blocks=list(self.groups.values()), input_taps=None,
                              weight_grads=config.weight_grads,
                              batch_small_calls=bool(config.batch_small_calls))
            cap.__enter__()
            self.capture = cap
            self._wrapper = self._logps_wrapper(trainer)
            trainer._get_per_token_logps_and_entropies = self._wrapper

        _, self.error = _try(start)

    def _logps_wrapper(self, trainer: Any) -> Any:
        """TRL's ``_get_per_token_logps_and_entropies`` until its first call with gradients:
        hooks the gradient of the log-probabilities that call returns (``u``), then removes
        itself."""
        original = type(trainer)._get_per_token_logps_and_entropies

        def logps(*args: Any, **kwargs: Any) -> Any:
            out = original(trainer, *args, **kwargs)
            lp = out[0]
            if getattr(lp, "requires_grad", False):  # the step's own (not a no-grad call)
                self._unwrap(trainer)
                lp.register_hook(self._store_u)
            return out

        return logps

    def _store_u(self, grad: Any) -> None:
        import torch

        self.u = grad.detach().to(torch.float64).cpu()

    def _unwrap(self, trainer: Any) -> None:
        if self._wrapper is not None and trainer.__dict__.get(
                "_get_per_token_logps_and_entropies") is self._wrapper:
            del trainer.__dict__["_get_per_token_logps_and_entropies"]
        self._wrapper = None

    def close(self, trainer: Any) -> None:
        """After the micro-step's backward: remove the hooks, keep the Grams (or the reason)."""
        self._unwrap(trainer)
        cap, self.capture = self.capture, None
        if cap is None:
            return
        _, err = _try(lambda: cap.__exit__(None, None, None))
        self.error = self.error or err
        _, err = _try(cap.backward_done)  # TRL's training_step (its backward) has returned
        self.error = self.error or err
        if self.error is None:
            Ks, self.error = _try(cap.result)
            self.coverage = cap.coverage()
            self.from_rows = sorted(cap.from_rows)
            self.batched = sorted(cap.batched)
            if Ks is not None:
                self.row_grams = {g: K.detach().cpu().double().numpy()
                                  for g, K in zip(self.groups, Ks, strict=True)}
        if self.error is None and self.u is None:
            self.error = ("the step's per-token loss gradient was not seen (TRL's "
                          "_get_per_token_logps_and_entropies gave no log-probabilities "
                          "with gradients)")


def _inrun_group(micro: _InRunMicro, g: int, pos: list[int], *, config: GeometryConfig,
                 group_size: int, score_ok: bool
                 ) -> tuple[dict[str, Any], np.ndarray | None, np.ndarray | None]:
    """Record, score Gram ``K`` (or None) and row Gram ``Kg`` of one group captured in-run.

    ``Kg`` is the captured Gram of the rows ``g_i`` (rows with an empty loss mask left out, as
    in :func:`measure_rows`). ``K = diag(1/a) Kg diag(1/a)`` when every row's ``u_i = a_i m_i``
    with ``a_i != 0`` and TRL's loss has no term outside the log-probabilities (``score_ok``);
    else only the gradient-matrix metrics (:func:`gradient_row_metrics`).
    """
    import torch

    from .geometry_metrics import gradient_row_metrics

    gen = micro.gen
    local = gen.chunk_rows[micro.chunk][pos]
    order = np.argsort(local, kind="stable")
    U = torch.zeros(gen.batch["completion_ids"].shape, dtype=torch.float64)
    U[torch.as_tensor(gen.chunk_rows[micro.chunk])] = micro.u
    rows = _assemble_rows([_row_payload(gen, U, local[order], group_size, local=True)])
    Kg_all = micro.row_grams[g][np.ix_(order, order)]
    L = rows.loss_mask.sum(dim=1).cpu().numpy()
    rec = _group_record(rows, np.arange(L.size), L, group_size=group_size, config=config)
    rec["path"] = "in_run"
    rec["has_gradient"] = bool(float(rows.weights.abs().max()) > 0) if L.size else False
    if not rec["has_gradient"]:
        return rec, None, None
    sel = np.nonzero(L > 0)[0]
    Kg = Kg_all[np.ix_(sel, sel)]
    a, prop = _row_multiples(rows.weights[sel], rows.loss_mask[sel])
    if score_ok and prop and np.all(a != 0):
        K = Kg / np.outer(a, a)
        rec.update(_measured_fields(rows, sel, K, Kg, a, config=config))
        return rec, K, Kg
    rec.update(gradient_row_metrics(Kg, rtol=config.rtol))
    rec["measured_rows"] = [int(x) for x in rows.row[sel]]
    rec["row_grad_norms"] = [float(math.sqrt(max(x, 0.0))) for x in np.diag(Kg)]
    rec["max_rank"] = int(np.count_nonzero(np.diag(Kg) > 0))
    rec["score_geometry"] = ("not from the in-run Gram (a row's u is not a nonzero multiple of "
                             "its loss mask, or the loss has terms outside the log-probabilities)"
                             ": geometry_score_every > 0 measures it by the second pass")
    return rec, None, Kg


class GeometryStrictError(RuntimeError):
    """Raised under ``strict=True`` instead of skipping a step's geometry."""


def _try(fn: Any) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, reason)`` for any exception (a strict error re-raises)."""
    try:
        return fn(), None
    except GeometryStrictError:
        raise
    except Exception as exc:  # noqa: BLE001 - the geometry must never stop training
        _free_memory()
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _rng_devices() -> list[int]:
    import torch

    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


class _eval_mode:  # noqa: N801 - a context manager used like a function
    """``model.eval()`` for the block, the previous mode restored after."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.was_training = bool(model.training)

    def __enter__(self) -> Any:
        self.model.eval()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self.model.train(self.was_training)


class _without_input_require_grads:  # noqa: N801 - a context manager used like a function
    """Remove HF's ``enable_input_require_grads`` hooks for the block, restore them after.

    PEFT + gradient checkpointing make the input embeddings' output require grad (the hook may
    be registered several times); the Gram pass, in eval mode, has no checkpointing and needs the
    embedding outputs free of gradient.
    """

    def __init__(self, model: Any) -> None:
        get = getattr(model, "get_input_embeddings", None)
        self.emb = get() if callable(get) else None

    def __enter__(self) -> None:
        if self.emb is None:
            return
        hooks = self.emb._forward_hooks
        self.saved = dict(hooks)
        for key, fn in list(hooks.items()):
            if getattr(fn, "__name__", "") == "make_inputs_require_grads":
                del hooks[key]

    def __exit__(self, *exc: Any) -> None:
        if self.emb is None:
            return
        hooks = self.emb._forward_hooks
        hooks.clear()
        hooks.update(self.saved)


class _TrlLossState:
    """Snapshot and restore what TRL's ``compute_loss`` changes besides the loss (metrics,
    adaptive-entropy window) and put the model in train mode (TRL's loss reads the mode)."""

    _ATTRS = ("_entropy_window_stats", "entropy_coef", "_last_world_entropy")

    def __init__(self, trainer: Any) -> None:
        self.tr = trainer

    def __enter__(self) -> None:
        m = self.tr._metrics
        self.metrics = {mode: {k: list(v) for k, v in buf.items()} for mode, buf in m.items()}
        self.attrs = {a: getattr(self.tr, a) for a in self._ATTRS if hasattr(self.tr, a)}
        self.mode = bool(self.tr.model.training)
        self.tr.model.train()

    def __exit__(self, *exc: Any) -> None:
        for mode, buf in self.tr._metrics.items():
            buf.clear()
            buf.update(self.metrics.get(mode, {}))
        for a, v in self.attrs.items():
            setattr(self.tr, a, v)
        self.tr.model.train(self.mode)


def _loss_gradient(tr: Any, chunk: Mapping[str, Any], leaf: Any, ent: Any, aux: Any) -> Any:
    """``dL/dleaf`` of TRL's own ``compute_loss`` with the per-token log-probs ``leaf``."""
    import torch

    def logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
              *args: Any, compute_entropy: bool = False, compute_aux_loss: bool = False,
              **kw: Any) -> tuple[Any, Any, Any]:
        if tuple(input_ids.shape[:1]) != tuple(leaf.shape[:1]) or logits_to_keep != leaf.shape[1]:
            raise RuntimeError("geometry: TRL's loss scored a batch other than the micro-batch")
        return leaf, (ent if compute_entropy else None), (aux if compute_aux_loss else None)

    tr._get_per_token_logps_and_entropies = logps
    try:
        loss = tr.compute_loss(tr.model, chunk)
    finally:
        del tr._get_per_token_logps_and_entropies
    if not loss.requires_grad:
        return torch.zeros_like(leaf, dtype=torch.float64)
    (u,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf) if u is None else u.detach()


def _row_payload(gen: _Generation, U: Any, rows: np.ndarray, group_size: int, *,
                 local: bool) -> dict[str, Any]:
    """The rows ``rows`` of the local generation batch, CPU tensors (sent across processes)."""
    import torch

    b = gen.batch
    idx = torch.as_tensor(rows, dtype=torch.long)
    cm = b["completion_mask"].cpu()
    lm = cm * b["tool_mask"].cpu() if "tool_mask" in b else cm
    glob = gen.first_row + rows
    return {
        "prompt_ids": b["prompt_ids"].cpu()[idx], "prompt_mask": b["prompt_mask"].cpu()[idx],
        "completion_ids": b["completion_ids"].cpu()[idx], "completion_mask": cm[idx],
        "loss_mask": lm[idx], "weights": U[idx],
        "rewards": gen.rewards[rows], "advantages": gen.advantages[rows],
        "row": glob, "group": gen.group_offset + glob // group_size,
        "local": np.full(rows.size, local),
    }


def _select_payload(p: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    import torch

    idx = torch.as_tensor(np.nonzero(keep)[0], dtype=torch.long)
    return {k: (v[idx] if hasattr(v, "index_select") else np.asarray(v)[keep])
            for k, v in p.items() if k != "owner"}


def _assemble_rows(parts: Sequence[dict[str, Any]]) -> GeometryRows:
    """One :class:`GeometryRows` from payloads of different prompt / completion widths.

    Prompts are left-padded and completions right-padded to the widest; each row keeps the
    positions TRL's forward gave it on its own process (``0 .. P_r + C_r - 1`` of its padded
    row), shifted by its extra left padding.
    """
    import torch

    parts = [p for p in parts if len(p["row"])]
    P = max((p["prompt_ids"].shape[1] for p in parts), default=1)
    C = max((p["completion_ids"].shape[1] for p in parts), default=1)
    cols: dict[str, list[Any]] = {k: [] for k in ("ids", "am", "pos", "lm", "w")}
    for p in parts:
        n, Pp, Cp = p["prompt_ids"].shape[0], p["prompt_ids"].shape[1], p["completion_ids"].shape[1]
        d = P - Pp
        pad = lambda x, left, right: torch.nn.functional.pad(x, (left, right))  # noqa: E731
        cols["ids"].append(pad(torch.cat([p["prompt_ids"], p["completion_ids"]], 1), d, C - Cp))
        cols["am"].append(pad(torch.cat([p["prompt_mask"], p["completion_mask"]], 1), d, C - Cp))
        cols["lm"].append(pad(p["loss_mask"].to(torch.float64), P, C - Cp))
        cols["w"].append(pad(p["weights"].to(torch.float64), P, C - Cp))
        cols["pos"].append((torch.arange(P + C) - d).clamp(min=0).expand(n, -1))
    if not parts:
        z = torch.zeros((0, P + C), dtype=torch.long)
        return GeometryRows(z, z, z, z.double(), z.double(), np.zeros(0), np.zeros(0),
                            np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool),
                            np.zeros(0, dtype=np.int64))
    cat = {k: torch.cat(v, 0) for k, v in cols.items()}
    row = np.concatenate([np.asarray(p["row"]) for p in parts]).astype(np.int64)
    return GeometryRows(
        input_ids=cat["ids"], attention_mask=cat["am"], position_ids=cat["pos"],
        loss_mask=cat["lm"], weights=cat["w"],
        rewards=np.concatenate([np.asarray(p["rewards"], dtype=np.float64) for p in parts]),
        advantages=np.concatenate([np.asarray(p["advantages"], dtype=np.float64)
                                   for p in parts]),
        group=np.concatenate([np.asarray(p["group"], dtype=np.int64) for p in parts]),
        local=np.concatenate([np.asarray(p["local"], dtype=bool) for p in parts]),
        row=row,
    )


def _make_trainer_class() -> Any:
    from trl import GRPOTrainer

    class GeometryGRPOTrainer(GeometryMixin, GRPOTrainer):  # type: ignore[misc, valid-type]
        """``trl.GRPOTrainer`` with :class:`GeometryMixin`: the exact per-group geometry."""

    GeometryGRPOTrainer.__module__ = __name__
    return GeometryGRPOTrainer


def _make_config_class() -> Any:
    import dataclasses

    from trl import GRPOConfig

    specs = []
    for f in fields(GeometryConfig):
        typ = {"geometry_every": int, "jsonl_path": str | None, "gram_method": str,
               "rtol": float, "success_threshold": float, "log_prefix": str,
               "keep_groups": bool, "strict": bool, "grad_norm": bool,
               "memory_budget_mb": float | None, "mode": str, "score_every": int,
               "group_order": bool, "weight_grads": str, "batch_small_calls": bool}[f.name]
        specs.append((_geometry_field_name(f.name), typ,
                      dataclasses.field(default=f.default, metadata={"help": _FIELD_HELP[f.name]})))

    def __post_init__(self: Any) -> None:
        GRPOConfig.__post_init__(self)
        self.geometry_config()  # validates the geometry fields

    def geometry_config(self: Any) -> GeometryConfig:
        """The :class:`GeometryConfig` of this config's ``geometry_*`` fields."""
        return settings_from_args(self)

    cls = dataclasses.make_dataclass(
        "GeometryGRPOConfig", specs, bases=(GRPOConfig,),
        namespace={"__post_init__": __post_init__, "geometry_config": geometry_config,
                   "__doc__": "``trl.GRPOConfig`` plus the geometry settings as "
                              "``geometry_*`` fields (see :class:`GeometryConfig`)."},
    )
    cls.__module__ = __name__  # pickled with checkpoints as real_model.trl_geometry.<name>
    return cls


_CACHE: dict[str, Any] = {}
_FACTORIES = {"GeometryGRPOTrainer": _make_trainer_class, "GeometryGRPOConfig": _make_config_class}


def __getattr__(name: str) -> Any:
    """``GeometryGRPOTrainer`` / ``GeometryGRPOConfig`` are built on first access (trl then)."""
    if name in _FACTORIES:
        if name not in _CACHE:
            _CACHE[name] = _FACTORIES[name]()
        return _CACHE[name]
    raise AttributeError(name)


def config_dict(cfg: GeometryConfig) -> dict[str, Any]:
    """JSON-ready dict of a :class:`GeometryConfig`."""
    return asdict(cfg)
