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

__version__ = "0.1.0"

__all__ = [
    "ESTIMATORS",
    "SpectralMetrics",
    "asym_grpo_advantages",
    "compute_advantages",
    "dr_grpo_advantages",
    "effective_rank",
    "entropy_effective_rank",
    "fade_advantages",
    "fade_alpha_schedule",
    "fade_delta_schedule",
    "get_estimator",
    "gradient_gram",
    "gram_clustered",
    "gram_common_component",
    "gram_isotropic",
    "grpo_advantages",
    "grpo_std_advantages",
    "isotropic_effective_rank_binary",
    "numerical_rank",
    "power_alpha_advantages",
    "reinforce_advantages",
    "rloo_advantages",
    "singular_values_from_gram",
    "spectral_metrics",
    "spectral_metrics_from_matrix",
    "stable_rank",
    "top1_fraction",
    "zero_variance_groups",
]
