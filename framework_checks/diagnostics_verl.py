"""verl's ``variance_proxy/*`` metrics, run from verl's own code, against the exact quantities.

verl 0.9.1 logs, with ``actor.calculate_sum_pi_squared=True``,
``compute_variance_proxy_metrics`` (``verl/trainer/ppo/metric_utils.py``): for sequences
``i = 1..N`` with per-sequence advantage ``Abar_i`` (the masked mean of its token advantages),

* ``proxy1_signal_strength = grad_norm^2`` (the actor's gradient norm of the step's loss),
  standing for ``|gbar|^2``, the squared norm of the mean per-sequence gradient
  ``gbar = (1/N) sum_i g_i``, ``g_i = Abar_i grad_theta log pi(tau_i)``;
* ``proxy2_total_power = mean_i Abar_i^2 W_i``, ``W_i = sum_t (1 - 2 pi_t(y_t) + sum_v pi_v^2)``
  (verl's ``sum_pi_squared``), standing for ``E|g_i|^2 = mean_i |g_i|^2``. ``W_i`` is
  ``sum_t |e_{y_t} - pi_t|^2``: the squared norm of the per-token *logit* gradients, summed. It
  equals ``|grad_theta log pi(tau_i)|^2`` when every token position has its own logits as
  parameters, and drops the Jacobian of the logits in the parameters and the cross-token terms
  ``2 sum_{s < t} <J_s^T (e - pi_s), J_t^T (e - pi_t)>`` otherwise;
* ``proxy3_pure_noise = max(0, (proxy2 - proxy1) / (N - 1))``, standing for
  ``(mean_i |g_i|^2 - |gbar|^2) / (N - 1) = tr(Sigma_seq) / N``, the variance of the mean vector
  with sequences as the units; users read ``proxy1 / proxy3`` as the SNR (verl issue 5842).

Here both sides are computed on one batch of tiny float64 policies (sequences sampled from the
policy, binary rewards, verl's own GRPO advantages, verl's own policy loss and ``agg_loss`` for
``grad_norm``, one mini-batch per step): the exact side from per-sequence gradients by autograd
(no Gram engine), their Gram ``K_ij = <g_i, g_j>``. Policies (:data:`WORLDS`): ``tabular`` (a
logit vector per position: ``W`` is exact there) and small networks of width 4 and 32 (shared
embeddings and head: the Jacobian and cross-token terms matter); two aggregations:
``token-mean`` (verl's default) and ``seq-mean-token-sum`` (whose loss gradient is ``-gbar``).
For comparison, the SNR with prompts (groups) as the units
(:func:`grpo_theory.diagnostics.step_diagnostics`) on the same rows.
"""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np

from grpo_theory.diagnostics import step_diagnostics

from .extract import exec_defs
from .source import SourceTree
from .verl import ACTOR_DEFAULTS, ActorConfig, VerlCode

__all__ = ["METRIC_FILE", "WORLDS", "MODES", "load_variance_proxy", "audit_variance_proxy"]

METRIC_FILE = "verl/trainer/ppo/metric_utils.py"
#: The policies: ``tabular`` (no width), and networks of hidden width ``D``.
WORLDS: dict[str, int] = {"tabular": 0, "neural D=4": 4, "neural D=32": 32}
MODES = ("token-mean", "seq-mean-token-sum")
#: Batch of the audit: prompts x rollouts, vocabulary, longest response.
P, R, V, T = 8, 4, 6, 5
#: Successes per group (shuffled within the group): two dead groups (all or none solved).
SOLVED = (4, 0, 1, 2, 3, 1, 2, 3)


