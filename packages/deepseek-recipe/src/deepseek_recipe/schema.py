"""Tool declaration checks and strict-mode schema normalization.

Strict tools and strict JSON schemas follow OpenAI's structured-output rules:
every object closes (`additionalProperties: false`) and lists all its
properties as required.  Conversion applies that rewrite so the constraint the
engine enforces is the one the client asked for.
"""

from __future__ import annotations

import re
from typing import Any

from deepseek_recipe.errors import ConversionError
from deepseek_recipe.pyjson import dumps_compact

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


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


def check_parameters(name: str, parameters: Any, *, require_object_type: bool = False) -> None:
    """Reject parameter schemas that are not JSON Schemas of an object.

    Chat Completions only rejects a `type` other than `object`; Responses and
    Messages also want the `type` said (so a bare `true` or `{}` fails), with the
    same message.
    """
    if parameters is None:
        return
    if not isinstance(parameters, (dict, bool)):
        raise ConversionError(
            f"Invalid schema for function '{name}': {dumps_compact(parameters)} is not of "
            'types "boolean", "object"'
        )
    kind = parameters.get("type") if isinstance(parameters, dict) else None
    if require_object_type:
        wrong = kind != "object"
    else:
        wrong = isinstance(parameters, dict) and "type" in parameters and kind != "object"
    if wrong:
        raise ConversionError(
            f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: "
            f"\"object\"', got 'type: {dumps_compact(kind)}'."
        )


def check_schema_kinds(schema: Any, *, for_tool: bool) -> None:
    """The one check the official converter runs before the others: every node says what it is."""
    prefix = "Invalid tool parameters schema : " if for_tool else "Invalid json schema: "
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if "type" not in node and "anyOf" not in node and "$ref" not in node:
            raise ConversionError(f"{prefix}one of `type`, `anyOf`, `$ref` field is required")
        props = node.get("properties")
        if isinstance(props, dict):
            stack.extend(reversed(list(props.values())))
        if isinstance(node.get("items"), dict):
            stack.append(node["items"])
        if isinstance(node.get("anyOf"), list):
            stack.extend(reversed(node["anyOf"]))


def normalize_strict(schema: Any, *, for_tool: bool) -> Any:
    """Rewrite a strict schema into the supported subset, closed and fully required.

    The subset is typed: each node keeps only the keywords its type supports, in a
    fixed order, and anything outside the subset is rejected with the official
    message.  `for_tool` selects the tool-parameters wording and lets a tool's
    top-level object omit `properties`.
    """
    prefix = "Invalid tool parameters schema : " if for_tool else "Invalid json schema: "
    top = "function parameters schema" if for_tool else "json schema"
    if not isinstance(schema, dict):
        raise ConversionError(f"{prefix}invalid type: {_json_kind(schema)}, expected a map")
    if "type" not in schema and "anyOf" not in schema and "$ref" not in schema:
        raise ConversionError(f"{prefix}one of `type`, `anyOf`, `$ref` field is required")
    if schema.get("type") != "object":
        raise ConversionError(f"The top level of the {top} must be an object.")
    return _node(schema, prefix, allow_empty=for_tool)


_PRIMITIVES = ("string", "number", "integer", "boolean", "null")
_FORMATS = ("email", "hostname", "ipv4", "ipv6", "uuid")
_KEEP = {
    "string": ("description", "pattern", "format", "enum"),
    "number": (
        "description",
        "default",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    ),
    "boolean": ("description",),
    "null": ("description",),
}
_KEEP["integer"] = _KEEP["number"]


def _node(node: Any, prefix: str, allow_empty: bool = False) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise ConversionError(f"{prefix}invalid type: {_json_kind(node)}, expected a map")
    if "anyOf" in node:
        out: dict[str, Any] = {"anyOf": [_node(n, prefix) for n in node["anyOf"]]}
        if "description" in node:
            out["description"] = node["description"]
        return out
    if "$ref" in node:
        return {"$ref": node["$ref"]}
    if "type" not in node:
        raise ConversionError(f"{prefix}one of `type`, `anyOf`, `$ref` field is required")
    kind = node["type"]
    if isinstance(kind, list):
        for item in kind:
            if item not in _PRIMITIVES:
                expected = ", ".join(f"`{p}`" for p in _PRIMITIVES)
                raise ConversionError(
                    f"{prefix}field `type`: unknown variant `{item}`, expected one of {expected}"
                )
        out = {"type": list(kind)}
        if "description" in node:
            out["description"] = node["description"]
        return out
    if kind == "object":
        return _object(node, prefix, allow_empty)
    if kind == "array":
        if "items" not in node:
            raise ConversionError(f"{prefix}missing field `items`")
        out = {"type": "array", "items": _node(node["items"], prefix)}
        if "description" in node:
            out["description"] = node["description"]
        return out
    if kind not in _KEEP:
        variants = ", ".join(f"`{v}`" for v in ("object", "array", *_PRIMITIVES))
        raise ConversionError(f"{prefix}unknown variant `{kind}`, expected one of {variants}")
    if kind == "string" and "format" in node and node["format"] not in _FORMATS:
        expected = ", ".join(f"`{f}`" for f in _FORMATS)
        raise ConversionError(
            f"{prefix}unknown variant `{node['format']}`, expected one of {expected}"
        )
    out = {"type": kind}
    for key in _KEEP[kind]:
        if key in node:
            out[key] = node[key]
    return out


def _object(node: dict[str, Any], prefix: str, allow_empty: bool) -> dict[str, Any]:
    props = node.get("properties") or {}
    keys = list(props)
    if node.get("additionalProperties") is True:
        raise ConversionError("additionalProperties should not be true")
    if not props and not allow_empty:
        raise ConversionError("An object with no properties is not allowed.")
    if "required" in node and sorted(node["required"]) != sorted(keys):
        raise ConversionError("Required properties must match all properties in the object")
    out: dict[str, Any] = {
        "type": "object",
        "properties": {k: _node(v, prefix) for k, v in props.items()},
        "additionalProperties": False,
        "required": keys,
    }
    if "description" in node:
        out["description"] = node["description"]
    return out
