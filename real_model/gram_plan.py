"""Which modules own which trainable parameters, and how the exact Gram handles each.

Kinds: ``"linear"`` (``nn.Linear``), ``"embedding"`` (``nn.Embedding`` without max_norm or
scale_grad_by_freq) and ``"generic"`` (a leaf module with at most ``GENERIC_MAX_PARAMS``
parameters). Anything else raises ``ValueError`` naming the module type. A parameter may be
shared only as an Embedding weight tied to one Linear weight (the LM head).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Sequence

from torch import nn

__all__ = ["Plan", "GENERIC_MAX_PARAMS", "plan_of"]

GENERIC_MAX_PARAMS = 1 << 20


class Plan:
    """Which modules own which trainable parameters, and how each is handled."""

    def __init__(self, model: nn.Module) -> None:
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        self.uses: dict[int, list[tuple[str, nn.Module, str]]] = defaultdict(list)
        self.modules: dict[str, tuple[nn.Module, str, list[str]]] = {}
        seen: set[int] = set()
        for mname, mod in model.named_modules(remove_duplicate=False):
            names = [n for n, p in mod.named_parameters(recurse=False) if id(p) in trainable]
            if not names or id(mod) in seen:
                continue
            seen.add(id(mod))
            kind = self._kind(mname, mod, names)
            self.modules[mname] = (mod, kind, names)
            for n in names:
                self.uses[id(getattr(mod, n))].append((mname, mod, n))
        self.tied: dict[int, tuple[str, str]] = {}  # id(param) -> (embedding name, linear name)
        for pid, us in self.uses.items():
            if len(us) == 1:
                continue
            kinds = sorted((self.modules[m][1], m, n) for m, _, n in us)
            if [k for k, _, _ in kinds] == ["embedding", "linear"] and all(
                n == "weight" for _, _, n in kinds
            ):
                self.tied[pid] = (kinds[0][1], kinds[1][1])
                continue
            where = ", ".join(f"{m}.{n} ({type(self.modules[m][0]).__name__})" for m, _, n in us)
            raise ValueError(
                f"parameter shared by several modules ({where}): only an Embedding weight tied to "
                "one Linear weight (the LM head) is supported by the exact Gram"
            )

    @staticmethod
    def _kind(mname: str, mod: nn.Module, names: list[str]) -> str:
        if type(mod).__name__.startswith("Dora"):
            raise ValueError(
                f"module {mname!r} ({type(mod).__name__}) is PEFT's DoRA magnitude: DoRA uses the "
                "adapters' weights outside their modules' forward, which the exact Gram cannot "
                "attribute (use plain LoRA, or method='naive')"
            )
        if type(mod) is nn.Linear or isinstance(mod, nn.Linear):
            return "linear"
        if isinstance(mod, nn.Embedding):
            if mod.max_norm is not None or mod.scale_grad_by_freq:
                raise ValueError(
                    f"module {mname!r} ({type(mod).__name__}) uses max_norm/scale_grad_by_freq: "
                    "not supported by the exact Gram"
                )
            return "embedding"
        n_par = sum(getattr(mod, n).numel() for n in names)
        if next(mod.children(), None) is None and n_par <= GENERIC_MAX_PARAMS:
            return "generic"
        why = "it has child modules" if next(mod.children(), None) is not None else (
            f"it holds {n_par} parameters (> {GENERIC_MAX_PARAMS} for the per-sample fallback)"
        )
        raise ValueError(
            f"unsupported module type {type(mod).__name__} at {mname!r} with trainable parameters "
            f"{names}: {why}; the exact Gram handles nn.Linear, nn.Embedding and small leaf "
            "modules (use method='naive', or set requires_grad=False on these parameters)"
        )


_PLANS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[tuple[int, bool], ...], Plan]] = (
    weakref.WeakKeyDictionary())


def plan_of(model: nn.Module, *, params: Sequence[nn.Parameter] | None = None) -> Plan:
    """``Plan(model)``, reused while the model's parameters (objects and ``requires_grad``) are
    the same: a trainer builds one capture per micro-batch, and walking every module each time
    is a measurable part of a small step. A change of the parameters builds a new plan.
    ``params``: ``list(model.parameters())`` when the caller has it (one walk, not two)."""
    params = model.parameters() if params is None else params
    key = tuple((id(p), bool(p.requires_grad)) for p in params)
    hit = _PLANS.get(model)
    if hit is not None and hit[0] == key:
        return hit[1]
    plan = Plan(model)
    _PLANS[model] = (key, plan)
    return plan