class VerlBatch:
    """Stands in for ``verl.DataProto``: the metric reads ``batch.batch[key]`` only."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self.batch = tensors


def load_variance_proxy(tree: SourceTree) -> tuple[Any, Any]:
    """verl's ``compute_variance_proxy_metrics`` and ``calculate_sum_pi_squared_from_logits``,
    executed from its source with ``verl_F`` = its own ``torch_functional`` helpers."""
    import torch

    tf = types.ModuleType("verl.utils.torch_functional")
    tf.__dict__["torch"] = torch
    exec_defs(tree.text("verl/utils/torch_functional.py"),
              ["masked_sum", "masked_mean", "calculate_sum_pi_squared_from_logits"], tf.__dict__)
    ns: dict[str, Any] = {"torch": torch, "verl_F": tf, "DataProto": VerlBatch}
    fns = exec_defs(tree.text(METRIC_FILE), ["compute_variance_proxy_metrics"], ns)
    return fns["compute_variance_proxy_metrics"], tf.calculate_sum_pi_squared_from_logits


# --- the tiny policies ----------------------------------------------------------------------------
def _policy(world: str, gen: Any) -> tuple[list[Any], Any]:
    """``(params, logits_fn)``: ``logits_fn(prompt [B], prev [B, T]) -> [B, T, V]``."""
    import torch

    def rnd(*shape: int, scale: float = 1.0) -> Any:
        x = scale * torch.randn(*shape, generator=gen, dtype=torch.float64)
        return x.requires_grad_(True)

    if world == "tabular":  # a logit vector per position, shared by the prompts
        table = rnd(T, V)
        return [table], lambda p, prev: table.expand(len(p), T, V)
    D = WORLDS[world]
    emb, prompt = rnd(V + 1, D), rnd(P, D)
    mix, head = rnd(D, D, scale=D**-0.5), rnd(D, V, scale=D**-0.5)

    def logits(p: Any, prev: Any) -> Any:
        h = torch.tanh((emb[prev] + prompt[p][:, None, :]) @ mix)
        return h @ head

    return [emb, prompt, mix, head], logits


def _sample(logits_fn: Any, gen: Any) -> tuple[Any, Any, Any]:
    """On-policy sequences: prompts ``[N]``, previous tokens ``[N, T]`` (``V`` = start),
    responses ``[N, T]``."""
    import torch

    p = torch.arange(P).repeat_interleave(R)
    prev = torch.full((P * R, T), V, dtype=torch.long)
    y = torch.zeros(P * R, T, dtype=torch.long)
    with torch.no_grad():
        for t in range(T):
            probs = torch.softmax(logits_fn(p, prev)[:, t], dim=-1)
            y[:, t] = torch.multinomial(probs, 1, generator=gen)[:, 0]
            if t + 1 < T:
                prev[:, t + 1] = y[:, t]
    return p, prev, y


def _flat_grads(value: Any, params: list[Any]) -> np.ndarray:
    """The gradient of a scalar ``value`` ``[D]``, or of each entry of a vector ``[N, D]`` (one
    batched backward)."""
    import torch

    batched = value.ndim == 1
    out = torch.eye(len(value), dtype=value.dtype) if batched else None
    grads = torch.autograd.grad(value, params, grad_outputs=out, retain_graph=True,
                                allow_unused=True, is_grads_batched=batched)
    lead = (len(value),) if batched else ()
    return torch.cat([(g if g is not None else torch.zeros(*lead, *q.shape, dtype=q.dtype))
                      .reshape(*lead, -1) for g, q in zip(grads, params, strict=True)],
                     dim=-1).detach().numpy()


def _world(code: VerlCode, sum_pi_sq: Any, world: str, seed: int) -> dict[str, Any]:
    """One sampled batch of ``world`` with verl's GRPO advantages and the exact per-sequence
    rows ``g_i = Abar_i grad log pi(tau_i)`` (shared by the aggregation modes)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    params, logits_fn = _policy(world, gen)
    p, prev, y = _sample(logits_fn, gen)
    rng = np.random.default_rng(seed)
    L = rng.integers(1, T + 1, size=P * R)
    mask = (torch.arange(T)[None, :] < torch.as_tensor(L)[:, None]).double()
    logits = logits_fn(p, prev)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, y[..., None])[..., 0]
    rewards = (np.arange(R)[None, :] < np.array(SOLVED)[:, None]).astype(float)
    rewards = rng.permuted(rewards, axis=1)
    tok = torch.zeros(P * R, T, dtype=torch.float64)
    tok[torch.arange(P * R), torch.as_tensor(L) - 1] = torch.as_tensor(rewards.reshape(-1))
    adv, _ = code.C["compute_grpo_outcome_advantage"](
        token_level_rewards=tok, response_mask=mask, index=np.repeat(np.arange(P), R))
    abar = ((adv * mask).sum(-1) / mask.sum(-1)).detach()
    rows = abar.numpy()[:, None] * _flat_grads((logp * mask).sum(-1), params)
    spsq = sum_pi_sq(logits.detach())
    W = abar**2 * ((1 - 2 * logp.detach().exp() + spsq) * mask).sum(-1)
    sq = (rows * rows).sum(axis=1)
    live = sq > 0
    N = P * R
    groups = rows.reshape(P, R, -1) / N  # rows summing to gbar, grouped by prompt
    ours = step_diagnostics(np.einsum("gid,gjd->gij", groups, groups),
                            tokens=L.reshape(P, R), rewards=rewards,
                            total_grad_norm=float(np.linalg.norm(groups.sum(axis=(0, 1)))))
    return {"params": params, "logp": logp, "mask": mask, "adv": adv, "L": L, "rows": rows,
            "sum_pi_squared": spsq, "w_over_exact": W.numpy()[live] / sq[live],
            "snr_groups": ours["noise/snr"], "snr_groups_status": ours["noise/status"]}


