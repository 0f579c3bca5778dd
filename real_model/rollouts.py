"""Sampling a group of ``R`` completions per prompt, with the masks the Gram engine needs.

:func:`sample_group` (one prompt) and :func:`sample_groups` (several, batched) share one seeded
decoding loop (:func:`_decode`: KV cache, temperature, top-p, stop at EOS and at stop strings
such as ``"\\n\\n"`` or ``"Question:"``; ``"\\n\\n"`` is not one reliable token, so stops are
detected on the decoded text); they differ only in their model calls (:class:`_GroupForward`,
:class:`_BatchForward`) and in how much text the stop check decodes. Each returns a
:class:`RolloutBatch` per prompt whose rows are ``prompt + completion`` right-padded to a common
length ``T``:

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
from typing import TYPE_CHECKING, Any

import numpy as np

from .data import Problem, ProblemSet

if TYPE_CHECKING:
    from .config import RankConfig

__all__ = [
    "RolloutBatch", "DEFAULT_STOP_STRINGS", "build_prompt", "sample_group", "sample_groups",
    "sample_prompts", "prompt_seed", "sample_problem_groups",
]

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


def _sampling_probs(logits: Any, temperature: float, top_p: float) -> Any:
    """``softmax(logits / temperature)``, nucleus-truncated to ``top_p`` when ``top_p < 1``."""
    import torch

    probs = torch.softmax(logits / temperature, dim=-1)
    return _top_p_filter(probs, top_p) if top_p < 1 else probs


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

    The decoding loop is :func:`sample_groups`'s (:func:`_decode`) for one group, with this
    sampler's own model calls (:class:`_GroupForward`: no padding, so no attention mask or
    positions are passed) and a stop check on the full decoded text at every token.

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
    _check_sampling(R, max_new_tokens, temperature, top_p)
    pids = _encode(tokenizer, [prompt], add_special_tokens)
    device = next(model.parameters()).device
    forward = _GroupForward(model, pids[0], R=R, pad=_pad_id(tokenizer), device=device)
    watch = _StopWatch(tokenizer, stop_strings, tokenizer.eos_token_id, tail_only=False)
    (batch,) = _decode(forward, watch, pids, R=R, seeds=[seed], max_new_tokens=max_new_tokens,
                       temperature=temperature, top_p=top_p)
    return batch


def sample_groups(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    R: int,
    seeds: Sequence[int],
    max_new_tokens: int = 96,
    temperature: float = 0.7,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS,
    add_special_tokens: bool = False,
) -> list[RolloutBatch]:
    """Sample ``R`` completions of each of ``G = len(prompts)`` prompts in ONE batch of ``G R``.

    The batched twin of :func:`sample_group` (same options, same :class:`RolloutBatch` per prompt,
    same per-group seeding, the same decoding loop :func:`_decode`): prompts are left-padded to a
    common length (``position_ids`` from the attention mask, so padding does not shift
    positions), the token prefix all prompts share (a few-shot header) is prefilled once, each
    prompt's own tokens once, its KV cache is repeated ``R`` times (:func:`_prefill`), and every
    decoding step runs all rows together (:class:`_BatchForward`). Group ``g`` draws its tokens
    from its own ``torch.Generator`` seeded by ``seeds[g]`` with one ``multinomial`` call over its
    ``R`` rows per step, as :func:`sample_group` does, so for the same logits both give the same
    tokens. Stops are detected per row on the decoded tail only (:class:`_StopWatch`); once a
    quarter of the rows in the batch have finished, they are dropped from it (KV cache
    ``batch_select_indices``; a finished row's draws are then made from a placeholder
    distribution, which leaves every other row's draw unchanged).

    What batching changes: the logits of a row are computed inside a batch of a different shape,
    with left padding, so they differ from :func:`sample_group`'s in the last bits of floating
    point (and in bf16 more); a sampled token, hence a completion and its reward, can then differ
    where two tokens' cumulative probabilities straddle the uniform draw. The outcome for a prompt
    depends on its seed AND on the batch it was sampled in; callers that must be reproducible
    (resume) therefore batch prompts in fixed blocks of prompt indices.

    Args:
        prompts: the ``G`` prompt texts (see :func:`build_prompt`).
        seeds: ``G`` seeds, one private generator per group (the global RNG is untouched).
        R, max_new_tokens, temperature, top_p, stop_strings, add_special_tokens: as in
            :func:`sample_group`.

    Returns:
        ``G`` :class:`RolloutBatch` objects, in the order of ``prompts``.
    """
    G = len(prompts)
    if G < 1 or len(seeds) != G:
        raise ValueError(f"need one seed per prompt and >= 1 prompt, got {G} prompts and "
                         f"{len(seeds)} seeds")
    _check_sampling(R, max_new_tokens, temperature, top_p)
    pids = _encode(tokenizer, prompts, add_special_tokens)
    device = next(model.parameters()).device
    forward = _BatchForward(model, pids, R=R, pad=_pad_id(tokenizer), device=device)
    watch = _StopWatch(tokenizer, stop_strings, tokenizer.eos_token_id)
    return _decode(forward, watch, pids, R=R, seeds=seeds, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_p=top_p)


def _check_sampling(R: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    if R < 1 or max_new_tokens < 1:
        raise ValueError(f"need R >= 1 and max_new_tokens >= 1, got R={R}, {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")


def _encode(tokenizer: Any, prompts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids of each prompt (none may be empty)."""
    pids = [list(tokenizer.encode(p, add_special_tokens=add_special_tokens)) for p in prompts]
    if any(not p for p in pids):
        raise ValueError("a prompt encodes to zero tokens")
    return pids


def _pad_id(tokenizer: Any) -> int:
    """The padding token: ``pad_token_id``, else ``eos_token_id``."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _decode(
    forward: _GroupForward | _BatchForward,
    watch: _StopWatch,
    pids: Sequence[Sequence[int]],
    *,
    R: int,
    seeds: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
) -> list[RolloutBatch]:
    """The decoding loop of both samplers: at step ``t`` every group draws its rows' next token
    from the current logits (:func:`_draw`), the rows record it and check for a stop
    (:class:`_Rows`), and ``forward`` computes the next logits of the rows still running.
    Row ``g R + i`` is completion ``i`` of prompt ``g``."""
    import torch

    device = forward.device
    gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    rows = _Rows(len(pids) * R, max_new_tokens, pad=forward.pad, device=device)
    with torch.no_grad():
        logits = forward.prefill()
        for t in range(max_new_tokens):
            nxt = _draw(logits, forward.live, gens, R=R, active=rows.active,
                        temperature=temperature, top_p=top_p, pad=forward.pad)
            rows.record(t, nxt, watch)
            if not rows.active.any() or t + 1 == max_new_tokens:
                break
            logits = forward.step(nxt, t, rows.active)
    rows.decode_unfinished(watch.tok)
    return rows.groups(pids, R)


def _draw(
    logits: Any,
    live: np.ndarray,
    gens: Sequence[Any],
    *,
    R: int,
    active: np.ndarray,
    temperature: float,
    top_p: float,
    pad: int,
) -> Any:
    """Next token of every row ``[G R]``: per group with a running row, one ``multinomial`` over
    its ``R`` rows from its own generator (``argmax`` at temperature 0); ``pad`` for the rows
    that have finished. ``logits [B, V]`` are those of the rows ``live`` still in the batch; a
    row dropped from it draws from a placeholder (uniform) distribution, which leaves the other
    rows' draws unchanged (each row's sample depends on its own probabilities only)."""
    import torch

    device = logits.device
    nxt = torch.full((active.size,), pad, dtype=torch.long, device=device)
    slot = np.full(active.size, -1)
    slot[live] = np.arange(live.size)
    for g, gen in enumerate(gens):
        rows = np.arange(g * R, (g + 1) * R)
        if not active[rows].any():
            continue
        inb = slot[rows] >= 0  # rows of group g still in the batch
        lg = logits[torch.from_numpy(slot[rows][inb]).to(device)]
        if temperature == 0:
            pick = lg.argmax(dim=-1)
        else:
            probs = _sampling_probs(lg, temperature, top_p)
            if not inb.all():
                full = torch.full((R, probs.shape[-1]), 1.0 / probs.shape[-1],
                                  dtype=probs.dtype, device=device)
                full[torch.from_numpy(np.flatnonzero(inb)).to(device)] = probs
                probs = full
            pick = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            if not inb.all():
                pick = pick[torch.from_numpy(np.flatnonzero(inb)).to(device)]
        nxt[torch.from_numpy(rows[inb]).to(device)] = pick
    return torch.where(torch.from_numpy(active).to(device), nxt, torch.full_like(nxt, pad))


class _Rows:
    """The sampled tokens of ``N`` rows: ``new [N, max_new_tokens]`` (``pad`` after a row's
    end), kept lengths, texts, stop reasons (``"length"`` until a row stops) and which rows still
    run."""

    def __init__(self, n: int, max_new_tokens: int, *, pad: int, device: Any) -> None:
        import torch

        self.pad = pad
        self.new = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)
        self.keep = np.zeros(n, dtype=np.int64)
        self.texts = [""] * n
        self.reasons = ["length"] * n
        self.active = np.ones(n, dtype=bool)
        self.toks: list[list[int]] = [[] for _ in range(n)]

    def record(self, t: int, nxt: Any, watch: _StopWatch) -> None:
        """Store step ``t``'s tokens ``nxt [N]``; a running row that ends with its token stops."""
        import torch

        self.new[:, t] = nxt
        running = nxt[torch.from_numpy(self.active).to(nxt.device)].tolist()
        for i, tok in zip(np.flatnonzero(self.active), running, strict=True):
            self.toks[i].append(tok)
            self.keep[i] = t + 1
            done = watch.check(self.toks[i])
            if done is not None:
                self.reasons[i], self.texts[i] = done
                self.active[i] = False

    def decode_unfinished(self, tokenizer: Any) -> None:
        """Texts of the rows that ran to the length limit."""
        for i in np.flatnonzero(self.active):
            self.texts[i] = tokenizer.decode(self.toks[i], skip_special_tokens=True)

    def groups(self, pids: Sequence[Sequence[int]], R: int) -> list[RolloutBatch]:
        """One :class:`RolloutBatch` per prompt (rows ``g R .. g R + R - 1``)."""
        import torch

        out = []
        for g, p in enumerate(pids):
            rows = slice(g * R, (g + 1) * R)
            x = torch.tensor([list(p)] * R, dtype=torch.long, device=self.new.device)
            out.append(_assemble(x, self.new[rows], self.keep[rows], self.pad, self.texts[rows],
                                 self.reasons[rows]))
        return out


