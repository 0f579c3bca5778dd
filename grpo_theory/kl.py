"""KL regularisers at the gradient level: the k1/k2/k3 estimators, where they are placed, and the
exact expected gradient each placement delivers, against the exact gradients of the reverse and
the forward KL.

Notation (per token ``t`` of a sampled response ``y``; arrays ``[N, T]`` over ``N`` responses of
``T`` tokens, ``mask [N, T]`` marking real tokens):

* ``lr_t = log pi(y_t | y_<t) - log pi_ref(y_t | y_<t)`` the token log-ratio, ``delta_t =
  exp(-lr_t) = pi_ref / pi``; ``LR = sum_t lr_t`` the sequence log-ratio;
* ``S_t = grad_theta log pi(y_t | y_<t)`` the token score (``[N, T, d]``), ``psi = sum_t S_t``;
* ``RKL = KL(pi || pi_ref) = E_pi[LR]`` (the regulariser of ``J = E[r] - beta RKL``) and ``FKL =
  KL(pi_ref || pi)``.

Estimators (Schulman 2020; :func:`kl_estimate`), their derivative with respect to ``log pi``
(:func:`kl_estimate_derivative`):

=========  ==============================  =====================
name       ``k(lr)``                       ``dk / d log pi``
=========  ==============================  =====================
``k1``     ``lr``                          ``1``
``k2``     ``lr^2 / 2``                    ``lr``
``k3``     ``delta - 1 + lr``              ``1 - delta``
``abs``    ``|lr|``                        ``sign(lr)``
=========  ==============================  =====================

Every placement (:data:`KL_PLACEMENTS`) makes the KL term's gradient, for one sampled response,
``sum_t c_t S_t`` with a per-token coefficient ``c_t`` (:func:`kl_coefficients`): a term
differentiated by autograd ("k as loss") has ``c_t = dk/dlog pi``; a detached term that multiplies
the score ("k in reward", REINFORCE form) has ``c_t = k``. The exact expected gradient is then
``E_{y ~ q}[sum_t c_t S_t]`` over the sampling law ``q`` (``pi`` on-policy, ``pi_old``
off-policy; :func:`expected_kl_gradient`), set against the exact targets of
:func:`kl_gradient_targets`:

* ``reverse_sequence``: ``grad RKL = E_pi[LR psi]`` (Tang & Munos, arXiv 2506.09477: the correct
  gradient; ``E_pi[psi] = 0`` removes the ``grad log pi`` term of ``grad E_pi[LR]``);
* ``forward_sequence``: ``grad FKL = -E_{pi_ref}[psi]``;
* ``reverse_token``: ``sum_t E_{s_t ~ pi}[grad KL(pi(.|s_t) || pi_ref(.|s_t))]`` with the state
  law held fixed, ``= E_pi[sum_t lr_t S_t]``: the "partial gradient" of a sum of per-token KLs
  (arXiv 2506.09477, second pitfall), which ignores how token ``t`` changes the later states;
* ``forward_token``: ``sum_t E_{s_t ~ pi}[grad KL(pi_ref(.|s_t) || pi(.|s_t))] =
  E_pi[sum_t (1 - delta_t) S_t]``.

:func:`classify_gradient` names the target a gradient equals (up to a positive scale), or says it
is zero or a mix. For a one-token world (a bandit) the sequence and token targets coincide.

Exact worlds are given as arrays: every response with its per-token log-probs under ``pi``,
``pi_ref`` (and ``pi_old``) and its per-token scores. :func:`tabular_sequences`,
:func:`tabular_token_log_probs` and :func:`tabular_token_scores` build them for a tabular softmax
policy over ``V^T`` sequences (``T = 1``: a softmax bandit), with the state numbering of
``sims.token_mdp.TokenMDP``; :func:`tabular_partial_kl_gradients` gives the two token targets
by a second route (the softmax per-state KL gradients, weighted by the state law).
:func:`joint_groups` and :func:`expected_group_gradient` enumerate whole groups for a KL that
enters the reward before a group-normalised advantage. :func:`regularised_token_weights` is what
a KL term does to the per-token weights of the GRPO gradient
(:func:`grpo_theory.aggregation.aggregation_weights`).

numpy only; cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from .aggregation import aggregation_weights

__all__ = [
    "KL_ESTIMATORS",
    "KL_PLACEMENTS",
    "KL_TARGETS",
    "GradientClass",
    "kl_estimate",
    "kl_estimate_derivative",
    "kl_coefficients",
    "expected_kl_gradient",
    "kl_gradient_targets",
    "sequence_kl_values",
    "classify_gradient",
    "tabular_sequences",
    "tabular_token_log_probs",
    "tabular_token_scores",
    "tabular_partial_kl_gradients",
    "joint_groups",
    "expected_group_gradient",
    "regularised_token_weights",
]

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "abs")

#: Placement -> what it is (the coefficient ``c_t`` of the token score ``S_t``; ``k`` is the
#: estimator, ``r_t = pi / pi_old`` the token ratio).
KL_PLACEMENTS: dict[str, str] = {
    "loss": "k_t in the loss, differentiated: c_t = dk/dlog pi (lr_t)",
    "loss_k2_gradient": "value k_t, gradient of k2 (straight-through; verl's '+' variants): "
    "c_t = lr_t",
    "loss_ratio_weighted": "k_t r_t in the loss with the ratio differentiable (TRL "
    "use_bias_correction_kl): c_t = r_t (dk/dlog pi + k_t) (sequence ratio: see kl_coefficients)",
    "loss_is_k2": "value k_t, gradient of sg[min(r_t, clip)] k2_t (OpenRLHF unbiased_gradient): "
    "c_t = min(r_t, clip) lr_t",
    "reward": "k_t detached, on its own token's score: c_t = k_t",
    "reward_to_go": "k detached, summed over the token and the later ones: c_t = sum_{s >= t} k_s",
    "reward_sum": "k detached, summed over the whole response, on every token's score: "
    "c_t = sum_s k_s",
}

#: The exact targets of :func:`kl_gradient_targets`, in the order :func:`classify_gradient`
#: tries them.
KL_TARGETS: tuple[str, ...] = ("reverse_sequence", "forward_sequence", "reverse_token",
                               "forward_token")

Estimator = Literal["k1", "k2", "k3", "abs"]


def _check_estimator(estimator: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def _as_tokens(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"{name} must be shaped [N, T] (or [N]), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf")
    return a


def _mask(mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    if mask is None:
        return np.ones(shape)
    m = np.asarray(mask, dtype=np.float64)
    if m.ndim == 1:
        m = m[:, None]
    if m.shape != shape or not np.all((m == 0) | (m == 1)):
        raise ValueError(f"mask must be 0/1 shaped {shape}, got shape {m.shape}")
    return m


def kl_estimate(log_ratio: Any, *, estimator: Estimator) -> np.ndarray:
    """The estimator's value ``k(lr)`` at ``lr = log pi - log pi_ref`` (module table).

    ``k1 = lr``; ``k2 = lr^2 / 2``; ``k3 = exp(-lr) - 1 + lr`` (``= delta - 1 - log delta``,
    ``>= 0``); ``abs = |lr|``. For ``y ~ pi``, ``E[k1] = E[k3] = KL(pi || pi_ref)``.

    Args:
        log_ratio: any shape, finite.
        estimator: one of :data:`KL_ESTIMATORS`.

    >>> kl_estimate([0.0, 1.0], estimator="k3").round(6).tolist()
    [0.0, 0.367879]
    """
    _check_estimator(estimator)
    lr = np.asarray(log_ratio, dtype=np.float64)
    if not np.all(np.isfinite(lr)):
        raise ValueError("log_ratio contains NaN or inf")
    if estimator == "k1":
        return lr.copy()
    if estimator == "k2":
        return 0.5 * lr**2
    if estimator == "k3":
        return np.expm1(-lr) + lr
    return np.abs(lr)


def kl_estimate_derivative(log_ratio: Any, *, estimator: Estimator) -> np.ndarray:
    """``dk / d log pi`` at ``lr`` (``pi_ref`` fixed): ``1``, ``lr``, ``1 - exp(-lr)``,
    ``sign(lr)`` for k1, k2, k3, abs. "k as loss" multiplies the token score by this.

    >>> kl_estimate_derivative([0.5], estimator="k2").tolist()
    [0.5]
    """
    _check_estimator(estimator)
    lr = np.asarray(log_ratio, dtype=np.float64)
    if not np.all(np.isfinite(lr)):
        raise ValueError("log_ratio contains NaN or inf")
    if estimator == "k1":
        return np.ones_like(lr)
    if estimator == "k2":
        return lr.copy()
    if estimator == "k3":
        return -np.expm1(-lr)
    return np.sign(lr)


def kl_coefficients(
    log_ratio: Any,
    *,
    estimator: Estimator,
    placement: str,
    level: Literal["token", "sequence"] = "token",
    log_ratio_old: Any = None,
    ratio_level: Literal["token", "sequence"] = "token",
    weight_clip: float | None = None,
    importance: Literal["none", "token", "sequence"] = "none",
    mask: Any = None,
) -> np.ndarray:
    """Per-token coefficients ``c [N, T]``: the KL term's gradient for response ``n`` is
    ``sum_t c[n, t] S[n, t]`` (``S`` the token scores).

    Token level (``level="token"``, the estimator of each token's log-ratio ``lr_t``), by
    ``placement`` (:data:`KL_PLACEMENTS`):

    * ``"loss"``: ``c_t = k'(lr_t)``;
    * ``"loss_k2_gradient"``: ``c_t = lr_t`` (``k2' = lr``);
    * ``"loss_ratio_weighted"``: the loss ``sum_t rho k_t`` with ``rho`` differentiable: token
      ratio ``rho = r_t = exp(lr_old_t)``: ``c_t = r_t (k'(lr_t) + k_t)``; sequence ratio
      (``ratio_level="sequence"``, ``rho = exp(mean_t lr_old_t)`` on every token):
      ``c_t = rho (k'(lr_t) + (1/L) sum_s k_s)``. On-policy (``rho = 1``) with k3:
      ``k3' + k3 = lr``, so the token ratio turns k3 into k1-in-reward;
    * ``"loss_is_k2"``: ``c_t = min(r_t, clip) lr_t`` (``weight_clip``; None: no clip);
    * ``"reward"``: ``c_t = k_t``; ``"reward_to_go"``: ``c_t = sum_{s >= t} k_s``;
      ``"reward_sum"``: ``c_t = sum_s k_s``.

    Sequence level (``level="sequence"``, the estimator of ``LR = sum_t lr_t``; its gradient is
    on ``grad log pi(y) = sum_t S_t``, so ``c_t`` is the same on every token): ``"loss"``:
    ``k'(LR)``; ``"loss_k2_gradient"``: ``LR``; ``"reward"``: ``k(LR)``.

    ``importance`` multiplies ``c`` by a detached weight: ``"token"`` ``r_t``, ``"sequence"``
    ``prod_t r_t`` (the off-policy corrections of arXiv 2510.01555 and 2512.21852).

    Args:
        log_ratio: ``[N, T]`` ``lr = log pi - log pi_ref`` (``[N]``: one token).
        estimator: one of :data:`KL_ESTIMATORS`.
        placement: a key of :data:`KL_PLACEMENTS` (sequence level: ``loss``,
            ``loss_k2_gradient``, ``reward``).
        level: ``"token"`` (default) or ``"sequence"``.
        log_ratio_old: ``[N, T]`` ``log pi - log pi_old`` (default 0: on-policy).
        ratio_level: the ratio of ``"loss_ratio_weighted"``: ``"token"`` (default) or
            ``"sequence"`` (the geometric mean over the response's tokens).
        weight_clip: upper clip of ``r_t`` in ``"loss_is_k2"`` (OpenRLHF: 10); None: none.
        importance: ``"none"`` (default), ``"token"`` or ``"sequence"``.
        mask: ``[N, T]`` 0/1 real tokens (default all); masked tokens get ``c = 0`` and are left
            out of every sum.

    Returns:
        ``[N, T]`` float64.

    >>> kl_coefficients([[0.0, 1.0]], estimator="k1", placement="reward_to_go").tolist()
    [[1.0, 1.0]]
    """
    lr = _as_tokens(log_ratio, "log_ratio")
    m = _mask(mask, lr.shape)
    lo = np.zeros_like(lr) if log_ratio_old is None else _as_tokens(log_ratio_old,
                                                                    "log_ratio_old")
    if lo.shape != lr.shape:
        raise ValueError(f"log_ratio_old shape {lo.shape} does not match log_ratio {lr.shape}")
    lr, lo = lr * m, lo * m
    if level == "sequence":
        if placement not in ("loss", "loss_k2_gradient", "reward"):
            raise ValueError(f"placement {placement!r} has no sequence-level form; use 'loss', "
                             "'loss_k2_gradient' or 'reward'")
        LR = lr.sum(axis=1, keepdims=True)
        per = {"loss": lambda: kl_estimate_derivative(LR, estimator=estimator),
               "loss_k2_gradient": lambda: LR,
               "reward": lambda: kl_estimate(LR, estimator=estimator)}[placement]()
        c = np.broadcast_to(per, lr.shape).copy()
    elif level == "token":
        if placement not in KL_PLACEMENTS:
            raise ValueError(f"unknown KL placement {placement!r}; choose one of "
                             f"{sorted(KL_PLACEMENTS)}")
        k = kl_estimate(lr, estimator=estimator) * m
        dk = kl_estimate_derivative(lr, estimator=estimator)
        if placement == "loss":
            c = dk
        elif placement == "loss_k2_gradient":
            c = lr.copy()
        elif placement == "loss_ratio_weighted":
            if ratio_level == "token":
                c = np.exp(lo) * (dk + k)
            elif ratio_level == "sequence":
                L = np.maximum(m.sum(axis=1, keepdims=True), 1.0)
                rho = np.exp(lo.sum(axis=1, keepdims=True) / L)
                c = rho * (dk + k.sum(axis=1, keepdims=True) / L)
            else:
                raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
        elif placement == "loss_is_k2":
            w = np.exp(lo)
            if weight_clip is not None:
                w = np.minimum(w, float(weight_clip))
            c = w * lr
        elif placement == "reward":
            c = k
        elif placement == "reward_to_go":
            c = np.cumsum(k[:, ::-1], axis=1)[:, ::-1]
        else:  # reward_sum
            c = np.broadcast_to(k.sum(axis=1, keepdims=True), lr.shape).copy()
    else:
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if importance == "token":
        c = c * np.exp(lo)
    elif importance == "sequence":
        c = c * np.exp(lo.sum(axis=1, keepdims=True))
    elif importance != "none":
        raise ValueError(f"importance must be 'none', 'token' or 'sequence', got {importance!r}")
    return c * m


def expected_kl_gradient(coefficients: Any, *, probs: Any, scores: Any) -> np.ndarray:
    """``E_{y ~ q}[sum_t c_t(y) S_t(y)] = sum_n q_n sum_t c[n, t] S[n, t, :]``: the exact
    expected gradient of a KL term over an enumerated sampling law ``q``.

    Args:
        coefficients: ``[N, T]`` from :func:`kl_coefficients` (or read off a framework's code).
        probs: ``[N]`` the sampling law (``pi`` on-policy, ``pi_old`` off-policy), summing to 1.
        scores: ``[N, T, d]`` token scores ``S = grad log pi(y_t | y_<t)`` at ``pi``.

    Returns:
        ``[d]``.
    """
    c = _as_tokens(coefficients, "coefficients")
    q = _law(probs, c.shape[0])
    S = np.asarray(scores, dtype=np.float64)
    if S.shape[:2] != c.shape or S.ndim != 3:
        raise ValueError(f"scores must be shaped [N, T, d] with [N, T] = {c.shape}, got {S.shape}")
    return np.einsum("n,nt,ntd->d", q, c, S)


def _law(probs: Any, N: int) -> np.ndarray:
    q = np.asarray(probs, dtype=np.float64)
    if q.shape != (N,) or np.any(q < 0) or not np.isfinite(q).all():
        raise ValueError(f"probs must be a non-negative law shaped [{N}], got shape {q.shape}")
    if abs(q.sum() - 1.0) > 1e-9:
        raise ValueError(f"probs must sum to 1 (every response enumerated), got {q.sum()!r}")
    return q


def sequence_kl_values(logp: Any, ref_logp: Any, *, mask: Any = None) -> tuple[float, float]:
    """``(KL(pi || pi_ref), KL(pi_ref || pi))`` over every response:
    ``sum_y pi(y) LR(y)`` and ``-sum_y pi_ref(y) LR(y)``, with ``log pi(y) = sum_t logp``.

    Args:
        logp, ref_logp: ``[N, T]`` token log-probs under ``pi`` and ``pi_ref`` of all ``N``
            responses (each law must sum to 1).
        mask: ``[N, T]`` real tokens.
    """
    lp = _as_tokens(logp, "logp")
    lq = _as_tokens(ref_logp, "ref_logp")
    m = _mask(mask, lp.shape)
    a, b = (lp * m).sum(1), (lq * m).sum(1)
    P, Q = _law(np.exp(a), a.size), _law(np.exp(b), b.size)
    return float(P @ (a - b)), float(Q @ (b - a))


def kl_gradient_targets(logp: Any, ref_logp: Any, scores: Any, *, mask: Any = None
                        ) -> dict[str, np.ndarray]:
    """The exact gradients (``[d]`` each) a KL term can be set against, by enumeration.

    * ``reverse_sequence``: ``grad KL(pi || pi_ref) = sum_y pi(y) LR(y) psi(y)``;
    * ``forward_sequence``: ``grad KL(pi_ref || pi) = -sum_y pi_ref(y) psi(y)``;
    * ``reverse_token``: ``sum_y pi(y) sum_t lr_t S_t`` (per-state KLs, state law fixed);
    * ``forward_token``: ``sum_y pi(y) sum_t (1 - exp(-lr_t)) S_t``.

    ``psi = sum_t S_t``. The last two equal
    ``sum_s d_pi(s) grad KL(pi(.|s) || pi_ref(.|s))`` and its forward form, with ``d_pi`` the
    state law held fixed (:func:`tabular_partial_kl_gradients` computes them that way).

    Args:
        logp, ref_logp: ``[N, T]`` token log-probs of every response under ``pi``, ``pi_ref``.
        scores: ``[N, T, d]`` token scores at ``pi``.
        mask: ``[N, T]`` real tokens.
    """
    lp = _as_tokens(logp, "logp")
    lq = _as_tokens(ref_logp, "ref_logp")
    m = _mask(mask, lp.shape)
    S = np.asarray(scores, dtype=np.float64) * m[..., None]
    if S.shape[:2] != lp.shape:
        raise ValueError(f"scores must be shaped [N, T, d] with [N, T] = {lp.shape}")
    lr = (lp - lq) * m
    P = _law(np.exp((lp * m).sum(1)), lp.shape[0])
    Q = _law(np.exp((lq * m).sum(1)), lp.shape[0])
    psi = S.sum(axis=1)
    return {
        "reverse_sequence": (P * lr.sum(1)) @ psi,
        "forward_sequence": -(Q @ psi),
        "reverse_token": np.einsum("n,nt,ntd->d", P, lr, S),
        "forward_token": np.einsum("n,nt,ntd->d", P, -np.expm1(-lr) * m, S),
    }


@dataclass(frozen=True)
class GradientClass:
    """What a KL term's expected gradient ``g`` is.

    Attributes:
        matches: the :data:`KL_TARGETS` that ``g`` equals up to a positive scale (empty: none);
            ``("zero",)`` when ``g = 0``.
        scale: the scale ``c`` of ``g = c target`` for the first match (``nan``-free: 0 for
            zero, the least-squares scale on ``reverse_sequence`` for a mix).
        cos_reverse: cosine between ``g`` and ``grad KL(pi || pi_ref)`` (0 when ``g = 0``).
        rel_error_reverse: ``||g - grad RKL|| / ||grad RKL||`` (scale 1: the bias of ``g`` as an
            estimate of the reverse-KL gradient).
    """

    matches: tuple[str, ...]
    scale: float
    cos_reverse: float
    rel_error_reverse: float

    @property
    def label(self) -> str:
        """``"reverse"``/``"forward"`` + ``"_sequence"``/``"_token"``, ``"zero"`` or ``"mix"``
        (a one-token world matches both levels: the label is then the sequence one)."""
        return self.matches[0] if self.matches else "mix"


def classify_gradient(g: Any, targets: dict[str, np.ndarray], *, rtol: float = 1e-9
                      ) -> GradientClass:
    """Which exact target ``g`` equals (``g = c t`` with ``c > 0``, ``||g - c t|| <= rtol
    ||g||``), or zero (``||g|| <= rtol max ||t||``), or a mix.

    Args:
        g: ``[d]`` an expected gradient.
        targets: :func:`kl_gradient_targets`'s dict.
        rtol: relative tolerance.
    """
    g = np.asarray(g, dtype=np.float64)
    rev = np.asarray(targets["reverse_sequence"], dtype=np.float64)
    big = max(float(np.linalg.norm(t)) for t in targets.values())
    ng, nr = float(np.linalg.norm(g)), float(np.linalg.norm(rev))
    cos = float(g @ rev / (ng * nr)) if ng > 0 and nr > 0 else 0.0
    err = float(np.linalg.norm(g - rev) / nr) if nr > 0 else float(np.linalg.norm(g))
    if ng <= rtol * big:
        return GradientClass(("zero",), 0.0, cos, err)
    matches: list[str] = []
    scale = 0.0
    for name in KL_TARGETS:
        t = np.asarray(targets[name], dtype=np.float64)
        tt = float(t @ t)
        if tt == 0.0:
            continue
        c = float(g @ t) / tt
        if c > 0 and np.linalg.norm(g - c * t) <= rtol * ng:
            if not matches:
                scale = c
            matches.append(name)
    if not matches:
        scale = float(g @ rev) / (nr * nr) if nr > 0 else 0.0
    return GradientClass(tuple(matches), scale, cos, err)


# --- the tabular softmax world -------------------------------------------------------------------
def tabular_sequences(vocab: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence of ``length`` tokens from ``vocab`` and the state (prefix) each token is
    drawn in: ``(seqs [V^T, T], state_index [V^T, T])``.

    Sequence ``i`` is the base-``V`` number ``a_0 ... a_{T-1}``; the prefix ``a_0..a_{t-1}`` has
    state index ``(V^t - 1)/(V - 1) + sum_i a_i V^(t-1-i)`` (``sims.token_mdp``'s numbering);
    ``n_states = (V^T - 1)/(V - 1)``.
    """
    return _sequences(int(vocab), int(length))


@lru_cache(maxsize=16)
def _sequences(V: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    if V < 2 or T < 1 or V**T > 200_000:
        raise ValueError(f"need vocab >= 2, length >= 1 and V^T <= 200000, got V={V}, T={T}")
    idx = np.arange(V**T)
    seqs = np.stack([(idx // V ** (T - 1 - t)) % V for t in range(T)], axis=1)
    states = np.zeros_like(seqs)
    code = np.zeros(idx.size, dtype=np.int64)
    for t in range(T):
        states[:, t] = (V**t - 1) // (V - 1) + code
        code = code * V + seqs[:, t]
    seqs.setflags(write=False)
    states.setflags(write=False)
    return seqs, states


def _tabular_policy(logits: Any, vocab: int, length: int) -> np.ndarray:
    th = np.asarray(logits, dtype=np.float64)
    n = (vocab**length - 1) // (vocab - 1)
    if th.shape != (n, vocab) or not np.all(np.isfinite(th)):
        raise ValueError(f"logits must be finite and shaped [{n}, {vocab}], got {th.shape}")
    z = np.exp(th - th.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def tabular_token_log_probs(logits: Any, *, vocab: int, length: int) -> np.ndarray:
    """``[V^T, T]`` ``log pi(a_t | s_t)`` of every sequence under the tabular softmax
    ``pi(. | s) = softmax(logits[s])`` (``logits [n_states, V]``)."""
    pol = _tabular_policy(logits, vocab, length)
    seqs, states = tabular_sequences(vocab, length)
    return np.log(pol[states, seqs])


def tabular_token_scores(logits: Any, *, vocab: int, length: int) -> np.ndarray:
    """``[V^T, T, n_states V]`` token scores ``grad_theta log pi(a_t | s_t)``: in the block of
    state ``s_t``, ``e_{a_t} - pi(. | s_t)``; 0 elsewhere."""
    pol = _tabular_policy(logits, vocab, length)
    seqs, states = tabular_sequences(vocab, length)
    N, T = seqs.shape
    out = np.zeros((N, T, pol.shape[0], vocab))
    n, t = np.meshgrid(np.arange(N), np.arange(T), indexing="ij")
    out[n, t, states] -= pol[states]
    out[n, t, states, seqs] += 1.0
    return out.reshape(N, T, -1)


def tabular_partial_kl_gradients(logits: Any, ref_logits: Any, *, vocab: int, length: int
                                 ) -> dict[str, np.ndarray]:
    """The two token targets by the per-state route: with ``d(s) = P_pi(reach s)`` held fixed,

    * ``reverse_token = sum_s d(s) grad KL(pi_s || ref_s)``, block ``s``:
      ``d(s) pi_s (log(pi_s / ref_s) - KL(pi_s || ref_s))`` (softmax gradient of the KL);
    * ``forward_token = sum_s d(s) grad KL(ref_s || pi_s)``, block ``s``: ``d(s) (pi_s - ref_s)``.

    Returns ``{"reverse_token": [d], "forward_token": [d]}``.
    """
    pol = _tabular_policy(logits, vocab, length)
    ref = _tabular_policy(ref_logits, vocab, length)
    seqs, states = tabular_sequences(vocab, length)
    P = np.exp(np.log(pol[states, seqs]).sum(axis=1))
    d = np.zeros(pol.shape[0])
    for t in range(seqs.shape[1]):
        d += np.bincount(states[:, t], weights=P, minlength=pol.shape[0])
    lr = np.log(pol) - np.log(ref)
    kl = (pol * lr).sum(axis=1, keepdims=True)
    return {"reverse_token": (d[:, None] * pol * (lr - kl)).reshape(-1),
            "forward_token": (d[:, None] * (pol - ref)).reshape(-1)}


# --- groups: a KL in the reward of a group-normalised advantage ----------------------------------
def joint_groups(n_outcomes: int, group_size: int, *, ordered: bool = True
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Every group of ``G`` outcomes out of ``n``: ``(groups [M, G], multiplicity [M])``.

    ``ordered=True``: the ``n^G`` ordered groups (row ``m`` is ``m`` in base ``n``), each of
    multiplicity 1. ``ordered=False``: the ``C(n + G - 1, G)`` multisets (sorted rows), each with
    its number of orderings ``G! / prod_j c_j!``; an exchangeable estimator's expectation over
    them equals the one over ordered groups. At most 2^20 rows.
    """
    n, G = int(n_outcomes), int(group_size)
    if n < 1 or G < 1 or (ordered and n**G > 2**20):
        raise ValueError(f"need n >= 1, G >= 1 and n^G <= 2^20, got n={n}, G={G}")
    if ordered:
        m = np.arange(n**G)
        return (np.stack([(m // n ** (G - 1 - i)) % n for i in range(G)], axis=1),
                np.ones(n**G))
    import itertools
    from math import factorial, prod

    rows = np.array(list(itertools.combinations_with_replacement(range(n), G)), dtype=np.int64)
    if rows.shape[0] > 2**20:
        raise ValueError(f"{rows.shape[0]} multisets is too many")
    mult = np.array([factorial(G) / prod(factorial(c) for c in np.bincount(r, minlength=n))
                     for r in rows])
    return rows, mult


def expected_group_gradient(advantages: Any, groups: Any, *, probs: Any, psi: Any,
                            multiplicity: Any = None) -> np.ndarray:
    """``E[(1/G) sum_i A_i psi(y_i)]`` over every group: ``sum_m n_m prod_i q(y_mi) (1/G)
    sum_i A_mi psi(y_mi)`` (``n_m`` the multiplicity of row ``m``; 1 for ordered groups).

    Args:
        advantages: ``[M, G]`` the advantage of each rollout of each enumerated group (any
            estimator: a framework's code or :func:`grpo_theory.compute_advantages`).
        groups: ``[M, G]`` outcome indices (:func:`joint_groups`).
        probs: ``[n]`` outcome law.
        psi: ``[n, d]`` the score of each outcome.
        multiplicity: ``[M]`` (default 1 each).
    """
    A = np.asarray(advantages, dtype=np.float64)
    idx = np.asarray(groups)
    if A.shape != idx.shape or A.ndim != 2:
        raise ValueError(f"advantages {A.shape} and groups {idx.shape} must be one [M, G] shape")
    q = _law(probs, np.asarray(psi).shape[0])
    w = np.prod(q[idx], axis=1)
    if multiplicity is not None:
        w = w * np.asarray(multiplicity, dtype=np.float64)
    return np.einsum("m,mg,mgd->d", w, A, np.asarray(psi, dtype=np.float64)[idx]) / A.shape[1]


# --- the per-token weights of the GRPO gradient --------------------------------------------------
def regularised_token_weights(
    advantages: Any,
    lengths: Any,
    coefficients: Any,
    *,
    beta: float,
    mode: str,
    max_tokens: int | None = None,
    kl_mode: str | None = None,
) -> np.ndarray:
    """``[P, R, T]`` per-token weights of the regularised gradient: token ``t`` of rollout ``i``
    moves along ``S_it`` by ``w_i A_i - beta w'_i c_it`` (ascent direction of
    ``J - beta KL``), with ``w_i`` the policy loss's aggregation weight
    (:func:`grpo_theory.aggregation.aggregation_weights`, ``mode``) and ``w'_i`` the KL term's
    (``kl_mode``, default the same): the KL makes a sequence's weight vary along its tokens.

    Args:
        advantages: ``[P, R]``.
        lengths: ``[P, R]`` completion lengths; ``T = max length``.
        coefficients: ``[P, R, T]`` the KL coefficients ``c`` (:func:`kl_coefficients`).
        beta: the KL coefficient, ``>= 0``.
        mode, max_tokens: the aggregation of the policy loss.
        kl_mode: the aggregation of the KL term (TRL, verl and OpenRLHF aggregate both alike).
    """
    A = np.asarray(advantages, dtype=np.float64)
    L = np.asarray(lengths)
    c = np.asarray(coefficients, dtype=np.float64)
    if not (np.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be finite and >= 0, got {beta!r}")
    T = max(int(L.max()), 1)
    if A.shape != L.shape or c.shape != (*A.shape, T):
        raise ValueError(f"advantages {A.shape}, lengths {L.shape} and coefficients {c.shape} "
                         f"must be [P, R], [P, R] and [P, R, {T}]")
    w = aggregation_weights(L, mode=mode, max_tokens=max_tokens)  # type: ignore[arg-type]
    wk = w if kl_mode is None else aggregation_weights(L, mode=kl_mode)  # type: ignore[arg-type]
    on = np.arange(T)[None, None, :] < L[..., None]
    return np.where(on, w[..., None] * A[..., None] - beta * wk[..., None] * c, 0.0)