def _one_case(code: VerlCode, proxy: Any, wb: dict[str, Any], world: str, mode: str
              ) -> dict[str, Any]:
    """verl's proxies with ``loss_agg_mode = mode`` against the exact values of batch ``wb``."""
    logp, mask, adv, rows, L = wb["logp"], wb["mask"], wb["adv"], wb["rows"], wb["L"]
    loss_fn = code.C["get_policy_loss_fn"]("vanilla")
    loss = loss_fn(old_log_prob=logp.detach(), log_prob=logp, advantages=adv,
                   response_mask=mask, loss_agg_mode=mode,
                   config=ActorConfig(**ACTOR_DEFAULTS, global_batch_info={}))[0]
    grad = _flat_grads(loss, wb["params"])
    batch = VerlBatch({"old_log_probs": logp.detach(), "advantages": adv, "response_mask": mask,
                       "sum_pi_squared": wb["sum_pi_squared"]})
    fw = proxy(batch=batch, gradient_norm=float(np.linalg.norm(grad)))
    N = P * R
    K = rows @ rows.T
    p2 = float(np.trace(K)) / N
    p1 = float(K.sum()) / N**2
    p3 = (p2 - p1) / (N - 1)
    v1, v2, v3 = (fw[f"variance_proxy/{k}"] for k in
                  ("proxy1_signal_strength", "proxy2_total_power", "proxy3_pure_noise"))
    per_seq = wb["w_over_exact"]
    return {
        "world": world,
        "loss_agg_mode": mode,
        "sequences": N,
        "tokens": int(L.sum()),
        "verl": {"proxy1": v1, "proxy2": v2, "proxy3": v3, "snr": _ratio(v1, v3)},
        "exact": {"proxy1": p1, "proxy2": p2, "proxy3": p3, "snr": _ratio(p1, p3)},
        "ratio": {"proxy1": _ratio(v1, p1), "proxy2": _ratio(v2, p2), "proxy3": _ratio(v3, p3),
                  "snr": _ratio(_ratio(v1, v3), _ratio(p1, p3))},
        "proxy3_clamped": bool((v2 - v1) < 0),
        "token_mean_scale": (N / float(L.sum())) ** 2,
        "w_over_exact_per_sequence": {"min": float(per_seq.min()),
                                      "median": float(np.median(per_seq)),
                                      "max": float(per_seq.max())},
        "snr_groups_as_units": wb["snr_groups"],
        "snr_groups_status": wb["snr_groups_status"],
        "grad_matches_minus_gbar": bool(np.allclose(-grad, rows.sum(0) / N, rtol=1e-9,
                                                    atol=1e-12)),
    }


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return math.inf if a > 0 else (0.0 if a == 0 else -math.inf)
    return a / b


