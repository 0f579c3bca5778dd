"""Caps on the exact routines whose cost grows with the group size ``R``.

Every exact routine of :mod:`grpo_theory` whose time or memory grows with ``R`` either has an
``O(1)``-memory route that answers for any ``R`` or refuses an ``R`` above a stated cap, at once,
with a ``ValueError`` naming the cap and the alternative (a closed form, a bound, a Monte Carlo
estimate). Each cap is sized so that the routine at the cap answers in about a second (or less)
in well under 1 GB on one core; ``docs/grpo_theory.md`` lists them with their routines.

==================  ==========  ==================================================================
cap                 value       what grows with R
==================  ==========  ==================================================================
``EXACT_R_MAX``     10 000      sympy enumeration of the ``2(R+1)`` exact advantage values
``EXACT_P_R_MAX``   1 000       the exact Binomial law of ``R + 1`` terms for an exact ``p``
                                (Fraction/sympy), and the exact sums over it (moments, tails,
                                masses): rationals of ``~R log2(den p)`` bits
``SUP_R_MAX``       100 000     the ``~4R`` pieces of the supremum over ``p`` of the baseline tail
``ARRAY_R_MAX``     1 000 000   float arrays of ``R + 1`` entries (a law over ``k = 0..R``, a mask)
``SQUARE_R_MAX``    2 048       ``R x R`` arrays: Gram matrices, every group's advantages
                                (32 MiB of float64 at the cap)
``LAW_CELLS_MAX``   32 768      the joint (successes, total length) law of ``n`` rollouts,
                                ``(n + 1)(n L_max + 1)`` cells built by ``n`` convolutions
                                (cost ~ cells^2: 1.4 s at 32 000)
==================  ==========  ==================================================================

Routines with an ``O(1)`` route for any ``R``: the classical bounds (Chebyshev, Hoeffding,
Bernstein), :func:`grpo_theory.bounds.baseline_tail_counts` and, for a float ``p``,
:func:`grpo_theory.bounds.exact_baseline_tail_bernoulli` (two regularised incomplete beta
functions), :func:`grpo_theory.spectral.isotropic_effective_rank_binary`, the closed forms of
:mod:`grpo_theory.symbolic`, and the per-``(R, k)`` exact forms of the registry.
"""

from __future__ import annotations

__all__ = [
    "EXACT_R_MAX", "EXACT_P_R_MAX", "SUP_R_MAX", "ARRAY_R_MAX", "SQUARE_R_MAX", "LAW_CELLS_MAX",
    "check_R_limit",
]

#: Largest group the exact (sympy) enumeration accepts: ``advantage_value_table`` and everything
#: built on it (about half a second for grpo at the limit; with a float ``p``).
EXACT_R_MAX = 10_000

#: Largest group for an exact ``p`` (Fraction or sympy): the exact Binomial law of
#: ``group_outcomes`` and every exact sum over it (``exact_advantage_moments``,
#: ``exact_advantage_tail_bernoulli``, ``exact_baseline_tail_bernoulli``,
#: ``expected_mass_bernoulli``): 0.1 to 2.6 s at the limit (3 to 24 s at R = 3000).
EXACT_P_R_MAX = 1_000

#: Largest R accepted by ``sup_baseline_tail_bernoulli`` (about a second at the limit).
SUP_R_MAX = 100_000

#: Largest R for which a float array of ``R + 1`` entries is built (``group_outcomes``,
#: ``baseline_tail_event``, ``advantage_values(exact=False)``): 8 MB per array at the limit; a
#: routine that builds ``C`` such arrays caps R at ``ARRAY_R_MAX // C``.
ARRAY_R_MAX = 1_000_000

#: Largest R for which an ``R x R`` array is built: Gram matrices (``gram_isotropic``,
#: ``gram_common_component``, ``gram_clustered``) and the advantages of every binary group
#: (``question_weights.success_failure_values``): 32 MiB of float64 at the limit.
SQUARE_R_MAX = 2_048

#: Most cells ``(n + 1)(n L_max + 1)`` of ``length_bias.others_reward_length_law`` (``n``
#: convolutions; time grows as the square of the cells: 1.4 s at 63 rollouts of length <= 8).
LAW_CELLS_MAX = 32_768


def check_R_limit(R: int, *, limit: int, name: str, routine: str, cost: str,
                  alternative: str) -> None:
    """Refuse ``R > limit`` with one ``ValueError`` naming the routine, the cap and the way on.

    Args:
        R: the group size (already validated as an int).
        limit: the cap; ``name`` is its constant's name (e.g. ``"ARRAY_R_MAX"``).
        routine: the function refusing.
        cost: what grows with R (``"arrays of R + 1 floats"``).
        alternative: what to use instead (a closed form, a bound, Monte Carlo).

    >>> check_R_limit(10, limit=100, name="X", routine="f", cost="c", alternative="a")
    >>> check_R_limit(10**9, limit=100, name="X", routine="f", cost="c", alternative="use g")
    Traceback (most recent call last):
    ...
    ValueError: f: R=1000000000 exceeds X=100 (it builds c); use g
    """
    if R > limit:
        raise ValueError(f"{routine}: R={R} exceeds {name}={limit} (it builds {cost}); "
                         f"{alternative}")