def cached_forward(model: Any, past: Any, **inputs: Any) -> tuple[Any, Any]:
    """``model(**inputs, use_cache=True)`` continuing the KV cache ``past`` (``None``: none yet);
    returns the output and the model's new cache.

    transformers 5.x names the cache ``cache`` (``past_key_values`` is deprecated there: a
    FutureWarning and a log line per run); earlier releases and plain modules take
    ``past_key_values``. The name is read from the model's ``forward`` signature.
    """
    import inspect

    if past is not None:
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else (
            "past_key_values")
        inputs[name] = past
    out = model(**inputs, use_cache=True)
    new = getattr(out, "cache", None)  # transformers 5.x; reading past_key_values would warn
    return out, (out.past_key_values if new is None else new)


class _GroupForward:
    """:func:`sample_group`'s model calls for the ``R`` rows of one unpadded prompt ``pids``.

    Prefill: the prompt once, its KV cache repeated ``R`` times (a cache without
    ``batch_repeat_interleave``: every row prefilled); a step: the ``R`` newest tokens against
    the cache, no attention mask or positions (there is no padding). Every row stays in the
    batch (``live``).
    """

    def __init__(self, model: Any, pids: Sequence[int], *, R: int, pad: int, device: Any) -> None:
        self.model, self.pids, self.R, self.pad, self.device = model, list(pids), R, pad, device
        self.live = np.arange(R)
        self.past: Any = None

    def prefill(self) -> Any:
        """Logits ``[R, V]`` (float32) of the token after the prompt."""
        import torch

        x = torch.tensor([self.pids] * self.R, device=self.device)
        if self.R > 1:  # the R rows share the prompt: prefill once, repeat the cache
            out, self.past = cached_forward(self.model, None, input_ids=x[:1])
            if hasattr(self.past, "batch_repeat_interleave"):
                self.past.batch_repeat_interleave(self.R)
                return out.logits[:, -1, :].float().expand(self.R, -1)
        out, self.past = cached_forward(self.model, None, input_ids=x)  # R = 1, or no repetition
        return out.logits[:, -1, :].float()

    def step(self, nxt: Any, t: int, active: np.ndarray) -> Any:
        """Logits ``[R, V]`` after the tokens ``nxt [R]`` of step ``t``."""
        out, self.past = cached_forward(self.model, self.past, input_ids=nxt[:, None])
        return out.logits[:, -1, :].float()