def audit_variance_proxy(tree: SourceTree, *, seed: int = 0) -> dict[str, Any]:
    """verl's variance proxies against the exact quantities on each world and aggregation."""
    code = VerlCode(tree, "float64")
    proxy, sum_pi_sq = load_variance_proxy(tree)
    cases = []
    for world in WORLDS:
        wb = _world(code, sum_pi_sq, world, seed)
        cases += [_one_case(code, proxy, wb, world, mode) for mode in MODES]
    return {"framework": "verl", "version": tree.version, "metric": "variance_proxy/*",
            "seed": seed, "cases": cases, "findings": findings(cases)}


def _by(cases: list[dict[str, Any]], world: str, mode: str) -> dict[str, Any]:
    return next(c for c in cases if c["world"] == world and c["loss_agg_mode"] == mode)


def findings(cases: list[dict[str, Any]]) -> list[str]:
    """What each proxy measures, in words; every number from ``cases``."""
    out = []
    tab = _by(cases, "tabular", "seq-mean-token-sum")
    exact = all(abs(tab["ratio"][k] - 1) <= 1e-6 for k in ("proxy1", "proxy2", "proxy3"))
    out.append(
        "Where the formula holds: on the tabular policy (the logits are the parameters) with "
        "seq-mean-token-sum (the loss gradient is minus the mean per-sequence gradient) "
        + ("all three proxies equal the exact values (ratios 1 within 1e-6; verl's masked_mean "
           "adds 1e-8 to the token count)." if exact else
           f"the ratios are {tab['ratio']['proxy1']:.3g}, {tab['ratio']['proxy2']:.3g}, "
           f"{tab['ratio']['proxy3']:.3g}: not exact even there.")
    )
    nets = [c for c in cases if c["world"] != "tabular" and c["loss_agg_mode"] == MODES[1]]
    out.append(
        "proxy2 measures logit-space power, not the gradient's: Abar^2 times the summed squared "
        "norms of the per-token logit gradients. On networks it is "
        + "; ".join(f"{c['ratio']['proxy2']:.3g} x the exact mean |g_i|^2 at {c['world']} "
                    f"(per sequence {c['w_over_exact_per_sequence']['min']:.3g} to "
                    f"{c['w_over_exact_per_sequence']['max']:.3g})" for c in nets)
        + ": it drops the Jacobian of the logits in the parameters and the cross-token terms, "
        "so it is not on the scale of proxy1, a parameter-space norm."
    )
    tm = _by(cases, "tabular", MODES[0])
    out.append(
        "proxy1 is the actor's grad_norm^2, the squared norm of the loss gradient. Under "
        f"token-mean (verl's default) that is (N / sum_i L_i)^2 = {tm['token_mean_scale']:.3g} x "
        f"the |mean per-sequence gradient|^2 the formula assumes (measured ratio "
        f"{tm['ratio']['proxy1']:.3g}); proxy3 = (proxy2 - proxy1) / (N - 1) then mixes two "
        f"scales and proxy1 / proxy3 is {tm['ratio']['snr']:.3g} x the exact SNR even on the "
        "tabular policy."
    )
    clamped = [f"{c['world']} {c['loss_agg_mode']}" for c in cases if c["proxy3_clamped"]]
    out.append(
        "proxy3 is max(0, .): when proxy2 < proxy1 it reads 0"
        + (f" (here: {', '.join(clamped)}), so proxy1 / proxy3 is infinite while the exact "
           "variance of the mean gradient is positive." if clamped
           else "; no case here hit the clamp.")
    )
    snrs = "; ".join(f"{c['world']} {c['loss_agg_mode']}: {c['ratio']['snr']:.3g}"
                     for c in cases)
    units = "; ".join(
        f"{c['world']}: {c['exact']['snr']:.3g} vs {c['snr_groups_as_units']:.3g}"
        + (" (|mu|^2 estimate <= 0: no signal shared by the prompts is detectable)"
           if c["snr_groups_status"] == 4 else "")
        for c in cases if c["loss_agg_mode"] == MODES[1])
    out.append(
        f"proxy1 / proxy3 over the exact SNR, by case: {snrs}. Units: rollouts of one prompt "
        "share its direction and its baseline, so with sequences as the units (verl's N - 1) "
        "their agreement counts as signal; with prompts as the units (grpo_theory.diagnostics "
        "noise/snr) only what prompts share does. The batch's SNR, sequences vs prompts as the "
        f"units: {units}."
    )
    return out
