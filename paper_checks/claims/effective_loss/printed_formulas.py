"""The PAPER'S printed formulas for arXiv 2503.06639 (v4), transcribed once, here only.

Mroueh, "Reinforcement Learning with Verifiable Rewards: GRPO's Effective Loss, Dynamics, and
Success Amplification". Nothing here is a result of ours: each function transcribes a formula as
the paper prints it (typos included, labelled), so that the checks compare it with an
independent computation; the printed numbers come from ``paper_values/effective_loss.py``. Every
check of this paper takes the paper's side from here; the planted-error tests pass perturbed
copies of these in their place.

Formulas that the checks also verify symbolically take ``xp`` (``numpy`` by default, or
``sympy``), the module whose ``sqrt``/``exp``/``log`` they use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import paper_values.effective_loss as PV

__all__ = [
    "FIG2_EPS",
    "FIG5_EPS",
    "FIG5_DIVERGENT",
    "APPA",
    "advantage_binary",
    "weights_eq4",
    "weights_mean_only",
    "h_thm2",
    "h_prime_prop1",
    "h_sigmoid_prop1",
    "h_prime_lemma1",
    "beta_bound_appc2",
    "theorem8_policy",
    "theorem8_pos_logit",
    "thm10_bound_factor",
    "clip_helper_identity_as_printed",
    "contrastive_form",
    "no_clip_pos_contrast",
    "theorem1_policy",
    "odds_form_logit",
    "mirror_logit",
    "mean_only_reference_logit",
    "mean_only_mirror_logit",
    "beta_eff",
    "beta_eff_takeaway",
    "lemma3_logit",
    "conditionals_as_printed",
    "thm9_logit",
    "table1_two_kl_fixed_point_logit",
]

#: The paper's printed numbers, from their one place.
FIG2_EPS = PV.FIG2_EPS
FIG5_EPS = PV.FIG5_EPS
FIG5_DIVERGENT = PV.FIG5_DIVERGENT
APPA = PV.APPA
thm10_bound_factor = PV.THM10_BOUND_FACTOR


def advantage_binary(p: Any, *, xp: Any = np) -> tuple[Any, Any]:
    """Eq. (3), right form: ``(sqrt((1-p)/p), -sqrt(p/(1-p)))`` for ``r = 1, 0``."""
    return xp.sqrt((1 - p) / p), -xp.sqrt(p / (1 - p))


def weights_eq4(p: Any, eps: Any, *, xp: Any = np) -> tuple[Any, Any]:
    """Eq. (4): ``omega+ = (1-p)/sqrt(p(1-p)+eps)``, ``omega- = p/sqrt(p(1-p)+eps)``."""
    s = xp.sqrt(p * (1 - p) + eps)
    return (1 - p) / s, p / s


def weights_mean_only(p: Any) -> tuple[Any, Any]:
    """Sec. 5, Eq. (13): ``omega+ = 1 - p``, ``omega- = p``."""
    return 1 - p, p


def h_thm2(p: Any, p_ref: Any, beta: Any, eps: Any, *, xp: Any = np) -> Any:
    """Theorem 2: ``1 / (1 + (1-p_ref)/p_ref exp(-(1/beta) / sqrt(p(1-p)+eps)))``."""
    return 1 / (1 + (1 - p_ref) / p_ref * xp.exp(-(1 / beta) / xp.sqrt(p * (1 - p) + eps)))


def h_prime_prop1(p: Any, p_ref: Any, beta: Any, eps: Any, *, xp: Any = np) -> Any:
    """Proposition 1 (ii): ``-h (1-h) (1-2p) / (2 beta [p(1-p)+eps]^(3/2))``."""
    h = h_thm2(p, p_ref, beta, eps, xp=xp)
    return -h * (1 - h) * (1 - 2 * p) / (2 * beta * xp.sqrt(p * (1 - p) + eps) ** 3)


def h_sigmoid_prop1(p: Any, p_ref: Any, beta: Any, eps: Any, *, xp: Any = np) -> Any:
    """Proposition 1 (iii): ``sigma(logit(p_ref) + Omega_eps(p)/beta)``, ``Omega_eps =
    (p(1-p)+eps)^(-1/2)``."""
    z = xp.log(p_ref / (1 - p_ref)) + 1 / xp.sqrt(p * (1 - p) + eps) / beta
    return 1 / (1 + xp.exp(-z))


def h_prime_lemma1(p_star: Any, beta: Any, eps: Any, *, xp: Any = np) -> Any:
    """Lemma 1: ``h'(p*) = p*(1-p*)(2p*-1) / (2 beta [p*(1-p*)+eps]^(3/2))``."""
    return p_star * (1 - p_star) * (2 * p_star - 1) / (
        2 * beta * xp.sqrt(p_star * (1 - p_star) + eps) ** 3)


