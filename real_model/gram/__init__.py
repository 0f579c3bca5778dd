"""The exact per-row gradient Gram engine: second passes (:mod:`.api`), in-run capture.

One capture of a forward + backward hands each trainable module's call to the rule registered
for its type (:mod:`.layers`); packed rows (:mod:`.packed`), small-call batching
(:mod:`.small_calls`), the tiled head (:mod:`.head`), a host's fused head
(:mod:`.layers.fused_head`) and the Triton kernel (:mod:`.triton`) each have their own file.
Docs: ``docs/real_model_gram.md``.
"""

from .api import rows_gram, trajectory_gram
from .capture import GramCapture, GramCaptureError
from .head import HeadTransform, head_logprobs, head_transform
from .memory import default_memory_budget, pass_bytes_per_row, pass_fixed_bytes, plan_passes
from .model import (
    CausalLMParts,
    TemperatureScaled,
    causal_lm_parts,
    fsdp_sharded,
    model_device,
    reshard_fsdp,
    token_logprobs,
    trainable_parameters,
)
from .options import EngineOptions
from .plan import active_dropout_modules, checkpointing_enabled

__all__ = ["trajectory_gram", "rows_gram", "GramCapture", "GramCaptureError", "EngineOptions",
           "HeadTransform", "head_logprobs", "head_transform", "token_logprobs",
           "CausalLMParts", "causal_lm_parts", "TemperatureScaled", "model_device",
           "trainable_parameters", "reshard_fsdp", "fsdp_sharded", "active_dropout_modules",
           "checkpointing_enabled", "default_memory_budget", "pass_bytes_per_row",
           "pass_fixed_bytes", "plan_passes"]
