"""Python API arguments checked at the edge: a wrong type is one ``ArgumentError`` naming the argument, not an
AttributeError or a NumPy TypeError from deep inside (``vocab=123``, ``steps=True``, ``steps="3"``)."""

from __future__ import annotations

import numbers
from typing import Any

from gradscope.core.errors import ArgumentError
from gradscope.core.files import shorten


def check_argument(name: str, value: Any, kinds: tuple[type, ...], what: str) -> None:
    """Raise ``ArgumentError`` unless ``value`` is an instance of ``kinds`` (``None`` passes when ``type(None)``
    is one of them). A bool is not a number here, though Python counts it as an int."""
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ArgumentError(f"{name} must be {what}; got {type(value).__name__} {shorten(repr(value), 60)}.")


def check_count(name: str, value: Any, low: int, high: int) -> int:
    """A whole number in ``low..high`` (a count of steps, a row), exactly as given: no "3" read as 3."""
    check_argument(name, value, (numbers.Integral,), "a whole number")
    if not low <= value <= high:
        raise ArgumentError(f"{name} must be {low} to {high}; got {shorten(str(value), 40)}.")
    return int(value)