class _BatchForward:
    """:func:`sample_groups`' model calls for ``G R`` rows of left-padded prompts.

    Prefill: :func:`_prefill`; a step: the newest tokens of the rows still in the batch
    (``live``: their original row numbers), with their attention mask and positions counted on
    real tokens. Once a quarter of the rows in the batch have finished they are dropped from it
    (KV cache ``batch_select_indices``, where the cache has it).
    """

    def __init__(
        self, model: Any, pids: Sequence[Sequence[int]], *, R: int, pad: int, device: Any
    ) -> None:
        import torch

        self.model, self.pids, self.R, self.pad, self.device = model, pids, R, pad, device
        self.live = np.arange(len(pids) * R)
        # position of each row's first sampled token
        self.next_pos = torch.tensor([len(p) for p in pids], device=device).repeat_interleave(R)
        self.past: Any = None
        self.attn: Any = None
        self.compact = False

    def prefill(self) -> Any:
        """Logits ``[G R, V]`` (float32) of the token after each prompt."""
        self.past, logits, self.attn = _prefill(self.model, self.pids, R=self.R, pad=self.pad,
                                                device=self.device)
        self.compact = hasattr(self.past, "batch_select_indices")
        return logits

    def step(self, nxt: Any, t: int, active: np.ndarray) -> Any:
        """Logits ``[B, V]`` of the ``B`` rows ``live`` after the tokens ``nxt [G R]`` of step
        ``t``; first drops the finished rows when a quarter of the batch has finished."""
        import torch

        if self.compact and active[self.live].sum() <= 0.75 * self.live.size:
            kept = np.flatnonzero(active[self.live])
            idx = torch.from_numpy(kept).to(self.device)
            self.past.batch_select_indices(idx)
            self.attn, self.live = self.attn[idx], self.live[kept]
        lv = torch.from_numpy(self.live).to(self.device)
        ones = torch.ones((self.live.size, 1), dtype=self.attn.dtype, device=self.device)
        self.attn = torch.cat([self.attn, ones], dim=1)
        out, self.past = cached_forward(self.model, self.past, input_ids=nxt[lv][:, None],
                                        attention_mask=self.attn,
                                        position_ids=(self.next_pos[lv] + t)[:, None])
        return out.logits[:, -1, :].float()


