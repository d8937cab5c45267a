"""Strict JSON schemas: decoded into the supported subset, then closed and fully required.

Strict tools and strict JSON schemas follow OpenAI's structured-output rules:
every object closes (`additionalProperties: false`) and lists all its
properties as required, so the constraint the engine enforces is the one the
client asked for.

The official converter first decodes the whole schema into a typed model of
that subset and only then applies the rules, so a problem anywhere in the
decoding (an unsupported `format`, a misspelt `type`, a field of the wrong
JSON type) is reported before any rule violation, in the order the schema is
written and in serde's words.  A node with `type` is a typed node (a list of
types is a primitive union); otherwise `anyOf`, then `$ref`, decide its kind.
Errors below an `anyOf`, a `$ref`, a type union or its description are
prefixed with that field's name, as the official decoder reports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from deepseek_recipe.body import describe
from deepseek_recipe.errors import ConversionError

#: The typed node kinds, in the order the official decoder lists them.
_KINDS = ("object", "string", "number", "integer", "boolean", "array", "null")
#: The kinds a union of types (`"type": [...]`) may name.
_PRIMITIVES = ("string", "number", "integer", "boolean", "null")
#: The string formats strict mode supports.
_FORMATS = ("email", "hostname", "ipv4", "ipv6", "uuid")


class _Invalid(Exception):
    """A decoding problem, worded as serde words it (without the schema prefix)."""


def _invalid_type(value: Any, expected: str) -> _Invalid:
    return _Invalid(f"invalid type: {describe(value)}, expected {expected}")


def _unknown_variant(value: str, expected: tuple[str, ...]) -> _Invalid:
    listed = ", ".join(f"`{e}`" for e in expected)
    return _Invalid(f"unknown variant `{value}`, expected one of {listed}")


@contextmanager
def _under(name: str) -> Iterator[None]:
    """Prefix a problem found while decoding field `name` of a custom-decoded node."""
    try:
        yield
    except _Invalid as exc:
        raise _Invalid(f"field `{name}`: {exc}") from None


@dataclass
class _Typed:
    """A node with a single `type`; `fields` holds its decoded scalar keywords."""

    kind: str
    fields: dict[str, Any]
    properties: list[tuple[str, _Node]] | None
    items: _Node | None
    required: list[str] | None
    additional: bool | None


@dataclass
class _AnyOf:
    branches: list[_Typed]
    description: str | None


@dataclass
class _Ref:
    ref: str


@dataclass
class _Union:
    """`"type": [...]`: a union of primitive types."""

    types: list[str]
    description: str | None


_Node = _Typed | _AnyOf | _Ref | _Union


# Decoding ------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _invalid_type(value, "a string")
    return value


def _texts(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise _invalid_type(value, "a sequence")
    return [_text(v) for v in value]


def _number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid_type(value, "a JSON number")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _invalid_type(value, "a boolean")
    return value


def _unit_variant(value: Any, names: tuple[str, ...]) -> str:
    """A unit-variant enum read from buffered JSON: a name, or a one-key map to null or `{}`."""
    if isinstance(value, str):
        if value not in names:
            raise _unknown_variant(value, names)
        return value
    if not isinstance(value, dict):
        raise _invalid_type(value, "string or map")
    if len(value) != 1:
        raise _Invalid("invalid value: map, expected map with a single key")
    ((name, inner),) = value.items()
    if name not in names:
        raise _unknown_variant(name, names)
    if inner is not None and inner != {}:
        raise _invalid_type(inner, "unit")
    return name


def _format(value: Any) -> str:
    return _unit_variant(value, _FORMATS)


def _properties(value: Any) -> list[tuple[str, _Node]]:
    if not isinstance(value, dict):
        raise _invalid_type(value, "a map")
    return [(name, _schema(node)) for name, node in value.items()]


def _typed(value: Any) -> _Typed:
    """A node tagged by `type`: the tag first, then its keywords in the order written."""
    if not isinstance(value, dict):
        raise _invalid_type(value, "internally tagged enum JsonSchemaType")
    if "type" not in value:
        raise _Invalid("missing field `type`")
    kind = value["type"]
    if not isinstance(kind, str):
        raise _invalid_type(kind, "variant identifier")
    if kind not in _KINDS:
        raise _unknown_variant(kind, _KINDS)
    decoders = _FIELDS[kind]
    decoded: dict[str, Any] = {}
    for key, raw in value.items():
        decoder = decoders.get(key)
        if decoder is None or (raw is None and key not in _REQUIRED_FIELDS.get(kind, ())):
            continue
        decoded[key] = decoder(raw)
    for key in _REQUIRED_FIELDS.get(kind, ()):
        if key not in decoded:
            raise _Invalid(f"missing field `{key}`")
    return _Typed(
        kind,
        properties=decoded.pop("properties", None),
        items=decoded.pop("items", None),
        required=decoded.pop("required", None),
        additional=decoded.pop("additionalProperties", None),
        # What is left are the scalar keywords, kept in the kind's output order.
        fields={key: decoded[key] for key in decoders if key in decoded},
    )


def _description(obj: dict[str, Any]) -> str | None:
    raw = obj.get("description")
    if raw is None:
        return None
    with _under("description"):
        return _text(raw)


def _union(obj: dict[str, Any]) -> _Union:
    with _under("type"):
        types = [_unit_variant(t, _PRIMITIVES) for t in obj["type"]]
    return _Union(types, _description(obj))


def _any_of(obj: dict[str, Any]) -> _AnyOf:
    raw = obj["anyOf"]
    with _under("anyOf"):
        if not isinstance(raw, list):
            raise _invalid_type(raw, "a sequence")
        branches = [_typed(branch) for branch in raw]
    return _AnyOf(branches, _description(obj))


def _ref(obj: dict[str, Any]) -> _Ref:
    with _under("$ref"):
        return _Ref(_text(obj["$ref"]))


def _schema(value: Any) -> _Node:
    """Any schema node; `type` decides first, then `anyOf`, then `$ref`."""
    obj = value if isinstance(value, dict) else {}
    if "type" in obj:
        return _union(obj) if isinstance(obj["type"], list) else _typed(obj)
    if "anyOf" in obj:
        return _any_of(obj)
    if "$ref" in obj:
        return _ref(obj)
    raise _Invalid("one of `type`, `anyOf`, `$ref` field is required")


_NUMBER_FIELDS: dict[str, Callable[[Any], Any]] = {
    "description": _text,
    "default": _number,
    "minimum": _number,
    "maximum": _number,
    "exclusiveMinimum": _number,
    "exclusiveMaximum": _number,
    "multipleOf": _number,
}
#: The keywords each kind decodes (all optional but an array's `items`), in output order.
_FIELDS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "object": {
        "properties": _properties,
        "required": _texts,
        "additionalProperties": _flag,
        "description": _text,
    },
    "string": {"description": _text, "pattern": _text, "format": _format, "enum": _texts},
    "number": _NUMBER_FIELDS,
    "integer": _NUMBER_FIELDS,
    "boolean": {"description": _text},
    "null": {"description": _text},
    "array": {"items": _schema, "description": _text},
}
_REQUIRED_FIELDS = {"array": ("items",)}


# The structured-output rules -------------------------------------------------------------------


def _check_required(required: list[str], names: list[str]) -> None:
    """Each required name once and declared, and every declared property required."""
    seen: set[str] = set()
    for name in required:
        if name in seen:
            raise ConversionError(f"Duplicate required property '{name}'")
        seen.add(name)
        if name not in names:
            raise ConversionError(f"Required property '{name}' not found in object")
    if len(seen) != len(names):
        raise ConversionError("Required properties must match all properties in the object")


def _object(node: _Typed, allow_empty: bool) -> dict[str, Any]:
    """A closed object requiring every property; its properties are checked before it."""
    properties = {name: _output(child) for name, child in node.properties or []}
    if not properties and not allow_empty:
        raise ConversionError("An object with no properties is not allowed.")
    if node.required is not None:
        _check_required(node.required, list(properties))
    if node.additional is True:
        raise ConversionError("additionalProperties should not be true")
    out: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "required": list(properties),
    }
    out.update(node.fields)
    return out


def _with_description(out: dict[str, Any], description: str | None) -> dict[str, Any]:
    if description is not None:
        out["description"] = description
    return out


def _output(node: _Node) -> dict[str, Any]:
    """The normalized form of a decoded node below the top level."""
    if isinstance(node, _Ref):
        return {"$ref": node.ref}
    if isinstance(node, _Union):
        return _with_description({"type": node.types}, node.description)
    if isinstance(node, _AnyOf):
        branches = [_output(branch) for branch in node.branches]
        return _with_description({"anyOf": branches}, node.description)
    if node.kind == "object":
        return _object(node, allow_empty=False)
    if node.kind == "array":
        assert node.items is not None
        return {"type": "array", "items": _output(node.items), **node.fields}
    return {"type": node.kind, **node.fields}


def normalize_strict(schema: Any, *, for_tool: bool) -> dict[str, Any]:
    """Rewrite a strict schema into the supported subset, closed and fully required.

    `for_tool` selects the tool-parameters wording and lets a tool's top-level
    object omit `properties`.
    """
    prefix = "Invalid tool parameters schema : " if for_tool else "Invalid json schema: "
    try:
        node = _schema(schema)
    except _Invalid as exc:
        raise ConversionError(f"{prefix}{exc}") from None
    if not isinstance(node, _Typed) or node.kind != "object":
        top = "function parameters schema" if for_tool else "json schema"
        raise ConversionError(f"The top level of the {top} must be an object.")
    return _object(node, allow_empty=for_tool)
