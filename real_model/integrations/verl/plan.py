"""Where verl's groups are measured, and the second passes that measure the spread ones.

From every rank's rows (gathered), :class:`Plan` decides identically on every rank which groups
were captured in-run (all rows in one micro-batch of one rank) and which are measured by a
second pass on the rank owning most of their rows (:func:`run_pass`: ``trajectory_gram`` on
verl's FSDP module with the rows' per-token loss gradient ``u`` as token weights, or unit
weights on the response for the score Gram); every rank runs the same number of passes (dummy
ones where it has none: FSDP's forwards are collective). :func:`rows_of_batch` reads verl's
packed batch; :func:`metrics_for_verl` turns a step's aggregate into verl's engine metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...gram import EngineOptions, model_device, trajectory_gram

__all__ = ["ROW_KEY", "ROW_SHIFT", "Row", "Plan", "rows_of_batch", "jagged_values", "row_meta",
           "pass_row", "run_pass", "dummy_pass", "autocast", "row_gram", "metrics_for_verl"]


ROW_KEY = "grpo_geometry_row"  # per-row int64 key added to verl's batch during a measured step


ROW_SHIFT = 32  # row key = rank << ROW_SHIFT | local index


@dataclass
class Row:
    """What the geometry keeps of one local row of verl's batch: its ``tokens`` are
    ``ids_all[start:stop]`` of the packed batch (:attr:`ids`, :attr:`pos`: copied on use, by
    the second passes only)."""

    key: int
    uid: str
    reward: float | None
    advantage: float
    adv_varies: bool
    length: int
    tokens: int
    packed: tuple[torch.Tensor, torch.Tensor, int] = field(repr=False)  # ids, pos, start
    mb: int = -1
    u_span: tuple[torch.Tensor, int, int, float] | None = field(default=None, repr=False)

    @property
    def u(self) -> torch.Tensor | None:
        """``dL/dlogp`` of the row's tokens, float64, scaled for the data-parallel average
        (formed on use, by the second passes only)."""
        if self.u_span is None:
            return None
        g, a, b, scale = self.u_span
        return g[a:b].detach().cpu().double() * scale

    @property
    def ids(self) -> torch.Tensor:
        ids, _, start = self.packed
        return ids[start:start + self.tokens].detach().cpu()

    @property
    def pos(self) -> torch.Tensor:
        _, pos, start = self.packed
        return pos[start:start + self.tokens].detach().cpu()


def row_gram(plan: Plan, grams: Mapping[tuple[str, str], np.ndarray],
              uid: str) -> np.ndarray | None:
    """Group ``uid``'s Gram of the gradient rows: in-run, or from its second pass."""
    return plan.inrun.get(uid) if plan.path[uid] == "in_run" else grams.get(("grad", uid))


# ---------------------------------------------------------------------------------------------
class Plan:
    """Where each group is measured, decided identically on every rank from the gathered rows.

    ``path[uid]``: ``"in_run"`` (all rows in one micro-batch of one rank, Gram captured),
    ``"second_pass"`` (rows spread: gathered to the owner, the rank with most of them, ties
    broken round robin in group order) or ``"unsupported"`` (spread and an entropy bonus in the
    loss). ``passes[rank]``: that rank's second passes ``(kind, [uids])``, kind ``"grad"``
    (weights ``u``) or ``"score"`` (unit weights on response tokens), at most ``max_rows`` rows
    each (whole groups).
    """

    def __init__(self, everyone: list[dict], world: int, *, score: bool, max_rows: int) -> None:
        self.world = world
        rows = [r for x in everyone for r in x["summary"]["rows"]]
        entropy = any(x["summary"]["entropy"] for x in everyone)
        temps = {r["temperature"] for r in rows}
        if len(temps) > 1:
            raise ValueError(f"rows with different temperatures {sorted(temps)}: not supported")
        self.temperature = temps.pop() if temps else 1.0
        self.groups: dict[str, list[dict]] = {}
        for r in sorted(rows, key=lambda r: r["key"]):
            self.groups.setdefault(r["uid"], []).append(r)
        inrun = {k: v for x in everyone for k, v in x["summary"]["inrun"].items()}
        self.inrun: dict[str, np.ndarray] = {}
        self.path: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.owner: dict[str, int] = {}
        for g, (uid, rs) in enumerate(self.groups.items()):
            places = {(r["rank"], r["mb"]) for r in rs}
            counts = np.bincount([r["rank"] for r in rs], minlength=world)
            most = np.flatnonzero(counts == counts.max())
            self.owner[uid] = int(most[g % most.size])  # ties: round robin in group order
            if len(places) == 1:
                self.path[uid] = "in_run"
                self.inrun[uid] = inrun[(uid, *places.pop())]
            elif entropy:
                self.path[uid] = "unsupported"
                self.reason[uid] = ("rows spread over micro-batches/ranks and an entropy bonus "
                                    "in the loss: the second pass sees only the log-prob terms")
            else:
                self.path[uid] = "second_pass"
        self.passes: list[list[tuple[str, list[str]]]] = [[] for _ in range(world)]
        for kind in ("grad", "score"):
            todo = [u for u in self.groups if (self.path[u] == "second_pass" if kind == "grad"
                                               else score)]
            for rank in range(world):
                self.passes[rank] += _chunks(kind, [u for u in todo if self.owner[u] == rank],
                                             self.groups, max_rows)
        self.n_passes = max(len(p) for p in self.passes)
        self.moved: dict[int, list[int]] = {}
        for rank in range(world):
            for _kind, uids in self.passes[rank]:
                for u in uids:
                    for r in self.groups[u]:
                        if r["rank"] != rank and r["key"] not in self.moved.get(r["rank"], []):
                            self.moved.setdefault(r["rank"], []).append(r["key"])

    def rows_needed_by(self, rank: int) -> list[int]:
        return [r["key"] for _, uids in self.passes[rank] for u in uids for r in self.groups[u]]

    def layout(self) -> dict[str, int]:
        paths = list(self.path.values())
        return {"groups": len(paths), "in_run_groups": paths.count("in_run"),
                "second_pass_groups": paths.count("second_pass"),
                "unsupported_groups": paths.count("unsupported"),
                "second_passes": self.n_passes,
                "moved_rows": sum(len(v) for v in self.moved.values())}


