"""argparse value types shared by the inference tools: each error names the value and what is allowed."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type = int) -> Callable[[str], int | float]:
    """An int (or float) above zero."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {'integer' if kind is int else 'number'}, "
                                             f"got {text!r}")
        return value

    return parse


positive_int = positive(int)


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """`1,4,16`: comma-separated positive integers, for sweeps."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text!r}")
    return value
