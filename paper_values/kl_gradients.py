"""The PAPERS' printed values of the KL-estimator papers (Tang and Munos, arXiv 2506.09477; Liu
et al., arXiv 2510.01555; Shah et al., arXiv 2512.21852), typed in once, here only.

Nothing here is a result of ours, and none of it was read in the papers themselves: the numbers
come from the secondary summaries named in the digest ``shared/papers/kl-gradients.md``. Data
only: imports nothing.
"""

from __future__ import annotations

__all__ = ["LIU_GAUSSIAN_EXAMPLE", "LIU_GRPO_RUN"]

#: [LIU] Gaussian example (via a secondary summary): p = N(0, 1), q = N(0.1, 0.2) (0.2 a
#: variance or a standard deviation: not said), samples from q, delta = p / q; one run's sample
#: standard deviations.
LIU_GAUSSIAN_EXAMPLE: dict[str, float] = {"mu_p": 0.0, "var_p": 1.0, "mu_q": 0.1, "q_scale": 0.2,
                                          "sd_k3": 8.8244, "sd_k1": 0.6912}
#: [LIU] experiments (via a secondary summary): the GRPO runs' setting.
LIU_GRPO_RUN: dict[str, object] = {"prompts": "OpenR1-Math-220k", "actor": "Qwen2.5-Math-1.5B",
                                   "beta": 0.5}
