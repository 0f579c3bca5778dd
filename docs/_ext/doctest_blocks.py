"""A griffe extension for the documentation site: the library's docstrings as Markdown.

Doctest examples written at the left margin of a docstring (the library's style: ``>>>`` lines
after the sections) become ``pycon`` code blocks, so that Markdown shows them as code instead of
reading ``[a, b]`` output as a link; Sphinx roles (``:func:`~pkg.name```) become inline code."""

from __future__ import annotations

import re
from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """``text`` with each run of unindented doctest lines (from a ``>>>`` line to the next blank
    line) fenced as a ``pycon`` block; lines inside an existing fence are left alone."""
    out: list[str] = []
    in_run = in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and not in_run and line.startswith(">>>"):
            out.append("```pycon")
            in_run = True
        elif in_run and not line.strip():
            out.append("```")
            in_run = False
        out.append(line)
    if in_run:
        out.append("```")
    return "\n".join(out)


ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|data|attr|exc|obj|const|term):`~?([^`]+)`")


def plain_roles(text: str) -> str:
    """``text`` with each Sphinx cross-reference role written as inline code."""
    return ROLE.sub(r"`\1`", text)


class DoctestBlocks(griffe.Extension):
    """Fence the doctests and unwrap the Sphinx roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(fence_doctests(obj.docstring.value))