def _assemble(
    x: Any, new: Any, keep: np.ndarray, pad: int, texts: list[str], reasons: list[str]
) -> RolloutBatch:
    """:class:`RolloutBatch` of prompt rows ``x [R, Lp]`` and sampled tokens ``new [R, T]``."""
    import torch

    device = x.device
    T_new = int(keep.max())
    new = new[:, :T_new]
    pos = torch.arange(T_new, device=device)[None, :]
    cmask_new = (pos < torch.as_tensor(keep, device=device)[:, None]).long()
    new = torch.where(cmask_new.bool(), new, torch.full_like(new, pad))
    input_ids = torch.cat([x, new], dim=1)
    completion_mask = torch.cat([torch.zeros_like(x), cmask_new], dim=1)
    attention_mask = torch.cat([torch.ones_like(x), cmask_new], dim=1)
    return RolloutBatch(
        input_ids, attention_mask, completion_mask, int(x.shape[1]), texts, keep.copy(), reasons
    )


class _StopWatch:
    """Per-row stop detection on the newly decoded tail (O(1) decoding work per row and token).

    A row's text is decoded in full only when the decoded tail of its last ``window`` tokens
    contains a stop string (then the full text confirms it and gives the cut, exactly as the
    per-group sampler does), or when the row ends. ``window`` = longest stop string in characters
    + 4 tokens: every token that is not special decodes to at least one character, so a stop
    string completed by the newest token lies within the window. With ``tail_only=False``
    (:func:`sample_group`) the full text is decoded and checked at every token.
    """

    def __init__(
        self, tokenizer: Any, stop_strings: Sequence[str], eos: int | None, *,
        tail_only: bool = True,
    ) -> None:
        self.tok = tokenizer
        self.stops = [s for s in stop_strings if s]
        self.eos = eos
        self.window = max((len(s) for s in self.stops), default=0) + 4
        self.tail_only = tail_only

    def check(self, ids: list[int]) -> tuple[str, str] | None:
        """``(reason, text)`` if the row ends with its newest token ``ids[-1]``, else ``None``."""
        if self.eos is not None and ids[-1] == self.eos:
            return "eos", self.tok.decode(ids[:-1], skip_special_tokens=True)
        if not self.stops:
            return None
        if self.tail_only:
            tail = self.tok.decode(ids[-self.window :], skip_special_tokens=True)
            if not any(s in tail for s in self.stops):
                return None
        text = self.tok.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in self.stops if s in text]
        return ("stop", text[: min(cuts)]) if cuts else None


