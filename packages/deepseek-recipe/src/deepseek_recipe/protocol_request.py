"""The request bodies of the Responses and Messages converters.

Both protocols take the same three body forms and word their problems alike.
Chat Completions shares only the JSON text parsing (`body.loads_body`): the
official package fails differently there on a JSON array or on bytes that
are not UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe.errors import body_error
from deepseek_recipe.json_errors import serde_syntax_error
from deepseek_recipe.serde_decode import Field


def parse_protocol_body(
    body: bytes | str | dict[str, Any], struct_name: str, fields: Sequence[Field]
) -> Any:
    """Turn the three body forms into JSON values with the official error wording.

    A JSON array is what serde reads as the struct's fields in declaration order,
    so it is decoded that way here too (by the caller's field list).
    """
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            # serde reads bytes directly: a bad byte where JSON expects a value is a syntax
            # error; inside a string it is an invalid code point.
            text = bytes(body).decode("utf-8", errors="replace")
            message = serde_syntax_error(text)
            if message is None:
                line = text.count("\n", 0, exc.start) + 1
                column = exc.start - (text.rfind("\n", 0, exc.start) + 1) + 1
                message = f"invalid unicode code point at line {line} column {column}"
            raise ValueError(f"invalid JSON request: {message}") from None
    if isinstance(body, str):
        value = b.loads_body(body)
    elif isinstance(body, (dict, list, tuple)):
        value = body
    else:
        raise TypeError("request body must be bytes, str or dict")
    if isinstance(value, (list, tuple)):
        return _sequence_body(list(value), struct_name, fields)
    if not isinstance(value, dict):
        raise b.invalid_type(value, f"struct {struct_name}")
    return value


def _sequence_body(items: list[Any], struct_name: str, fields: Sequence[Field]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, field in enumerate(fields):
        if i >= len(items):
            raise body_error(
                f"invalid length {len(items)}, expected struct {struct_name} with "
                f"{len(fields)} elements"
            )
        value = items[i]
        out[field.name] = value
        if value is None and field.optional:
            continue
        field.decoder(value)
    if len(items) > len(fields):
        raise body_error(f"invalid length {len(items)}, expected fewer elements in array")
    return out
