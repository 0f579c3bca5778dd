"""grpo_theory: exact mathematics of GRPO advantage estimators (arXiv 2606.29238 and FADE).

Public API is re-exported here; see each module for equations and conventions.
"""

from .advantages import (
    ESTIMATORS,
    asym_grpo_advantages,
    compute_advantages,
    dr_grpo_advantages,
    fade_advantages,
    fade_alpha_schedule,
    fade_delta_schedule,
    get_estimator,
    grpo_advantages,
    grpo_std_advantages,
    power_alpha_advantages,
    reinforce_advantages,
    rloo_advantages,
    zero_variance_groups,
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
    Convention,
    conventions_markdown,
)
from .framework_estimators import (
    FRAMEWORK_ESTIMATORS,
    gdpo_advantages,
    grouped_advantages,
    nan_excluding_advantages,
    optimal_token_baseline_advantages,
    remax_advantages,
    whiten,
)
from .mass import expected_mass_bernoulli, gradient_mass
from .multiturn import MULTITURN_MODES, multiturn_advantages, past_rewards, reward_to_go
from .registry import (
    EstimatorSpec,
    estimator_names,
    estimator_spec,
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
    spectral_metrics_from_matrix,
    stable_rank,
    top1_fraction,
)
from .symbolic import LINEAR_ESTIMATORS, linear_estimator_moments, linear_weights
from .tables import TABLE_KINDS, BoundTable, bound_table

__all__ = [
    "advantage_distribution",
    "advantage_value_table",
    "advantage_values",
    "AGGREGATION_MODES",
    "aggregation_weights",
    "POLICY_LOSSES",
    "policy_loss_weights",
    "FRAMEWORK_ESTIMATORS",
    "gdpo_advantages",
    "grouped_advantages",
    "nan_excluding_advantages",
    "optimal_token_baseline_advantages",
    "remax_advantages",
    "whiten",
    "asym_grpo_advantages",
    "advantage_tail_event",
    "baseline_tail_event",
    "bernstein_bound",
    "binom_pmf",
    "bound_table",
    "BoundTable",
    "chebyshev_bound",
    "compute_advantages",
    "Convention",
    "CONVENTIONS",
    "conventions_markdown",
    "dr_grpo_advantages",
    "effective_rank",
    "effective_weights",
    "entropy_effective_rank",
    "estimator_names",
    "estimator_spec",
    "EstimatorSpec",
    "ESTIMATORS",
    "exact_advantage_moments",
    "exact_advantage_tail_bernoulli",
    "exact_baseline_tail_bernoulli",
    "EXACT_ESTIMATORS",
    "expected_mass_bernoulli",
    "fade_advantages",
    "fade_alpha_schedule",
    "fade_delta_schedule",
    "get_estimator",
    "gradient_gram",
    "gradient_mass",
    "gram_clustered",
    "gram_common_component",
    "gram_isotropic",
    "group_outcomes",
    "grpo_advantages",
    "grpo_std_advantages",
    "hoeffding_bound",
    "isotropic_effective_rank_binary",
    "linear_estimator_moments",
    "LINEAR_ESTIMATORS",
    "linear_weights",
    "multiturn_advantages",
    "MULTITURN_MODES",
    "numerical_rank",
    "past_rewards",
    "power_alpha_advantages",
    "register_estimator",
    "reinforce_advantages",
    "reward_to_go",
    "rloo_advantages",
    "singular_values_from_gram",
    "spectral_metrics",
    "spectral_metrics_from_matrix",
    "SpectralMetrics",
    "stable_rank",
    "sup_baseline_tail_bernoulli",
    "TABLE_KINDS",
    "to_exact",
    "top1_fraction",
    "zero_variance_groups",
]


def __getattr__(name: str) -> str:
    """``__version__``: the installed distribution's (one source: pyproject.toml), read lazily."""
    if name == "__version__":
        from grpo_io import package_version

        return package_version("grpo-audit") or "0+unknown"
    raise AttributeError(f"module 'grpo_theory' has no attribute {name!r}")
