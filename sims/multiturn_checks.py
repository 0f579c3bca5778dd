"""Multi-turn checks (seed paper Sec. 6, App. A.3) on :class:`sims.multiturn.MultiTurnMDP`.

* :func:`multiturn_bias_table`: every reachable prefix, exact ``E[A_hat(h) | prefix]`` vs the
  true advantage and the paper's Eq. 23 / 26-27.
* :func:`check_multiturn`: Monte Carlo vs exact for the most probable prefix of each stage, and
  whether the per-stage bias biases the gradient.
* :func:`check_multiturn_modes`: Eq. 22 and the reward-to-go modes of
  :func:`grpo_theory.multiturn.multiturn_advantages`: exact gradient ratio and MC variance.

Re-exported by :mod:`sims.checks`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_theory import compute_advantages
from grpo_theory.limits import ARRAY_R_MAX, check_R_limit

from ._stats import jackknife_cosine as _jackknife_cosine
from ._stats import mean_se as _mean_se
from .exact import estimator_options
from .results import DEFAULT_K, CheckResult, make_check

__all__ = [
    "multiturn_bias_table",
    "check_multiturn",
    "multiturn_mode_coefficients",
    "check_multiturn_modes",
]


def multiturn_bias_table(
    mdp: Any, estimator: str, *, R: int, opts: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every reachable prefix ``(h, s_h, a_h, past)``: exact ``E[A_hat(h) | prefix]``, true
    ``A_h(s_h, a_h)``, the paper's Eq. 26-27 prediction ``past + q_h - v_0`` and both biases
    (exact: ``E[A_hat] - A``; paper Eq. 23: ``past + v_h(s_h) - v_0(s_0)``)."""
    v, q = mdp.values()
    v0 = v[0, mdp.init_state]
    c = mdp.reward_value
    rows = []
    for pr in mdp.prefix_table():
        h, s, a, pc = pr["h"], pr["s"], pr["a"], pr["past_count"]
        ex = mdp.conditional_advantage(estimator, R=R, h=h, s=s, a=a, past_count=pc, opts=opts)
        true_a = q[h, s, a] - v[h, s]
        rows.append(
            {
                **pr,
                "exact_cond_adv": ex,
                "true_adv": float(true_a),
                "paper_cond_adv": float(c * pc + q[h, s, a] - v0),
                "exact_bias": float(ex - true_a),
                "paper_bias": float(c * pc + v[h, s] - v0),
            }
        )
    return rows


def check_multiturn(
    mdp: Any,
    estimator: str,
    *,
    R: int,
    n: int,
    rng: np.random.Generator,
    k: float = DEFAULT_K,
    opts: dict[str, Any] | None = None,
) -> list[CheckResult]:
    """Multi-turn checks (seed paper Sec. 6, App. A.3).

    1. For each stage ``h`` (named 1..H as in the paper; 0-based in the code), the most probable
       prefix: Monte Carlo ``E[A_hat(h) | prefix]`` (own
       continuation from ``(s_h, a_h)`` sampled, the other ``R-1`` rollouts sampled from ``s_0``,
       advantages from the estimator on the total returns, Eq. 22) vs the exact value; paper value
       Eq. 26-27 ``past + q_h(s_h, a_h) - v_0(s_0)``; details carry the true ``A_h`` and both
       biases.
    2. Whether this per-stage bias biases the gradient: ``E[g_hat]`` (exact, enumeration) vs
       ``grad J`` as ratio and cosine, each with a Monte Carlo estimate.
    """
    table = multiturn_bias_table(mdp, estimator, R=R, opts=opts)
    out = []
    for h in range(mdp.shape[0]):
        top = max((r for r in table if r["h"] == h), key=lambda r: r["prob"])
        out.append(_stage_advantage_check(mdp, estimator, top, R=R, n=n, rng=rng, k=k,
                                          opts=opts))
    return out + _multiturn_gradient_checks(mdp, estimator, R=R, n=n, rng=rng, k=k, opts=opts)


