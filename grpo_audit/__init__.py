"""grpo_audit: the ``grpo-audit`` application, the top of the package stack.

Layers, bottom to top (an arrow means "may import")::

    grpo_io      (stdlib only)               JSON/JSONL IO, one NaN/inf policy, environment()
    paper_values (imports nothing)           the seed paper's printed values (data)
    grpo_theory  -> grpo_io                  the mathematics (numpy; sympy only where asked)
    sims         -> grpo_theory, grpo_io     toy worlds with exact ground truth
    real_model   -> the above (sims lazily)  real-model gradient geometry, grpo-audit compare
    paper_checks -> the above                the proof audit of the papers (arXiv 2606.29238, ...)
    framework_checks -> grpo_theory, grpo_io TRL's, verl's, OpenRLHF's own code against the theory
    grpo_audit   -> everything               command line, rendering of the core's tables

Each package contributes its subcommands through ``register(subparsers)`` in its own cheap
``cli.py``; :func:`grpo_audit.cli.build_parser` calls them. Importing this package is cheap
(no numpy).
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "package_version"]


def package_version() -> str:
    """The installed distribution's version (one source: ``pyproject.toml``)."""
    from grpo_io import package_version as _version

    return _version("grpo-audit") or "0+unknown"


def __getattr__(name: str) -> Any:  # lazy: importlib.metadata costs ~30 ms, --help needs none
    if name == "__version__":
        return package_version()
    raise AttributeError(f"module 'grpo_audit' has no attribute {name!r}")
