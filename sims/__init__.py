"""sims: toy worlds with exact ground truth and Monte Carlo checks of GRPO theory.

Worlds (each exactly solvable): :class:`SoftmaxBandit`, :class:`TokenMDP` (enumeration),
:class:`MultiTurnMDP` (dynamic programming), and trajectory-score models in :mod:`sims.psi_models`.
Checks (:mod:`sims.checks`) return :class:`CheckResult` objects; experiments are registered in
:data:`sims.experiments.EXPERIMENTS` and run with ``grpo-audit sims <experiment> --out DIR``.

The public names below are imported lazily (PEP 562) so that ``from sims import cli`` (done by
``grpo-audit`` at start-up) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "SoftmaxBandit": "bandit",
    "TokenMDP": "token_mdp",
    "MultiTurnMDP": "multiturn",
    "CheckResult": "results",
    "make_check": "results",
    "results_table": "results",
    "ESTIMATOR_SPECS": "exact",
    "bernoulli_advantage_moments": "exact",
    "bernoulli_tail": "exact",
    "cond_advantage_given_reward": "exact",
    "expected_gradient_bernoulli": "exact",
    "expected_gradient_linear": "exact",
    "check_theorem41": "checks",
    "check_tails": "checks",
    "check_unbiasedness": "checks",
    "check_unbiasedness_batch": "checks",
    "check_multiturn": "checks",
    "check_multiturn_modes": "checks",
    "check_spectra_limit": "checks",
    "multiturn_bias_table": "checks",
    "spectra_summary": "checks",
    "run_training": "training",
    "summarize_training": "training",
    "EXPERIMENTS": "experiments",
    "NoiseScaleWorld": "noise_scale",
    "check_noise_scale": "noise_scale",
    "run_experiment": "experiments",
}
_SUBMODULES = (
    "bandit",
    "token_mdp",
    "multiturn",
    "psi_models",
    "results",
    "exact",
    "checks",
    "multiturn_checks",
    "plots",
    "training",
    "experiments",
    "cli",
    "noise_scale",
)

__all__ = sorted([*_LAZY, "psi_models"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'sims' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_SUBMODULES])
