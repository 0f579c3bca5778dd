"""``grpo-audit tables KIND``: placeholder, implemented with grpo_theory.tables."""

from __future__ import annotations

import argparse
from typing import Any

TABLE_KINDS: dict[str, Any] = {}


def register(sub: Any) -> None:
    """Add the ``tables`` subcommand."""
    p = sub.add_parser("tables", help="print exact bound/tail tables (Markdown, CSV, LaTeX)")
    p.add_argument("kind")
    p.set_defaults(func=lambda a: print("not yet implemented") or 1)


__all__ = ["register", "TABLE_KINDS", "argparse"]
