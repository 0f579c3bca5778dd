"""Subcommands of ``grpo-audit`` contributed by this package (placeholder until implemented)."""

from __future__ import annotations

import argparse
from typing import Any

TABLE_KINDS: dict[str, Any] = {}


def register(sub: Any) -> None:  # argparse subparsers action
    """Add this package's subcommands to ``grpo-audit``."""
    del sub


__all__ = ["register", "TABLE_KINDS", "argparse"]
