"""Whole numbers typed by a user (a token id, a class, a position): one parser for every front end.

``str.isdigit`` and ``int()`` disagree (``"²".isdigit()`` is True, ``int("--5")`` fails, ``int("٣")`` is 3), so
each site that tested one and called the other could end in a ValueError. Here a whole number is ASCII digits
with at most one sign; everything else is not one, and the caller says what it expected.
"""

from __future__ import annotations

import re

_WHOLE = re.compile(r"[+-]?[0-9]+")


def int_or_none(text: str) -> int | None:
    """``text`` (surrounding spaces allowed) as an int when it is written as one, else None."""
    stripped = text.strip()
    return int(stripped) if _WHOLE.fullmatch(stripped) else None


def is_whole(text: str) -> bool:
    """Whether ``text`` is written as a whole number (``int_or_none`` would read it)."""
    return _WHOLE.fullmatch(text.strip()) is not None
