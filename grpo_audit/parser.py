"""The argument parser of ``grpo-audit`` and its commands: a usage error is one line."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["Parser", "printable"]


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line (the error and where to find
    the usage), exit status 2; its subparsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {printable(message)} (see {self.prog} --help)\n")


def printable(text: str) -> str:
    """``text`` safe to print: bytes that are not UTF-8 (a path from the command line) shown as
    ``\\xNN``, other unprintable surrogates escaped."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
