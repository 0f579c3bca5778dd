"""Claims of the FADE abstract (arXiv 2607.01490)."""

from __future__ import annotations
