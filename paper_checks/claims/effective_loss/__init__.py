"""The audit of arXiv 2503.06639 v4 (Mroueh, "Reinforcement Learning with Verifiable Rewards:
GRPO's Effective Loss, Dynamics, and Success Amplification"): ``grpo-audit audit --paper
grpo-effective-loss``. One module per paper section (``s2_contrastive_loss`` ...
``appF_parametric``); the paper's printed formulas and values are in :mod:`.printed`, shared
grids and worlds in :mod:`._shared`. Claim ids carry the prefix ``effloss_``.
"""
