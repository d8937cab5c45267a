"""Request handling shared by the Responses and Messages converters.

Both protocols accept the same three body forms, resolve the model name the
same way, and are stricter than Chat Completions about tool schemas (a schema
must say `type: object`), so these live in one place.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe.errors import ConversionError, body_error
from deepseek_recipe.json_errors import serde_syntax_error
from deepseek_recipe.options import ConversionOptions, ModelVersion
from deepseek_recipe.pyjson import dumps_compact
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
        try:
            value = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as exc:
            message = serde_syntax_error(body) or str(exc)
            raise ValueError(f"invalid JSON request: {message}") from None
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


def model_version(model: str, options: ConversionOptions) -> ModelVersion:
    models = options.model_versions_by_name
    version = models.get(model)
    if version is None:
        names = ", ".join(models)
        raise ConversionError(f"The supported API model names are {names}, but you passed {model}.")
    return version


def check_object_schema(name: str, parameters: Any) -> None:
    """A Responses function schema must be an object schema that says `type: object`."""
    if parameters is None:
        return
    if not isinstance(parameters, (dict, bool)):
        raise ConversionError(
            f"Invalid schema for function '{name}': {dumps_compact(parameters)} is not of "
            'types "boolean", "object"'
        )
    kind = parameters.get("type") if isinstance(parameters, dict) else None
    if kind != "object":
        raise ConversionError(
            f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: "
            f"\"object\"', got 'type: {dumps_compact(kind)}'."
        )
