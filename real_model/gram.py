"""Exact per-rollout gradient Gram matrix of a causal LM from ONE batched forward + backward.

For a batch of ``R`` rollouts (one row each of ``input_ids``), the trajectory score of rollout ``i``
(seed paper, Eq. 18; the GRPO gradient is ``(1/R) sum_i A_i psi_i``, Eq. 19) is::

    psi_i = grad_theta  sum_t  w_it  log pi_theta(y_it | y_i,<t)        (w = completion_mask)

over ALL trainable parameters ``theta`` (``requires_grad=True``), and

    K_ij = <psi_i, psi_j>,   K in R^{R x R}.

The paper's gradient matrix (Sec. 7.1) has rows ``A_i psi_i^T``, so its Gram is
``G G^T = diag(A) K diag(A)``: its singular values are those of ``G`` without forming ``G``.

``method="exact"`` (default) runs one batched forward and one backward of
``L = sum_i sum_t w_it log pi(y_it | y_i,<t)``. Rollouts do not interact in a causal-LM forward
(each row attends only to itself), so the output gradient ``delta_i`` of every module, restricted
to row ``i``, is exactly the gradient of rollout ``i``'s own term, and per module:

* ``nn.Linear``, ``y = a W^T + b``: ``dW_i = delta_i^T a_i``, hence
  ``<dW_i, dW_j> = sum_{t,t'} (delta_it . delta_jt') (a_it . a_jt')`` (cost ``(RT)^2 (d_in+d_out)``)
  or explicit per-sample gradients chunked over output rows (cost ``R T d_in d_out``), whichever is
  cheaper for the layer's shape; ``db_i = sum_t delta_it``.
* ``nn.Embedding``: ``<dE_i, dE_j> = sum_{t,t'} [id_it == id_jt'] (delta_it . delta_jt')``.
* tied embeddings (``lm_head.weight is embed_tokens.weight``): the parameter's gradient is the sum
  ``H_i + E_i`` of both uses, so the cross terms ``<H_i, E_j> + <E_i, H_j>`` are included.
* norms: closed forms (``out = weight * z`` of RMSNorm, from the ``z`` of a re-run of the norm;
  ``nn.LayerNorm`` and subclasses such as Nemotron's LayerNorm1P), each module class checked once
  per pass against the generic path;
* any other small leaf module: exact per-sample vector-Jacobian products of the module on its
  captured input (:func:`torch.func.vmap`).

The per-layer identities are applied by :class:`real_model.gram_capture.GramCapture` (the same
engine that measures a host's own backward in-run). For Hugging Face causal LMs the pass runs the
backbone and then the head in vocabulary tiles (:func:`real_model.gram_head.head_logprobs`), so
no ``[R, T, V]`` logits tensor exists; the head's Gram (weight, bias, tied cross terms) is added
tile by tile. The backward asks autograd only for what the capture's hooks need
(:meth:`GramCapture.grad_inputs`), so autograd skips the batched weight gradients, which the
per-sample products replace: the cost stays close to one plain forward + backward. Every trainable
parameter must be accounted for exactly once, or a ``ValueError`` names the module. No
``[R, num_parameters]`` buffer is created; Gram entries are accumulated in float64.

:func:`rows_gram` is the bounded-memory second pass for any real token weights (e.g. a trainer's
``dL/d log p``): per-block Grams, as many blocks per forward + backward as a memory budget allows.

``method="naive"`` is the reference: ``R`` separate forward + backward passes (one per rollout),
each ``psi_i`` flattened and stored (at most ``naive_stored`` at once), and ``K`` from float64
chunked dot products. Docs and benchmark: ``docs/real_model_gram.md``,
``benchmarks/bench_gram.py``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from real_model import gram_layers as gm
from real_model import gram_triton
from real_model.gram_capture import GramCapture, validate_blocks
from real_model.gram_head import head_logprobs, head_transform

__all__ = [
    "trajectory_gram",
    "rows_gram",
    "token_logprobs",
    "trainable_parameters",
    "model_device",
    "causal_lm_parts",
    "CausalLMParts",
    "pass_bytes_per_row",
    "pass_fixed_bytes",
    "plan_passes",
    "default_memory_budget",
    "reshard_fsdp",
]

Method = Literal["exact", "naive"]
LinearMethod = Literal["auto", "measured", "identity", "per_sample", "triton"]
GramPrecision = Literal["auto", "float64", "float32"]


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` for every distinct parameter with ``requires_grad=True``."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (its local shard's under FSDP2: a ``DTensor``
    parameter), where its inputs go. A model without parameters is a ``ValueError``."""
    p = next(model.parameters(), None)
    if p is None:
        raise ValueError(f"{type(model).__name__} has no parameters: it has no device")
    return (p.to_local() if hasattr(p, "to_local") else p).device


