"""The one estimator registry: one :class:`EstimatorSpec` per advantage estimator.

The registry holds the entries; :mod:`grpo_theory.advantages` registers every estimator of the
library, in one place, when ``grpo_theory`` is imported (this module imports nothing of the
library, so there is no import cycle). Every other list of estimators in the project derives
from this registry: :data:`grpo_theory.ESTIMATORS` (name -> float form),
:data:`grpo_theory.EXACT_ESTIMATORS` (name -> exact form), :data:`grpo_theory.LINEAR_ESTIMATORS`
(name -> linear weights), the options the simulations check (:func:`check_options`) and the
estimators the experiments loop over (:func:`estimator_names`, in registration order).

Adding an estimator of the library is one entry in :mod:`grpo_theory.advantages`; from outside,
it is one call (see :class:`EstimatorSpec` for each field)::

    from grpo_theory.registry import EstimatorSpec, register_estimator

    def my_advantages(rewards, *, scale: float = 1.0):  # [P, R] -> [P, R], numpy or torch
        ...

    register_estimator(EstimatorSpec(
        name="my_est",
        fn=my_advantages,
        options={"scale": 1.0},            # every keyword option and its default
        check_options={"scale": 2.0},      # non-trivial options the checks exercise
        exact=None,                        # or (R, k, **opts) -> (a_S, a_F), sympy numbers
        linear=None,                       # or (R, **opts) -> (alpha, beta, c)
        min_group_size=2,
        source="Author et al. 2025, Eq. (3)",
    ))

``tests/test_theory_registry.py`` then checks the new entry automatically: float form on NumPy
and torch with shape ``[P, R]``, the declared options equal the function's keyword defaults,
unknown options are rejected by name, the exact form agrees with the float form on every binary
group, and the estimator is linear iff it declares linear weights (which must reproduce it).

This module imports nothing but the standard library: registering costs no sympy import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "EstimatorSpec",
    "register_estimator",
    "estimator_spec",
    "get_estimator",
    "estimator_names",
    "check_options",
    "validate_options",
    "RegistryView",
]


@dataclass(frozen=True)
class EstimatorSpec:
    """One advantage estimator: float form, exact form, options, linearity, source.

    Attributes:
        name: registry name (``compute_advantages(name, rewards)``).
        fn: float form ``fn(rewards, **options) -> advantages``; ``rewards`` shaped
            ``[num_prompts, group_size]`` (NumPy array-like or ``torch.Tensor``), result of the
            same shape and backend. Options are keyword-only.
        options: every option of ``fn`` and its stated default (``{}`` for none).
        check_options: the options the simulations and the registry tests use (non-trivial
            values where the default would hide a behaviour, e.g. ``delta=0.5``); a subset of
            ``options``' keys. Default ``{}`` (the defaults).
        exact: exact form for binary rewards, or ``None``. Called as ``exact(R, k, **options)``
            for a group of ``R`` with ``k`` successes, it returns ``(a_S, a_F)``: the advantage of
            a success and of a failure as exact sympy numbers (import sympy inside the function,
            never at module level). Values for a kind of rollout that does not exist (``a_S``
            at ``k = 0``, ``a_F`` at ``k = R``) are ignored.
        linear: for an estimator of the form ``A_i = alpha r_i + beta sum_{j != i} r_j + c``, a
            function ``linear(R, **options) -> (alpha, beta, c)`` using arithmetic only (``R``
            may be an int, a :class:`fractions.Fraction` or a sympy symbol); ``None`` when the
            estimator is not linear in the rewards for every option value.
        min_group_size: smallest group size ``R`` the estimator accepts.
        source: citation (paper, equation; framework and file for framework estimators).
        batch_coupled: True when a group's advantages depend on the other groups of the batch
            (batch statistics: whitening, GPG's batch factor, a batch-mean baseline). The
            per-group exact enumeration and the per-group simulations do not apply to such an
            estimator (``estimator_names(batch_coupled=False)`` leaves it out). Default False.
    """

    name: str
    fn: Callable[..., Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    check_options: Mapping[str, Any] = field(default_factory=dict)
    exact: Callable[..., tuple[Any, Any]] | None = None
    linear: Callable[..., tuple[Any, Any, Any]] | None = None
    min_group_size: int = 2
    source: str = ""
    batch_coupled: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"estimator name must be an identifier string, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"estimator {self.name!r}: fn must be callable")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "check_options", MappingProxyType(dict(self.check_options)))
        unknown = sorted(set(self.check_options) - set(self.options))
        if unknown:
            raise ValueError(
                f"estimator {self.name!r}: check_options {unknown} are not among its options "
                f"{sorted(self.options)}"
            )
        if self.min_group_size < 1:
            raise ValueError(f"estimator {self.name!r}: min_group_size must be >= 1")

    @property
    def is_linear(self) -> bool:
        """True when the estimator declares linear weights."""
        return self.linear is not None

    @property
    def has_exact(self) -> bool:
        """True when the estimator has an exact (sympy) form for binary rewards."""
        return self.exact is not None


_REGISTRY: dict[str, EstimatorSpec] = {}


def register_estimator(spec: EstimatorSpec, *, replace: bool = False) -> EstimatorSpec:
    """Add ``spec`` to the registry (the one operation that adds an estimator).

    Args:
        spec: the estimator's :class:`EstimatorSpec`.
        replace: allow replacing an entry of the same name (default False: raise).

    Returns:
        ``spec`` (so a module can keep a reference).

    Raises:
        ValueError: a different estimator is already registered under ``spec.name``.
    """
    if not isinstance(spec, EstimatorSpec):
        raise TypeError(f"register_estimator needs an EstimatorSpec, got {type(spec)!r}")
    old = _REGISTRY.get(spec.name)
    if old is not None and old is not spec and not replace:
        raise ValueError(f"estimator {spec.name!r} is already registered (pass replace=True)")
    _REGISTRY[spec.name] = spec
    return spec


def estimator_spec(name: str) -> EstimatorSpec:
    """The :class:`EstimatorSpec` registered as ``name``; ``ValueError`` listing the names."""
    if not isinstance(name, str):
        raise TypeError(
            f"estimator name must be a string (a registry name), got {type(name).__name__} {name!r}"
        )
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(_REGISTRY)}"
        ) from None


def get_estimator(name: str) -> Callable[..., Any]:
    """The float form of estimator ``name`` (``estimator_spec(name).fn``)."""
    return estimator_spec(name).fn


def estimator_names(
    *,
    exact: bool | None = None,
    linear: bool | None = None,
    batch_coupled: bool | None = None,
) -> tuple[str, ...]:
    """Registered names in registration order, optionally only those with(out) an exact form,
    linear weights or batch coupling (``exact=True``: exact form declared; ``linear=False``: not
    linear; ``batch_coupled=False``: a group's advantages depend on that group only; ...)."""
    return tuple(
        n
        for n, s in _REGISTRY.items()
        if (exact is None or s.has_exact == exact)
        and (linear is None or s.is_linear == linear)
        and (batch_coupled is None or s.batch_coupled == batch_coupled)
    )


def check_options(name: str) -> dict[str, Any]:
    """A fresh dict of the options the checks use for ``name`` (its ``check_options``)."""
    return dict(estimator_spec(name).check_options)


def validate_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming every option of ``options`` that ``name`` does not have."""
    spec = estimator_spec(name)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        known = sorted(spec.options) or "none"
        raise ValueError(
            f"estimator {name!r} has no option(s) {unknown}; its options are {known}"
        )


class RegistryView(Mapping[str, Any]):
    """Read-only live view ``name -> attribute`` of the registry (entries where it is not None).

    ``ESTIMATORS``, ``EXACT_ESTIMATORS`` and ``LINEAR_ESTIMATORS`` are such views, so an
    estimator registered later appears in them too.
    """

    def __init__(
        self, attribute: str, *, where: Callable[[EstimatorSpec], bool] | None = None
    ) -> None:
        self._attr = attribute
        self._where = where

    def _items(self) -> dict[str, Any]:
        out = {}
        for n, s in _REGISTRY.items():
            if self._where is not None and not self._where(s):
                continue
            v = getattr(s, self._attr)
            if v is not None:
                out[n] = v
        return out

    def __getitem__(self, name: str) -> Any:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __repr__(self) -> str:
        return f"RegistryView({self._attr!r}: {list(self._items())})"
