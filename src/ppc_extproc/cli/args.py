"""Argument types and the parser class shared by ``serve``, ``mock-vllm`` and ``demo``.

A mistake on the command line is one line on stderr naming the flag, and exit status 2::

    ppc-extproc serve: error: argument --grpc-port: must be a port within 1-65535, got 70000

``argparse`` puts the flag's name in front of an ``ArgumentTypeError``'s message, so each type
below only says what it expected.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "OneLineParser",
    "fail",
    "fraction",
    "non_negative_float",
    "non_negative_int",
    "port",
    "port_or_zero",
    "positive_float",
    "positive_int",
]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: message``), exit 2.

    ``argparse`` prints the whole usage before the error; for ``serve`` that is a screenful in
    which the one line naming the flag is easy to miss. ``--help`` still prints the usage.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(text: str, convert: Callable[[str], float], kind: str) -> float:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None


def _int(text: str) -> int:
    return int(_number(text, int, "an integer"))


def _float(text: str) -> float:
    value = _number(text, float, "a number")
    if value != value or value in (float("inf"), float("-inf")):  # NaN or infinite
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 1-65535."""
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port within 1-65535, got {text}")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port, or 0 for one the kernel picks."""
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port within 1-65535 (or 0 for any free port), got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer ≥ 1 (counts, sizes)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer ≥ 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (rates, durations that must elapse)."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ≥ 0 (timeouts, intervals)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def fraction(text: str) -> float:
    """A number within [0, 1]."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {text}")
    return value


def fail(prog: str, message: str, status: int = 2) -> int:
    """Print ``prog: message`` as one line on stderr and return ``status`` (for a handler to return)."""
    print(f"{prog}: {message}", file=sys.stderr)
    return status