def _check_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    wname: str = "completion_mask",
) -> torch.Tensor:
    for name, x in (("input_ids", input_ids), ("attention_mask", attention_mask),
                    (wname, completion_mask)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(f"{name} must be shaped [R, T], got shape {tuple(x.shape)}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 2:
        raise ValueError(
            f"input_ids needs R >= 1 rows and T >= 2 tokens, got {tuple(input_ids.shape)}"
        )
    for name, x in (("attention_mask", attention_mask), (wname, completion_mask)):
        if x.shape != input_ids.shape:
            raise ValueError(
                f"{name} shape {tuple(x.shape)} differs from input_ids shape "
                f"{tuple(input_ids.shape)}"
            )
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    am = attention_mask
    if not bool(((am == 0) | (am == 1)).all()):
        raise ValueError("attention_mask must hold only 0 and 1")
    w = completion_mask.to(torch.float64)
    if not bool(torch.isfinite(w).all()):
        idx = tuple(int(i) for i in torch.nonzero(~torch.isfinite(w))[0])
        raise ValueError(f"{wname} contains a non-finite value at index {idx}")
    if bool((w[:, 0] != 0).any()):
        raise ValueError(
            f"{wname}[:, 0] must be 0: the first token has no conditional log-probability "
            "(put the weights on completion tokens, never on the first prompt token)"
        )
    if bool(((am == 0) & (w != 0)).any()):
        idx = tuple(int(i) for i in torch.nonzero((am == 0) & (w != 0))[0])
        raise ValueError(
            f"{wname} is non-zero on a padding token (attention_mask 0) at {idx}"
        )
    return w


def _forward_kwargs(model: nn.Module, attention_mask: torch.Tensor, position_ids: Any) -> dict:
    kw: dict[str, Any] = {"attention_mask": attention_mask}
    try:
        sig = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic callables
        sig = {}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values())

    def accepts(name: str) -> bool:  # wrappers such as PEFT's pass **kwargs to the model
        return name in sig or var_kw

    if accepts("use_cache"):
        kw["use_cache"] = False
    if isinstance(position_ids, str):
        if position_ids != "from_mask":
            raise ValueError(
                f"position_ids must be 'from_mask', None or a tensor, got {position_ids!r}"
            )
        if accepts("position_ids"):
            kw["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    elif position_ids is not None:
        kw["position_ids"] = position_ids
    return kw


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    position_ids: Any = "from_mask",
    temperature: float = 1.0,
) -> torch.Tensor:
    """``log pi(input_ids[i,t] | input_ids[i,<t])`` shaped ``[R, T]`` (column 0 is 0), with graph.

    The full-logits route (``[R, T, V]``; the naive reference and models without a separable
    head use it). Logits are upcast to float32 when the model computes in a lower precision
    (float64 is kept) and divided by ``temperature``. ``position_ids="from_mask"`` (default)
    passes ``cumsum(attention_mask) - 1`` so that a left-padded row scores exactly like the
    unpadded sequence; ``None`` lets the model decide.
    """
    out = model(input_ids=input_ids, **_forward_kwargs(model, attention_mask, position_ids))
    logits = out.logits if hasattr(out, "logits") else out[0]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    tok = lp.gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(tok[:, :1]), tok], dim=1)


@dataclass(frozen=True)
class CausalLMParts:
    """A Hugging Face causal LM split as TRL's fused head splits it: ``backbone(...)`` returns
    ``last_hidden_state`` ``[R, T, d]``; ``head`` is the ``nn.Linear`` of the output embeddings;
    ``lm`` is the model whose config gives the head transform (:func:`gram_head.head_transform`)."""

    lm: nn.Module
    backbone: nn.Module
    head: nn.Linear


