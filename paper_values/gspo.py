"""The PAPER'S printed values of GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization",
arXiv 2507.18071, read as v2), typed in once, here only.

Nothing here is a result of ours: the numbers as the paper (and TRL's Paper Index, for its
reproduction) print them (digest ``shared/papers/gspo-2507.18071.md``). Data only: imports
nothing.
"""

from __future__ import annotations

__all__ = ["CLIP_GSPO", "CLIP_GRPO", "TRL_GSPO_CONFIG"]

#: Sec. 5.1: GSPO's left and right clipping ranges, clip(s, 1 - 3e-4, 1 + 4e-4).
CLIP_GSPO: tuple[float, float] = (3e-4, 4e-4)
#: Sec. 5.1: GRPO's left and right clipping ranges, "carefully tuned".
CLIP_GRPO: tuple[float, float] = (0.2, 0.27)
#: TRL's Paper Index reproduction of GSPO (GRPOConfig arguments).
TRL_GSPO_CONFIG: dict[str, object] = {"importance_sampling_level": "sequence", "beta": 0.0,
                                      "epsilon": 3e-4, "epsilon_high": 4e-4}
