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
* norms: closed forms (``out = weight * z`` of RMSNorm, from the ``z`` autograd saved;
  ``nn.LayerNorm`` and subclasses such as Nemotron's LayerNorm1P), each module class checked once
  per call against the generic path;
* any other small leaf module: exact per-sample vector-Jacobian products of the module on its
  captured input (:func:`torch.func.vmap`).

The backward only asks autograd for the gradients w.r.t. the outputs of the modules whose inputs
need no gradient (the embeddings), so autograd skips
the batched weight gradients, which the per-sample products replace: the cost stays close to one
plain forward + backward. Every trainable parameter must be accounted for, or a ``ValueError``
names the module type that is not supported. No ``[R, num_parameters]`` buffer is created; Gram
entries are accumulated in float64.

``method="naive"`` is the reference: ``R`` separate forward + backward passes (one per rollout),
each ``psi_i`` flattened and stored (at most ``naive_stored`` at once), and ``K`` from float64
chunked dot products. Docs and benchmark: ``docs/real_model_gram.md``,
``benchmarks/bench_gram.py``.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from typing import Any, Literal

import torch
from torch import nn

from real_model import _gram_modules as gm
from real_model import _gram_triton
from real_model._gram_plan import Plan

__all__ = ["trajectory_gram", "token_logprobs", "trainable_parameters"]

Method = Literal["exact", "naive"]
LinearMethod = Literal["auto", "measured", "identity", "per_sample", "triton"]
GramPrecision = Literal["auto", "float64", "float32"]


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` for every distinct parameter with ``requires_grad=True``."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _check_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    for name, x in (("input_ids", input_ids), ("attention_mask", attention_mask),
                    ("completion_mask", completion_mask)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(f"{name} must be shaped [R, T], got shape {tuple(x.shape)}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 2:
        raise ValueError(
            f"input_ids needs R >= 1 rows and T >= 2 tokens, got {tuple(input_ids.shape)}"
        )
    for name, x in (("attention_mask", attention_mask), ("completion_mask", completion_mask)):
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
        raise ValueError(f"completion_mask contains a non-finite value at index {idx}")
    if bool((w[:, 0] != 0).any()):
        raise ValueError(
            "completion_mask[:, 0] must be 0: the first token has no conditional log-probability "
            "(put the weights on completion tokens, never on the first prompt token)"
        )
    if bool(((am == 0) & (w != 0)).any()):
        idx = tuple(int(i) for i in torch.nonzero((am == 0) & (w != 0))[0])
        raise ValueError(
            f"completion_mask is non-zero on a padding token (attention_mask 0) at {idx}"
        )
    return w


def _forward_kwargs(model: nn.Module, attention_mask: torch.Tensor, position_ids: Any) -> dict:
    kw: dict[str, Any] = {"attention_mask": attention_mask}
    try:
        sig = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic callables
        sig = {}
    if "use_cache" in sig:
        kw["use_cache"] = False
    if isinstance(position_ids, str):
        if position_ids != "from_mask":
            raise ValueError(
                f"position_ids must be 'from_mask', None or a tensor, got {position_ids!r}"
            )
        if "position_ids" in sig:
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
) -> torch.Tensor:
    """``log pi(input_ids[i,t] | input_ids[i,<t])`` shaped ``[R, T]`` (column 0 is 0), with graph.

    Logits are upcast to float32 when the model computes in a lower precision (float64 is kept).
    ``position_ids="from_mask"`` (default) passes ``cumsum(attention_mask) - 1`` so that a
    left-padded row scores exactly like the unpadded sequence; ``None`` lets the model decide.
    """
    out = model(input_ids=input_ids, **_forward_kwargs(model, attention_mask, position_ids))
    logits = out.logits if hasattr(out, "logits") else out[0]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    tok = lp.gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(tok[:, :1]), tok], dim=1)


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
            ``real_model._gram_triton`` (opt-in; needs ``pip install triton`` and a CUDA device,
            or ``TRITON_INTERPRET=1`` to run it on CPU for correctness checks; not yet
            measured on a GPU, see ``docs/real_model_gram.md``).
        gram_precision: dtype of the per-chunk products of explicit per-sample gradients
            (exact mode; chunk results are always summed in float64): ``"auto"`` (default:
            float64, except float32 when every trainable parameter is bfloat16/float16, whose
            gradients carry ~3 significant digits), ``"float64"`` or ``"float32"``.
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
    if method not in ("exact", "naive"):
        raise ValueError(f"method must be 'exact' or 'naive', got {method!r}")
    if linear_method not in gm.LINEAR_METHODS:
        raise ValueError(
            f"linear_method must be one of {gm.LINEAR_METHODS}, got {linear_method!r}"
        )
    if gram_precision not in ("auto", "float64", "float32"):
        raise ValueError(
            f"gram_precision must be auto, float64 or float32, got {gram_precision!r}"
        )
    if naive_stored is not None and int(naive_stored) < 1:
        raise ValueError(f"naive_stored must be a positive integer or None, got {naive_stored!r}")
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    w = _check_inputs(input_ids, attention_mask, completion_mask)
    if method == "exact" and linear_method == "triton":
        _gram_triton.require(input_ids.device)  # before the forward: clear, early errors
    if not trainable_parameters(model):
        raise ValueError("model has no parameter with requires_grad=True: psi would be empty")
    if method == "naive":
        chunk = gm.default_chunk_size(input_ids.device) if chunk_size is None else int(chunk_size)
        K, lp = _naive_gram(
            model, input_ids, attention_mask, w, chunk, position_ids, naive_stored
        )
    else:
        K, lp = _exact_gram(
            model, input_ids, attention_mask, w, None if chunk_size is None else int(chunk_size),
            position_ids, linear_method, gram_precision,
        )
    K = 0.5 * (K + K.T)
    if not bool(torch.isfinite(K).all()):
        raise ValueError("the Gram matrix holds non-finite values: the model's log-probabilities "
                         "or gradients overflowed (try float32 or float64)")
    return (K, lp) if return_logprobs else K


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


def _product_dtype(model: nn.Module, gram_precision: str) -> torch.dtype:
    if gram_precision == "float64":
        return torch.float64
    if gram_precision == "float32":
        return torch.float32
    low = {torch.bfloat16, torch.float16}
    return torch.float32 if all(p.dtype in low for _, p in trainable_parameters(model)) else (
        torch.float64
    )


def _exact_gram(
    model: nn.Module,
    ids: torch.Tensor,
    am: torch.Tensor,
    w: torch.Tensor,
    chunk: int | None,
    pos: Any,
    linear_method: str,
    gram_precision: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    engine = _ExactGram(
        model, R=ids.shape[0], device=ids.device, chunk=chunk, linear_method=linear_method,
        product_dtype=_product_dtype(model, gram_precision),
    )
    return engine.run(model, ids, am, w, pos)


class _ExactGram:
    """The exact Gram of one batch: forward hooks record inputs, backward hooks add identities.

    One instance serves one :func:`trajectory_gram` call. The forward (:meth:`record`) keeps each
    parameterised module's input row-block; the backward delivers the output gradient ``delta`` of
    every such module (:meth:`add_contribution`), which adds that module's per-layer identity to
    ``K``:

    * :meth:`add_linear`: ``<dW_i, dW_j>`` with ``dW_i = delta_i^T a_i`` and ``<db_i, db_j>``;
    * :meth:`add_embedding`: ``sum_{t,t'} [id_it = id_jt'] (delta_it . delta_jt')`` plus, for a
      tied LM head, the cross terms ``<H_i, E_j> + <E_i, H_j>``;
    * :meth:`add_leaf`: closed-form norm gradients (verified once per module class) or per-row
      VJPs of any other small leaf module.

    State (all attributes): ``K`` (float64 ``[R, R]``), ``saved`` (module name -> captured input),
    ``calls`` (forward calls per module), ``roots`` (outputs whose inputs need no gradient: the
    backward starts from them), the tied-head rows ``tied_rows``/``tied_values``, the per-class
    verdicts ``norm_closed_form_ok``, and ``recording`` (False once the forward is over, so that
    re-runs of a module for its per-sample gradients are not counted).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        R: int,
        device: torch.device,
        chunk: int | None,
        linear_method: str,
        product_dtype: torch.dtype,
    ) -> None:
        self.plan = Plan(model)
        self.R = R
        self.device = device
        self._chunk = chunk
        self.linear_method = linear_method
        self.product_dtype = product_dtype
        self.K = torch.zeros(R, R, dtype=torch.float64, device=device)
        self.scratch = gm.Scratch()
        self.saved: dict[str, Any] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.roots: list[tuple[str, torch.Tensor]] = []
        self.tied_embeddings = {emb for emb, _ in self.plan.tied.values()}
        self.embedding_of_head = {lin: emb for emb, lin in self.plan.tied.values()}
        self.tied_rows: dict[str, torch.Tensor] = {}  # embedding name -> sorted distinct ids
        self.tied_values: dict[str, torch.Tensor] = {}  # embedding name -> head rows [R, U, d]
        self.norm_closed_form_ok: dict[type, bool] = {}
        self.errors: list[str] = []
        self.recording = False

    @property
    def chunk(self) -> int:
        """Entries of one temporary block; by default sized from free memory at first use (the
        backward, when the forward's activations are held), see ``default_chunk_size``."""
        if self._chunk is None:
            self._chunk = gm.default_chunk_size(self.device)
        return self._chunk

    # ----------------------------------------------------------------- the pass
    def run(
        self, model: nn.Module, ids: torch.Tensor, am: torch.Tensor, w: torch.Tensor, pos: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward with hooks, one backward of ``sum_it w_it log pi``; returns ``(K, lp)``."""
        handles = [
            mod.register_forward_hook(functools.partial(self.record, mname), with_kwargs=True)
            for mname, (mod, _, _) in self.plan.modules.items()
        ]
        try:
            with torch.enable_grad():
                self.recording = True
                tok = token_logprobs(model, ids, am, position_ids=pos)
                self.recording = False
                loss = (tok * w.to(tok.dtype)).sum()
                self._check_coverage()
                if loss.requires_grad:
                    names = [m for m, _ in self.roots]
                    grads = torch.autograd.grad(
                        loss, [r for _, r in self.roots], allow_unused=True
                    )
                    # roots run last (they feed everything else); embeddings after the tied head
                    for mname, g in zip(names, grads, strict=True):
                        if g is not None:
                            self.add_contribution(mname, g)
        finally:
            self.recording = False
            for h in handles:
                h.remove()
        if self.errors:
            raise ValueError("; ".join(self.errors))
        return self.K, tok.detach().to(torch.float64)

    def _check_coverage(self) -> None:
        missing = [m for m in self.plan.modules if self.calls[m] == 0]
        if missing:
            m = missing[0]
            raise ValueError(
                f"module {m!r} ({type(self.plan.modules[m][0]).__name__}) owns trainable "
                f"parameters {self.plan.modules[m][2]} but was never called in the forward: its "
                "parameters may be used outside its forward, which the exact Gram cannot "
                "attribute (use method='naive', or set requires_grad=False on them)"
            )
        if not self.roots:
            raise ValueError("no trainable module output depends on the parameters only: "
                             "cannot run the exact Gram")

    # ----------------------------------------------------------------- forward side
    def _check_rows(self, mname: str, x: torch.Tensor) -> None:
        if x.dim() < 2 or x.shape[0] != self.R:
            raise ValueError(
                f"module {mname!r} ({type(self.plan.modules[mname][0]).__name__}) was called "
                f"with an input of shape {tuple(x.shape)} whose first axis is not the R={self.R} "
                "rollouts; the exact Gram needs batch-first per-rollout rows (use method='naive')"
            )

    def record(self, mname: str, mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        """Forward hook: keep the module's input and hook its output's gradient."""
        if not self.recording:  # re-runs of a module for its per-sample gradients
            return
        self.calls[mname] += 1
        if self.calls[mname] > 1:
            raise ValueError(
                f"module {mname!r} ({type(mod).__name__}) was called {self.calls[mname]} times "
                "in one forward (weight reuse or activation checkpointing): not supported by the "
                "exact Gram (use method='naive')"
            )
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"module {mname!r} ({type(mod).__name__}) returned a {type(out).__name__}, "
                "not one tensor: unsupported by the exact Gram"
            )
        if kwargs and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise ValueError(f"module {mname!r} ({type(mod).__name__}) got tensor keyword "
                             "arguments: unsupported by the exact Gram")
        kind = self.plan.modules[mname][1]
        if kind in ("linear", "embedding"):
            x = args[0]
            self._check_rows(mname, x)
            self.saved[mname] = x.detach()
            if mname in self.tied_embeddings:
                self.tied_rows[mname] = torch.unique(x.reshape(-1), sorted=True)
            needs_input_grad = x.requires_grad
        else:
            tensors = [v for v in args if isinstance(v, torch.Tensor)]
            for v in tensors:
                self._check_rows(mname, v)
            self.saved[mname] = (
                tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in args),
                out.grad_fn,
            )
            needs_input_grad = any(v.requires_grad for v in tensors)
        if not out.requires_grad:
            return
        self._check_rows(mname, out)
        if needs_input_grad:
            out.register_hook(functools.partial(self.add_contribution, mname))
        else:
            self.roots.append((mname, out))

    # ----------------------------------------------------------------- backward side
    def add_contribution(self, mname: str, delta: torch.Tensor) -> None:
        """Backward hook: ``delta`` is d(loss)/d(module output); add the module's Gram term."""
        mod, kind, names = self.plan.modules[mname]
        x = self.saved.pop(mname)
        if kind == "linear":
            self.add_linear(mname, names, x, delta)
        elif kind == "embedding":
            self.add_embedding(mname, mod, x, delta)
        else:
            args, grad_fn = x
            self.add_leaf(mod, names, args, grad_fn, delta)

    def add_linear(
        self, mname: str, names: list[str], x: torch.Tensor, delta: torch.Tensor
    ) -> None:
        """``<dW_i, dW_j>`` for ``dW_i = delta_i^T a_i``; ``<db_i, db_j>`` for ``sum_t delta_i``."""
        R = self.R
        a = x.reshape(R, -1, x.shape[-1])
        g = delta.reshape(R, -1, delta.shape[-1])
        if "weight" in names:
            gm.linear_weight_gram(
                self.K, a, g, method=self.linear_method, chunk_size=self.chunk,
                scratch=self.scratch, product_dtype=self.product_dtype,
            )
            emb = self.embedding_of_head.get(mname)
            if emb is not None:  # tied head: keep H_i on the batch's ids for the cross terms
                if emb not in self.tied_rows:
                    self.errors.append(f"tied embedding {emb!r} was not called before {mname!r}")
                else:
                    self.tied_values[emb] = gm.linear_weight_rows(
                        a, g.to(a.dtype), self.tied_rows[emb]
                    )
        if "bias" in names:
            gm.bias_gram(self.K, g)

    def add_embedding(
        self, mname: str, mod: nn.Module, x: torch.Tensor, delta: torch.Tensor
    ) -> None:
        """``<E_i, E_j> = sum_{t,t'} [id_it = id_jt'] (delta_it . delta_jt')`` (+ tied terms)."""
        ids = x.reshape(self.R, -1)
        g = delta.reshape(self.R, ids.shape[1], -1)
        tied = mname in self.tied_rows
        if tied and mname not in self.tied_values:
            self.errors.append(
                f"tied head of {mname!r} received no gradient before the embedding"
            )
        gm.embedding_rows_gram(
            self.K, ids, g, chunk_size=self.chunk, padding_idx=mod.padding_idx,
            tied_rows=self.tied_rows.get(mname), tied_values=self.tied_values.pop(mname, None),
        )

    def add_leaf(
        self, mod: nn.Module, names: list[str], args: tuple, grad_fn: Any, delta: torch.Tensor
    ) -> None:
        """Per-sample gradients of a small leaf module (closed-form norms, else per-row VJPs)."""
        R, cls = self.R, type(mod)
        grads = None
        if self.norm_closed_form_ok.get(cls, True):
            grads = gm.fast_leaf_grads(mod, names, args, delta, grad_fn, R=R)
        if grads is not None and cls not in self.norm_closed_form_ok:  # verify the closed form once
            ref = gm.generic_per_sample_grads(mod, names, args, delta, R=R)
            tol = 64 * torch.finfo(ref.dtype).eps * float(ref.abs().max())
            ok = bool((grads.to(ref.dtype) - ref).abs().max() <= tol)
            self.norm_closed_form_ok[cls] = ok
            grads = grads if ok else ref
        if grads is None:
            grads = gm.generic_per_sample_grads(mod, names, args, delta, R=R)
        gm.flat_gram(self.K, grads, self.scratch, product_dtype=self.product_dtype)