def _chunks(kind: str, uids: list[str], groups: dict[str, list], max_rows: int
            ) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    cur: list[str] = []
    n = 0
    for u in uids:
        k = len(groups[u])
        if cur and n + k > max_rows:
            out.append((kind, cur))
            cur, n = [], 0
        cur.append(u)
        n += k
    if cur:
        out.append((kind, cur))
    return out


# ---------------------------------------------------------------------------------------------
def rows_of_batch(data: Any, uids: list[str], rank: int) -> list[Row]:
    """The local rows of verl's (no-padding) batch: ids, positions, rewards, advantages."""
    from verl.utils import tensordict_utils as tu

    ids = data["input_ids"]
    pos = data["position_ids"]
    if pos.dim() == 3:
        raise ValueError("3-D (mRoPE) position ids are not supported by the geometry")
    rm = data["response_mask"].to(torch.float64)
    adv = data["advantages"].to(torch.float64)
    scores = data.get("token_level_scores", None)
    if scores is None:
        scores = data.get("token_level_rewards", None)
    temperature = tu.get_non_tensor_data(data, "temperature", 1.0)
    if isinstance(temperature, torch.Tensor):
        t = torch.unique(temperature.reshape(-1))
        if t.numel() != 1:
            raise ValueError("per-row temperatures are not supported by the geometry")
        temperature = float(t)
    lens = rm.sum(-1)
    a_mean = (adv * rm).sum(-1) / lens.clamp(min=1)
    varies = ((adv - a_mean[:, None]).abs() * rm).amax(-1) > 1e-6 * a_mean.abs().clamp(min=1)
    # per-row values as Python numbers in one conversion each (not one per row)
    rewards = (None if scores is None else scores.to(torch.float64).sum(-1).tolist())
    a_list, v_list, l_list = a_mean.tolist(), varies.tolist(), lens.to(torch.int64).tolist()
    out = []
    bounds = ids.offsets().tolist()  # the rows' tokens in the packed values (not unbound here)
    if pos.offsets().tolist() != bounds:
        raise ValueError("verl's position ids and input ids have different row lengths")
    values = tuple(t.values() if (v := jagged_values(t)) is None else v for t in (ids, pos))
    for i in range(len(bounds) - 1):
        r = Row(key=(rank << ROW_SHIFT) | i, uid=uids[i],
                 reward=None if rewards is None else float(rewards[i]),
                 advantage=float(a_list[i]), adv_varies=bool(v_list[i]), length=int(l_list[i]),
                 tokens=bounds[i + 1] - bounds[i], packed=(*values, bounds[i]))
        r.temperature = float(temperature)  # type: ignore[attr-defined]
        out.append(r)
    return out


