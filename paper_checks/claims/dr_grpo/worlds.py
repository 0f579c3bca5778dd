"""The toy worlds and measuring helpers shared by the Dr. GRPO claim modules.

Worlds (exact by enumeration, :mod:`sims.length_worlds`, :mod:`sims.question_mix`):

* :func:`response_bandit`: a softmax over four whole responses {short, long} x {correct,
  incorrect}, lengths 4 and 12, equal logits inside each correctness class (``J = 0.4``).
* :func:`answer_mdp`: a token MDP with 3 answers (one correct), then up to 5 fillers and ``eos``;
  the stop logits depend on the answer (seeded, so the initial lengths differ by answer).
* :func:`question_mix`: three such questions of different difficulty (``J_q`` about 0.2, 0.5,
  0.8) drawn with equal probability, each with its own parameters.

Helpers: :func:`proportionality` (least-squares scale and relative residual of a vector on a
reference), :func:`loss_spec` (a :class:`sims.length_dynamics.LossSpec` with a planted change).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paper_checks.registry import CheckContext

__all__ = ["response_bandit", "answer_mdp", "question_mix", "proportionality", "GROUP_SIZES",
           "TOL", "finite_difference", "surrogate_gradient", "mc_projection_check"]

#: Group sizes every exact check runs.
GROUP_SIZES: tuple[int, ...] = (2, 4, 8)
#: Float tolerance of the exact tier (enumeration; sums of a few thousand terms).
TOL = 1e-10


def response_bandit(*, long_length: int = 12, short_length: int = 4) -> Any:
    """{short, long} x {correct, incorrect}: 0, 1 correct (short, long), 2, 3 incorrect."""
    from sims.length_worlds import ResponseBandit

    return ResponseBandit(np.array([0.0, 0.0, 0.4, 0.4]),
                          np.array([short_length, long_length, short_length, long_length]),
                          np.array([1.0, 1.0, 0.0, 0.0]))


def answer_mdp(ctx: CheckContext, *, shared_stop: bool = False, n_fillers: int = 5) -> Any:
    """3 answers (answer 0 correct), up to ``n_fillers`` fillers; seeded stop logits."""
    from sims.length_worlds import AnswerLengthMDP

    rng = ctx.rng(2503)
    z = 0.5 * rng.standard_normal((1 if shared_stop else 3, n_fillers)) - 1.0
    return AnswerLengthMDP(np.array([0.0, 0.3, -0.2]), z, np.array([1.0, 0.0, 0.0]),
                           shared_stop=shared_stop)


def question_mix(ctx: CheckContext) -> Any:
    """Three answer-MDP questions (answer 0 correct) with solve rates about 0.2, 0.5, 0.8."""
    from sims.length_worlds import AnswerLengthMDP
    from sims.question_mix import QuestionMix

    rng = ctx.rng(2504)
    worlds = []
    for lead in (-1.4 + np.log(2.0), np.log(2.0), 1.4 + np.log(2.0)):
        z = 0.5 * rng.standard_normal((3, 4)) - 1.0
        worlds.append(AnswerLengthMDP(np.array([lead, 0.0, 0.0]), z, np.array([1.0, 0.0, 0.0])))
    return QuestionMix(tuple(worlds), np.full(3, 1.0 / 3.0))


def proportionality(g: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """``(c, rel)``: least-squares scale of ``g`` on ``ref``, ``|g - c ref| / max(|g|, |c ref|)``.

    ``rel = 0`` (to float rounding) iff ``g`` is a multiple of ``ref``.
    """
    g, ref = np.asarray(g, float), np.asarray(ref, float)
    nr = float(ref @ ref)
    if nr == 0.0:
        raise ValueError("the reference vector is zero")
    c = float(g @ ref / nr)
    scale = max(float(np.linalg.norm(g)), abs(c) * np.sqrt(nr))
    return c, (float(np.linalg.norm(g - c * ref)) / scale if scale > 0 else 0.0)


def finite_difference(fn: Any, theta: np.ndarray, *, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``fn(theta)``: a gradient that uses no score identity."""
    theta = np.asarray(theta, dtype=np.float64)
    g = np.empty(theta.size)
    for i in range(theta.size):
        e = np.zeros(theta.size)
        e[i] = h
        g[i] = (fn(theta + e) - fn(theta - e)) / (2.0 * h)
    return g


def surrogate_gradient(world: Any, idx: np.ndarray, advantages: np.ndarray, *, mode: str,
                       max_tokens: int | None = None, clip_eps: float = 0.2) -> np.ndarray:
    """Finite-difference gradient at ``theta_old`` of the clipped surrogate
    (:func:`grpo_theory.surrogate.clipped_surrogate`) of the responses ``idx`` of an
    :class:`sims.length_worlds.AnswerLengthMDP`, with fixed ``advantages`` ([G] or [G, T])."""
    from grpo_theory.surrogate import clipped_surrogate

    old, mask = world.token_probs()

    def objective(theta: np.ndarray) -> float:
        new = world.with_theta(theta).token_probs()[0]
        return clipped_surrogate(new[idx] / old[idx], advantages, mask[idx], clip_eps=clip_eps,
                                 mode=mode, max_tokens=max_tokens)

    return finite_difference(objective, world.theta)


def mc_projection_check(world: Any, loss: Any, *, G: int, direction: np.ndarray, name: str,
                        n_groups: int, rng: np.random.Generator) -> Any:
    """Seeded Monte Carlo of ``E[g . u]`` over sampled groups vs the exact
    :func:`sims.length_dynamics.expected_update` (a :class:`sims.results.CheckResult`,
    ``|estimate - exact| <= K_SE SE``)."""
    from paper_checks.claim_support import K_SE
    from sims.length_dynamics import expected_update, sampled_gradients
    from sims.results import make_check

    u = np.asarray(direction, dtype=np.float64)
    x = sampled_gradients(world, loss, G=G, n_groups=n_groups, rng=rng) @ u
    exact = float(expected_update(world, loss, G=G) @ u)
    return make_check(name, estimate=float(x.mean()), exact=exact,
                      se=float(x.std(ddof=1) / np.sqrt(x.size)), n=int(x.size), k=K_SE)
