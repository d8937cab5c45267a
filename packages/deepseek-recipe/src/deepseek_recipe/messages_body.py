"""Type-checking decode of an Anthropic Messages request body.

As for the other protocols, shape problems are reported as `ValueError`
("invalid request body: ...") in serde's words, and decoded values are plain
dicts keyed by field name with `type` (or `role`) holding the variant.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe import serde_decode as s
from deepseek_recipe.errors import body_error
from deepseek_recipe.responses_body import EFFORTS

ROLES = ["user", "assistant", "system"]


def _string_or_list(item: s.Decoder) -> s.Decoder:
    def decode(value: Any) -> str | list[Any]:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return [item(v) for v in value]
        raise body_error("expected a string or a list")

    return decode


_TEXT = [s.required("text", s.string)]
_IMAGE_SOURCE = s.tagged(
    "MessagesImageSource",
    {
        "base64": [s.required("media_type", s.string), s.required("data", s.string)],
        "url": [s.required("url", s.string)],
        "file": [s.required("file_id", s.string)],
    },
)
_IMAGE = [s.required("source", _IMAGE_SOURCE)]
_DOCUMENT = [
    s.required("source", s.struct("MessagesDocumentSource", [s.Field("media_type", s.string)]))
]
_TOOL_RESULT_BLOCK = s.tagged(
    "MessagesToolResultBlock",
    {
        "text": _TEXT,
        "image": _IMAGE,
        "document": _DOCUMENT,
        "tool_reference": [s.required("tool_name", s.string)],
    },
)
_TOOL_REFERENCE = s.tagged(
    "MessagesToolReference", {"tool_reference": [s.required("name", s.string)]}
)
_USE = [s.required("id", s.string), s.required("name", s.string), s.required("input", s.any_json)]

content_block = s.tagged(
    "MessagesContentBlock",
    {
        "text": _TEXT,
        "image": _IMAGE,
        "document": _DOCUMENT,
        "thinking": [s.required("thinking", s.string), s.Field("signature", s.string)],
        "server_tool_use": _USE,
        "tool_use": _USE,
        "tool_result": [
            s.required("tool_use_id", s.string),
            s.Field("content", _string_or_list(_TOOL_RESULT_BLOCK)),
            s.Field("is_error", s.boolean),
        ],
        "web_search_tool_result": [
            s.required("tool_use_id", s.string),
            s.required("content", s.any_json),
        ],
        "tool_addition": [s.required("tool", _TOOL_REFERENCE)],
    },
)
_CONTENT = _string_or_list(content_block)
_ROLE = s.string_or_map_variant(ROLES)


def message(value: Any) -> dict[str, Any]:
    """A message: `role` is the tag, read before `content` whatever the key order."""
    if not isinstance(value, dict):
        raise b.invalid_type(value, "adjacently tagged enum MessagesMessage")
    if "role" not in value:
        raise b.missing("role")
    role = _ROLE(value["role"])
    if "content" not in value:
        raise b.missing("content")
    return {"role": role, "content": _CONTENT(value["content"])}


_SYSTEM = _string_or_list(s.tagged("MessagesSystemBlock", {"text": _TEXT}))
_CUSTOM_TOOL = [
    s.required("name", s.string),
    s.Field("description", s.string),
    s.Field("input_schema", s.any_json),
    s.Field("defer_loading", s.boolean),
]


def tool(value: Any) -> dict[str, Any]:
    """A tool: any `type` marks a server tool; otherwise a client tool with a schema.

    Client-tool field errors name the field, as the official decoder reports them.
    """
    obj = value if isinstance(value, dict) else {}
    if isinstance(obj.get("type"), str):
        name = obj.get("name")
        return {
            "server": True,
            "type": obj["type"],
            "name": name if isinstance(name, str) else None,
        }
    for key, val in obj.items():
        field = next((f for f in _CUSTOM_TOOL if f.name == key), None)
        if field is None or (val is None and field.optional):
            continue
        try:
            field.decoder(val)
        except ValueError as exc:
            detail = str(exc).removeprefix("invalid request body: ")
            raise body_error(f"field `{key}`: {detail}") from None
    out = s.decode_fields(obj, _CUSTOM_TOOL)
    out["server"] = False
    return out


_PARALLEL = [s.Field("disable_parallel_tool_use", s.boolean)]
_TOOL_CHOICE = s.tagged(
    "MessagesToolChoice",
    {
        "auto": _PARALLEL,
        "any": _PARALLEL,
        "tool": [s.required("name", s.string), *_PARALLEL],
        "none": [],
    },
)
_THINKING = s.struct(
    "MessagesThinking",
    [
        s.required("type", s.variant(["adaptive", "enabled", "disabled"])),
        s.Field("budget_tokens", s.uint(64)),
    ],
)
_OUTPUT_CONFIG = s.struct(
    "MessagesOutputConfig", [s.Field("effort", s.string_or_map_variant(EFFORTS))]
)
_METADATA = s.struct("MessagesMetadata", [s.Field("user_id", s.string)])

REQUEST_FIELDS = [
    s.required("model", s.string),
    s.required("messages", s.seq(message)),
    s.Field("system", _SYSTEM),
    s.Field("max_tokens", s.uint(32)),
    s.Field("temperature", s.f32),
    s.Field("top_p", s.f32),
    s.Field("stop_sequences", s.seq(s.string)),
    s.Field("stream", s.boolean),
    s.Field("tools", s.seq(tool)),
    s.Field("tool_choice", _TOOL_CHOICE),
    s.Field("thinking", _THINKING),
    s.Field("output_config", _OUTPUT_CONFIG),
    s.Field("metadata", _METADATA),
]


def decode_messages_request(obj: Any) -> dict[str, Any]:
    """Decode a parsed body; the caller has turned bytes or text into JSON values."""
    if not isinstance(obj, dict):
        raise b.invalid_type(obj, "struct MessagesRequest")
    return s.decode_fields(obj, REQUEST_FIELDS)
