"""Type checks shared by request and option validation.

``bool`` is an ``int`` subclass in Python, so ``True`` would pass as a count or a token id, and
JSON bodies send ``true`` where a number belongs often enough to matter: these reject it.
"""

from __future__ import annotations


def is_int(value: object) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a float that is not a bool (NaN and infinities pass: ranges are checked apart)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
