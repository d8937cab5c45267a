"""Argument conversion for the image API and message constructors, as the official bindings do.

The official classes are Rust types behind PyO3, so a width is a `u32`, a byte
limit a `u64`, image data a `Vec<u8>` and message content a `String`.  Callers
written against the official package may rely on the exception type (an
`OverflowError` for a negative width, a `TypeError` for a float or a `None`
content), so these helpers reproduce PyO3's conversions and messages instead of
accepting whatever Python allows.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

__all__ = ["as_bytes", "as_sequence", "as_str", "as_u32", "as_u64", "expect_instance", "type_name"]

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1


def type_name(value: object) -> str:
    """Return the bare class name PyO3 puts in its conversion errors."""
    return type(value).__name__


def expect_instance(value: object, cls: type, name: str) -> None:
    """Refuse anything but a ``cls`` instance, as PyO3 does for an argument of a Rust class."""
    if not isinstance(value, cls):
        raise TypeError(
            f"argument '{name}': '{type_name(value)}' object cannot be cast as '{cls.__name__}'"
        )


def _index(value: object, name: str) -> int:
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"argument '{name}': '{type_name(value)}' object cannot be interpreted as an integer"
        ) from None


def as_u32(value: object, name: str) -> int:
    """Convert like PyO3 converts a Python int to a Rust `u32`."""
    number = _index(value, name)
    if number < _I64_MIN or number > _I64_MAX:
        raise OverflowError("Python int too large to convert to C long")
    if number < 0 or number > U32_MAX:
        raise OverflowError("out of range integral type conversion attempted")
    return number


def as_u64(value: object, name: str) -> int:
    """Convert like PyO3 converts a Python int to a Rust `u64`."""
    number = _index(value, name)
    if number < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if number > U64_MAX:
        raise OverflowError("int too big to convert")
    return number


def as_str(value: object, name: str) -> str:
    """Accept only `str`, as PyO3 does for a Rust `String` argument.

    A string with a lone surrogate is not valid UTF-8 and fails the same way,
    with `UnicodeEncodeError`.
    """
    expect_instance(value, str, name)
    if not value.isascii():
        value.encode("utf-8")
    return value


def as_bytes(value: object, name: str) -> bytes:
    """Convert like PyO3 extracts a `Vec<u8>`: any byte buffer or sequence of byte values.

    A `str` is refused (it is a sequence, but of characters), and so is anything
    that is not a sequence.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        raise TypeError(f"argument '{name}': Can't extract `str` to `Vec`")
    expect_instance(value, Sequence, name)
    out = bytearray()
    for item in value:
        number = _index(item, name)
        if number < _I64_MIN or number > _I64_MAX:
            raise OverflowError("Python int too large to convert to C long")
        if number < 0 or number > 255:
            raise OverflowError("out of range integral type conversion attempted")
        out.append(number)
    return bytes(out)


def as_sequence(value: Any, name: str) -> Sequence[Any]:
    """Accept a sequence (never a `str`), as PyO3 does for a `Vec<T>` argument."""
    if isinstance(value, str):
        raise TypeError(f"argument '{name}': Can't extract `str` to `Vec`")
    expect_instance(value, Sequence, name)
    return value
