"""Tool declaration checks: names and parameter schemas.

Strict parameter schemas are decoded and normalized in `strict_schema`; the
others only have to be JSON Schemas of an object.
"""

from __future__ import annotations

import re
from typing import Any

from deepseek_recipe.errors import ConversionError
from deepseek_recipe.pyjson import dumps_compact
from deepseek_recipe.strict_schema import normalize_strict

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


def check_tool_name(index: int, name: str) -> None:
    where = f"tools[{index}].function.name"
    if name == "":
        raise ConversionError(
            f"Invalid '{where}': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead."
        )
    if not _NAME_RE.match(name):
        raise ConversionError(
            f"Invalid '{where}': string does not match pattern. "
            "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
        )


def check_parameters(name: str, parameters: Any) -> None:
    """Reject parameter schemas that are not JSON Schemas of an object.

    The `type` must be said: a bare `true` or `{}` fails too, as in every protocol
    of the official converter.
    """
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


def tool_parameters(name: str, parameters: Any, strict: bool | None) -> Any:
    """The parameter schema a function tool is offered with, once it passed its checks.

    A strict schema is normalized (no parameters count as an empty object); any
    other is kept as declared, no parameters becoming `{}`.  Chat Completions and
    Responses treat function tools alike.
    """
    if strict:
        declared = {"type": "object"} if parameters is None else parameters
        return normalize_strict(declared, for_tool=True)
    check_parameters(name, parameters)
    return {} if parameters is None else parameters
