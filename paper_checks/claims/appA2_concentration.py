"""Appendix A.2, Baseline concentration: the Hoeffding derivation, the printed table cell by cell
(value and "vacuous" label), and the connection to advantage quality.

Each cell is recomputed (:func:`grpo_theory.bounds.hoeffding_bound`) beside the exact Bernoulli
tail (worst case over ``p`` and at ``p = 1/2``); the printed values come from :mod:`paper_values`.
:func:`a2_cell` is also the row builder of ``grpo-audit tables appendix-a2``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import sympy as sp

from grpo_theory import compute_advantages
from grpo_theory.bounds import hoeffding_bound
from grpo_theory.bounds import sup_baseline_tail_bernoulli as _sup_lib
from paper_checks.enumeration import baseline_tail, sup_baseline_tail
from paper_checks.registry import CheckContext, Outcome, claim, verdict_from
from paper_values import PAPER_A2_EPS, PAPER_A2_R, PAPER_A2_TABLE

SECTION = "A.2 Baseline concentration"

__all__ = ["PRINT_TOL", "a2_cell", "sup_baseline_tail_bernoulli"]


PRINT_TOL = 0.005  # a printed 2-decimal value matches when |printed - recomputed| <= 0.005


@lru_cache(maxsize=512)
def sup_baseline_tail_bernoulli(*, R: int, eps: float) -> tuple[float, float]:
    """Cached :func:`grpo_theory.bounds.sup_baseline_tail_bernoulli` (exact piecewise sup)."""
    return _sup_lib(R=R, eps=eps)


@claim(
    "a2_hoeffding_derivation", kind="derivation",
    location="App. A.2, display",
    text="For i.i.d. rewards in [0, 1], P(|v_hat_R - v| > eps) <= 2 exp(-2 R^2 eps^2 / (R 1^2)) "
    "= 2 exp(-2 R eps^2).",
    check="Sympy: the simplification; and the exact supremum over p of the Bernoulli tail "
    "(grpo_theory.bounds, cross-checked on a grid) never exceeds the bound, R in {1..16}, "
    "eps in {0.05, 0.1, ..., 0.5}.",
)
def _a2_derivation(ctx: CheckContext) -> Outcome:
    R, e = sp.symbols("R epsilon", positive=True)
    sym_ok = sp.simplify(2 * sp.exp(-2 * R**2 * e**2 / (R * 1**2)) - 2 * sp.exp(-2 * R * e**2)) == 0
    worst = -1.0
    routes = 0.0
    for Rv in range(1, 17) if not ctx.quick else (1, 2, 3, 4, 8, 16):
        for eps in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5) if not ctx.quick else (0.1, 0.2, 0.3, 0.5):
            sup, _ = sup_baseline_tail_bernoulli(R=Rv, eps=eps)
            worst = max(worst, sup - hoeffding_bound(R=Rv, eps=eps))
            if Rv in (2, 8) and eps in (0.1, 0.3):
                routes = max(routes, abs(sup - sup_baseline_tail(R=Rv, eps=eps)[0]))
    ok = sym_ok and worst <= 1e-12
    return Outcome(
        verdict_from(ok),
        {"sympy_difference_is_zero": sym_ok, "max_sup_tail_minus_bound": worst,
         "max_abs_disagreement_sup_two_routes": routes},
        correction=None if ok else "Hoeffding bound violated",
    )


def a2_cell(R: int, eps: float) -> dict[str, float | bool]:
    """One cell of App. A.2's table recomputed: bound, printed value, difference, vacuity, and
    the exact tails (worst case over p, and at p = 1/2) beside it."""
    printed, printed_vac = PAPER_A2_TABLE[(R, eps)]
    b = float(hoeffding_bound(R=R, eps=eps))
    sup, arg = sup_baseline_tail_bernoulli(R=R, eps=eps)
    return {
        "R": R,
        "eps": eps,
        "bound": b,
        "printed": printed,
        "difference_printed_minus_bound": printed - b,
        "value_matches": abs(printed - b) <= PRINT_TOL,
        "vacuous": b >= 1.0,
        "printed_vacuous_label": printed_vac,
        "label_matches": (b >= 1.0) == printed_vac,
        "exact_sup_tail": sup,
        "exact_sup_tail_argmax_p": arg,
        "exact_tail_p_half": baseline_tail(R=R, p=0.5, eps=eps),
    }


def _register_cell(R: int, eps: float) -> None:
    cid = f"a2_cell_r{R}_eps{str(eps).replace('.', '_')}"
    printed, vac = PAPER_A2_TABLE[(R, eps)]

    def fn(ctx: CheckContext) -> Outcome:
        c = a2_cell(R, eps)
        ok = bool(c["value_matches"]) and bool(c["label_matches"])
        problems = []
        if not c["value_matches"]:
            problems.append(f"2 exp(-2 R eps^2) = {c['bound']:.4f}, printed {printed:.2f}")
        if not c["label_matches"]:
            problems.append(
                f"labelled {'vacuous' if vac else 'non-vacuous'} but the bound is "
                f"{c['bound']:.4f} {'>= 1' if c['vacuous'] else '< 1 (informative)'}")
        return Outcome(
            verdict_from(ok),
            c,
            short="; ".join(problems) if not ok else None,
            correction=("; ".join(problems) + f"; exact worst-case tail sup_p P = "
                        f"{c['exact_sup_tail']:.4f}") if not ok else None,
        )

    claim(
        cid,
        kind="printed-value",
        location=f"App. A.2 table, row R={R}, column eps={eps}",
        text=f"P(|v_hat_R - v| > {eps}) <= {printed:.2f}" + (" (vacuous)" if vac else "")
        + f" at R = {R}.",
        check="Recompute 2 exp(-2 R eps^2) (grpo_theory.bounds.hoeffding_bound); match if "
        f"|printed - value| <= {PRINT_TOL}; the label is right iff (value >= 1) == labelled "
        "vacuous; exact Bernoulli tail sup over p and at p = 1/2 beside it.",
    )(fn)


for _R in PAPER_A2_R:
    for _e in PAPER_A2_EPS:
        _register_cell(_R, _e)


@claim(
    "a2_nontrivial_only_for_large_r_or_eps", kind="interpretation",
    location="App. A.2, after the table",
    text="The bound becomes non-trivial only for larger R or larger eps; with R = 2, 4 the "
    "baseline has variance sigma^2/R.",
    check="Monotonicity of 2 exp(-2 R eps^2) in R and eps; smallest R with a bound < 1 for each "
    "eps; Var(v_hat) = sigma^2/R (exact Binomial).",
)
def _a2_trivial(ctx: CheckContext) -> Outcome:
    ev: dict[str, float] = {}
    Rs = np.arange(1, 65)
    es = np.linspace(0.01, 0.5, 50)
    grid = np.array([[hoeffding_bound(R=int(R), eps=float(e)) for e in es] for R in Rs])
    mono = bool(np.all(np.diff(grid, axis=0) < 0) and np.all(np.diff(grid, axis=1) < 0))
    for eps in PAPER_A2_EPS:
        Rmin = next(R for R in range(1, 1000) if hoeffding_bound(R=R, eps=eps) < 1)
        ev[f"smallest_R_with_bound_below_1_eps{eps}"] = Rmin
        ev[f"exact_R_threshold_eps{eps}"] = float(np.log(2) / (2 * eps**2))
    var_err = max(
        abs(float(_pmf(R, p) @ (np.arange(R + 1) / R - p) ** 2) - p * (1 - p) / R)
        for R in (2, 4) for p in (0.2, 0.5)
    )
    ev["bound_decreasing_in_R_and_eps"] = mono
    ev["max_abs_error_var_v_hat_equals_sigma2_over_R"] = var_err
    ok = mono and var_err < 1e-12
    return Outcome(verdict_from(ok), ev,
                   correction=None if ok else "bound not monotone or Var(v_hat) != sigma^2/R")


def _pmf(R: int, p: float) -> np.ndarray:
    from scipy.stats import binom

    return binom.pmf(np.arange(R + 1), R, p)


@claim(
    "a2_advantage_error_identity", kind="derivation",
    location="App. A.2, Connection to advantage quality",
    text="A_hat_i - (r_i - v) = v - v_hat_R for every rollout; with probability >= "
    "1 - 2 exp(-2 R eps^2) every advantage is within eps of r_i - v.",
    check="Random rewards: the identity; exact Bernoulli: P(max_i |A_hat_i - (r_i - v)| <= eps) "
    "= P(|v_hat - v| <= eps) >= 1 - bound, R in {2,4,8,16}, eps in the table's columns.",
)
def _a2_identity(ctx: CheckContext) -> Outcome:
    rng = ctx.rng(92)
    r = rng.random((500, 8))
    v = 0.5
    A = np.asarray(compute_advantages("grpo", r))
    err = float(np.max(np.abs((A - (r - v)) - (v - r.mean(1, keepdims=True)))))
    worst = 1.0
    for R in PAPER_A2_R:
        for eps in PAPER_A2_EPS:
            for p in (0.1, 0.3, 0.5):
                worst = min(worst, (1 - baseline_tail(R=R, p=p, eps=eps))
                            - (1 - hoeffding_bound(R=R, eps=eps)))
    ok = err < 1e-12 and worst >= -1e-12
    return Outcome(verdict_from(ok),
                   {"max_abs_identity_error": err, "min_prob_minus_guarantee": worst},
                   correction=None if ok else "identity or guarantee fails")
