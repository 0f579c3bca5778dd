"""The PAPER'S printed values of arXiv 2503.06639 v4 (Mroueh, "Reinforcement Learning with
Verifiable Rewards: GRPO's Effective Loss, Dynamics, and Success Amplification"), typed in once,
here only.

Nothing here is a result of ours: the numbers as the paper prints them (figure captions, the
text on Fig. 5, the GSM8K experiment of App. A and App. H). The paper's printed formulas are code,
not data: they are transcribed as functions in
``paper_checks/claims/effective_loss/printed_formulas.py``, which takes these numbers from here.
Data only: imports nothing.
"""

from __future__ import annotations

__all__ = ["FIG2_EPS", "FIG5_EPS", "FIG5_DIVERGENT", "THM10_BOUND_FACTOR", "APPA"]

#: Fig. 2 caption: fixed points of h as functions of beta and p_ref for varepsilon = 1e-5.
FIG2_EPS = 1e-5
#: Fig. 5 caption (App. G): the GRPO recursion for varepsilon = 1e-5.
FIG5_EPS = 1e-5
#: App. C.2, text on Fig. 5: "For beta = 5 and p_ref = 0.001, we see a divergent behavior".
FIG5_DIVERGENT = {"beta": 5.0, "p_ref": 0.001}
#: Theorem 10: lim_n |p~_n - p*| <= 2 delta*.
THM10_BOUND_FACTOR = 2.0
#: App. A and App. H: the GSM8K experiment as printed.
APPA = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "dataset": "GSM8K (train split; 1319 test questions, 50 samples each)",
    "lr": 5e-6, "clip": 0.2, "beta": 0.1, "mu": 10, "G": 16, "context": 200, "temperature": 0.1,
    "mean_pos_ref": 0.21, "mean_pos_after_one_epoch": 0.375,
}