def beta_bound_appc2(p_star: Any, eps: Any, *, xp: Any = np) -> Any:
    """App. C.2: ``|h'(p*)| < 1`` if
    ``beta > B(p*) = p*(1-p*)|2p*-1| / (2[p*(1-p*)+eps]^(3/2))``."""
    return p_star * (1 - p_star) * abs(2 * p_star - 1) / (
        2 * xp.sqrt(p_star * (1 - p_star) + eps) ** 3)


def theorem8_policy(anchor: np.ndarray, success: np.ndarray, w_plus: float, w_minus: float,
                    beta: float) -> np.ndarray:
    """Theorem 8 (1) as printed: ``pi* = pi_o exp(A_nu) / (p_o e^{w+} + (1-p_o) e^{-w-})`` (no
    ``beta``, although the objective is ``E_pi A_nu - beta KL(pi || pi_o)``)."""
    A = np.where(success, w_plus, -w_minus)
    p_o = anchor[success].sum()
    return anchor * np.exp(A) / (p_o * np.exp(w_plus) + (1 - p_o) * np.exp(-w_minus))


def theorem8_pos_logit(logit_anchor: float, Omega: float, beta: float) -> float:
    """Theorem 8 (2) as printed: ``logit(p_n) = logit(p_o_{n-1}) + Omega(p_{n-1})`` (no beta)."""
    return logit_anchor + Omega


def clip_helper_identity_as_printed(x: np.ndarray, y: np.ndarray, clip: float) -> np.ndarray:
    """Sec. 2.2 text: "for x > 0 and y > 0, f(x,y) = x min(y, 1+eps) and for x > 0, y < 0,
    f(x,y) = x max(y, 1-eps)" (x the ratio, y the advantage), as printed."""
    return np.where(y > 0, x * np.minimum(y, 1 + clip), x * np.maximum(y, 1 - clip))


def contrastive_form(pi: np.ndarray, pi_old: np.ndarray, success: np.ndarray, w_plus: float,
                     w_minus: float, clip: float) -> float:
    """Sec. 2.2 display: ``w+ E_{pi_old}[min(pi/pi_old, 1+eps) 1{r=1}]
    - w- E_{pi_old}[max(pi/pi_old, 1-eps) 1{r=0}]`` (``eps`` the clipping parameter)."""
    x = pi / pi_old
    return float(w_plus * np.sum(pi_old * np.minimum(x, 1 + clip) * success)
                 - w_minus * np.sum(pi_old * np.maximum(x, 1 - clip) * ~success))


def no_clip_pos_contrast(pi: np.ndarray, success: np.ndarray, w_plus: float,
                         w_minus: float) -> float:
    """Eq. (5): ``w+ P_pi(r=1) - w- P_pi(r=0)`` (the KL term is common to both sides)."""
    ps = float(pi[success].sum())
    return w_plus * ps - w_minus * (1 - ps)


def theorem1_policy(pi_ref: np.ndarray, success: np.ndarray, w_plus: float, w_minus: float,
                    beta: float) -> np.ndarray:
    """Theorem 1: ``pi_n = pi_ref exp((w+ 1{r=1} - w- 1{r=0}) / beta) / Z`` with
    ``Z = p_ref e^{w+/beta} + (1 - p_ref) e^{-w-/beta}``."""
    p_ref = pi_ref[success].sum()
    Z = p_ref * np.exp(w_plus / beta) + (1 - p_ref) * np.exp(-w_minus / beta)
    return pi_ref * np.exp(np.where(success, w_plus, -w_minus) / beta) / Z