def causal_lm_parts(model: nn.Module) -> CausalLMParts | None:
    """The backbone / head split of a (PEFT-wrapped) Hugging Face causal LM, or ``None``.

    ``None`` when the model exposes no ``nn.Linear`` output embedding or no separate
    ``base_model`` (e.g. a wrapper computing its own logits): callers then use the full logits.
    """
    lm = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    try:
        head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    except (NotImplementedError, AttributeError):
        head = None
    backbone = getattr(lm, "base_model", None)
    if not isinstance(head, nn.Linear) or not isinstance(backbone, nn.Module) or backbone is lm:
        return None
    return CausalLMParts(lm=lm, backbone=backbone, head=head)


def trajectory_gram(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    method: Method = "exact",
    chunk_size: int | None = None,
    return_logprobs: bool = False,
    position_ids: Any = "from_mask",
    linear_method: LinearMethod = "auto",
    gram_precision: GramPrecision = "auto",
    naive_stored: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Gram matrix ``K_ij = <psi_i, psi_j>`` of the per-rollout trajectory scores.

    ``psi_i = grad_theta sum_t completion_mask[i,t] log pi(input_ids[i,t] | input_ids[i,<t])`` over
    every parameter with ``requires_grad=True`` (seed paper Eq. 18, weighted per token). The
    model is used as it is (call ``model.eval()`` first if it
    has dropout); its ``.grad`` fields are not touched.

    Args:
        model: a causal LM returning ``.logits`` ``[R, T, V]`` (Hugging Face style).
        input_ids: ``[R, T]`` token ids, prompt + completion, right or left padded.
        attention_mask: ``[R, T]`` 1 for real tokens, 0 for padding.
        completion_mask: ``[R, T]`` per-token weights (0/1 or float); 0 on prompt and padding
            tokens; column 0 must be 0.
        method: ``"exact"`` (one batched forward + backward, per-layer identities) or ``"naive"``
            (``R`` backward passes and stored flat gradients; the reference).
        chunk_size: bound on the number of entries of any temporary block (default ``None``:
            2^23 on CPU; on a GPU a quarter of the free memory at the start of the backward, in
            float64 entries, clamped to [2^22, 2^28]: fewer, larger kernels matter more there).
        return_logprobs: also return the detached per-token log-probabilities ``[R, T]`` float64
            (column 0 is 0; unweighted).
        position_ids: ``"from_mask"`` (default: ``cumsum(attention_mask) - 1``), ``None`` (the
            model's default) or an ``[R, T]`` tensor.
        linear_method: ``"auto"`` (default: the cheaper of the two by multiply-add count;
            deterministic), ``"measured"`` (by a cached one-off timing of both where the counts
            are within a factor 4; fastest, but the choice may differ between processes),
            ``"identity"`` or ``"per_sample"`` for every Linear weight (exact mode only), or
            ``"triton"``: every Linear weight by the fused Triton kernel of
            ``real_model.gram_triton`` (opt-in; needs ``pip install triton`` and a CUDA device,
            or ``TRITON_INTERPRET=1`` to run it on CPU for correctness checks; slower than the
            default on an H200 at the Nemotron-Mini-4B shape, see ``docs/real_model_gram.md``).
        gram_precision: dtype of the per-chunk products of explicit per-sample gradients
            (exact mode; chunk results are always summed in float64): ``"auto"`` (default:
            float64, except float32 when every trainable parameter is bfloat16/float16, whose
            gradients carry ~3 significant digits, or float32 on CPU, summed over slabs of
            2^14 columns in float64: ~2e-8 relative, below the rows' float32 rounding;
            :func:`real_model.gram_capture.product_dtype`), ``"float64"`` or ``"float32"``.
        naive_stored: naive mode only: at most this many flat gradients ``psi_i`` held at once
            (default ``None``: all ``R``); fewer trade memory for recomputation, about
            ``R + R^2 / (2 naive_stored)`` single-rollout backward passes.

    Returns:
        ``K`` float64 ``[R, R]`` on the device of ``input_ids`` (symmetric), or ``(K, logprobs)``.

    Raises:
        ValueError: malformed inputs, no trainable parameter, or a parameter the exact mode cannot
            attribute per rollout (the message names the module type); ``linear_method="triton"``
            on a non-CUDA device without ``TRITON_INTERPRET=1``.
        ImportError: ``linear_method="triton"`` (exact mode) without triton installed.
    """
    _check_method(method, naive_stored)
    _check_options(linear_method, gram_precision, chunk_size)
    w = _check_inputs(input_ids, attention_mask, completion_mask)
    if method == "exact" and linear_method == "triton":
        gram_triton.require(input_ids.device)  # before the forward: clear, early errors
    if not trainable_parameters(model):
        raise ValueError("model has no parameter with requires_grad=True: psi would be empty")
    if method == "exact":
        opts = PassOptions(linear_method=linear_method, gram_precision=gram_precision,
                           chunk_size=None if chunk_size is None else int(chunk_size))
        K, lp = _gram_pass(model, input_ids, attention_mask, w, position_ids, blocks=None,
                           opts=opts, all_logprobs=return_logprobs)
        return (K, lp) if return_logprobs else K
    chunk = gm.default_chunk_size(input_ids.device) if chunk_size is None else int(chunk_size)
    K, lp = _naive_gram(model, input_ids, attention_mask, w, chunk, position_ids, naive_stored)
    K = _finite_symmetric(K)
    return (K, lp) if return_logprobs else K


def _check_method(method: str, naive_stored: int | None) -> None:
    if method not in ("exact", "naive"):
        raise ValueError(f"method must be 'exact' or 'naive', got {method!r}")
    if naive_stored is not None and int(naive_stored) < 1:
        raise ValueError(f"naive_stored must be a positive integer or None, got {naive_stored!r}")


def _finite_symmetric(K: torch.Tensor) -> torch.Tensor:
    """``(K + K^T) / 2``; ValueError if it holds a non-finite value (overflowed gradients)."""
    K = 0.5 * (K + K.T)
    if not bool(torch.isfinite(K).all()):
        raise ValueError("the Gram matrix holds non-finite values: the model's log-probabilities "
                         "or gradients overflowed (try float32 or float64)")
    return K


def _check_options(linear_method: str, gram_precision: str, chunk_size: int | None) -> None:
    if linear_method not in gm.LINEAR_METHODS:
        raise ValueError(
            f"linear_method must be one of {gm.LINEAR_METHODS}, got {linear_method!r}"
        )
    if gram_precision not in ("auto", "float64", "float32"):
        raise ValueError(
            f"gram_precision must be auto, float64 or float32, got {gram_precision!r}"
        )
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def _naive_gram(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    chunk: int,
    pos: Any,
    stored: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """R single-rollout backward passes; at most ``stored`` flat gradients held at once.

    With ``B = stored < R`` the rows are taken in blocks of ``B``: a block's gradients are stored,
    then every later rollout's gradient is recomputed once per block and dotted with them
    (about ``R + R^2 / (2B)`` backward passes instead of ``R``).
    """
    params = [p for _, p in trainable_parameters(model)]
    R = ids.shape[0]
    n = sum(p.numel() for p in params)
    dtype = params[0].dtype if all(p.dtype == params[0].dtype for p in params) else torch.float64
    B = R if stored is None else max(1, min(R, int(stored)))
    psi = torch.empty(B, n, dtype=dtype, device=ids.device)  # stored flat gradients
    cur = torch.empty(n, dtype=dtype, device=ids.device) if B < R else None
    step = max(1, chunk // (B + 1))
    buf = torch.empty(B + 1, min(step, n), dtype=torch.float64, device=ids.device)
    lps: list[torch.Tensor | None] = [None] * R

    def grad_into(i: int, dst: torch.Tensor) -> None:
        pos_i = pos[i : i + 1] if isinstance(pos, torch.Tensor) else pos
        with torch.enable_grad():
            tok = token_logprobs(model, ids[i : i + 1], am[i : i + 1], position_ids=pos_i)
            loss = (tok * w[i : i + 1].to(tok.dtype)).sum()
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        lps[i] = tok.detach().to(torch.float64)
        off = 0
        for g, p in zip(grads, params, strict=True):
            seg = dst[off : off + p.numel()]
            seg.zero_() if g is None else seg.copy_(g.reshape(-1))
            off += p.numel()

    def dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """float64 ``a b^T`` of flat gradients, in column chunks."""
        out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=ids.device)
        for c0 in range(0, n, step):
            c = min(step, n - c0)
            fa, fb = buf[: a.shape[0], :c], buf[a.shape[0] : a.shape[0] + b.shape[0], :c]
            fa.copy_(a[:, c0 : c0 + c])
            if b is a:
                out.addmm_(fa, fa.T)
            else:
                fb.copy_(b[:, c0 : c0 + c])
                out.addmm_(fa, fb.T)
        return out

    K = torch.zeros(R, R, dtype=torch.float64, device=ids.device)
    for i0 in range(0, R, B):
        i1 = min(R, i0 + B)
        for i in range(i0, i1):
            grad_into(i, psi[i - i0])
        blk = psi[: i1 - i0]
        K[i0:i1, i0:i1] = dots(blk, blk)
        for j in range(i1, R):  # only when B < R
            grad_into(j, cur)
            col = dots(blk, cur.unsqueeze(0))[:, 0]
            K[i0:i1, j] = col
            K[j, i0:i1] = col
    return K, torch.cat(lps)



# --------------------------------------------------------------------------- the exact pass
@dataclass(frozen=True)
class PassOptions:
    """Options of one exact forward + backward (see :func:`rows_gram` for their meaning)."""

    linear_method: str = "auto"
    gram_precision: str = "auto"
    chunk_size: int | None = None
    vocab_tile: int | None = None
    temperature: float = 1.0


def _weight_window(w: torch.Tensor, all_logprobs: bool) -> tuple[int, int]:
    """Columns ``[a, b)`` (``a >= 1``) holding every non-zero token weight (all if asked)."""
    T = w.shape[1]
    cols = (w != 0).any(dim=0).nonzero().reshape(-1)
    if all_logprobs or cols.numel() == 0:
        return 1, T
    return max(1, int(cols[0])), int(cols[-1]) + 1


def _pass_logprobs(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    pos: Any,
    window: tuple[int, int],
    cap: GramCapture,
    opts: PassOptions,
) -> torch.Tensor:
    """``log pi(ids[:, t] | ids[:, <t])`` for ``t`` in the window, ``[R, b - a]``, with graph.

    Hugging Face causal LMs: the backbone's last hidden state and the head in vocabulary tiles
    (:func:`gram_head.head_logprobs`, the head's Gram added by the capture; no ``[R, T, V]``
    tensor). Other models: their full logits (:func:`token_logprobs`).
    """
    a, b = window
    parts = causal_lm_parts(model)
    if parts is None:
        return token_logprobs(model, ids, am, position_ids=pos,
                              temperature=opts.temperature)[:, a:b]
    out = parts.backbone(input_ids=ids, **_forward_kwargs(parts.backbone, am, pos))
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    lp, _ = head_logprobs(
        h[:, a - 1 : b - 1], parts.head.weight, parts.head.bias, ids[:, a:b],
        transform=head_transform(parts.lm, opts.temperature), vocab_tile=opts.vocab_tile,
        capture=cap, param_grads=False,  # the pass wants dh and the Gram, never dW
    )
    return lp


def _reentrant_checkpointing(model: nn.Module) -> bool:
    """Whether a Hugging Face layer will run reentrant activation checkpointing (which
    ``torch.autograd.grad`` does not support)."""
    for mod in model.modules():
        if getattr(mod, "gradient_checkpointing", False) and mod.training:
            fn = getattr(mod, "_gradient_checkpointing_func", None)
            kw = getattr(fn, "keywords", None) or {}
            if kw.get("use_reentrant", True):
                return True
    return False


@contextlib.contextmanager
def _grads_kept(model: nn.Module) -> Iterator[None]:
    """Restore every trainable parameter's ``.grad`` afterwards (a full ``.backward()`` inside)."""
    params = [p for _, p in trainable_parameters(model)]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g


def reshard_fsdp(model: nn.Module) -> None:
    """Reshard every FSDP2 module (``torch.distributed.fsdp.FSDPModule``) of ``model``.

    Call after a Gram pass on an FSDP2 model: its backward asks for no parameter gradient, so
    FSDP's post-backward resharding may not run, and stale unsharded weights would then serve
    the next forward after the optimizer step. No-op without FSDP2 modules; every process of
    the FSDP group must call it (resharding frees, it does not communicate).
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _fsdp_roots(model: nn.Module) -> list[nn.Module]:
    """The outermost FSDP2 modules of ``model`` (none without FSDP2)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    roots: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule) and not any(
                name == r or name.startswith(r + ".") or r == "" for r, _ in roots):
            roots.append((name, m))
    return [m for _, m in roots]


def fsdp_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 modules (parameters sharded across processes): then every
    forward of a Gram pass is collective (an all-gather per module), and all processes must run
    the same passes."""
    return bool(_fsdp_roots(model))


@contextlib.contextmanager
def _fsdp_unsharded_roots(model: nn.Module) -> Iterator[None]:
    """FSDP2: the outermost FSDP modules' own parameters (the embedding, final norm and LM head
    of a causal LM wrapped per layer) unsharded for the block, every FSDP module resharded after.

    The tiled pass calls the backbone and reads the head's weight outside the root's forward,
    where FSDP would otherwise leave them sharded (``DTensor``); unsharded before the capture is
    built, a tied head and embedding are one tensor again, so the tie's cross terms are found.
    Collective (an all-gather per root): every process must run the same passes.
    """
    roots = _fsdp_roots(model)
    try:
        for r in roots:
            r.unshard()  # type: ignore[operator]
        yield
    finally:
        if roots:
            reshard_fsdp(model)


def _gram_pass(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    pos: Any,
    *,
    blocks: Sequence[Sequence[int]] | None,
    opts: PassOptions,
    all_logprobs: bool,
) -> tuple[Any, torch.Tensor]:
    """One forward + backward of ``L = sum_it w_it log pi(y_it)`` inside a :class:`GramCapture`.

    Returns ``(K or [K_b], logprobs [R, T] float64)`` (log-probs are 0 outside the window of
    non-zero weights unless ``all_logprobs``). A problem of the capture raises
    :class:`GramCaptureError` after the backward has run to the end (never from inside it).
    The backward asks autograd only for what the capture needs
    (:meth:`GramCapture.grad_inputs`), so the batched weight gradients are never formed; under
    reentrant checkpointing (no ``autograd.grad``) it runs ``.backward()`` and restores
    ``.grad``.
    """
    # not strict: a problem is recorded and raised by ``cap.result()`` AFTER the backward, so
    # the forward and backward always run to the end; under FSDP every process then runs the
    # same collectives (all-gathers of the parameters) whatever failed on one of them
    window = _weight_window(w, all_logprobs)
    with _fsdp_unsharded_roots(model):  # FSDP2: before the capture reads the parameters
        cap = GramCapture(model, blocks=blocks, linear_method=opts.linear_method,
                          gram_precision=opts.gram_precision, chunk_size=opts.chunk_size)
        with torch.enable_grad(), cap:
            lp = _pass_logprobs(model, ids, am, pos, window, cap, opts)
            loss = (lp * w[:, window[0] : window[1]].to(lp.dtype)).sum()
            if loss.requires_grad:
                if _reentrant_checkpointing(model):
                    with _grads_kept(model):
                        loss.backward()
                else:
                    torch.autograd.grad(loss, cap.grad_inputs(), allow_unused=True)
    full = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
    full[:, window[0] : window[1]] = lp.detach().to(torch.float64)
    return cap.result(), full


# --------------------------------------------------------------------------- bounded memory
ACT_PER_D = 20
"""Activation values one token keeps per decoder layer and hidden feature during an exact pass
(what autograd saves for the backward: norm outputs, projections, rotary copies, residual sums;
the capture's input taps share that storage), calibrated on SmolLM2-135M (float32, CPU, sdpa):
see ``docs/real_model_gram.md``, "Memory model"."""
ACT_PER_F = 5
"""The same per MLP intermediate feature (gate, up, activation, product)."""
ACT_PER_KEY = 2
"""The same per attention head and key position, for ``eager`` attention only (it keeps the
scores and probabilities ``[heads, T, T]`` per row and layer; sdpa/flash kernels do not)."""


def _text_config(model: nn.Module) -> Any:
    lm = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    cfg = getattr(lm, "config", None)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def pass_bytes_per_row(model: nn.Module, T: int) -> int:
    """Estimated bytes one row of ``T`` tokens adds to the peak of an exact pass.

    ``L T (20 d + 5 f [+ 2 H T for eager attention]) s`` for ``L`` layers of width ``d``, MLP
    width ``f``, ``H`` attention heads and ``s`` bytes per element of the trainable parameters,
    read from the (text) config (``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``_attn_implementation``); without a config, ``64 d`` per token
    and group of 7 Linear layers. The head's vocabulary tiles and the Gram's chunk buffers do
    not grow with the rows (:func:`pass_fixed_bytes`).
    """
    cfg = _text_config(model)
    trainable = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    s = max((p.element_size() for p in trainable), default=4)
    d = getattr(cfg, "hidden_size", None)
    if d is None:
        lins = [m for m in model.modules() if isinstance(m, nn.Linear)]
        d = max((m.in_features for m in lins), default=1)
        return int(T * 64 * d * max(1, len(lins) // 7) * s)
    L = int(getattr(cfg, "num_hidden_layers", 1))
    f = int(getattr(cfg, "intermediate_size", None) or 4 * d)
    per_token = ACT_PER_D * d + ACT_PER_F * f
    if getattr(cfg, "_attn_implementation", None) == "eager":
        per_token += ACT_PER_KEY * int(getattr(cfg, "num_attention_heads", 1)) * T
    return int(L * T * per_token * s)


def pass_fixed_bytes(chunk_size: int | None, device: torch.device) -> int:
    """Bytes of an exact pass that do not grow with the rows: four vocabulary tiles of
    ``gram_head.TILE_ENTRIES`` (logits, probabilities, their gradient, float64 at most) and three
    chunk buffers of the Gram (``chunk_size`` float64 entries each)."""
    from real_model.gram_head import TILE_ENTRIES

    chunk = gm.default_chunk_size(device) if chunk_size is None else int(chunk_size)
    return 4 * TILE_ENTRIES * 8 + 3 * chunk * 8


def default_memory_budget(device: torch.device) -> int:
    """Half of the memory available now: ``MemAvailable`` of ``/proc/meminfo`` on CPU (8 GiB if
    unreadable), free plus cached-unused memory on CUDA."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free // 2)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 8 << 30


def plan_passes(sizes: list[int], max_rows: int) -> list[list[int]]:
    """Group consecutive blocks (by index) so that each group holds at most ``max_rows`` rows;
    a block larger than that is a group of its own (a block is never split)."""
    passes: list[list[int]] = []
    rows = 0
    for b, n in enumerate(sizes):
        if passes and rows + n <= max_rows:
            passes[-1].append(b)
            rows += n
        else:
            passes.append([b])
            rows = n
    return passes


def rows_gram(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_weights: torch.Tensor,
    *,
    blocks: Sequence[Sequence[int]] | None = None,
    temperature: float = 1.0,
    position_ids: Any = "from_mask",
    memory_budget_bytes: int | None = None,
    linear_method: LinearMethod = "auto",
    gram_precision: GramPrecision = "auto",
    chunk_size: int | None = None,
    vocab_tile: int | None = None,
    return_logprobs: bool = False,
) -> Any:
    """Per-block Grams ``K_b = [<g_i, g_j>]_{i,j in b}`` of ``g_i = grad sum_t u_it log pi_it``.

    ``u = token_weights`` (any real per-token weights, e.g. a host's ``dL/d log p``), log-probs at
    ``temperature`` (TRL's ``log softmax(z / T)``), over every trainable parameter; exact, by
    forward + backward passes inside a :class:`GramCapture`, each over as many whole blocks as
    ``memory_budget_bytes`` allows (:func:`pass_bytes_per_row` per row, plus
    :func:`pass_fixed_bytes`); the head runs in vocabulary tiles (no ``[rows, T, V]`` tensor).

    Args:
        model: a causal LM (Hugging Face style; PEFT-wrapped models work), used as it is (its
            mode, hence its dropout, is the caller's: see ``gram_capture.active_dropout_modules``).
        input_ids, attention_mask: ``[R, T]``; token_weights: ``[R, T]`` real weights, 0 on
            padding and in column 0.
        blocks: row-index lists (e.g. the rows of each group); ``None``: the full ``[R, R]`` in
            one pass, whatever the budget.
        temperature: divides the logits (after logit scale and soft-cap, as TRL does).
        position_ids: ``"from_mask"`` (default), ``None`` (the model's default) or ``[R, T]``.
            With explicit positions, columns that are padding in every row of a pass are
            dropped (exact: padding is masked out).
        memory_budget_bytes: peak bytes for one pass (default :func:`default_memory_budget`).
        linear_method, gram_precision, chunk_size: as :func:`trajectory_gram`.
        vocab_tile: columns per vocabulary tile (default ``gram_head.default_vocab_tile``).
        return_logprobs: also return the detached log-probs ``[R, T]`` float64 (0 at column 0,
            outside the window of non-zero weights of each pass, and in rows of no block).

    Returns:
        ``K`` float64 ``[R, R]`` (``blocks=None``) or a list of ``[n_b, n_b]``; with
        ``return_logprobs``, ``(that, logprobs)``.
    """
    _check_options(linear_method, gram_precision, chunk_size)
    w = _check_inputs(input_ids, attention_mask, token_weights, "token_weights")
    if not trainable_parameters(model):
        raise ValueError("model has no parameter with requires_grad=True: the rows are empty")
    if memory_budget_bytes is not None and int(memory_budget_bytes) < 1:
        raise ValueError(f"memory_budget_bytes must be positive, got {memory_budget_bytes!r}")
    opts = PassOptions(linear_method=linear_method, gram_precision=gram_precision,
                       chunk_size=None if chunk_size is None else int(chunk_size),
                       vocab_tile=vocab_tile, temperature=float(temperature))
    R, T = input_ids.shape
    groups = validate_blocks(blocks, R) or [list(range(R))]
    budget = default_memory_budget(input_ids.device) if memory_budget_bytes is None else int(
        memory_budget_bytes)
    per_row = pass_bytes_per_row(model, T)
    max_rows = max(1, (budget - pass_fixed_bytes(chunk_size, input_ids.device)) // per_row)
    passes = [[0]] if blocks is None else plan_passes([len(g) for g in groups], max_rows)
    Ks: list[torch.Tensor | None] = [None] * len(groups)
    lp_all = torch.zeros(R, T, dtype=torch.float64, device=input_ids.device)
    for pas in passes:
        rows = [r for b in pas for r in groups[b]]
        rel, k = [], 0
        for b in pas:
            rel.append(list(range(k, k + len(groups[b]))))
            k += len(groups[b])
        K_pass, lp = _rows_pass(model, input_ids, attention_mask, w, position_ids, rows, rel,
                                opts, return_logprobs)
        for b, Kb in zip(pas, K_pass, strict=True):
            Ks[b] = Kb
        lp_all[rows] = lp
    out = Ks[0] if blocks is None else Ks
    return (out, lp_all) if return_logprobs else out


def _rows_pass(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    pos: Any,
    rows: list[int],
    blocks: list[list[int]],
    opts: PassOptions,
    all_logprobs: bool,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One exact pass over ``rows`` (``blocks`` relative to them); columns that are padding in
    every row are dropped when the positions are explicit (and the first kept column carries no
    weight); returns the block Grams and the log-probs ``[len(rows), T]``."""
    idx = torch.tensor(rows, dtype=torch.long, device=ids.device)
    ids_r, am_r, w_r = ids[idx], am[idx], w[idx]
    if isinstance(pos, torch.Tensor):
        pos_r = pos[idx]
    elif pos is not None:
        pos_r = (am_r.long().cumsum(-1) - 1).clamp(min=0)
    else:
        pos_r = None
    keep = am_r.bool().any(dim=0).nonzero().reshape(-1)
    if pos_r is None or keep.numel() < 2 or bool((w_r[:, keep[0]] != 0).any()):
        keep = torch.arange(ids.shape[1], device=ids.device)
    else:
        pos_r = pos_r[:, keep]
    Ks, lp = _gram_pass(model, ids_r[:, keep], am_r[:, keep], w_r[:, keep], pos_r,
                        blocks=blocks, opts=opts, all_logprobs=all_logprobs)
    full = torch.zeros(len(rows), ids.shape[1], dtype=torch.float64, device=ids.device)
    full[:, keep] = lp
    return Ks, full
