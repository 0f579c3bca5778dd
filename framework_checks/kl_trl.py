"""TRL's KL options through its own ``GRPOTrainer._compute_loss`` (1.16.0).

TRL adds ``beta * k3`` per token to the per-token loss (``per_token_kl = exp(ref - logp) -
(ref - logp) - 1``), optionally multiplied by the importance ratio ``coef_1`` (``GRPOConfig.
use_bias_correction_kl``; the ratio is differentiable, token-level or, with
``importance_sampling_level="sequence"``, the sequence's geometric mean), and aggregates it with
the policy loss's ``loss_type``. The options run through ``_compute_loss`` on the stub trainer of
:mod:`framework_checks.trl` with the advantages set to 0, so the gradient is the KL term's alone.
Defaults (``beta``, ``loss_type``, ``use_bias_correction_kl``) are read from
``trl/trainer/grpo_config.py``.
"""

from __future__ import annotations

import types
from functools import partial
from typing import Any

import numpy as np

from grpo_theory.conventions import TRL_LOSS_AGGREGATION

from .kl_audit import BETA, KLOptions, KLSetting, autograd_coefficients
from .kl_source import dataclass_default
from .source import SourceTree
from .trl import CONFIG_DEFAULTS, TrlCode, loss_inputs

__all__ = ["kl_options"]

CONFIG = "trl/trainer/grpo_config.py"


def _kl_loss(code: TrlCode, logp: Any, ref: Any, old: Any, mask: Any, *, loss_type: str,
             level: str, bias_correction: bool) -> Any:
    import torch

    args = types.SimpleNamespace(**{**CONFIG_DEFAULTS, "use_bias_correction_kl": bias_correction})
    s = code.trainer(logp, beta=BETA, loss_type=loss_type, importance_sampling_level=level,
                     args=args)
    A = torch.zeros(logp.shape[0], dtype=logp.dtype)
    inputs = loss_inputs(logp, mask, A, num_items_in_batch=mask.sum(),
                         ref_per_token_logps=ref, old_per_token_logps=old)
    return code.grpo_methods["_compute_loss"](s, None, inputs)


def _coefficients(code: TrlCode, logp: np.ndarray, ref: np.ndarray, old: np.ndarray,
                  lengths: np.ndarray, dtype: Any, *, loss_type: str, level: str,
                  bias_correction: bool) -> np.ndarray:
    fn = partial(_kl_loss, code, loss_type=loss_type, level=level,
                 bias_correction=bias_correction)
    return autograd_coefficients(fn, logp, ref, old, lengths, dtype=dtype,
                                 mode=TRL_LOSS_AGGREGATION[loss_type][0])


def kl_options(tree: SourceTree, dtype: str, *, code: TrlCode | None = None) -> KLOptions:
    """TRL's KL settings: k3 per token, with and without the ratio weighting, token and sequence
    ratio, at the default ``loss_type`` (``code``: an already executed :class:`TrlCode` of
    ``tree``)."""
    code = TrlCode(tree, dtype) if code is None else code
    cfg = tree.text(CONFIG)
    defaults = {name: dataclass_default(cfg, "GRPOConfig", name)
                for name in ("beta", "loss_type", "use_bias_correction_kl",
                             "importance_sampling_level")}
    lt = defaults["loss_type"]
    bc = defaults["use_bias_correction_kl"]
    mode = TRL_LOSS_AGGREGATION[lt][0]
    out = KLOptions(defaults=defaults)
    for level, flag in (("token", False), ("token", True), ("sequence", False),
                        ("sequence", True)):
        text = f"GRPOConfig(beta={BETA:g}"
        if flag != bc:
            text += f", use_bias_correction_kl={flag}"
        if level != defaults["importance_sampling_level"]:
            text += f', importance_sampling_level="{level}"'
        text += ")"
        model: dict[str, Any] = {"estimator": "k3", "placement": "loss"}
        if flag:
            model = {"estimator": "k3", "placement": "loss_ratio_weighted", "ratio_level": level}
        out.settings.append(KLSetting(
            text, model,
            partial(_coefficients, code, loss_type=lt, level=level, bias_correction=flag),
            mode=mode, default=(flag == bc and level == defaults["importance_sampling_level"])))
    return out
