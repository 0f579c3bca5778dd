"""Options of a real-model run: model, problems, sampling, geometry (:class:`RankConfig`).

``real rank`` runs on a :class:`RankConfig`; ``real train`` (:class:`~real_model.train.TrainConfig`)
and ``real trl-train`` extend it. Every option has a stated default, is recorded in
``results.json``, and is checked by :meth:`RankConfig.validate` before a model is loaded or a file
is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RankConfig"]


@dataclass(frozen=True)
class RankConfig:
    """Options of a rank run (defaults stated; every one is recorded in ``results.json``)."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    R_values: tuple[int, ...] = (2, 4, 8)
    prompts: int = 8
    max_new_tokens: int = 64
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int = 0
    source: str = "generated"  # "generated" | "gsm8k" | "gsm-symbolic"
    data_path: str | None = None
    difficulty: tuple[int, ...] = (1, 2)
    operations: tuple[str, ...] = ("add", "sub", "mul")
    shots: int = 3
    prompt_style: str = "fewshot"
    estimators: tuple[str, ...] = ("grpo", "rloo", "grpo_std")
    aggregation: str = "sequence_sum"
    gram_method: str = "exact"
    stop_strings: tuple[str, ...] = field(default=("\n\n", "Question:"))
    rollout_batch: int = 8  # prompts sampled in one batch; 1: one group at a time (old path)

    def resume_key(self) -> dict[str, Any]:
        """The configuration a resumed run must match (everything but ``prompts``).

        ``rollout_batch=1`` (per-group sampling, the only mode of earlier releases) is left out,
        so that run folders written before the option existed resume with it."""
        d = asdict(self)
        d.pop("prompts")
        if d.get("rollout_batch") == 1:
            d.pop("rollout_batch")
        return d

    def validate(self) -> None:
        """Check every option (cheap: no model, no files written); ``ValueError`` names it."""
        from grpo_theory import compute_advantages

        _positive_ints("R values", self.R_values, minimum=2)
        _positive_ints("prompts", (self.prompts,), minimum=1)
        _positive_ints("max_new_tokens", (self.max_new_tokens,), minimum=1)
        _positive_ints("shots", (self.shots,), minimum=0)
        _positive_ints("difficulty", self.difficulty, minimum=1)
        _positive_ints("rollout_batch", (self.rollout_batch,), minimum=1)
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature < float("inf")):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        for name, value, allowed in (
            ("source", self.source, ("generated", "gsm8k", "gsm-symbolic")),
            ("prompt_style", self.prompt_style, ("fewshot", "chat")),
            ("aggregation", self.aggregation, _AGGREGATIONS),
            ("gram_method", self.gram_method, ("exact", "naive")),
        ):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; choose one of {list(allowed)}")
        if self.source == "gsm-symbolic" and self.data_path is None:
            raise ValueError("source 'gsm-symbolic' needs --data PATH to the wheel")
        if self.data_path is not None and not Path(self.data_path).expanduser().exists():
            raise FileNotFoundError(f"--data {self.data_path}: no such file or folder")
        if not self.estimators:
            raise ValueError("estimators must name at least one grpo_theory estimator")
        probe = np.zeros((1, min(self.R_values)))
        probe[0, 0] = 1.0
        for name in self.estimators:
            try:  # the registry's own check: unknown names and options fail here, before any work
                compute_advantages(name, probe)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"estimator {name!r}: {exc}") from exc


_AGGREGATIONS = ("sequence_sum", "token_mean", "sequence_mean", "dr_grpo")


def _positive_ints(name: str, values: Sequence[Any], *, minimum: int) -> None:
    if isinstance(values, (str, bytes)) or not len(values):
        raise ValueError(f"{name} must be one or more integers >= {minimum}, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            raise ValueError(f"{name} must be integers >= {minimum}, got {tuple(values)!r}")
