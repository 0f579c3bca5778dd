"""The one geometry config of every host: one name, one meaning and one default per option.

:class:`GeometryConfig` holds the options of the in-training geometry; each field carries its
help text, its bounds or choices, and the hosts that read it (:data:`HOSTS`). The hosts' own
settings are views of it, generated from the fields, never retyped: TRL's ``GRPOConfig`` gets
a ``geometry_<name>`` field per option TRL reads (:func:`host_fields`,
``integrations.trl.config``), verl's Hydra ``geometry`` block takes the names as they are
(``integrations.verl.config``). Every value is checked when a config is made
by the library's one option layer (:mod:`grpo_io.options`, :func:`check_values`): a wrong type
raises ``TypeError``, a value out of range, not finite or not among the choices ``ValueError``,
one line naming the option as the user wrote it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_io.options import OptionError, check_value, option, option_fields
from grpo_theory.spectral import DEFAULT_RTOL

__all__ = ["GeometryConfig", "HOSTS", "MODES", "host_fields", "check_values", "from_mapping"]

MODES = ("second_pass", "in_run", "auto")
"""Where TRL's rows' Gram comes from (:attr:`GeometryConfig.mode`)."""


@dataclass(frozen=True)
class GeometryConfig:
    """Options of the exact per-group gradient geometry inside a host's training step."""

    every: int = option(1, ge=0, help="Measure the exact gradient geometry at optimizer steps "
                        "0, k, 2k, ... (0: off, nothing is hooked).")
    score_every: int = option(0, ge=0, help="Every k-th measured step also forms the score "
                              "Gram of every group by a second pass (0: only where the "
                              "measurement gives it: TRL's second_pass mode, in-run groups whose "
                              "loss gradient is a multiple of their loss mask).")
    jsonl_path: str | None = option(None, help="JSONL file of the per-step geometry records "
                                    "(default: TRL <output_dir>/geometry.jsonl; verl none).")
    gram_method: str = option("exact", choices=("exact", "naive"), help="Gram engine of the "
                              "second pass: 'exact' (one forward + backward) or 'naive' (one "
                              "backward per row; the reference).")
    rtol: float = option(DEFAULT_RTOL, gt=0, lt=1, help="Numerical-rank tolerance of the "
                         "geometry's spectra.")
    success_threshold: float = option(0.5, help="A rollout is a success when its reward "
                                      "exceeds this.")
    log_prefix: str = option("geometry/", help="Prefix of the geometry metrics in the host's "
                             "log.")
    keep_groups: bool = option(True, help="Write each group's record to the geometry JSONL "
                               "(metrics, singular values; verl: also its Gram matrices); "
                               "False: the step's aggregates only.")
    strict: bool = option(False, help="Raise instead of skipping the step's geometry on any "
                          "failure or inexact option.")
    grad_norm: bool = option(True, help="Form the full Gram over a process's rows in one pass "
                             "(gives the gradient norm).")
    memory_budget_mb: float | None = option(None, gt=0, help="Memory budget of one geometry "
                                            "Gram pass in MiB (needs grad_norm off; passes hold "
                                            "whole groups).")
    mode: str = option("second_pass", choices=MODES, help="Gram of the rows from: "
                       "'second_pass' (an extra forward + backward), 'in_run' (the host's own "
                       "backward; groups whole in one micro-batch), 'auto' (in-run, else second "
                       "pass).")
    group_order: bool = option(False, help="Opt-in: shuffle whole groups (not rows) before TRL "
                               "splits the generation batch into micro-batches (changes bnpo's "
                               "and entropy-based losses' gradient).")
    second_pass_rows: int = option(16, ge=1, help="Most rows of one second-pass forward (whole "
                                   "groups; a larger group runs alone).")
    weight_grads: str = option("rows", choices=("rows", "host"), help="In-run: each Linear's "
                               "weight gradient as the sum of the per-row gradients ('rows', "
                               "equal to the host's up to float rounding) or the host's own "
                               "('host': bit-identical to a run without geometry; slower).")
    batch_small_calls: bool = option(True, help="In-run: add the terms of small module calls "
                                     "together after the backward; set false only when the "
                                     "geometry reports a module output modified in place.")

    def __post_init__(self) -> None:
        check_values(vars(self))

    def measures(self, step: int) -> bool:
        """Whether optimizer step ``step`` is measured."""
        return self.every > 0 and step % self.every == 0

    def scores(self, step: int) -> bool:
        """Whether measured step ``step`` also forms every group's score Gram (``score_every``)."""
        k = self.score_every
        return k > 0 and self.measures(step) and (step // self.every) % k == 0


HOSTS: dict[str, tuple[str, ...]] = {
    "gram_method": ("trl",), "grad_norm": ("trl",), "memory_budget_mb": ("trl",),
    "mode": ("trl",), "group_order": ("trl",), "second_pass_rows": ("verl",),
}
"""Options only some hosts read (the others: every host). verl measures in-run where a group is
whole in one micro-batch and by the second pass otherwise (TRL's ``mode="auto"``), with
``second_pass_rows`` bounding its passes."""


def host_fields(host: str) -> list[dataclasses.Field]:
    """The fields of :class:`GeometryConfig` that ``host`` (``"trl"``, ``"verl"``) reads."""
    return [f for f in dataclasses.fields(GeometryConfig) if host in HOSTS.get(f.name, (host,))]


def check_values(values: Mapping[str, Any], *, prefix: str = "") -> None:
    """Check ``values`` (a subset of the options) against their fields' declarations
    (:func:`grpo_io.options.check_value`: types, bounds, choices, finite numbers) and
    ``memory_budget_mb`` needing ``grad_norm`` off; ``prefix`` names the options as the host
    spells them (``"geometry_"`` for TRL)."""
    for f in option_fields(GeometryConfig):
        if f.name in values:
            check_value(values[f.name], f.kind, f.spec, label=prefix + f.name)
    if values.get("memory_budget_mb") is not None and values.get("grad_norm", True):
        raise OptionError(f"{prefix}memory_budget_mb splits the Gram pass by groups: it needs "
                          f"{prefix}grad_norm=False (the gradient norm needs one full pass)")


def from_mapping(values: Mapping[str, Any] | None, *, host: str) -> GeometryConfig | None:
    """The config of a host's settings block (verl's Hydra ``geometry``): ``None`` or
    ``enable: false`` -> ``None`` (geometry off); a key the host does not read is a
    ``ValueError`` naming it and the known ones."""
    if values is None:
        return None
    d = dict(values)
    if not d.pop("enable", True):
        return None
    known = {f.name for f in host_fields(host)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown geometry option(s) {unknown}; known: {sorted(known)}")
    return GeometryConfig(**d)
