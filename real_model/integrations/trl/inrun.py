"""In-run: the Gram of a micro-batch's rows captured from TRL's own forward + backward.

:class:`InRunMicro` opens a :class:`real_model.gram.GramCapture` around one micro-step (the
whole groups of the micro-batch as blocks; TRL's fused head reporting to it,
:class:`.private.fused_head`) and reads TRL's per-token loss gradient ``u = dL/dlogp`` of that
micro-batch by a gradient hook on the log-probabilities TRL's step computes (TRL's gradients
unchanged). :func:`inrun_group` turns one captured group into its record.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..config import GeometryConfig
from ..protocol import gradient_row_metrics
from . import private
from .rows import (
    Generation,
    assemble_rows,
    group_fields,
    measured_fields,
    row_multiples,
    row_payload,
)
from .step import StepState, attempt

__all__ = ["InRunMicro", "inrun_group", "inrun_results"]


class InRunMicro:
    """The in-run capture of one micro-batch's forward + backward (TRL's own training step).

    ``groups``: ``{group: positions in the micro-batch}`` of the whole groups captured;
    ``u``: ``[n, C]`` TRL's per-token loss gradient of the micro-batch; ``row_grams``:
    ``{group: Kg}`` float64 in the group's position order; ``error``: why the capture failed
    (None when it did not).
    """

    def __init__(self, *, gen: Generation, chunk: int, groups: dict[int, list[int]]) -> None:
        self.gen, self.chunk, self.groups = gen, chunk, groups
        self.capture: Any = None
        self.u: Any = None
        self.error: str | None = None
        self.row_grams: dict[int, np.ndarray] = {}
        self.coverage: dict[str, int] = {}
        self.from_rows: list[str] = []  # Linear modules whose dW the capture formed
        self.batched: list[str] = []  # modules whose small calls were added after the backward
        self._logps: Any = None
        self._head: Any = None

    def open(self, trainer: Any, model: Any, *, config: GeometryConfig) -> None:
        """Install the capture's hooks and the log-prob gradient hook (errors recorded)."""
        from ...gram import EngineOptions, GramCapture

        def start() -> None:
            # input taps only under gradient checkpointing (TRL backpropagates with
            # accelerator.backward: the hooks alone see every module; fewer autograd nodes)
            cap = GramCapture(model, blocks=list(self.groups.values()), input_taps=None,
                              engine=EngineOptions(
                                  weight_grads=config.weight_grads,
                                  batch_small_calls=bool(config.batch_small_calls)))
            head = private.fused_head(cap).__enter__()  # first: it may refuse
            try:
                cap.__enter__()
            except BaseException:
                head.__exit__(None, None, None)
                raise
            self.capture, self._head = cap, head
            self._logps = private.logps_replaced(trainer, self._first_logps).__enter__()

        _, self.error = attempt(start)

    def _first_logps(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        """TRL's per-token log-probs until its first call with gradients: hooks the gradient of
        the log-probabilities that call returns (``u``), then removes itself."""
        out = original(*args, **kwargs)
        lp = out[0]
        if getattr(lp, "requires_grad", False):  # the step's own (not a no-grad call)
            self._logps.undo()
            lp.register_hook(self._store_u)
        return out

    def _store_u(self, grad: Any) -> None:
        import torch

        self.u = grad.detach().to(torch.float64).cpu()

    def close(self) -> None:
        """After the micro-step's backward: remove the hooks, keep the Grams (or the reason)."""
        if self._logps is not None:
            self._logps.undo()
        cap, self.capture = self.capture, None
        if cap is None:
            return
        _, err = attempt(lambda: cap.__exit__(None, None, None))
        self.error = self.error or err
        if self._head is not None:
            self._head.__exit__(None, None, None)
        _, err = attempt(cap.backward_done)  # TRL's training_step (its backward) has returned
        self.error = self.error or err
        if self.error is None:
            Ks, self.error = attempt(cap.result)
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


def inrun_group(micro: InRunMicro, g: int, pos: list[int], *, config: GeometryConfig,
                group_size: int, score_ok: bool
                ) -> tuple[dict[str, Any], np.ndarray | None, np.ndarray | None]:
    """Record, score Gram ``K`` (or None) and row Gram ``Kg`` of one group captured in-run.

    ``Kg`` is the captured Gram of the rows ``g_i`` (rows with an empty loss mask left out, as
    in ``rows.measure_rows``). ``K = diag(1/a) Kg diag(1/a)`` when every row's ``u_i = a_i m_i``
    with ``a_i != 0`` and TRL's loss has no term outside the log-probabilities (``score_ok``);
    else only the gradient-matrix metrics (``protocol.gradient_row_metrics``).
    """
    import torch

    gen = micro.gen
    local = gen.chunk_rows[micro.chunk][pos]
    order = np.argsort(local, kind="stable")
    U = torch.zeros(gen.batch["completion_ids"].shape, dtype=torch.float64)
    U[torch.as_tensor(gen.chunk_rows[micro.chunk])] = micro.u
    rows = assemble_rows([row_payload(gen, U, local[order], group_size, local=True)])
    Kg_all = micro.row_grams[g][np.ix_(order, order)]
    L = rows.loss_mask.sum(dim=1).cpu().numpy()
    rec = group_fields(rows, np.arange(L.size), L, group_size=group_size, config=config)
    rec["path"] = "in_run"
    rec["has_gradient"] = bool(float(rows.weights.abs().max()) > 0) if L.size else False
    if not rec["has_gradient"]:
        return rec, None, None
    sel = np.nonzero(L > 0)[0]
    Kg = Kg_all[np.ix_(sel, sel)]
    a, prop = row_multiples(rows.weights[sel], rows.loss_mask[sel])
    if score_ok and prop and np.all(a != 0):
        K = Kg / np.outer(a, a)
        rec.update(measured_fields(rows, sel, K, Kg, a, config=config))
        return rec, K, Kg
    rec.update(gradient_row_metrics(Kg, rtol=config.rtol))
    rec["measured_rows"] = [int(x) for x in rows.row[sel]]
    rec["row_grad_norms"] = [float(math.sqrt(max(x, 0.0))) for x in np.diag(Kg)]
    rec["max_rank"] = int(np.count_nonzero(np.diag(Kg) > 0))
    rec["score_geometry"] = ("not from the in-run Gram (a row's u is not a nonzero multiple of "
                             "its loss mask, or the loss has terms outside the log-probabilities)"
                             ": geometry_score_every > 0 measures it by the second pass")
    return rec, None, Kg


def inrun_results(st: StepState, *, config: GeometryConfig, group_size: int,
                  score_ok: bool) -> dict[str, Any]:
    """This process's in-run groups of the step: records, Grams, the rows they cover
    (``done``), the groups present and the capture failures (``in_run``: skipped; ``auto``:
    second pass). The micro-batches' ``u`` is also written into the step's segments."""
    G = group_size
    out: dict[str, Any] = {"groups": [], "grams": {}, "row_grams": {}, "done": set(),
                           "failed": {}, "errors": [], "present": []}
    for seg in st.segments:
        gen = seg["generation"]
        out["present"] += sorted({int(g) for g in gen.group_offset
                                  + (gen.first_row + seg["rows"]) // G})
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
            rec, K, Kg = inrun_group(micro, g, pos, config=config, group_size=G,
                                     score_ok=score_ok)
            out["groups"].append(rec)
            if K is not None:
                out["grams"][g] = K
            if Kg is not None:
                out["row_grams"][g] = Kg
            rows = micro.gen.chunk_rows[micro.chunk][pos]
            out["done"] |= {(micro.gen.index, int(r)) for r in rows}
    return out
