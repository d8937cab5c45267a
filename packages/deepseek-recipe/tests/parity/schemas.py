"""Strict JSON schemas for the parity generators: tool parameters and response formats.

`STRICT_SCHEMAS` exercise the structured-output rules (closed objects, every
property required, the typed subset); `FORMAT_SCHEMAS` the string `format`
values, supported or not, which the official converter only reports after
decoding the whole schema.
"""

from __future__ import annotations

import random
from typing import Any

STRICT_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "array",
                "items": {"type": "object", "properties": {"x": {"type": "string"}}},
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "anyOf": [
                    {"type": "object", "properties": {"y": {"type": "integer"}}},
                    {"type": "string"},
                ],
                "description": "d",
                "title": "t",
            }
        },
    },
    {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A", "description": "d"}},
        "$defs": {"A": {"type": "string"}},
    },
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "description": "top",
        "title": "T",
    },
    {"type": "object"},
    {"properties": {"a": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"type": "object"}}},
    {"type": "object", "properties": {"a": {"type": ["object", "null"]}}},
    {"type": "object", "properties": {"a": {"type": ["string", "null"], "enum": ["x", None]}}},
    {"anyOf": [{"type": "object", "properties": {"q": {"type": "string"}}}]},
    {
        "type": "object",
        "properties": {
            "s": {
                "type": "string",
                "format": "email",
                "pattern": "^a",
                "enum": ["a"],
                "default": "a",
                "minLength": 1,
                "description": "d",
            }
        },
    },
    {"type": "object", "properties": {"s": {"type": "string", "format": "date"}}},
    {
        "type": "object",
        "properties": {
            "n": {
                "type": "number",
                "minimum": 0,
                "maximum": 5,
                "exclusiveMinimum": 1,
                "exclusiveMaximum": 3,
                "multipleOf": 2,
                "default": 1,
                "enum": [1],
                "title": "t",
                "description": "d",
            },
            "i": {"type": "integer", "maximum": 3},
        },
    },
    {
        "type": "object",
        "properties": {
            "b": {"type": "boolean", "default": True},
            "z": {"type": "null"},
            "arr": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
        },
    },
    {"type": "object", "properties": {"arr": {"type": "array"}}},
    {"type": "object", "properties": {"c": {"const": "k"}}},
    {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["b", "a"],
    },
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},
]


def _string_format(value: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "format": value, **extra}


#: Strict schemas around `format`: supported and unsupported names, values that are not names
#: (serde also reads a one-key map as a name), formats in nested and `anyOf` nodes, and formats
#: beside problems the official converter only finds after decoding the whole schema.
FORMAT_SCHEMAS: list[dict[str, Any]] = (
    [
        {"type": "object", "properties": {"s": _string_format(f)}}
        for f in ("uuid", "hostname", "ipv4", "date-time", "uri", "time", "EMAIL", "")
    ]
    + [
        {"type": "object", "properties": {"s": _string_format(f)}}
        for f in (5, 1.5, True, None, ["email"], {}, {"ipv6": None}, {"ipv6": {}}, {"date": None})
    ]
    + [
        {"type": "object", "properties": {"s": _string_format({"email": 5})}},
        {"type": "object", "properties": {"s": _string_format({"email": None, "uuid": None})}},
        {"type": "object", "properties": {"n": {"type": "integer", "format": "date"}}},
        {"type": "object", "properties": {"s": {"type": ["string", "null"], "format": 5}}},
        {
            "type": "object",
            "properties": {"a": {"anyOf": [_string_format("uri"), {"type": "null"}]}},
        },
        {
            "type": "object",
            "properties": {
                "a": {"anyOf": [{"type": "object", "properties": {"b": _string_format("date")}}]}
            },
        },
        {"type": "object", "properties": {"a": {"type": "array", "items": _string_format("ipv5")}}},
        {
            "type": "object",
            "properties": {"o": {"type": "object", "properties": {"s": _string_format("uri")}}},
        },
        {
            "type": "object",
            "properties": {"s": _string_format("date"), "t": {"type": "string"}},
            "required": ["s"],
            "additionalProperties": True,
        },
        {"type": "object", "properties": {"o": {"type": "object"}, "s": _string_format("date")}},
        {"type": "object", "properties": {"s": _string_format("date"), "x": {"description": "d"}}},
        {"type": "object", "properties": {"s": {"description": 5, **_string_format("date")}}},
        {"type": "object", "properties": {"s": _string_format("uuid", pattern=5)}},
        {"type": "object", "properties": {"t": {"type": "wat"}, "s": _string_format("email")}},
        {"type": "string", "format": "date"},
        {
            "type": "object",
            "properties": {"s": _string_format("email", enum=["a@b.c", None], description=None)},
        },
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
        {
            "type": "object",
            "required": ["z"],
            "properties": {
                "o": {
                    "type": "object",
                    "properties": {"a": _string_format("email")},
                    "required": [],
                }
            },
        },
    ]
)


def strict_schema(rng: random.Random) -> dict[str, Any]:
    """A schema for a strict tool or response format; two in five are about `format`."""
    return rng.choice(FORMAT_SCHEMAS if rng.random() < 0.4 else STRICT_SCHEMAS)
