"""real_model: GRPO estimators on a real causal LM: rollouts, gradient Gram, spectra, training.

Importing this package is cheap: nothing here imports torch or transformers until an attribute is
used (PEP 562 lazy attributes). See ``docs/real_model.md`` for set-up and the CLI
(``grpo-audit real rank``, ``grpo-audit real train``, ``grpo-audit compare``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # loading
    "OFFLINE_MODEL": "loading",
    "DEFAULT_GPU_MODEL": "loading",
    "ModelNotAvailableError": "loading",
    "LoadedModel": "loading",
    "ModelSpec": "loading",
    "load_model": "loading",
    "resolve_model": "loading",
    "tiny_random_model": "loading",
    "CharTokenizer": "loading",
    # data
    "Problem": "data",
    "extract_answer": "data",
    "parse_number": "data",
    "binary_reward": "data",
    "load_gsm8k": "data",
    "load_gsm_symbolic_originals": "data",
    "generate_problems": "data",
    "ProblemSet": "data",
    "load_problems": "data",
    # rollouts
    "RolloutBatch": "rollouts",
    "build_prompt": "rollouts",
    "sample_group": "rollouts",
    "sample_groups": "rollouts",
    "sample_prompts": "rollouts",
    "prompt_seed": "rollouts",
    "sample_problem_groups": "rollouts",
    # gram
    "trajectory_gram": "gram",
    "rows_gram": "gram",
    "GramCapture": "gram",
    "active_dropout_modules": "gram",
    "head_logprobs": "gram",
    # geometry
    "group_gram": "geometry",
    "rollout_weights": "geometry",
    "score_geometry": "geometry",
    "group_geometry": "geometry",
    "nested_group_geometry": "geometry",
    # experiments
    "RankConfig": "config",
    "run_rank": "rank",
    "summarize_rank": "outputs",
    "TrainConfig": "train",
    "run_train": "train",
    "grpo_loss": "train",
    "run_compare": "compare",
    "toy_rank_rows": "compare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'real_model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
