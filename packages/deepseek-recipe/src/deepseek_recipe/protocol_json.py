"""Compact JSON for Responses and Messages payloads, formatted like serde_json.

Clients compare these payloads as text (and our parity tests do too), so the
formatting follows the official serializer: no spaces, non-ASCII kept, floats as
shortest round-trip digits (`1e+21`, `1e-7`, `0.00001`).  Sampling settings are
single-precision values in the official objects; wrapping one in `F32` prints it
as the shortest decimal that round-trips through `f32` (0.7, not
0.699999988079071).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from deepseek_recipe.pyjson import dumps_compact, format_float


def to_f32(value: float) -> float:
    """Round through single precision, as a value stored in an `f32` field."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


class F32(float):
    """A float that the official objects store in single precision."""

    def __new__(cls, value: float) -> F32:
        return super().__new__(cls, to_f32(float(value)))


def f32_shortest(value: float) -> float:
    """The shortest decimal that reads back as the same `f32` (what serde prints)."""
    target = to_f32(value)
    if math.isnan(target) or math.isinf(target):
        return target
    for digits in range(1, 10):
        candidate = float(f"{target:.{digits}g}")
        if to_f32(candidate) == target:
            return candidate
    return target


def _serde_float(value: float) -> str:
    """serde's spelling of a float, printing an `F32` at single precision."""
    if isinstance(value, F32):
        return format_float(f32_shortest(value))
    return format_float(value)


def dumps(value: Any) -> str:
    """Serialize like serde_json's compact writer."""
    return dumps_compact(value, _serde_float)


_I64_MIN = -(2**63)
_U64_MAX = 2**64 - 1


def loads(text: str) -> Any:
    """Parse JSON into the value serde_json would read; `ValueError` where serde fails.

    Integers outside the 64-bit range become floats, `-0` is the float -0.0, and
    `NaN`, `Infinity` or a number too large for a float are errors.
    """

    def reject(_: str) -> Any:
        raise ValueError("non-standard JSON constant")

    def number(literal: str) -> float:
        value = float(literal)
        if math.isinf(value):
            raise ValueError("number out of range")
        return value

    def integer(literal: str) -> int | float:
        value = int(literal)
        if literal == "-0" or not _I64_MIN <= value <= _U64_MAX:
            return number(literal)
        return value

    try:
        return json.loads(text, parse_constant=reject, parse_float=number, parse_int=integer)
    except RecursionError:
        raise ValueError("recursion limit exceeded") from None
