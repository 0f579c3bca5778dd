"""TRL's ``GRPOTrainer`` with the exact per-group gradient geometry: a thin mixin.

``class MyTrainer(GeometryMixin, MyGRPOTrainer): ...``. Settings come from the trainer's
``args`` when it is a ``GeometryGRPOConfig`` (``geometry_*`` fields, :mod:`.config`), else from
the ``geometry=`` keyword (:class:`~real_model.integrations.config.GeometryConfig`), else the
defaults. Each override calls the parent unchanged and hands TRL's values to the meter
(:mod:`.meter`): ``_calculate_rewards`` (TRL's gathered rewards), ``_generate_and_score_
completions`` (tags each row of the generation batch), ``_prepare_inputs`` (measures at the
first micro-step of a due optimizer step, and where a new generation batch starts inside it),
``training_step`` (closes an in-run capture), transformers' ``_get_grad_norm`` (the step's
pre-clip gradient norm: the measured step's diagnostics and record), ``log`` (adds
``geometry/skipped_reason``).
"""

from __future__ import annotations

from typing import Any

from ..config import GeometryConfig
from . import meter, private
from .config import settings_from_args
from .rows import group_permutation

__all__ = ["GeometryMixin", "make_trainer_class"]


class GeometryMixin:
    """Mix into any ``trl.GRPOTrainer`` (subclass) to measure the exact gradient geometry."""

    def __init__(self, *args: Any, geometry: GeometryConfig | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = geometry if geometry is not None else settings_from_args(self.args)
        self.geometry_run = meter.new_run(self, cfg)

    @property
    def geometry(self) -> GeometryConfig:
        return self.geometry_run.config

    @property
    def geometry_records(self) -> list[dict[str, Any]]:
        return self.geometry_run.records

    @property
    def geometry_last(self) -> dict[str, Any] | None:
        return self.geometry_run.last

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.geometry_run.batches.rewards = out
        return out

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        return meter.on_generation(self, self.geometry_run, out)

    def _prepare_inputs(self, generation_batch):
        if self.geometry.group_order and self.model.training:
            with private.group_shuffle(self._group_shuffle):
                inputs = super()._prepare_inputs(generation_batch)
        else:
            inputs = super()._prepare_inputs(generation_batch)
        meter.on_micro_step(self, self.geometry_run)
        return inputs

    def training_step(self, model, inputs, num_items_in_batch=None):
        completed = False
        try:
            out = super().training_step(model, inputs, num_items_in_batch)
            completed = True
            return out
        finally:
            meter.after_micro_step(self, self.geometry_run, completed=completed)

    def _get_grad_norm(self, model, grad_norm=None):
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        meter.on_grad_norm(self, self.geometry_run, norm)
        return norm

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        meter.add_log_fields(self, self.geometry_run, logs)
        super().log(logs, start_time)

    def _group_shuffle(self, seq_dict: dict[str, Any]) -> dict[str, Any]:
        """TRL 1.16's ``shuffle_sequence_dict`` with :func:`.rows.group_permutation`: whole
        groups in a random order."""
        import torch

        B = len(next(v for v in seq_dict.values() if v is not None))
        perm = group_permutation(B, first_row=self.accelerator.process_index * B,
                                 group_size=int(self.num_generations))

        def permute(v: Any) -> Any:
            if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
                return v
            if isinstance(v, torch.Tensor):
                return v[perm.to(v.device)]
            return [v[int(i)] for i in perm]

        return {key: permute(val) for key, val in seq_dict.items()}


def make_trainer_class(module: str) -> type:
    """``GeometryGRPOTrainer``: ``GeometryMixin + trl.GRPOTrainer``."""
    from trl import GRPOTrainer

    class GeometryGRPOTrainer(GeometryMixin, GRPOTrainer):  # type: ignore[misc, valid-type]
        """``trl.GRPOTrainer`` with :class:`GeometryMixin`: the exact per-group geometry."""

    GeometryGRPOTrainer.__module__ = module
    GeometryGRPOTrainer.__qualname__ = "GeometryGRPOTrainer"
    return GeometryGRPOTrainer
