"""JSON text in the two styles the prompts and constraints use.

Prompts show schemas and argument values the way Python's `json.dumps` prints
them (`", "` and `": "` separators, non-ASCII kept), because that is what the
models saw in training.  Floats follow the official formatter: shortest
round-trip digits, decimal notation for exponents in [-5, 16), otherwise
`1e+20`-style scientific notation without zero padding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}


def quote(text: str) -> str:
    """JSON string literal with only the mandatory escapes."""
    out = ['"']
    for ch in text:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def format_float(value: float) -> str:
    """Format a float like the official serializer (see module docstring)."""
    if value == 0.0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    text = repr(value)
    sign = ""
    if text.startswith("-"):
        sign, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    exp = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # Decimal exponent of the first significant digit.
    point = len(int_part) + exp
    if int_part.strip("0") == "":
        point = exp - (len(frac_part) - len(frac_part.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    sci_exp = point - 1
    if -5 <= sci_exp < 16:
        if point <= 0:
            body = "0." + "0" * (-point) + digits
        elif point >= len(digits):
            body = digits + "0" * (point - len(digits)) + ".0"
        else:
            body = digits[:point] + "." + digits[point:]
        return sign + body
    head = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    exp_sign = "+" if sci_exp >= 0 else "-"
    return f"{sign}{head}e{exp_sign}{abs(sci_exp)}"


def python_float(value: float) -> str:
    """Python's own float repr, which the V4.1 encoding keeps (`1e-07`)."""
    return repr(value)


def format_compact_float(value: float) -> str:
    """The official compact JSON keeps the same float spelling as the prompts (`1e+21`, `1e-7`)."""
    return format_float(value)


def _dumps(value: Any, fmt: Callable[[float], str], comma: str, colon: str) -> str:
    """The one JSON writer behind every style; the styles differ only in separators and floats."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, dict):
        items = (f"{quote(str(k))}{colon}{_dumps(v, fmt, comma, colon)}" for k, v in value.items())
        return "{" + comma.join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + comma.join(_dumps(v, fmt, comma, colon) for v in value) + "]"
    raise TypeError(f"value of type {type(value).__name__} is not JSON serializable")


def dumps_python(value: Any, fmt: Callable[[float], str] = format_float) -> str:
    """Serialize like Python's `json.dumps(value, ensure_ascii=False)`; `fmt` formats floats."""
    return _dumps(value, fmt, ", ", ": ")


def dumps_compact(value: Any, fmt: Callable[[float], str] = format_compact_float) -> str:
    """Compact JSON (no spaces) for output constraints and protocol payloads; `fmt` as above."""
    return _dumps(value, fmt, ",", ":")


def loads(text: str) -> Any:
    """Parse JSON, keeping key order (Python dicts already do)."""
    return json.loads(text)
