"""Every advantage estimator, registered here and nowhere else: ``compute_advantages(name, ...)``.

Each estimator takes ``rewards`` shaped ``[num_prompts, group_size]`` (``P x R``; NumPy
array-like or ``torch.Tensor``) and returns advantages of the same shape and backend; options
are keyword-only, and every convention that changes the mathematics (ddof, eps, the scope of
the std, the zero-variance rule) is a parameter with its default stated. The functions live with
their mathematics; this module registers each one in :mod:`grpo_theory.registry` (float form,
exact form for binary rewards, options with defaults, linear weights, source), in the order the
simulations loop over:

=================================  ======================================  ======================
name                               advantage ``A_i`` (``c_i = r_i - mean``)  module
=================================  ======================================  ======================
``grpo``                           ``c_i`` (seed paper, Eq. 15)             ``outcome_baselines``
``grpo_std``                       ``c_i / (std + eps)``                    ``normalisation``
``dr_grpo``                        ``c_i`` (the change is in the loss)      ``outcome_baselines``
``rloo``                           ``r_i - mean of the others``             ``outcome_baselines``
``reinforce``                      ``r_i - b``                              ``outcome_baselines``
``asym_grpo``                      ``c_i``, failures ``/ delta``            ``fade``
``power_alpha``                    ``(1 - mean)^(alpha - 1) c_i``           ``fade``
``fade``                           Power-alpha, then AsymGRPO               ``fade``
``reinforce_plus_plus``            ``r_i`` whitened over tokens             ``normalisation``
``reinforce_plus_plus_baseline``   ``c_i`` whitened over tokens             ``normalisation``
``opo``                            ``r_i -`` length-weighted mean           ``outcome_baselines``
``gpg``                            ``B / #nonzero * c_i / f_norm``          ``outcome_baselines``
``grpo_passk``                     best: ``r_max - r_2nd``, others 0        ``outcome_baselines``
``reinforce_baseline``             ``c_i`` whitened (OpenRLHF)              ``normalisation``
``flash_reinforce``                ``r_i -`` batch mean                     ``outcome_baselines``
``rloo_normalized``                RLOO whitened over the batch (TRL)       ``normalisation``
=================================  ======================================  ======================

The forms that are not ``[P, R] -> [P, R]`` are plain functions, not registry entries: ReMax
(needs the greedy reward), GDPO (:mod:`grpo_theory.multi_reward`), the optimal token baseline
(:mod:`grpo_theory.token_baselines`), ragged groups and NaN exclusion
(:mod:`grpo_theory.grouping`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .fade import (
    asym_grpo_advantages,
    exact_asym_grpo,
    exact_fade,
    exact_power_alpha,
    fade_advantages,
    power_alpha_advantages,
)
from .normalisation import (
    exact_grpo_std,
    grpo_std_advantages,
    reinforce_baseline_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_normalized_advantages,
)
from .outcome_baselines import (
    dr_grpo_advantages,
    exact_grpo,
    exact_grpo_passk,
    exact_opo,
    exact_reinforce,
    exact_rloo,
    flash_reinforce_advantages,
    gpg_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    linear_grpo,
    linear_opo,
    linear_reinforce,
    linear_rloo,
    opo_advantages,
    reinforce_advantages,
    rloo_advantages,
)
from .registry import (
    EstimatorSpec,
    RegistryView,
    get_estimator,
    register_estimator,
    validate_options,
)

__all__ = ["ESTIMATORS", "ESTIMATOR_SPECS", "FRAMEWORK_ESTIMATORS", "compute_advantages"]

Array = Any  # np.ndarray or torch.Tensor

_SHAO = "Shao et al. 2024 (DeepSeekMath), Sec. 4.1.2"
_FADE = "FADE (arXiv 2607.01490), as summarised in docs/conventions.md"
_VERL = "verl 0.9.1 verl/trainer/ppo/core_algos.py"
_ORL = "OpenRLHF 0.11.2 openrlhf/trainer/ppo_utils/experience_maker.py"

#: The estimators of the seed paper, of Shao et al., Dr.GRPO, RLOO, REINFORCE and FADE.
_PAPER_SPECS: tuple[EstimatorSpec, ...] = (
    EstimatorSpec(name="grpo", fn=grpo_advantages, exact=exact_grpo, linear=linear_grpo,
                  source="seed paper arXiv 2606.29238, Eq. (15)"),
    EstimatorSpec(name="grpo_std", fn=grpo_std_advantages,
                  options={"ddof": 1, "eps": 0.0, "std_scope": "group", "on_zero_std": "zero",
                           "eps_mode": "add_std"},
                  check_options={"ddof": 1, "eps": 0.0}, exact=exact_grpo_std, source=_SHAO),
    EstimatorSpec(name="dr_grpo", fn=dr_grpo_advantages, exact=exact_grpo, linear=linear_grpo,
                  source="Liu et al. 2025 (Dr.GRPO, arXiv 2503.20783), Sec. 3.2 and Fig. 1"),
    EstimatorSpec(name="rloo", fn=rloo_advantages, exact=exact_rloo, linear=linear_rloo,
                  source="Kool et al. 2019; Ahmadian et al. 2024, Eq. (7)"),
    EstimatorSpec(name="reinforce", fn=reinforce_advantages, options={"baseline": 0.0},
                  check_options={"baseline": 0.0}, exact=exact_reinforce,
                  linear=linear_reinforce, min_group_size=1, source="Williams 1992"),
    EstimatorSpec(name="asym_grpo", fn=asym_grpo_advantages, options={"delta": 1.0},
                  check_options={"delta": 0.5}, exact=exact_asym_grpo, source=_FADE),
    EstimatorSpec(name="power_alpha", fn=power_alpha_advantages, options={"alpha": 1.0},
                  check_options={"alpha": 2.0}, exact=exact_power_alpha, source=_FADE),
    EstimatorSpec(name="fade", fn=fade_advantages, options={"alpha": 1.0, "delta": 1.0},
                  check_options={"alpha": 2.0, "delta": 0.5}, exact=exact_fade, source=_FADE),
)

#: The estimators that TRL 1.16.0, verl 0.9.1 and OpenRLHF 0.11.2 ship beyond those.
_FRAMEWORK_SPECS: tuple[EstimatorSpec, ...] = (
    EstimatorSpec(name="reinforce_plus_plus", batch_coupled=True,
                  fn=reinforce_plus_plus_advantages, options={"lengths": None, "eps": 1e-8},
                  min_group_size=1,
                  source="Hu 2025 (arXiv 2501.03262); " + _VERL
                  + " compute_reinforce_plus_plus_outcome_advantage"),
    EstimatorSpec(name="reinforce_plus_plus_baseline", batch_coupled=True,
                  fn=reinforce_plus_plus_baseline_advantages,
                  options={"lengths": None, "eps": 1e-8}, min_group_size=1,
                  source=_VERL + " compute_reinforce_plus_plus_baseline_outcome_advantage"),
    EstimatorSpec(name="opo", fn=opo_advantages, options={"lengths": None}, exact=exact_opo,
                  linear=linear_opo, min_group_size=1,
                  source="Hao et al. 2025 (arXiv 2505.23585); " + _VERL
                  + " compute_opo_outcome_advantage"),
    EstimatorSpec(name="gpg", batch_coupled=True, fn=gpg_advantages, options={"f_norm": 1.0},
                  check_options={"f_norm": 2.0}, min_group_size=1,
                  source="Chu et al. 2025 (arXiv 2504.02546); " + _VERL
                  + " compute_gpg_outcome_advantage"),
    EstimatorSpec(name="grpo_passk", fn=grpo_passk_advantages,
                  options={"normalize_std": True, "eps": 1e-6},
                  check_options={"normalize_std": True, "eps": 0.0}, exact=exact_grpo_passk,
                  source="Chen et al. 2025 (arXiv 2503.19595); " + _VERL
                  + " compute_grpo_passk_outcome_advantage"),
    EstimatorSpec(name="reinforce_baseline", batch_coupled=True,
                  fn=reinforce_baseline_advantages, options={"lengths": None, "eps": 1e-8},
                  source=_ORL + " (estimator reinforce_baseline)"),
    EstimatorSpec(name="flash_reinforce", batch_coupled=True, fn=flash_reinforce_advantages,
                  min_group_size=1, source=_ORL + " (estimator flash_reinforce)"),
    EstimatorSpec(name="rloo_normalized", batch_coupled=True, fn=rloo_normalized_advantages,
                  options={"eps": 1e-4}, check_options={"eps": 0.0},
                  source="TRL 1.16.0 trl/trainer/rloo_trainer.py (normalize_advantages=True)"),
)

ESTIMATOR_SPECS: tuple[EstimatorSpec, ...] = _PAPER_SPECS + _FRAMEWORK_SPECS
"""Every registered estimator, in registration order."""

for _spec in ESTIMATOR_SPECS:
    register_estimator(_spec)
del _spec

FRAMEWORK_ESTIMATORS: tuple[str, ...] = tuple(s.name for s in _FRAMEWORK_SPECS)
"""Registry names of the estimators the frameworks ship beyond the papers' (``[P, R]`` rewards)."""

ESTIMATORS: Mapping[str, Callable[..., Array]] = RegistryView("fn")
"""Read-only live view ``name -> float form`` of :mod:`grpo_theory.registry`."""


def compute_advantages(name: str, rewards: Array, **options: Any) -> Array:
    """Advantages ``[P, R]`` of the registered estimator ``name`` with ``options``.

    Unknown options raise ``ValueError`` naming them (see :func:`grpo_theory.estimator_spec`
    for each estimator's options and defaults).

    >>> compute_advantages("rloo", [[1.0, 0.0, 0.0]]).tolist()
    [[1.0, -0.5, -0.5]]
    """
    validate_options(name, options)
    return get_estimator(name)(rewards, **options)
