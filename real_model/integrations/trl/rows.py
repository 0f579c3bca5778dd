"""The rows of a TRL step on plain tensors: what is measured, by the second pass, per group.

A step's rows (:class:`GeometryRows`: token ids, masks, positions, TRL's per-token loss gradient
``u`` as ``weights``, rewards, advantages, groups) are gathered from TRL's generation batches
(:class:`Generation`, :func:`row_payload`, :func:`assemble_rows`: across processes too) and
measured by :func:`measure_rows`: the score Gram ``K`` (unit weights on the loss mask, seed paper
Eq. 18) and the rows' Gram ``Kg`` (weights ``u``) by one exact forward + backward each
(:func:`real_model.gram.rows_gram`), or one when every row's ``u`` is a multiple of its mask
(``Kg = diag(a) K diag(a)``). Group records come from the shared protocol
(:func:`real_model.integrations.protocol.group_records`). No TRL import here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import GeometryConfig
from ..protocol import group_records

__all__ = ["Generation", "GeometryRows", "RowsMeasurement", "measure_rows", "second_pass_shape",
           "row_multiples", "group_fields", "measured_fields", "row_payload", "select_payload",
           "assemble_rows", "whole_groups_in_chunk", "group_permutation"]


@dataclass
class Generation:
    """One local generation batch of TRL (rows in TRL's group order) and its chunks."""

    index: int
    batch: dict[str, Any]
    rewards: np.ndarray
    advantages: np.ndarray
    first_row: int
    group_offset: int
    chunk_rows: list[np.ndarray] = field(default_factory=list)


# relative tolerance of "u_i is a multiple of the loss mask m_i" (one Gram pass instead of two)
PROPORTIONAL_RTOL = 1e-9


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


def row_multiples(weights: Any, mask: Any) -> tuple[np.ndarray, bool]:
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

    from ...gram import TemperatureScaled, model_device, rows_gram, trajectory_gram

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
        a, prop = row_multiples(rows.weights[sel], rows.loss_mask[sel])
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
        rec = group_fields(rows, mine, L, group_size=group_size, config=config)
        rec["has_gradient"] = int(g) in grams
        if int(g) in grams:
            Kb, Kgb, b = grams[int(g)]
            rec.update(measured_fields(rows, sel[b], Kb, Kgb, a[b] if out.proportional else None,
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
    _, prop = row_multiples(rows.weights[sel], rows.loss_mask[sel])
    return (1 if prop else 2, 1 if grad_norm else len(blocks))


def group_fields(rows: GeometryRows, mine: np.ndarray, L: np.ndarray, *, group_size: int,
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


def measured_fields(rows: GeometryRows, idx: np.ndarray, K: np.ndarray, Kg: np.ndarray,
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


def row_payload(gen: Generation, U: Any, rows: np.ndarray, group_size: int, *,
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


def select_payload(p: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    import torch

    idx = torch.as_tensor(np.nonzero(keep)[0], dtype=torch.long)
    return {k: (v[idx] if hasattr(v, "index_select") else np.asarray(v)[keep])
            for k, v in p.items() if k != "owner"}


def assemble_rows(parts: Sequence[dict[str, Any]]) -> GeometryRows:
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