def _common_prefix(pids: Sequence[Sequence[int]]) -> int:
    """Length of the longest common token prefix of the prompts, leaving each >= 1 own token."""
    P = min(len(p) for p in pids) - 1
    first = pids[0]
    for p in pids[1:]:
        P = min(P, next((i for i in range(P) if p[i] != first[i]), P))
    return max(P, 0)


def _prefill(
    model: Any, pids: Sequence[Sequence[int]], *, R: int, pad: int, device: Any
) -> tuple[Any, Any, Any]:
    """KV cache, last-token logits ``[G R, V]`` (float32) and attention mask of ``G`` prompts.

    Row ``g R + i`` holds prompt ``g``. Prompts sharing a token prefix of length ``P`` (a
    few-shot header) have it prefilled ONCE: the prefix as one row, its cache repeated ``G``
    times, then each prompt's own tokens left-padded behind it, so a row's layout is
    ``[prefix | padding | own tokens]``, padding masked out and ``position_ids`` counted on real
    tokens only. Each prompt's cache is then repeated ``R`` times. Caches without
    ``batch_repeat_interleave`` prefill all ``G R`` rows, left-padded.
    """
    import torch

    G = len(pids)
    P = _common_prefix(pids) if G > 1 else 0
    past = None
    if P > 0:
        _, past = cached_forward(model, None, input_ids=torch.tensor([list(pids[0][:P])],
                                                                     device=device))
        if hasattr(past, "batch_repeat_interleave"):
            past.batch_repeat_interleave(G)
        else:
            P, past = 0, None
    own = [list(p[P:]) for p in pids]
    Smax = max(len(o) for o in own)
    ids = torch.full((G, Smax), pad, dtype=torch.long, device=device)
    mask = torch.zeros((G, P + Smax), dtype=torch.long, device=device)
    mask[:, :P] = 1
    for g, o in enumerate(own):
        ids[g, Smax - len(o) :] = torch.tensor(o, device=device)
        mask[g, P + Smax - len(o) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, P:]
    out, past = cached_forward(model, past, input_ids=ids, attention_mask=mask, position_ids=pos)
    logits = out.logits[:, -1, :].float()
    if R == 1:
        return past, logits, mask
    if hasattr(past, "batch_repeat_interleave"):
        past.batch_repeat_interleave(R)
        return past, logits.repeat_interleave(R, dim=0), mask.repeat_interleave(R, dim=0)
    rows = [list(p) for p in pids for _ in range(R)]  # no cache repetition: prefill every row
    return _prefill(model, rows, R=1, pad=pad, device=device)