def _stage_advantage_check(
    mdp: Any, estimator: str, top: dict[str, Any], *, R: int, n: int, rng: np.random.Generator,
    k: float, opts: dict[str, Any] | None,
) -> CheckResult:
    """``E[A_hat(h) | prefix]`` for the prefix row ``top`` of :func:`multiturn_bias_table`: the
    own rollout continues from ``(s_h, a_h)`` after ``past_count`` rewards, the other ``R - 1``
    start at ``s_0``; the exact SE from the exact second moment; paper value Eq. 26-27."""
    opts_ = estimator_options(estimator, opts)
    fut = mdp.sample_continuation(top["h"], top["s"], top["a"], n, rng)
    others = mdp.sample(n, R - 1, rng)["stage_rewards"].sum(-1)
    totals = np.concatenate([(mdp.reward_value * top["past_count"] + fut)[:, None], others], 1)
    A1 = np.asarray(compute_advantages(estimator, totals, **opts_))[:, 0]
    m, sample_se = _mean_se(A1)
    second = mdp.conditional_advantage(estimator, R=R, h=top["h"], s=top["s"], a=top["a"],
                                       past_count=top["past_count"], opts=opts, power=2)
    return make_check(
        f"E[A_hat(h={top['h'] + 1})|prefix s={top['s']},a={top['a']},past={top['past_count']}] "
        f"{estimator} R={R}",
        estimate=m,
        exact=top["exact_cond_adv"],
        se=float(np.sqrt(max(second - top["exact_cond_adv"] ** 2, 0.0) / n)),
        se_from="exact moments",
        n=n,
        k=k,
        paper_value=top["paper_cond_adv"],
        details={**{key: top[key] for key in ("true_adv", "exact_bias", "paper_bias",
                                              "prob")}, "sample_se": sample_se},
    )


def _multiturn_gradient_checks(
    mdp: Any, estimator: str, *, R: int, n: int, rng: np.random.Generator, k: float,
    opts: dict[str, Any] | None,
) -> list[CheckResult]:
    """``E[g_hat]`` (exact, by enumeration) vs ``grad J``: the ratio
    ``<g_hat, grad J> / |grad J|^2`` (sample SE) and the cosine (jackknife SE), each estimated
    from ``n`` sampled groups of ``R`` rollouts on the total returns."""
    gJ = mdp.grad_J()
    Eg = mdp.expected_gradient(estimator, R=R, opts=opts)
    nrm2 = float(gJ @ gJ)
    smp = mdp.sample(n, R, rng)
    totals = smp["stage_rewards"].sum(-1)
    A = np.asarray(compute_advantages(estimator, totals, **estimator_options(estimator, opts)))
    g = np.einsum("nr,nrd->nd", A, mdp.psi(smp["states"], smp["actions"])) / R
    m, se = _mean_se(g @ gJ / nrm2)
    ratio = make_check(
        f"multiturn E[g_hat] ratio {estimator} R={R}",
        estimate=m,
        exact=float(Eg @ gJ / nrm2),
        se=se,
        se_from="sample",
        n=n,
        k=k,
        paper_value=None,
        details={
            "true_advantage_gradient_ratio": float(
                mdp.expected_gradient_true_advantage() @ gJ / nrm2
            )
        },
    )
    cos, cse = _jackknife_cosine(g, gJ)
    cosine = make_check(
        f"multiturn E[g_hat] cosine {estimator} R={R}",
        estimate=cos,
        exact=float(Eg @ gJ / (np.linalg.norm(Eg) * np.sqrt(nrm2))),
        se=cse,
        se_from="jackknife",
        n=n,
        k=k,
    )
    return [ratio, cosine]


