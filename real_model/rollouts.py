"""Sampling a group of ``R`` completions per prompt, with the masks the Gram engine needs.

:func:`sample_group` runs its own seeded sampling loop (KV cache, temperature, top-p, stop at EOS
and at stop strings such as ``"\\n\\n"`` or ``"Question:"``; ``"\\n\\n"`` is not one reliable token,
so stops are detected on the decoded text). It returns a :class:`RolloutBatch` whose rows are
``prompt + completion`` right-padded to a common length ``T``:

* ``input_ids [R, T]``, ``attention_mask [R, T]`` (1 on prompt and kept completion tokens),
* ``completion_mask [R, T]``: 1 at position ``t`` iff token ``t`` was sampled and kept, so
  ``sum_t completion_mask[i, t] log pi(input_ids[i, t] | input_ids[i, <t])`` is the log-probability
  of completion ``i`` (the trajectory score ``psi_i`` is its gradient, Eq. 18). Kept = up to and
  including the EOS token or the token that completed a stop string; later tokens are masked.
* ``texts`` (completion text, cut before the stop string), ``lengths [R]`` (kept tokens),
  ``stop_reasons`` (``"eos"``, ``"stop"`` or ``"length"``).

:func:`build_prompt` makes few-shot (``Question: ... Answer: ... The answer is N.``) or chat
prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import Problem

__all__ = ["RolloutBatch", "DEFAULT_STOP_STRINGS", "build_prompt", "sample_group"]

DEFAULT_STOP_STRINGS: tuple[str, ...] = ("\n\n", "Question:")
_CHAT_INSTRUCTION = "Solve the problem step by step and end with 'The answer is N.'"


@dataclass
class RolloutBatch:
    """A group of ``R`` sampled completions of one prompt (see the module docstring)."""

    input_ids: Any
    attention_mask: Any
    completion_mask: Any
    prompt_length: int
    texts: list[str]
    lengths: np.ndarray
    stop_reasons: list[str]

    @property
    def group_size(self) -> int:
        """``R``."""
        return int(self.input_ids.shape[0])

    def subset(self, idx: Sequence[int]) -> RolloutBatch:
        """The rollouts ``idx`` (e.g. the first ``R'`` for a nested smaller group)."""
        ii = list(idx)
        return RolloutBatch(
            self.input_ids[ii],
            self.attention_mask[ii],
            self.completion_mask[ii],
            self.prompt_length,
            [self.texts[i] for i in ii],
            self.lengths[ii],
            [self.stop_reasons[i] for i in ii],
        )


def build_prompt(
    question: str,
    *,
    style: str = "fewshot",
    shots: Sequence[Problem] = (),
    tokenizer: Any = None,
) -> str:
    """Prompt text for ``question``.

    Args:
        question: the problem.
        style: ``"fewshot"`` (default): ``"Question: q\\nAnswer: solution\\n\\n"`` per shot, then
            ``"Question: q\\nAnswer:"``; ``"chat"``: the tokenizer's chat template.
        shots: worked examples (their ``solution`` should end ``"The answer is N."``).
        tokenizer: needed for ``style="chat"``.
    """
    if style == "fewshot":
        head = "".join(f"Question: {s.question}\nAnswer: {s.solution}\n\n" for s in shots)
        return f"{head}Question: {question}\nAnswer:"
    if style == "chat":
        if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
            raise ValueError("style='chat' needs a tokenizer with apply_chat_template")
        msgs = []
        for s in shots:
            msgs += [
                {"role": "user", "content": f"{s.question}\n{_CHAT_INSTRUCTION}"},
                {"role": "assistant", "content": s.solution},
            ]
        msgs.append({"role": "user", "content": f"{question}\n{_CHAT_INSTRUCTION}"})
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    raise ValueError(f"unknown prompt style {style!r}; use 'fewshot' or 'chat'")


def _top_p_filter(probs: Any, top_p: float) -> Any:
    import torch

    sp, si = torch.sort(probs, dim=-1, descending=True)
    cum = torch.cumsum(sp, dim=-1)
    drop = (cum - sp) > top_p  # keep the smallest prefix whose mass reaches top_p (>= 1 token)
    sp = sp.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter(-1, si, sp)
    return out / out.sum(dim=-1, keepdim=True)


def sample_group(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    R: int,
    max_new_tokens: int = 96,
    temperature: float = 0.7,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS,
    seed: int = 0,
    add_special_tokens: bool = False,
) -> RolloutBatch:
    """Sample ``R`` completions of ``prompt`` in one batch (seeded, no gradient).

    Args:
        model: a causal LM returning ``.logits`` and ``.past_key_values``.
        tokenizer: ``encode``/``decode`` and ``eos_token_id``/``pad_token_id``.
        prompt: prompt text (see :func:`build_prompt`).
        R: group size (>= 1).
        max_new_tokens: cap on sampled tokens per completion (>= 1).
        temperature: softmax temperature (> 0), or ``0`` for greedy decoding.
        top_p: nucleus mass in ``(0, 1]`` (default 1: no truncation).
        stop_strings: stop once the decoded completion contains one (cut before it).
        seed: seeds a private ``torch.Generator``; the global RNG is untouched.
        add_special_tokens: let the tokenizer add BOS (default ``False``).

    Returns:
        :class:`RolloutBatch` on the model's device.
    """
    import torch

    if R < 1 or max_new_tokens < 1:
        raise ValueError(f"need R >= 1 and max_new_tokens >= 1, got R={R}, {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    device = next(model.parameters()).device
    pids = list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
    if not pids:
        raise ValueError("prompt encodes to zero tokens")
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    gen = torch.Generator(device=device).manual_seed(int(seed))
    Lp = len(pids)
    x = torch.tensor([pids] * R, device=device)
    new = torch.full((R, max_new_tokens), pad, dtype=torch.long, device=device)
    keep = np.zeros(R, dtype=np.int64)
    texts = [""] * R
    reasons = ["length"] * R
    active = np.ones(R, dtype=bool)
    past = None
    step_input = x
    with torch.no_grad():
        for t in range(max_new_tokens):
            if t == 0 and R > 1:  # the R rows share the prompt: prefill once, repeat the cache
                out = model(input_ids=x[:1], use_cache=True)
                past = out.past_key_values
                if hasattr(past, "batch_repeat_interleave"):
                    past.batch_repeat_interleave(R)
                    logits = out.logits[:, -1, :].float().expand(R, -1)
                else:  # caches without batch repetition: prefill every row
                    out = model(input_ids=x, use_cache=True)
                    past, logits = out.past_key_values, out.logits[:, -1, :].float()
            else:
                out = model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[:, -1, :].float()
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                if top_p < 1:
                    probs = _top_p_filter(probs, top_p)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            nxt = torch.where(torch.from_numpy(active).to(device), nxt, torch.full_like(nxt, pad))
            new[:, t] = nxt
            ids_now = new[:, : t + 1].tolist()
            for i in np.flatnonzero(active):
                keep[i] = t + 1
                if eos is not None and ids_now[i][-1] == eos:
                    texts[i] = tokenizer.decode(ids_now[i][:-1], skip_special_tokens=True)
                    reasons[i], active[i] = "eos", False
                    continue
                text = tokenizer.decode(ids_now[i], skip_special_tokens=True)
                cuts = [text.find(s) for s in stop_strings if s and s in text]
                if cuts:
                    texts[i], reasons[i], active[i] = text[: min(cuts)], "stop", False
                else:
                    texts[i] = text
            if not active.any():
                break
            step_input = nxt[:, None]
    T_new = int(keep.max())
    new = new[:, :T_new]
    pos = torch.arange(T_new, device=device)[None, :]
    cmask_new = (pos < torch.as_tensor(keep, device=device)[:, None]).long()
    new = torch.where(cmask_new.bool(), new, torch.full_like(new, pad))
    input_ids = torch.cat([x, new], dim=1)
    completion_mask = torch.cat([torch.zeros_like(x), cmask_new], dim=1)
    attention_mask = torch.cat([torch.ones_like(x), cmask_new], dim=1)
    return RolloutBatch(input_ids, attention_mask, completion_mask, Lp, texts, keep.copy(), reasons)
