"""Shared helpers of the verl geometry tests (in-process and ``torchrun`` script).

The reference rows are computed independently of the geometry's capture: a plain Hugging Face
copy of the engine's weights (``DTensor.full_tensor()``) in float64, one backward per rollout of
``sum_t u_it log pi(y_it | y_i,<t)`` with ``u`` the per-token loss gradient the adapter captured
from verl's own loss. Their sum must be the gradient verl's engine produced, and their Gram the
geometry's Gram.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from framework_checks.verl import LOSSES as VERL_LOSSES

# every policy loss / aggregation mode `grpo-audit frameworks --framework verl` knows (its one
# list of verl's loss settings: framework_checks.verl.LOSSES)
AGG_MODES = tuple(sorted({mode for mode, _ in VERL_LOSSES.values()}))
AUDITED_POLICY_LOSSES = tuple(sorted({policy for _, policy in VERL_LOSSES.values()}))
REWARDS = [[1, 0, 0, 1], [0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 0]]  # 4 groups of 4, all mixed
INTERLEAVED = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]  # every 2 rows: 2 groups
# bf16 steps (verl's mixed precision), relative errors against the float64 rows:
BF16_ENGINE_RTOL = 5e-2  # verl's own bf16 gradient (8 mantissa bits: 2^-8 = 0.4% per product)
BF16_GRAM_FACTOR = 4.0  # Gram <= factor * verl's error + 1e-3 (a Gram doubles its rows' error)
BF16_ROWS_GRAD_RTOL = 2.0**-7  # rows path vs verl's dW: each rounded to bf16 once (2 half-ulps)


def full_params(engine: Any) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
            for n, p in engine.module.named_parameters()}


def reference_model(model_path: Any, params: dict[str, torch.Tensor], *,
                    peft_config: Any = None) -> torch.nn.Module:
    """A float64 Hugging Face copy of the engine's current weights; with ``peft_config`` (the
    engine's ``module.peft_config["default"]``, verl's LoRA) the same PEFT wrapping, adapters
    trainable and the base frozen, as the engine's."""
    import copy

    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_path), attn_implementation="eager",
                                             dtype=torch.float64)
    if peft_config is not None:
        from peft import get_peft_model

        m = get_peft_model(m, copy.deepcopy(peft_config))
    missing, unexpected = m.load_state_dict({k: v.double() for k, v in params.items()},
                                            strict=False)
    tied = getattr(m.config, "tie_word_embeddings", False)
    head = [k for k in missing if k.endswith("lm_head.weight")]
    assert not unexpected and missing == (head if tied else []), (missing, unexpected)
    if tied:
        m.tie_weights()
    return m


def reference_rows(model: torch.nn.Module, rows: dict[int, Any],
                   temperature: float = 1.0) -> dict[int, np.ndarray]:
    """``{row key: flat float64 gradient of sum_t u_t log pi(ids[t+1] | ids[<=t])}``.

    verl's log-prob at position ``t`` scores token ``t + 1``; ``u`` is the adapter's captured
    per-token loss gradient (already divided by the data-parallel size).
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    out = {}
    for key, r in rows.items():
        ids, pos, u = r.ids[None], r.pos[None], r.u.double()
        logits = model(input_ids=ids, position_ids=pos).logits[0, :-1] / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, r.ids[1:, None])[:, 0]
        loss = (u[:-1] * lp).sum()
        grads = torch.autograd.grad(loss, [dict(model.named_parameters())[n] for n in names],
                                    allow_unused=True)
        out[key] = torch.cat([
            (g if g is not None else torch.zeros_like(p)).reshape(-1)
            for g, p in zip(grads, [dict(model.named_parameters())[n] for n in names],
                            strict=True)]).numpy()
    return out


def flat_grad(grads: dict[str, torch.Tensor], names: list[str]) -> np.ndarray:
    return torch.cat([grads[n].reshape(-1) for n in names]).numpy()


def rel_err(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(float(np.abs(b).max()), 1e-300)
    return float(np.abs(a - b).max() / scale)


def measured_step(engine: Any, data: Any, loss_fn: Any) -> tuple[dict, dict]:
    """One measured forward/backward (no optimizer step): ``(full grads, engine output)``."""
    from real_model.integrations.verl.cpu import full_grads

    with engine.train_mode(zero_grad_on_exit=False):
        engine.optimizer_zero_grad()
        out = engine.forward_backward_batch(data, loss_fn)
        grads = full_grads(engine)
        engine.optimizer_zero_grad()
    return grads, out


def check_step(engine: Any, model_path: Any, data: Any, loss_fn: Any, *,
               with_grad: bool = False) -> dict[str, Any]:
    """Run one measured step and compare it with the independent reference (this rank's view).

    Returns ``{"sum_err": ..., "gram_err": {uid: ...}, "grams": {uid: K}, "paths": {uid: path},
    "metrics": engine metrics}``; ``sum_err`` compares the sum of ALL ranks' reference rows
    with the engine's full gradient. ``with_grad``: also ``"engine_grad"`` (that gradient, flat
    float64 numpy) and ``"names"`` (its parameters' order).
    """
    import torch.distributed as dist

    grads, out = measured_step(engine, data, loss_fn)
    geo = engine.geometry
    rec = geo.last_record
    if rec is None or rec.get("failed"):
        return {"failed": None if rec is None else rec.get("failed"), "metrics": out["metrics"]}
    params = full_params(engine)
    peft = getattr(engine.module, "peft_config", None)
    ref = reference_model(model_path, params, peft_config=None if peft is None else
                          peft["default"])
    names = [n for n, p in ref.named_parameters() if p.requires_grad]
    mine = reference_rows(ref, geo.measured.rows)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    rows = {k: v for part in everyone for k, v in part.items()}
    total = np.sum(list(rows.values()), axis=0)
    engine_grad = flat_grad(grads, names)
    res: dict[str, Any] = {"sum_err": rel_err(total, engine_grad), "gram_err": {}, "grams": {},
                           "paths": {}, "metrics": out["metrics"]}
    if with_grad:
        res.update(engine_grad=engine_grad, names=names)
    for g in rec["groups"]:
        keys = g["keys"]
        G = np.stack([rows[k] for k in keys])
        K = np.asarray(g["gram"])
        res["gram_err"][g["uid"]] = rel_err(K, G @ G.T)
        res["grams"][g["uid"]] = K.tolist()
        res["paths"][g["uid"]] = g["path"]
    return res