def multiturn_mode_coefficients(
    mode: str, *, R: int, H: int, baseline: str = "group_mean"
) -> np.ndarray:
    """``coef[h, h']``: the own-reward coefficients of :func:`grpo_theory.multiturn_advantages`,
    probed with unit stage rewards (others 0); raises if the mode is not linear."""
    from grpo_theory.multiturn import multiturn_advantages

    check_R_limit(int(R), limit=ARRAY_R_MAX // (8 * max(int(H), 1)), name="ARRAY_R_MAX // (8 H)",
                  routine="multiturn_mode_coefficients", cost="probes of (H + 5) x R x H "
                  "stage rewards", alternative="estimate the gradient by Monte Carlo "
                  "(multiturn_advantages on sampled groups)")
    probe = np.zeros((H + 1, R, H))
    for hp in range(H):
        probe[hp + 1, 0, hp] = 1.0
    A = np.asarray(multiturn_advantages(probe, mode=mode, baseline=baseline))  # type: ignore[arg-type]
    base = A[0, 0]
    coef = (A[1:, 0] - base).T  # [h, h']
    x = np.random.default_rng(0).random((4, R, H))
    got = np.asarray(multiturn_advantages(x, mode=mode, baseline=baseline))  # type: ignore[arg-type]
    # linear and equivariant: rollout 0's advantage from its own rewards and the others' sums
    other = np.asarray(
        multiturn_advantages(
            np.concatenate([np.zeros((4, 1, H)), x[:, 1:]], axis=1), mode=mode, baseline=baseline
        )
    )[:, 0]
    if not np.allclose(got[:, 0], x[:, 0] @ coef.T + other, atol=1e-12):
        raise ValueError(f"multiturn mode {mode!r} is not linear in the own stage rewards")
    return coef


def check_multiturn_modes(
    mdp: Any,
    *,
    R: int,
    n: int,
    rng: np.random.Generator,
    k: float = DEFAULT_K,
    baseline: str = "group_mean",
    chunk: int = 20_000,
) -> tuple[list[CheckResult], list[dict[str, Any]]]:
    """Per-stage advantage modes of :func:`grpo_theory.multiturn_advantages` (Eq. 22 and the
    reward-to-go variants): exact ``E[g_hat]`` vs ``grad J`` (ratio; MC check, k stated) and the
    Monte Carlo total variance ``tr Cov(g_hat)`` of each mode (reported, no verdict).

    ``g_hat = (1/R) sum_i sum_h A_i(h) grad log pi_h(a_{i,h} | s_{i,h})``.
    """
    from grpo_theory.multiturn import MULTITURN_MODES, multiturn_advantages

    H, S, A_ = mdp.shape
    gJ = mdp.grad_J()
    nrm2 = float(gJ @ gJ)
    out, rows = [], []
    for mode in MULTITURN_MODES:
        coef = multiturn_mode_coefficients(mode, R=R, H=H, baseline=baseline)
        Eg = mdp.expected_gradient_stagewise(coef)
        proj, gs = [], []
        done = 0
        while done < n:
            m = min(chunk, n - done)
            smp = mdp.sample(m, R, rng)
            adv = np.asarray(
                multiturn_advantages(smp["stage_rewards"], mode=mode, baseline=baseline)
            )
            blocks = mdp.psi(smp["states"], smp["actions"]).reshape(m, R, H, S * A_)
            g = (adv[..., None] * blocks).reshape(m, R, -1).sum(1) / R
            proj.append(g @ gJ / nrm2)
            gs.append(g)
            done += m
        pr = np.concatenate(proj)
        G = np.concatenate(gs)
        mm, se = _mean_se(pr)
        out.append(
            make_check(
                f"multiturn E[g_hat] ratio mode={mode} baseline={baseline} R={R}",
                estimate=mm,
                exact=float(Eg @ gJ / nrm2),
                se=se,
                se_from="sample",
                n=n,
                k=k,
                details={"cosine_exact": float(Eg @ gJ / (np.linalg.norm(Eg) * np.sqrt(nrm2)))},
            )
        )
        rows.append(
            {
                "mode": mode,
                "baseline": baseline,
                "R": R,
                "exact_ratio": float(Eg @ gJ / nrm2),
                "exact_cosine": float(Eg @ gJ / (np.linalg.norm(Eg) * np.sqrt(nrm2))),
                "mc_trace_cov_g": float(np.trace(np.cov(G, rowvar=False))),
            }
        )
    return out, rows
