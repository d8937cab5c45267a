"""Decoding of a Chat Completions body into plain, type-checked values.

The official package deserializes bodies with serde and reports the first
problem as `ValueError("invalid request body: ...")` in serde's words.  Clients
and tests match on those words, so the helpers here reproduce them for the
common shapes (missing field, wrong type, unknown variant).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deepseek_recipe.errors import body_error
from deepseek_recipe.json_errors import serde_syntax_error

MISSING: Any = object()


def describe(value: Any) -> str:
    """serde's description of an unexpected JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        text = repr(value)
        if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
            text += ".0"
        return f"floating point `{text}`"
    if isinstance(value, str):
        return f"string {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "unknown"


def invalid_type(value: Any, expected: str) -> ValueError:
    return body_error(f"invalid type: {describe(value)}, expected {expected}")


def missing(name: str) -> ValueError:
    return body_error(f"missing field `{name}`")


def unknown_variant(value: str, expected: list[str]) -> ValueError:
    if len(expected) == 1:
        names = f"`{expected[0]}`"
    else:
        names = "one of " + ", ".join(f"`{e}`" for e in expected)
    return body_error(f"unknown variant `{value}`, expected {names}")


def as_map(value: Any, expected: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_type(value, expected)
    return value


def get_str(obj: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = obj.get(name, MISSING)
    if value is MISSING or (value is None and not required):
        if required:
            raise missing(name)
        return None
    if not isinstance(value, str):
        raise invalid_type(value, "a string")
    return value


def get_bool(obj: dict[str, Any], name: str) -> bool | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise invalid_type(value, "a boolean")
    return value


def get_uint(obj: dict[str, Any], name: str, bits: int) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    kind = f"u{bits}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_type(value, kind)
    if isinstance(value, float):
        raise invalid_type(value, kind)
    if value < 0 or value >= 2**bits:
        raise body_error(f"invalid value: integer `{value}`, expected {kind}")
    return value


def get_float(obj: dict[str, Any], name: str) -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_type(value, "f32")
    return float(value)


def variant(value: Any, expected: list[str]) -> str:
    if not isinstance(value, str):
        raise invalid_type(value, "variant identifier")
    if value not in expected:
        raise unknown_variant(value, expected)
    return value


def loads_body(text: str) -> Any:
    """Parse a JSON body; a syntax error is reported in serde's words where we know them."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        message = serde_syntax_error(text) or str(exc)
        raise ValueError(f"invalid JSON request: {message}") from None


def parse_body(body: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """Accept the three body forms of the official constructor."""
    if isinstance(body, dict):
        return body
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"invalid JSON request: {exc}") from None
    if isinstance(body, str):
        value = loads_body(body)
        if isinstance(value, list):
            raise _sequence_body_error(value)
        if not isinstance(value, dict):
            raise invalid_type(value, "struct ChatCompletionRequest")
        return value
    if isinstance(body, (list, tuple)):
        raise _sequence_body_error(list(body))
    raise TypeError("request body must be bytes, str or dict")


def _sequence_body_error(items: list[Any]) -> ValueError:
    """serde reads a sequence as the request's fields in order; `messages` comes first."""
    if items and not isinstance(items[0], list):
        return invalid_type(items[0], "a sequence")
    expected = "struct ChatCompletionRequest with 20 elements"
    return body_error(f"invalid length {len(items)}, expected {expected}")


@dataclass
class ContentPart:
    """One decoded content part: text, an image URL, or an unsupported file."""

    kind: str
    text: str = ""
    url: str = ""
    detail: str = "high"


@dataclass
class DecodedToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class DecodedMessage:
    role: str
    content: str | list[ContentPart] | None
    reasoning_content: str | None = None
    tool_calls: list[DecodedToolCall] | None = None
    tool_call_id: str | None = None
    prefix: bool = False
    raw: dict[str, Any] = field(default_factory=dict)


ROLES = ["system", "user", "assistant", "tool", "latest_reminder"]
PART_TYPES = ["text", "image_url", "file"]
DETAILS = ["low", "high", "original", "auto"]


def decode_content(value: Any, *, allow_parts: bool = True) -> str | list[ContentPart]:
    if isinstance(value, str):
        return value
    if not allow_parts:
        raise invalid_type(value, "a string")
    if not isinstance(value, list):
        raise body_error("content should be a string or a list")
    parts: list[ContentPart] = []
    for item in value:
        obj = as_map(item, "internally tagged enum ChatCompletionRequestContentBlock")
        if "type" not in obj:
            raise missing("type")
        kind = variant(obj["type"], PART_TYPES)
        if kind == "text":
            parts.append(ContentPart("text", text=get_str(obj, "text", required=True) or ""))
        elif kind == "image_url":
            if "image_url" not in obj:
                raise missing("image_url")
            image = obj["image_url"]
            if not isinstance(image, dict):
                raise invalid_type(image, "struct ChatCompletionImageUrl")
            url = get_str(image, "url", required=True) or ""
            detail = image.get("detail")
            detail = "high" if detail is None else variant(detail, DETAILS)
            parts.append(ContentPart("image_url", url=url, detail=detail))
        else:
            parts.append(
                ContentPart("file")
            )  # never read: V4 shows a placeholder, V4.1 rejects files
    return parts


def decode_tool_calls(value: Any) -> list[DecodedToolCall] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid_type(value, "a sequence")
    calls: list[DecodedToolCall] = []
    for item in value:
        obj = as_map(item, "struct ChatCompletionMessageToolCall")
        call_id = get_str(obj, "id", required=True) or ""
        if "type" in obj and obj["type"] is not None:
            variant(obj["type"], ["function"])
        if "function" not in obj:
            raise missing("function")
        fn = as_map(obj["function"], "struct FunctionCall")
        name = get_str(fn, "name", required=True) or ""
        arguments = get_str(fn, "arguments", required=True) or ""
        calls.append(DecodedToolCall(call_id, name, arguments))
    return calls


def decode_message(value: Any) -> DecodedMessage:
    obj = as_map(value, "internally tagged enum ChatCompletionRequestMessage")
    if "role" not in obj:
        raise missing("role")
    role = variant(obj["role"], ROLES)
    if role in ("system", "user", "tool"):
        if "content" not in obj:
            raise missing("content")
        content: str | list[ContentPart] | None = decode_content(obj["content"])
        tool_call_id = None
        if role == "tool":
            tool_call_id = get_str(obj, "tool_call_id", required=True)
        return DecodedMessage(role, content, tool_call_id=tool_call_id, raw=obj)
    if role == "latest_reminder":
        if "content" not in obj:
            raise missing("content")
        return DecodedMessage(role, decode_content(obj["content"], allow_parts=False), raw=obj)
    content = obj.get("content")
    if content is not None:
        content = decode_content(content)
    return DecodedMessage(
        role,
        content,
        reasoning_content=get_str(obj, "reasoning_content"),
        tool_calls=decode_tool_calls(obj.get("tool_calls")),
        prefix=bool(get_bool(obj, "prefix")),
        raw=obj,
    )
