"""Which modules own which trainable parameters, and which rule handles each; facts of the model.

Each trainable module gets the kind of the rule registered for its type
(:mod:`real_model.gram.layers`: ``"linear"``, ``"embedding"``, or ``"generic"`` for any small
leaf module); a module no rule can attribute raises ``ValueError`` naming it. A parameter may be
shared only as an Embedding weight tied to one Linear weight (the LM head).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Sequence

from torch import nn

from .registry import rule_for

__all__ = ["Plan", "plan_of", "checkpointing_enabled", "active_dropout_modules"]


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
        rule = rule_for(mod)
        rule.check(mname, mod, names)
        return rule.kind


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


def checkpointing_enabled(model: nn.Module) -> bool:
    """Whether a module of ``model`` runs activation checkpointing: a Hugging Face layer with
    ``gradient_checkpointing=True`` (``gradient_checkpointing_enable``), or a module wrapped by
    ``torch.distributed.algorithms._checkpoint`` (``CheckpointWrapper``)."""
    return any(getattr(m, "gradient_checkpointing", False) is True
               or type(m).__name__ == "CheckpointWrapper" for m in model.modules())


def active_dropout_modules(model: nn.Module) -> list[str]:
    """Modules that drop activations at random in their current mode, as ``"name (Type, p=..)"``.

    A module counts when it is in training mode and either is a ``torch.nn`` dropout layer with
    ``p > 0`` or carries a float attribute whose name contains ``"dropout"`` with a value ``> 0``
    (Hugging Face attention modules pass ``attention_dropout`` to the attention kernel only in
    training mode). A capture around the host's own step measures the rows with the host's own
    masks; a second pass does not, and should name these modules.
    """
    drop = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)
    out = []
    for name, mod in model.named_modules():
        if not mod.training:
            continue
        if isinstance(mod, drop):
            if mod.p > 0:
                out.append(f"{name} ({type(mod).__name__}, p={mod.p})")
            continue
        for key, val in vars(mod).items():
            if "dropout" in key and isinstance(val, float) and val > 0:
                out.append(f"{name} ({type(mod).__name__}, {key}={val})")
    return out
