"""Type-checking decode of an OpenAI Responses request body.

Everything here is shape checking, reported as `ValueError("invalid request
body: ...")` in serde's words; meaning (history rules, tool names, ranges) is
checked later by conversion, which raises `ConversionError`.  Decoded values
are plain dicts keyed by field name, with `type` holding the variant.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe import serde_decode as s
from deepseek_recipe.errors import body_error

EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]
ROLES = ["user", "assistant", "system", "developer"]
DETAILS = ["low", "high", "original", "auto"]


def _either(kind: str, what: str, item: s.Decoder) -> s.Decoder:
    """A field that is a string or a list of `item`s; anything else gets one fixed message."""

    def decode(value: Any) -> str | list[Any]:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return [item(v) for v in value]
        raise body_error(f"{kind} should be a string or a list of {what}")

    return decode


_IMAGE = [
    s.Field("image_url", s.string),
    s.Field("file_id", s.string),
    s.Field("detail", s.variant(DETAILS)),
]
_TEXT = [s.required("text", s.string)]

content_block = s.tagged(
    "ResponsesContentBlock",
    {"input_text": _TEXT, "output_text": _TEXT, "input_image": _IMAGE, "input_file": []},
)
output_part = s.tagged(
    "ResponsesToolCallOutputItem",
    {"input_text": _TEXT, "input_image": _IMAGE, "input_file": []},
)

_MESSAGE = [
    s.required("role", s.string_or_map_variant(ROLES)),
    s.required("content", _either("content", "content blocks", content_block)),
]
_OUTPUT = _either("output", "output content parts", output_part)
_FUNCTION_TOOL = [
    s.required("name", s.string),
    s.Field("description", s.string),
    s.Field("parameters", s.any_json),
    s.Field("strict", s.boolean),
]
_NAMESPACE_TOOL = s.tagged(
    "ResponsesNamespaceTool", {"function": _FUNCTION_TOOL, "custom": [s.required("name", s.string)]}
)
_USER_LOCATION = s.struct(
    "ResponsesUserLocation",
    [
        s.Field("city", s.string),
        s.Field("country", s.string),
        s.Field("region", s.string),
        s.Field("timezone", s.string),
    ],
)
_WEB_SEARCH = [
    s.Field("search_context_size", s.variant(["low", "medium", "high"])),
    s.Field("user_location", _USER_LOCATION),
]
tool = s.tagged(
    "ResponsesTool",
    {
        "function": _FUNCTION_TOOL,
        "namespace": [
            s.required("name", s.string),
            s.Field("description", s.string),
            s.required("tools", s.seq(_NAMESPACE_TOOL)),
        ],
        "custom": [s.required("name", s.string)],
        "web_search": _WEB_SEARCH,
        "web_search_2025_08_26": _WEB_SEARCH,
        "tool_search": [
            s.Field("execution", s.variant(["client", "server"])),
            s.Field("description", s.string),
            s.Field("parameters", s.any_json),
        ],
    },
    other=True,
)

_TYPED_ITEMS: dict[str, list[s.Field]] = {
    "message": _MESSAGE,
    "function_call": [
        s.required("arguments", s.string),
        s.required("call_id", s.string),
        s.required("name", s.string),
        s.Field("namespace", s.string),
    ],
    "function_call_output": [
        s.Field("call_id", s.string),
        s.required("output", _OUTPUT),
    ],
    "reasoning": [
        s.Field("content", s.seq(s.struct("ResponsesReasoningContent", _TEXT))),
        s.Field("encrypted_content", s.string),
    ],
    "custom_tool_call": [
        s.required("call_id", s.string),
        s.required("name", s.string),
        s.required("input", s.string),
    ],
    "custom_tool_call_output": [
        s.required("call_id", s.string),
        s.defaulted("output", _OUTPUT, ""),
    ],
    "tool_search_call": [
        s.required("call_id", s.string),
        s.required("arguments", s.json_map),
        s.Field("execution", s.variant(["client", "server"])),
    ],
    "tool_search_output": [
        s.required("call_id", s.string),
        s.required("tools", s.seq(tool)),
        s.Field("execution", s.variant(["client", "server"])),
    ],
    "web_search_call": [],
}
_TYPED_TABLES = {k: (v, {f.name: f for f in v}) for k, v in _TYPED_ITEMS.items()}


def input_item(value: Any) -> Any:
    """An input item: a typed item, or a message recognised by its `role`.

    Unknown item types (web search calls, item references, ...) decode to
    `UNSUPPORTED` and are dropped by conversion.
    """
    if not isinstance(value, dict):
        raise body_error("invalid input item")
    if "type" in value:
        kind = value["type"]
        if not isinstance(kind, str):
            raise b.invalid_type(kind, "variant identifier")
        if kind not in _TYPED_TABLES:
            return s.UNSUPPORTED
        fields, by_name = _TYPED_TABLES[kind]
    elif "role" in value:
        kind = "message"
        fields, by_name = _TYPED_TABLES[kind]
    else:
        raise body_error("invalid input item")
    rest = {k: v for k, v in value.items() if k != "type"}
    out = s.decode_fields(rest, fields, by_name)
    out["type"] = kind
    return out


_NAMED_CHOICE = s.tagged(
    "ResponsesNamedToolChoice",
    {
        "function": [s.required("name", s.string)],
        "web_search": [],
        "web_search_2025_08_26": [],
        "custom": [s.required("name", s.string)],
    },
)
_CHOICE_ERROR = "expected one of `none`, `auto`, `required` or a tool choice object"


def tool_choice(value: Any) -> str | dict[str, Any]:
    if isinstance(value, str) and value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and "type" in value:
        return _NAMED_CHOICE(value)
    raise body_error(_CHOICE_ERROR)


_TEXT_FORMAT = s.tagged(
    "ResponsesTextFormat",
    {
        "text": [],
        "json_schema": [
            s.required("name", s.string),
            s.required("schema", s.any_json),
            s.Field("description", s.string),
            s.Field("strict", s.boolean),
        ],
        "json_object": [],
    },
)
_TEXT_CONFIG = s.struct(
    "ResponsesTextConfig",
    [s.Field("format", _TEXT_FORMAT), s.Field("verbosity", s.variant(["low", "medium", "high"]))],
)
_SUMMARY = s.variant(["auto", "concise", "detailed"])
_REASONING = s.struct(
    "ResponsesReasoningConfig",
    [
        s.Field("effort", s.string_or_map_variant(EFFORTS)),
        s.Field("summary", _SUMMARY),
        s.Field("generate_summary", _SUMMARY),
    ],
)

REQUEST_FIELDS = [
    s.required("model", s.string),
    s.Field("input", _either("input", "input items", input_item)),
    s.Field("instructions", s.string),
    s.Field("max_output_tokens", s.uint(32)),
    s.Field("reasoning", _REASONING),
    s.Field("stream", s.boolean),
    s.Field("temperature", s.f32),
    s.Field("text", _TEXT_CONFIG),
    s.Field("tool_choice", tool_choice),
    s.Field("tools", s.seq(tool)),
    s.Field("top_logprobs", s.uint(8)),
    s.Field("top_p", s.f32),
    s.Field("user", s.string),
]


def decode_responses_request(obj: Any) -> dict[str, Any]:
    """Decode a parsed body; the caller has turned bytes or text into JSON values."""
    if not isinstance(obj, dict):
        raise b.invalid_type(obj, "struct ResponsesRequest")
    return s.decode_fields(obj, REQUEST_FIELDS)
