"""Exact per-rollout gradient geometry inside TRL's ``GRPOTrainer`` (TRL 1.16).

:class:`GeometryGRPOTrainer` is a ``trl.GRPOTrainer`` that, every ``geometry_every`` optimizer
steps, takes the step's groups exactly as TRL built them (prompt + completion ids, attention and
loss masks, TRL's own advantages and rewards) and computes, per group of ``R = num_generations``
rollouts, at the current weights (before the step's update):

* ``K [R, R]``, ``K_ij = <psi_i, psi_j>``: the Gram of the trajectory scores
  ``psi_i = grad_theta sum_t m_it log pi_theta(y_it | y_i,<t)`` (seed paper Eq. 18) over every
  trainable parameter, by :func:`real_model.gram.trajectory_gram` (exact), with TRL's temperature
  (TRL scores ``log softmax(logits / temperature)``), TRL's loss mask ``m`` (completion mask times
  tool mask) and TRL's position ids;
* the rows' effective weights ``w_i = c_i A_i`` of the trainer's ACTUAL loss: ``A_i`` TRL's
  advantages (whatever ``scale_rewards`` / ``multi_objective_aggregation`` made them) and ``c_i``
  the aggregation weight of :func:`grpo_theory.aggregation.aggregation_weights` for TRL's
  ``loss_type`` (:func:`trl_row_weights`), so that at an on-policy step with ``beta = 0``

      grad_theta L_TRL = - sum_{processes} sum_i w_i psi_i          (the optimizer's gradient);

* the metrics of ``G = diag(w) Psi`` from ``diag(w) K diag(w)``
  (:func:`grpo_theory.spectral.spectral_metrics`: numerical rank, effective rank, entropy
  effective rank, top-1 fraction, stable rank), the FADE masses ``m_S, m_F`` of TRL's advantages
  (:func:`grpo_theory.mass.gradient_mass`), and the score geometry
  (:func:`real_model.geometry.score_geometry`: per-rollout norms ``sqrt(K_ii)``, cosines within
  successes / failures / between, common share ``lambda_max(C)/R``), plus
  ``cos(S, F) = <g_S, g_F> / (||g_S|| ||g_F||)`` of the mean success and failure scores.

Per measured step the per-group values are gathered over all data-parallel processes
(``accelerate.utils.gather_object``) and aggregated over the step's mixed-reward groups (mean,
sd, min, max, count); the aggregates go into TRL's own metric buffer (so ``Trainer.log`` sends them
to TensorBoard / W&B / trackio under ``geometry/...``) and, on the main process, one JSON line per
step is appended to ``geometry.jsonl``.

Loss types of TRL 1.16 (``GRPOConfig.loss_type``) and their row weights at ratio 1
(``B_c`` rows and ``N_c`` loss tokens in the micro-batch that holds row ``i``, ``GA`` gradient
accumulation steps, ``S = steps_per_generation``, ``W`` processes, ``N`` loss tokens of the whole
generation batch over all processes, ``L_i`` row ``i``'s loss tokens)::

    grpo, sapo      c_i = 1 / (W GA B_c L_i)    aggregation "sequence_mean" of the micro-batch
    bnpo            c_i = 1 / (W GA N_c)        "token_mean" of the micro-batch
    dr_grpo         c_i = 1 / (W GA B_c Lmax)   "dr_grpo", Lmax = max_completion_length
    dapo, vespo     c_i = S / (GA N)            "token_mean" of the global generation batch
    cispo           c_i = min(1, eps_high) S / (GA N)
    luspo           c_i = 1 / (W GA B_c)        "sequence_sum" of the micro-batch

sapo's gate ``4 sigmoid(tau (r - 1)) / tau`` has slope 1 at ``r = 1``; vespo's Gamma weight is
``phi(1) = 1``; cispo's detached clipped ratio is ``min(1, eps_high)``; sequence-level importance
sampling (GSPO) gives the same row weights at ratio 1. These identities are checked against TRL's
own ``compute_loss`` gradient in ``tests/test_trl_geometry.py``.

Options that break the per-rollout structure ``sum_i w_i psi_i`` (the KL term with ``beta > 0``,
entropy bonus / entropy mask, MoE auxiliary loss, vLLM importance-sampling correction, token-level
advantages, ``steps_per_generation != gradient_accumulation_steps``) are listed by
:func:`structure_issues`; the trainer then logs the score geometry (valid for any loss) but NOT the
weight-dependent "gradient matrix" metrics, says why in the log and the JSONL, and warns once
(``strict=True`` raises instead). ``num_iterations > 1`` is fine for the measured step: geometry is
taken at generation time, i.e. the first inner step, where the ratio is 1; the later inner steps
(clipped, importance weighted) are not measured. Docs: ``docs/trl.md``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo_theory.aggregation import aggregation_weights
from grpo_theory.conventions import TRL_LOSS_AGGREGATION  # loss_type -> (mode, normaliser scope)
from grpo_theory.spectral import DEFAULT_RTOL

from .geometry_metrics import (
    aggregate_groups,
    cos_success_failure,
    group_records,
)

__all__ = [
    "GeometryConfig",
    "TRL_LOSS_AGGREGATION",
    "SUPPORTED_LOSS_TYPES",
    "trl_row_weights",
    "structure_issues",
    "structure_notes",
    "group_records",
    "aggregate_groups",
    "cos_success_failure",
    "GeometryGRPOTrainer",  # noqa: F822 (built lazily by __getattr__: no trl import here)
    "TemperatureScaled",
]

SUPPORTED_LOSS_TYPES = tuple(TRL_LOSS_AGGREGATION)

@dataclass(frozen=True)
class GeometryConfig:
    """Options of the in-training geometry (defaults stated).

    Attributes:
        geometry_every: measure at optimizer steps ``0, k, 2k, ...`` (default 1: every step).
        jsonl_path: JSONL file of per-step records (default ``<output_dir>/geometry.jsonl``).
        gram_method: ``"exact"`` (default) or ``"naive"`` (:func:`trajectory_gram`).
        rtol: numerical-rank tolerance (default ``1e-6``).
        success_threshold: a rollout is a success when its reward ``> success_threshold``
            (default 0.5; binary rewards).
        log_prefix: prefix of the logged metric names (default ``"geometry/"``).
        keep_groups: write per-group records (weights, norms, singular values) to the JSONL
            (default True).
        strict: raise instead of warning when an option breaks the per-rollout structure
            (default False).
    """

    geometry_every: int = 1
    jsonl_path: str | None = None
    gram_method: str = "exact"
    rtol: float = DEFAULT_RTOL
    success_threshold: float = 0.5
    log_prefix: str = "geometry/"
    keep_groups: bool = True
    strict: bool = False

    def __post_init__(self) -> None:
        if int(self.geometry_every) < 1:
            raise ValueError(f"geometry_every must be >= 1, got {self.geometry_every}")
        if self.gram_method not in ("exact", "naive"):
            raise ValueError(f"gram_method must be 'exact' or 'naive', got {self.gram_method!r}")
        if not self.rtol > 0:
            raise ValueError(f"rtol must be > 0, got {self.rtol}")


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
    """Row weights ``c_i`` of TRL's loss: the optimizer's gradient is ``-sum c_i A_i psi_i``.

    The table is in the module docstring (at importance ratio 1, ``beta = 0``). The gradient is the
    one the optimizer sees: summed over ``gradient_accumulation_steps`` micro-batches and averaged
    over ``num_processes`` data-parallel replicas (DDP's all-reduce mean), summed over every
    process's rows.

    Args:
        lengths: ``[B]`` loss tokens per local row (TRL's ``completion_mask * tool_mask`` sums).
        chunk_index: ``[B]`` micro-batch (``0 .. num_chunks-1``) that TRL put each row in.
        loss_type: one of :data:`SUPPORTED_LOSS_TYPES`.
        num_chunks: ``steps_per_generation`` (micro-batches per generation batch).
        gradient_accumulation_steps: TRL's ``current_gradient_accumulation_steps``.
        num_processes: data-parallel world size ``W``.
        num_items_in_batch: ``N``, loss tokens of the generation batch over all processes
            (TRL's ``num_items_in_batch``); needed by dapo, vespo, cispo.
        max_completion_length: ``Lmax`` of dr_grpo.
        epsilon_high: TRL's ``epsilon_high`` (cispo's clip of the detached ratio).

    Returns:
        ``[B]`` float64 weights ``c_i``.

    >>> trl_row_weights([2, 4], [0, 0], loss_type="grpo", num_chunks=1,
    ...                 gradient_accumulation_steps=1, num_processes=1).tolist()
    [0.25, 0.125]
    """
    if loss_type not in TRL_LOSS_AGGREGATION:
        raise ValueError(
            f"loss_type {loss_type!r} is not supported; TRL 1.16 loss types handled: "
            f"{SUPPORTED_LOSS_TYPES}"
        )
    L = np.asarray(lengths, dtype=np.float64).reshape(-1)
    k = np.asarray(chunk_index).reshape(-1)
    if L.shape != k.shape:
        raise ValueError(f"lengths {L.shape} and chunk_index {k.shape} must have the same shape")
    GA, W, S = int(gradient_accumulation_steps), int(num_processes), int(num_chunks)
    if min(GA, W, S) < 1:
        raise ValueError("num_chunks, gradient_accumulation_steps, num_processes must be >= 1")
    if k.size and (k.min() < 0 or k.max() >= S):
        raise ValueError(f"chunk_index must lie in [0, {S}), got {k.min()}..{k.max()}")
    mode, scope = TRL_LOSS_AGGREGATION[loss_type]
    c = np.zeros_like(L)
    if scope == "generation_batch":
        if num_items_in_batch is None or not num_items_in_batch > 0:
            if num_items_in_batch is not None and L.sum() == 0:
                return c
            raise ValueError(f"loss_type {loss_type!r} needs num_items_in_batch > 0")
        # token_mean over the global generation batch (N tokens), DDP-averaged, GA/S rescaled
        # as TRL does: loss = sum / (N / W * GA / S), then the all-reduce mean divides by W.
        c[:] = S / (GA * float(num_items_in_batch))
        if loss_type == "cispo":
            eh = 1.0 if epsilon_high is None else float(epsilon_high)
            c *= min(1.0, eh)
        return c
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


def structure_issues(args: Any, *, advantages_dim: int = 1, aux_loss: bool = False) -> list[str]:
    """Options of a ``GRPOConfig`` under which TRL's gradient is NOT ``-sum_i w_i psi_i``.

    Args:
        args: the trainer's ``GRPOConfig`` (any object with its attributes).
        advantages_dim: dimension of TRL's ``advantages`` (2: token-level advantages).
        aux_loss: the trainer adds a MoE router auxiliary loss.

    Returns:
        Human-readable reasons (empty: the per-rollout structure holds at the measured step).
    """
    out = []
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    if g("loss_type") not in TRL_LOSS_AGGREGATION:
        out.append(f"loss_type={g('loss_type')!r} is not supported (known: {SUPPORTED_LOSS_TYPES})")
    if float(g("beta", 0.0) or 0.0) != 0.0:
        out.append(f"beta={g('beta')} > 0: the KL term's per-token weights are not A_i; "
                   "rows are not w_i psi_i")
    if g("use_vllm", False) and g("vllm_importance_sampling_correction", False):
        out.append("vLLM importance-sampling correction reweights tokens within rollouts")
    if float(g("top_entropy_quantile", 1.0)) < 1.0:
        out.append("top_entropy_quantile < 1 masks tokens by entropy: psi_i is over a subset")
    if float(g("entropy_coef", 0.0) or 0.0) != 0.0 or g("use_adaptive_entropy", False):
        out.append("the entropy bonus adds a gradient that is not a multiple of psi_i")
    if aux_loss:
        out.append("the MoE router auxiliary loss adds a gradient outside the rollout scores")
    if advantages_dim != 1:
        out.append("token-level advantages (advantages of shape [B, T])")
    spg, ga = g("steps_per_generation"), g("gradient_accumulation_steps", 1)
    if spg is not None and int(spg) != int(ga):
        out.append(f"steps_per_generation={spg} != gradient_accumulation_steps={ga}: the "
                   "generation batch spans several optimizer steps (later ones off-policy)")
    thr = g("off_policy_mask_threshold")
    if thr is not None and g("use_vllm", False):
        out.append("off_policy_mask_threshold with vLLM sampling log-probs can drop rollouts")
    d = g("delta")
    if d is not None and float(d) < 1.0:
        out.append(f"delta={d} < 1 clips the ratio below 1 (zero gradient at ratio 1)")
    return out


def structure_notes(args: Any) -> list[str]:
    """Options that leave the measured step exact but limit what it covers (JSONL ``notes``)."""
    out = []
    if int(getattr(args, "num_iterations", 1) or 1) > 1:
        out.append(f"num_iterations={args.num_iterations}: measured at the first inner step "
                   "(ratio 1); the later, clipped and importance-weighted inner steps are not")
    if getattr(args, "use_vllm", False) and not getattr(
        args, "vllm_importance_sampling_correction", False
    ):
        out.append("vLLM sampling without correction: samples are slightly off-policy for the "
                   "trainer's weights; the scores are the trainer's")
    if getattr(args, "bf16", False) or getattr(args, "fp16", False):
        out.append("mixed-precision autocast: TRL's gradient is of the autocast forward, K of the "
                   "model's own precision (they agree to that precision only)")
    return out


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


def rows_gram(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    loss_mask: Any,
    prompt_width: int,
    *,
    temperature: float = 1.0,
    method: str = "exact",
) -> Any:
    """``K [n, n]`` (float64 numpy) of any ``n`` rows of TRL's batch, scored as TRL scores them.

    ``input_ids``/``attention_mask`` are TRL's ``[n, P + C]`` prompt + completion rows (prompt
    left-padded, completion right-padded), ``loss_mask`` ``[n, C]`` TRL's completion loss mask.
    Columns that are padding in every row are dropped; position ids are those TRL's
    forward uses (the model's default ``0 .. P+C-1`` of the full width), so the scores are
    TRL's exactly.
    """
    import torch

    from .gram import trajectory_gram

    ids, am = input_ids, attention_mask
    m = torch.zeros_like(am, dtype=torch.float32)
    m[:, prompt_width:] = loss_mask.to(torch.float32)
    live = am.bool().any(dim=0).nonzero().reshape(-1)
    c0, c1 = int(live[0]), int(live[-1]) + 1
    pos = torch.arange(c0, c1, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
    net = model if temperature == 1.0 else TemperatureScaled(model, temperature)
    K = trajectory_gram(
        net, ids[:, c0:c1], am[:, c0:c1], m[:, c0:c1], method=method, position_ids=pos
    )
    return K.detach().cpu().double().numpy()


def _make_trainer_class() -> Any:
    import torch
    from accelerate.utils import gather_object
    from trl import GRPOTrainer as base

    class GeometryGRPOTrainer(base):  # type: ignore[misc, valid-type]
        """``trl.GRPOTrainer`` that measures the exact per-group gradient geometry.

        Pass ``geometry=GeometryConfig(...)`` (default: every step) besides the usual
        ``GRPOTrainer`` arguments. Hooks (all call the parent unchanged):

        * ``_calculate_rewards``: keeps TRL's gathered per-function rewards of the batch;
        * ``_generate_and_score_completions``: keeps the step's generation batch in TRL's group
          order and tags each row with its index;
        * ``_prepare_inputs``: after TRL shuffled and split the batch into micro-batches, reads
          which micro-batch holds each row (the row weights of bnpo/grpo/dr_grpo depend on it),
          computes the geometry at the current weights (before any update of the step), and
          removes the row tag.

        ``self.geometry_records`` keeps the per-step records of this process (the JSONL on the
        main process holds the gathered ones).
        """

        def __init__(self, *args: Any, geometry: GeometryConfig | None = None, **kw: Any):
            super().__init__(*args, **kw)
            self.geometry = geometry or GeometryConfig()
            self.geometry_records: list[dict[str, Any]] = []
            self._geo_rewards: Any = None
            self._geo_pending: dict[str, Any] | None = None
            self._geo_warned = False
            self.geometry_last: dict[str, Any] | None = None
            p = self.geometry.jsonl_path
            self._geo_path = Path(p) if p else Path(self.args.output_dir) / "geometry.jsonl"

        # -- hooks -------------------------------------------------------------------------
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._geo_rewards = out
            return out

        def _geometry_due(self) -> bool:
            return bool(self.model.training) and (
                self.state.global_step % self.geometry.geometry_every == 0
            )

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if not self._geometry_due():
                self._geo_rewards = None
                return out
            B = out["completion_ids"].shape[0]
            rw = self._geo_rewards
            self._geo_rewards = None
            if rw is None:  # a subclass scored without _calculate_rewards: nothing to measure
                warnings.warn("geometry: TRL's rewards were not seen (_calculate_rewards was "
                              "not called); this step is not measured", stacklevel=2)
                return out
            weights = self.reward_weights.to(rw.device).unsqueeze(0)
            rewards = (rw * weights).nansum(dim=1)
            rewards[torch.isnan(rw).all(dim=1)] = torch.nan
            pi = self.accelerator.process_index
            rewards = rewards[pi * B : (pi + 1) * B]
            keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                    "advantages", "tool_mask")
            self._geo_pending = {
                **{k: out[k] for k in keys if k in out},
                "rewards": rewards.detach().cpu(),
                "num_items_in_batch": float(out["num_items_in_batch"]),
            }
            out["geometry_row"] = torch.arange(B, device=out["completion_ids"].device)
            return out

        def _prepare_inputs(self, generation_batch):
            inputs = super()._prepare_inputs(generation_batch)
            pend, self._geo_pending = self._geo_pending, None
            if pend is not None and self.model.training:
                chunks = self._buffered_inputs
                B = pend["completion_ids"].shape[0]
                chunk_of = np.full(B, -1, dtype=np.int64)
                for j, ch in enumerate(chunks):
                    rows = ch.pop("geometry_row", None)
                    if rows is not None:
                        chunk_of[rows.cpu().numpy()] = j
                if (chunk_of < 0).any():
                    raise RuntimeError("geometry: a row of the generation batch is in no chunk")
                self._measure(pend, chunk_of, len(chunks))
            inputs.pop("geometry_row", None)
            return inputs

        # -- measurement -------------------------------------------------------------------
        def _measure(self, pend: dict[str, Any], chunk_of: np.ndarray, num_chunks: int) -> None:
            import time

            t0 = time.perf_counter()
            G = int(self.num_generations)
            cm = pend["completion_mask"]
            lm = cm * pend["tool_mask"] if "tool_mask" in pend else cm
            A_t = pend["advantages"]
            issues = structure_issues(self.args, advantages_dim=A_t.dim(),
                                      aux_loss=bool(getattr(self, "aux_loss_enabled", False)))
            exact = not issues
            if issues:
                msg = "geometry: gradient-matrix metrics not reported: " + "; ".join(issues)
                if self.geometry.strict:
                    raise ValueError(msg)
                if not self._geo_warned:
                    warnings.warn(msg, stacklevel=2)
                    self._geo_warned = True
            B = cm.shape[0]
            L = lm.sum(dim=1).cpu().numpy()
            A = A_t.detach().double().cpu().numpy() if A_t.dim() == 1 else np.zeros(B)
            r = pend["rewards"].double().numpy()
            c = np.zeros(B)
            if exact:
                c = trl_row_weights(
                    L, chunk_of, loss_type=self.loss_type, num_chunks=num_chunks,
                    gradient_accumulation_steps=self.current_gradient_accumulation_steps,
                    num_processes=self.accelerator.num_processes,
                    num_items_in_batch=pend["num_items_in_batch"],
                    max_completion_length=self.max_completion_length,
                    epsilon_high=getattr(self, "epsilon_high", None),
                )
            pi = self.accelerator.process_index
            first = pi * B  # global index of the first local row
            model = self.accelerator.unwrap_model(self.model)
            ids = torch.cat([pend["prompt_ids"], pend["completion_ids"]], dim=1)
            am = torch.cat([pend["prompt_mask"], cm], dim=1)
            Pw = pend["prompt_ids"].shape[1]
            groups, skipped, grams = [], 0, {}
            local_sq: float | None = 0.0 if exact else None
            norm_incomplete = False
            was_training = model.training
            from trl.models.utils import disable_gradient_checkpointing

            model.eval()  # no dropout: psi_i are the deterministic scores
            try:
                with disable_gradient_checkpointing(
                    model, self.args.gradient_checkpointing_kwargs
                ):
                    # groups are G consecutive rows of the GLOBAL batch; a process holds those
                    # whose rows are all local (others are split across processes: skipped)
                    g0 = -(-first // G)
                    g1 = (first + B) // G
                    skipped = len({i // G for i in range(first, first + B)}) - max(0, g1 - g0)
                    mixed_rows: list[np.ndarray] = []
                    mixed_ids: list[int] = []
                    for g in range(g0, g1):
                        rows = np.arange(g * G - first, (g + 1) * G - first)
                        if np.isnan(r[rows]).any() or (L[rows] == 0).any():
                            # unscorable rewards, or a row with no loss token (psi_i = 0,
                            # e.g. mask_truncated_completions): counted as skipped
                            skipped += 1
                            if np.any(A[rows] != 0):
                                # its other rows are in TRL's gradient but not in our Gram:
                                # the local norm would be too small, so none is reported
                                norm_incomplete = True
                            continue
                        succ = r[rows] > self.geometry.success_threshold
                        if not np.any(A[rows] != 0):
                            # all advantages 0 (one reward level, group-centred): G = 0, the
                            # group adds nothing to the gradient; no Gram is computed for it
                            groups.append({
                                "group": int(g), "process": int(pi), "R": G,
                                "mixed": bool(succ.any() and not succ.all()),
                                "num_success": int(succ.sum()), "rewards": r[rows].tolist(),
                                "lengths": [int(x) for x in L[rows]],
                                "advantages": A[rows].tolist(),
                                **({"row_weights": c[rows].tolist()} if exact else {}),
                            })
                            continue
                        mixed_rows.append(rows)
                        mixed_ids.append(int(g))
                    if mixed_rows:
                        # ONE forward + backward over every mixed group of this process: the
                        # diagonal blocks are the groups' Grams, the rest gives ||local grad||
                        sel = np.concatenate(mixed_rows)
                        K_all = rows_gram(
                            model, ids[sel], am[sel], lm[sel], Pw,
                            temperature=float(self.temperature),
                            method=self.geometry.gram_method,
                        )
                        if exact:
                            wl = A[sel] * c[sel]
                            local_sq = float(max(wl @ K_all @ wl, 0.0))
                        for k, (g, rows) in enumerate(zip(mixed_ids, mixed_rows, strict=True)):
                            K = K_all[k * G : (k + 1) * G, k * G : (k + 1) * G]
                            rec = group_records(
                                K, r[rows], A[rows], c[rows], L[rows],
                                rtol=self.geometry.rtol,
                                success_threshold=self.geometry.success_threshold,
                                exact_structure=exact,
                            )
                            grams[g] = K
                            rec["group"] = g
                            rec["process"] = int(pi)
                            groups.append(rec)
            finally:
                model.train(was_training)
            local_time = time.perf_counter() - t0
            # the latest measured batch of this process, for inspection and tests
            self.geometry_last = {"batch": pend, "chunk_of": chunk_of, "c": c, "advantages": A,
                                  "lengths": L, "grams": grams, "first_row": first}
            all_groups = gather_object(groups)
            all_times = gather_object([local_time])
            all_skipped = gather_object([skipped])
            if norm_incomplete:
                local_sq = None
            all_sq = gather_object([local_sq])
            agg = aggregate_groups(all_groups)
            step = int(self.state.global_step)
            record = {
                "step": step,
                "num_processes": int(self.accelerator.num_processes),
                "loss_type": self.loss_type,
                "scale_rewards": getattr(self, "scale_rewards", None),
                "aggregation": TRL_LOSS_AGGREGATION.get(self.loss_type, (None, None))[0],
                "num_generations": G,
                "num_iterations": int(getattr(self, "num_iterations", 1)),
                "exact_structure": exact,
                "issues": issues,
                "notes": structure_notes(self.args),
                "groups_skipped": int(sum(all_skipped)),
                # ||-sum_i w_i psi_i||^2 over each process's rows (= ||TRL grad||^2 before
                # clipping when there is one process)
                "grad_norm_per_process": [None if x is None else math.sqrt(x) for x in all_sq],
                **agg,
                "geometry_time_s": float(max(all_times)),
            }
            if self.geometry.keep_groups:
                record["group_records"] = all_groups
            self.geometry_records.append(record)
            pre = self.geometry.log_prefix
            buf = self._metrics["train"]
            buf[pre + "mixed_groups"].append(float(agg["mixed_groups"]))
            buf[pre + "groups"].append(float(agg["groups"]))
            buf[pre + "exact_structure"].append(float(exact))
            buf[pre + "time_s"].append(float(max(all_times)))
            for name, st in agg["metrics"].items():
                if st["mean"] is not None:
                    buf[f"{pre}{name}/mean"].append(st["mean"])
                    if st["sd"] is not None:
                        buf[f"{pre}{name}/sd"].append(st["sd"])
            if self.accelerator.is_main_process:
                from ._io import append_jsonl

                self._geo_path.parent.mkdir(parents=True, exist_ok=True)
                append_jsonl(self._geo_path, record)

    return GeometryGRPOTrainer


_CACHE: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``GeometryGRPOTrainer`` is built on first access (imports trl only then)."""
    if name == "GeometryGRPOTrainer":
        if name not in _CACHE:
            _CACHE[name] = _make_trainer_class()
        return _CACHE[name]
    raise AttributeError(name)


def config_dict(cfg: GeometryConfig) -> dict[str, Any]:
    """JSON-ready dict of a :class:`GeometryConfig`."""
    return asdict(cfg)
