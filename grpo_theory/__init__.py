"""grpo_theory: exact mathematics of GRPO advantage estimators (arXiv 2606.29238 and FADE).

Modules by mathematical topic (each with its equations and conventions):

* estimators: :mod:`~grpo_theory.outcome_baselines` (``r_i - b``: GRPO, Dr.GRPO, RLOO,
  REINFORCE, ReMax, OPO, GPG, pass@k, batch-mean baselines), :mod:`~grpo_theory.normalisation`
  (std normalisation and token whitening), :mod:`~grpo_theory.fade` (AsymGRPO, Power-alpha,
  FADE), :mod:`~grpo_theory.multi_reward` (GDPO), :mod:`~grpo_theory.token_baselines` (the
  optimal token baseline), :mod:`~grpo_theory.grouping` (ragged groups, NaN exclusion),
  :mod:`~grpo_theory.multiturn` (stage-level advantages); every estimator registered once in
  :mod:`~grpo_theory.advantages` (:func:`compute_advantages`) on :mod:`~grpo_theory.registry`;
* their exact laws: :mod:`~grpo_theory.bernoulli` (binary rewards), :mod:`~grpo_theory.symbolic`
  (linear estimators, sympy), :mod:`~grpo_theory.bounds` (tails and concentration),
  :mod:`~grpo_theory.mass` (FADE's gradient masses);
* the gradient: :mod:`~grpo_theory.aggregation` (loss aggregation weights),
  :mod:`~grpo_theory.spectral` (spectra of the gradient matrix),
  :mod:`~grpo_theory.diagnostics` (a step's norms, dead groups, noise scale, SNR);
* the KL regulariser at the gradient level: :mod:`~grpo_theory.kl` (k1/k2/k3, their
  placements, the exact gradients they deliver against those of the reverse and forward KL);
* :mod:`~grpo_theory.conventions` (how TRL, verl and OpenRLHF name all this), and
  :mod:`~grpo_theory.tables`.

Every public name is re-exported here, in :data:`__all__`.
"""

from typing import Any

from .advantages import (
    ESTIMATOR_SPECS,
    ESTIMATORS,
    FRAMEWORK_ESTIMATORS,
    compute_advantages,
)
from .aggregation import (
    AGGREGATION_MODES,
    POLICY_LOSSES,
    aggregation_weights,
    effective_weights,
    policy_loss_weights,
)
from .bernoulli import (
    EXACT_ESTIMATORS,
    advantage_distribution,
    advantage_value_table,
    advantage_values,
    binom_pmf,
    exact_advantage_moments,
    group_outcomes,
    to_exact,
)
from .bounds import (
    advantage_tail_event,
    baseline_tail_event,
    bernstein_bound,
    chebyshev_bound,
    exact_advantage_tail_bernoulli,
    exact_baseline_tail_bernoulli,
    hoeffding_bound,
    sup_baseline_tail_bernoulli,
)
from .conventions import (
    CONVENTIONS,
    TRL_LOSS_AGGREGATION,
    TRL_LOSS_TYPES,
    Convention,
    TrlLossType,
    conventions_markdown,
)
from .diagnostics import (
    NOISE_STATUS,
    NoiseScale,
    dead_groups,
    diagnostics_from_sums,
    diagnostics_notes,
    gradient_noise_scale,
    group_sums,
    merge_group_sums,
    noise_scale_parts,
    step_diagnostics,
)
from .fade import (
    asym_grpo_advantages,
    fade_advantages,
    fade_alpha_schedule,
    fade_delta_schedule,
    power_alpha_advantages,
)
from .grouping import grouped_advantages, nan_excluding_advantages
from .mass import expected_mass_bernoulli, gradient_mass
from .multi_reward import gdpo_advantages
from .multiturn import MULTITURN_MODES, multiturn_advantages, past_rewards, reward_to_go
from .normalisation import (
    grpo_std_advantages,
    reinforce_baseline_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_normalized_advantages,
    whiten,
)
from .outcome_baselines import (
    dr_grpo_advantages,
    flash_reinforce_advantages,
    gpg_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    opo_advantages,
    reinforce_advantages,
    remax_advantages,
    rloo_advantages,
    zero_variance_groups,
)
from .registry import (
    EstimatorSpec,
    estimator_names,
    estimator_spec,
    get_estimator,
    register_estimator,
)
from .spectral import (
    SpectralMetrics,
    effective_rank,
    entropy_effective_rank,
    gradient_gram,
    gram_clustered,
    gram_common_component,
    gram_isotropic,
    isotropic_effective_rank_binary,
    numerical_rank,
    singular_values_from_gram,
    spectral_metrics,
    spectral_metrics_batch,
    spectral_metrics_from_matrix,
    stable_rank,
    top1_fraction,
)
from .symbolic import LINEAR_ESTIMATORS, linear_estimator_moments, linear_weights
from .tables import TABLE_KINDS, BoundTable, bound_table
from .token_baselines import optimal_token_baseline_advantages