def odds_form_logit(p: Any, p_ref: Any, beta: Any, eps: Any, *, xp: Any = np) -> Any:
    """Sec. 3.1: ``logit(p_n) = logit(p_ref) + Omega_eps(p_{n-1}) / beta`` (right-hand side)."""
    return xp.log(p_ref / (1 - p_ref)) + 1 / xp.sqrt(p * (1 - p) + eps) / beta


def mirror_logit(logit_prev: Any, p_prev: Any, beta: Any, eps: Any, *, xp: Any = np) -> Any:
    """Theorem 4 (2): ``logit(p_n) = logit(p_{n-1}) + Omega_eps(p_{n-1}) / beta``."""
    return logit_prev + 1 / xp.sqrt(p_prev * (1 - p_prev) + eps) / beta


def mean_only_reference_logit(logit_ref: float, n: int, beta: float) -> float:
    """Sec. 5: ``logit(p_n) = logit(p_ref) + 1/beta`` for every ``n >= 1``."""
    return logit_ref + 1.0 / beta


def mean_only_mirror_logit(logit_ref: float, n: int, beta: float) -> float:
    """Sec. 5: ``L_n = L_ref + n / beta`` (Mirror Dr. GRPO)."""
    return logit_ref + n / beta


def beta_eff(beta: float, sigma2: Any, eps: float) -> Any:
    """Sec. 5 (last paragraph): ``beta_eff = beta sqrt(sigma^2_{n-1} + eps)``."""
    return beta * np.sqrt(sigma2 + eps)


def beta_eff_takeaway(beta: float, sigma2: Any, eps: float) -> Any:
    """Sec. 6, "Normalization equivalence": ``beta_eff = beta sigma(q)`` (no eps)."""
    return beta * np.sqrt(sigma2)


def lemma3_logit(logit_ref: float, logit_prev: float, d_success: float, d_failure: float,
                 alpha: float) -> float:
    """Lemma 3: ``logit p~ = alpha logit p_ref + (1-alpha) logit p_{n-1}
    + (alpha - 1)[D_alpha(p_ref,S || p_{n-1},S) - D_alpha(p_ref,F || p_{n-1},F)]``."""
    return (alpha * logit_ref + (1 - alpha) * logit_prev
            + (alpha - 1) * (d_success - d_failure))


def conditionals_as_printed(pi_ref: np.ndarray, pi_prev: np.ndarray, success: np.ndarray
                            ) -> dict[str, np.ndarray]:
    """App. E, the definitions before Lemma 3 as printed: ``p_{ref,S} = pi_ref 1{r=1}/p_ref``,
    ``p_{n-1,S} = pi_{n-1} 1{r=0} / p_{n-1}`` (sic: the indicator of failure), ``p_{ref,F} =
    pi_ref 1{r=0}/(1-p_ref)``, ``p_{n-1,F} = pi_{n-1} 1{r=0}/(1-p_{n-1})``."""
    p_ref, p_prev = pi_ref[success].sum(), pi_prev[success].sum()
    return {"ref_S": pi_ref * success / p_ref, "prev_S": pi_prev * ~success / p_prev,
            "ref_F": pi_ref * ~success / (1 - p_ref), "prev_F": pi_prev * ~success / (1 - p_prev)}


def thm9_logit(logit_ref: float, logit_prev: float, renyi_correction: float, Omega: float,
               alpha: float, beta: float) -> float:
    """Theorem 9: ``logit p_n = alpha logit p_ref + (1-alpha) logit p_{n-1} + Delta_R
    + Omega_eps(p_{n-1}) / beta``, ``Delta_R = (1-alpha)(D_alpha(F) - D_alpha(S))``."""
    return alpha * logit_ref + (1 - alpha) * logit_prev + renyi_correction + Omega / beta


def table1_two_kl_fixed_point_logit(logit_ref: float, renyi_star: float, Omega_star: float,
                                    alpha: float, beta: float) -> float:
    """Table 1 (two-KL rows): ``logit p* = logit p_ref + Delta*/alpha + Omega(p*)/(alpha beta)``."""
    return logit_ref + renyi_star / alpha + Omega_star / (alpha * beta)