def jagged_values(t: torch.Tensor) -> torch.Tensor | None:
    """A jagged nested tensor's packed values, its ``_values`` (the plain tensor ``values()``
    views, without that view's dispatch through the nested tensor: ~0.1 ms), or ``None`` when
    ``t`` has none (a strided nested tensor, a plain tensor)."""
    v = getattr(t, "_values", None)
    return v if isinstance(v, torch.Tensor) and not v.is_nested else None


def row_meta(r: Row, rank: int) -> dict[str, Any]:
    return {"key": r.key, "uid": r.uid, "rank": rank, "mb": r.mb, "reward": r.reward,
            "advantage": r.advantage, "adv_varies": r.adv_varies, "length": r.length,
            "temperature": r.temperature}  # type: ignore[attr-defined]


def pass_row(r: Row) -> dict[str, Any]:
    """A row's second-pass inputs in trajectory alignment: ``w[t]`` weights ``log pi(ids[t]|<t)``.

    verl's log-prob at position ``t`` scores token ``t + 1``, so ``w_grad[t + 1] = u[t]``; the
    score weights are 1 on the row's last ``length`` (response) tokens.
    """
    ids = r.ids
    L = ids.numel()
    w_grad = torch.zeros(L, dtype=torch.float64)
    u = r.u
    if u is not None:
        w_grad[1:] = u[:-1]
    w_score = torch.zeros(L, dtype=torch.float64)
    w_score[L - r.length:] = 1.0
    return {"ids": ids, "pos": r.pos, "grad": w_grad, "score": w_score}


def run_pass(model: torch.nn.Module, kind: str, uids: list[str], plan: Plan,
             inputs: dict[int, dict[str, Any]], options: EngineOptions | None = None
             ) -> dict[tuple[str, str], np.ndarray]:
    """One second pass over whole groups: ``trajectory_gram`` with the ``kind`` weights."""
    keys = [r["key"] for u in uids for r in plan.groups[u]]
    rows = [inputs[k] for k in keys]
    T = max(x["ids"].numel() for x in rows)
    n = len(rows)
    ids = torch.zeros(n, T, dtype=torch.long)
    pos = torch.zeros(n, T, dtype=torch.long)
    am = torch.zeros(n, T, dtype=torch.long)
    w = torch.zeros(n, T, dtype=torch.float64)
    for i, x in enumerate(rows):
        L = x["ids"].numel()
        ids[i, :L], pos[i, :L], am[i, :L], w[i, :L] = x["ids"], x["pos"], 1, x[kind]
    dev = model_device(model)
    K = trajectory_gram(model, ids.to(dev), am.to(dev), w.to(dev), position_ids=pos.to(dev),
                        engine=options)
    K = K.detach().cpu().double().numpy()
    out, start = {}, 0
    for u in uids:
        k = len(plan.groups[u])
        out[(kind, u)] = K[start:start + k, start:start + k]
        start += k
    return out


def dummy_pass(model: torch.nn.Module) -> None:
    """A pass with zero weights: the same FSDP collectives as a real one, no result."""
    dev = model_device(model)
    ids = torch.ones(1, 2, dtype=torch.long, device=dev)
    trajectory_gram(model, ids, torch.ones_like(ids), torch.zeros(1, 2, device=dev),
                    position_ids=torch.arange(2, device=dev)[None])


def autocast(engine: Any) -> Any:
    import contextlib

    dtype = getattr(engine, "_autocast_dtype", torch.float32)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=model_device(engine.module).type, dtype=dtype)


# ---------------------------------------------------------------------------------------------
def metrics_for_verl(aggregate: Mapping[str, Any], layout: Mapping[str, int],
                     seconds: Mapping[str, float], *, prefix: str = "geometry/"
                     ) -> dict[str, list[float]]:
    """The step's aggregates as verl's engine metrics: ``{"<prefix><metric>/<stat>": [value]}``
    (``prefix``: the config's ``log_prefix``).

    Values are one-element lists, as verl's micro-batch metrics are (its worker all-gathers them
    over ranks and flattens the lists; the trainer averages: every rank sends the same values,
    but for the timings ``seconds_*`` of a step without second passes: each rank's own).
    Only finite numbers are sent.
    """
    out: dict[str, list[float]] = {prefix + "failed": [0.0]}
    for name, st in aggregate["metrics"].items():
        for stat in ("mean", "sd", "min", "max"):
            v = st.get(stat)
            if v is not None and math.isfinite(v):
                out[f"{prefix}{name}/{stat}"] = [float(v)]
    out[prefix + "mixed_groups"] = [float(aggregate["mixed_groups"])]
    for k, v in layout.items():
        out[f"{prefix}{k}"] = [float(v)]
    for k, v in seconds.items():
        out[f"{prefix}seconds_{k}"] = [float(v)]
    return out
