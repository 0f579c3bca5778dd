"""Shared helpers of the real_model pipeline tests: the character tokenizer, the options of a
small run, a scripted greedy model with a fake cache, a tiny random model wrapped as a loaded
model, and a deterministic reward.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from real_model.loading import CharTokenizer, LoadedModel, ModelSpec, tiny_random_model

TOK = CharTokenizer()

#: Options of a small ``real rank`` / ``real train`` run: one group size, 4 new tokens, one shot.
SMALL_RUN: dict[str, Any] = dict(R_values=(2,), max_new_tokens=4, shots=1, stop_strings=("\n",))


class ScriptedLM(torch.nn.Module):
    """Emits a fixed token script greedily (logit 50 on the scripted token), with a fake cache."""

    def __init__(self, script: list[int], vocab: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.script, self.vocab = script, vocab

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, **_: Any) -> Any:
        done = 0 if past_key_values is None else past_key_values
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        k = min(done, len(self.script) - 1)
        logits[:, -1, self.script[k]] = 50.0
        return SimpleNamespace(logits=logits, past_key_values=done + 1)


def tiny_loaded(seed: int = 0) -> LoadedModel:
    m = tiny_random_model(vocab_size=TOK.vocab_size, seed=seed)
    return LoadedModel(m, TOK, ModelSpec("tiny", "-"), "cpu", "float32")


def odd_reward(text: str, gold: Any) -> float:
    return float(sum(map(ord, text)) % 2)