def sample_prompts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    R: int,
    seeds: Sequence[int],
    batch_prompts: int = 8,
    **options: Any,
) -> list[RolloutBatch]:
    """Groups of ``R`` completions for ``prompts``, sampled ``batch_prompts`` prompts at a time.

    ``batch_prompts=1`` is the per-group path (:func:`sample_group` for each prompt, bit-identical
    to earlier releases); otherwise :func:`sample_groups` on consecutive blocks of
    ``batch_prompts`` prompts. The result for a prompt depends on the block it was sampled in, so
    callers choose blocks that are a fixed function of the prompt indices (see
    :func:`sample_groups`). ``options``: ``max_new_tokens``, ``temperature``, ``top_p``,
    ``stop_strings``, ``add_special_tokens``.
    """
    if int(batch_prompts) < 1:
        raise ValueError(f"batch_prompts must be >= 1, got {batch_prompts!r}")
    if len(seeds) != len(prompts):
        raise ValueError(f"need one seed per prompt, got {len(prompts)} prompts and "
                         f"{len(seeds)} seeds")
    if batch_prompts == 1:
        return [sample_group(model, tokenizer, p, R=R, seed=s, **options)
                for p, s in zip(prompts, seeds, strict=True)]
    out: list[RolloutBatch] = []
    for b0 in range(0, len(prompts), batch_prompts):
        out += sample_groups(model, tokenizer, prompts[b0 : b0 + batch_prompts], R=R,
                             seeds=seeds[b0 : b0 + batch_prompts], **options)
    return out


def prompt_seed(seed: int, index: int) -> int:
    """Sampling seed of prompt ``index`` of a run seeded by ``seed``: a function of the pair
    ``(seed, index)`` only, so a prompt draws the same completions whatever the run's length."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def sample_problem_groups(
    model: Any,
    tokenizer: Any,
    cfg: RankConfig,
    problem_set: ProblemSet,
    idxs: Sequence[int],
    *,
    R: int,
    batch_prompts: int,
) -> list[RolloutBatch]:
    """Groups of ``R`` completions for ``problem_set.problems[i]``, ``i in idxs``.

    The prompts are :func:`build_prompt` of each question with ``cfg.prompt_style`` and the
    set's few-shot examples; prompt ``i`` is seeded by :func:`prompt_seed` ``(cfg.seed, i)``;
    ``cfg``'s sampling options (``max_new_tokens``, ``temperature``, ``top_p``,
    ``stop_strings``) apply; :func:`sample_prompts` samples ``batch_prompts`` prompts at a time.
    Returns one :class:`RolloutBatch` per index, in the order of ``idxs``.
    """
    prompts = [build_prompt(problem_set.problems[i].question, style=cfg.prompt_style,
                            shots=problem_set.shots, tokenizer=tokenizer) for i in idxs]
    return sample_prompts(model, tokenizer, prompts, R=R,
                          seeds=[prompt_seed(cfg.seed, i) for i in idxs],
                          batch_prompts=batch_prompts, max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_p=cfg.top_p,
                          stop_strings=cfg.stop_strings)
