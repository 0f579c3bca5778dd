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
                nxt = torch.multinomial(_sampling_probs(logits, temperature, top_p), 1,
                                        generator=gen).squeeze(-1)
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
    return _assemble(x, new, keep, pad, texts, reasons)


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
    string completed by the newest token lies within the window.
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str], eos: int | None) -> None:
        self.tok = tokenizer
        self.stops = [s for s in stop_strings if s]
        self.eos = eos
        self.window = max((len(s) for s in self.stops), default=0) + 4

    def check(self, ids: list[int]) -> tuple[str, str] | None:
        """``(reason, text)`` if the row ends with its newest token ``ids[-1]``, else ``None``."""
        if self.eos is not None and ids[-1] == self.eos:
            return "eos", self.tok.decode(ids[:-1], skip_special_tokens=True)
        if not self.stops:
            return None
        tail = self.tok.decode(ids[-self.window :], skip_special_tokens=True)
        if not any(s in tail for s in self.stops):
            return None
        text = self.tok.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in self.stops if s in text]
        return ("stop", text[: min(cuts)]) if cuts else None


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
    same per-group seeding): prompts are left-padded to a common length (``position_ids`` from the
    attention mask, so padding does not shift positions), the token prefix all prompts share (a
    few-shot header) is prefilled once, each prompt's own tokens once, its KV cache is repeated
    ``R`` times (:func:`_prefill`), and every decoding step runs all rows together. Group
    ``g`` draws its tokens from its own ``torch.Generator`` seeded by ``seeds[g]`` with one
    ``multinomial`` call over its ``R`` rows per step, as :func:`sample_group` does, so for the
    same logits both give the same tokens. Stops are detected per row on the decoded tail only
    (:class:`_StopWatch`); once a quarter of the rows in the batch have finished, they are dropped
    from it (KV cache ``batch_select_indices``; a finished row's draws are then made from a
    placeholder distribution, which leaves every other row's draw unchanged).

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
    import torch

    G = len(prompts)
    if G < 1 or len(seeds) != G:
        raise ValueError(f"need one seed per prompt and >= 1 prompt, got {G} prompts and "
                         f"{len(seeds)} seeds")
    if R < 1 or max_new_tokens < 1:
        raise ValueError(f"need R >= 1 and max_new_tokens >= 1, got R={R}, {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    device = next(model.parameters()).device
    pids = [list(tokenizer.encode(p, add_special_tokens=add_special_tokens)) for p in prompts]
    if any(not p for p in pids):
        raise ValueError("a prompt encodes to zero tokens")
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    lens = [len(p) for p in pids]
    N = G * R
    next_pos = torch.tensor(lens, device=device).repeat_interleave(R)  # position of next token
    new = torch.full((N, max_new_tokens), pad, dtype=torch.long, device=device)
    keep = np.zeros(N, dtype=np.int64)
    texts = [""] * N
    reasons = ["length"] * N
    active = np.ones(N, dtype=bool)
    toks: list[list[int]] = [[] for _ in range(N)]
    watch = _StopWatch(tokenizer, stop_strings, eos)
    with torch.no_grad():
        past, logits, attn = _prefill(model, pids, R=R, pad=pad, device=device)
        live = np.arange(N)  # original row of each batch row (logits, KV cache, attn)
        compact = hasattr(past, "batch_select_indices")
        for t in range(max_new_tokens):
            nxt = torch.full((N,), pad, dtype=torch.long, device=device)
            slot = np.full(N, -1)
            slot[live] = np.arange(live.size)
            for g in range(G):
                rows = np.arange(g * R, (g + 1) * R)
                if not active[rows].any():
                    continue
                inb = slot[rows] >= 0  # rows of group g still in the batch
                lg = logits[torch.from_numpy(slot[rows][inb]).to(device)]
                if temperature == 0:
                    pick = lg.argmax(dim=-1)
                else:
                    probs = _sampling_probs(lg, temperature, top_p)
                    if not inb.all():  # rows dropped from the batch (finished): a placeholder
                        # distribution, so the group's draw is one multinomial over R rows as in
                        # sample_group (each row's sample depends on its own probabilities only)
                        full = torch.full((R, probs.shape[-1]), 1.0 / probs.shape[-1],
                                          dtype=probs.dtype, device=device)
                        full[torch.from_numpy(np.flatnonzero(inb)).to(device)] = probs
                        probs = full
                    pick = torch.multinomial(probs, 1, generator=gens[g]).squeeze(-1)
                    if not inb.all():
                        pick = pick[torch.from_numpy(np.flatnonzero(inb)).to(device)]
                nxt[torch.from_numpy(rows[inb]).to(device)] = pick
            act = torch.from_numpy(active).to(device)
            nxt = torch.where(act, nxt, torch.full_like(nxt, pad))
            new[:, t] = nxt
            for i, tok in zip(np.flatnonzero(active), nxt[act].tolist(), strict=True):
                toks[i].append(tok)
                keep[i] = t + 1
                done = watch.check(toks[i])
                if done is not None:
                    reasons[i], texts[i] = done
                    active[i] = False
            if not active.any() or t + 1 == max_new_tokens:
                break
            if compact and active[live].sum() <= 0.75 * live.size:  # drop finished rows
                kept = np.flatnonzero(active[live])
                idx = torch.from_numpy(kept).to(device)
                past.batch_select_indices(idx)
                attn, live = attn[idx], live[kept]
            lv = torch.from_numpy(live).to(device)
            attn = torch.cat([attn, torch.ones((live.size, 1), dtype=attn.dtype, device=device)],
                             dim=1)
            out = model(input_ids=nxt[lv][:, None], attention_mask=attn,
                        position_ids=(next_pos[lv] + t)[:, None], past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()
    for i in np.flatnonzero(active):  # ran to the length limit
        texts[i] = tokenizer.decode(toks[i], skip_special_tokens=True)
    batches = []
    for g, p in enumerate(pids):
        rows = slice(g * R, (g + 1) * R)
        x = torch.tensor([p] * R, dtype=torch.long, device=device)
        batches.append(_assemble(x, new[rows], keep[rows], pad, texts[rows], reasons[rows]))
    return batches


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
        out = model(input_ids=torch.tensor([list(pids[0][:P])], device=device), use_cache=True)
        past = out.past_key_values
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
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=past,
                use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1, :].float()
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