__all__ = [
    # estimators on [P, R] rewards (registered: compute_advantages(name, rewards, **options))
    "grpo_advantages",
    "grpo_std_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_advantages",
    "asym_grpo_advantages",
    "power_alpha_advantages",
    "fade_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "opo_advantages",
    "gpg_advantages",
    "grpo_passk_advantages",
    "reinforce_baseline_advantages",
    "flash_reinforce_advantages",
    "rloo_normalized_advantages",
    # estimators with other inputs, and their building blocks
    "remax_advantages",
    "gdpo_advantages",
    "optimal_token_baseline_advantages",
    "grouped_advantages",
    "nan_excluding_advantages",
    "whiten",
    "fade_alpha_schedule",
    "fade_delta_schedule",
    "zero_variance_groups",
    "multiturn_advantages",
    "MULTITURN_MODES",
    "past_rewards",
    "reward_to_go",
    # the registry
    "compute_advantages",
    "ESTIMATORS",
    "ESTIMATOR_SPECS",
    "FRAMEWORK_ESTIMATORS",
    "EstimatorSpec",
    "estimator_names",
    "estimator_spec",
    "get_estimator",
    "register_estimator",
    # exact laws for binary rewards, linear estimators, bounds
    "advantage_distribution",
    "advantage_value_table",
    "advantage_values",
    "binom_pmf",
    "exact_advantage_moments",
    "EXACT_ESTIMATORS",
    "group_outcomes",
    "to_exact",
    "LINEAR_ESTIMATORS",
    "linear_estimator_moments",
    "linear_weights",
    "advantage_tail_event",
    "baseline_tail_event",
    "bernstein_bound",
    "chebyshev_bound",
    "exact_advantage_tail_bernoulli",
    "exact_baseline_tail_bernoulli",
    "hoeffding_bound",
    "sup_baseline_tail_bernoulli",
    "expected_mass_bernoulli",
    "gradient_mass",
    # loss aggregation and spectra
    "AGGREGATION_MODES",
    "aggregation_weights",
    "effective_weights",
    "POLICY_LOSSES",
    "policy_loss_weights",
    "effective_rank",
    "entropy_effective_rank",
    "gradient_gram",
    "gram_clustered",
    "gram_common_component",
    "gram_isotropic",
    "isotropic_effective_rank_binary",
    "numerical_rank",
    "singular_values_from_gram",
    "spectral_metrics",
    "spectral_metrics_batch",
    "spectral_metrics_from_matrix",
    "SpectralMetrics",
    "stable_rank",
    "top1_fraction",
    # training diagnostics of a step (from the Grams of its gradient rows)
    "NOISE_STATUS",
    "NoiseScale",
    "dead_groups",
    "diagnostics_from_sums",
    "diagnostics_notes",
    "gradient_noise_scale",
    "group_sums",
    "merge_group_sums",
    "noise_scale_parts",
    "step_diagnostics",
    # the KL regulariser at the gradient level (grpo_theory.kl)
    "KL_ESTIMATORS",
    "KL_PLACEMENTS",
    "kl_estimate",
    "kl_coefficients",
    "expected_kl_gradient",
    "kl_gradient_targets",
    "classify_gradient",
    # framework conventions and tables
    "CONVENTIONS",
    "Convention",
    "conventions_markdown",
    "TRL_LOSS_TYPES",
    "TrlLossType",
    "TRL_LOSS_AGGREGATION",
    "TABLE_KINDS",
    "BoundTable",
    "bound_table",
]


#: Names of :mod:`grpo_theory.kl` re-exported here, imported on first use (the module is not
#: needed by the rest of the package, and ``import grpo_theory`` stays within its budget).
_KL_NAMES = ("KL_ESTIMATORS", "KL_PLACEMENTS", "kl_estimate", "kl_coefficients",
             "expected_kl_gradient", "kl_gradient_targets", "classify_gradient")


def __getattr__(name: str) -> Any:
    """``__version__``: the installed distribution's (one source: pyproject.toml), read lazily;
    the :mod:`grpo_theory.kl` names, imported lazily."""
    if name in _KL_NAMES:
        from . import kl

        return getattr(kl, name)
    if name == "__version__":
        from grpo_io import package_version

        return package_version("grpo-audit") or "0+unknown"
    raise AttributeError(f"module 'grpo_theory' has no attribute {name!r}")
