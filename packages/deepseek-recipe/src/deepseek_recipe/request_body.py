"""Type-checking decode of a Chat Completions body, field by field.

Everything a body can get wrong at the type level is reported here, before
any semantic validation, because that is the order the official package uses
(its deserializer runs first).
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe import serde_decode as s

_EFFORT_NAMES = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


def decode_request(obj: dict[str, Any]) -> dict[str, Any]:
    """Type-check every field up front, like deserialization does.

    As serde does, fields are checked in the order the body lists them, and a
    missing required field is reported only after all present ones passed.
    """
    return s.decode_fields(obj, _FIELDS, _BY_NAME)


def _thinking(value: Any) -> str:
    t = b.as_map(value, "struct ChatCompletionThinking")
    if "type" not in t:
        raise b.missing("type")
    return b.variant(t["type"], ["adaptive", "enabled", "disabled"])


def _effort(value: Any) -> str:
    if isinstance(value, dict):
        key = next(iter(value), "")
        raise b.unknown_variant(key, _EFFORT_NAMES)
    if not isinstance(value, str):
        raise b.invalid_type(value, "string or map")
    return b.variant(value, _EFFORT_NAMES)


def _flag(value: Any) -> bool:
    """A boolean that `null` leaves at its default, false."""
    return value is not None and s.boolean(value)


def _stream_options(value: Any) -> dict[str, Any]:
    return b.as_map(value, "struct ChatCompletionStreamOptions")


def _stop(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in value:
            if not isinstance(item, str):
                raise b.invalid_type(item, "a string")
        return list(value)
    raise b.body_error("expected a string or a list")


def _decode_tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise b.invalid_type(value, "a sequence")
    tools = []
    for item in value:
        obj = b.as_map(item, "struct ChatCompletionTool")
        if "type" not in obj:
            raise b.missing("type")
        b.variant(obj["type"], ["function"])
        if "function" not in obj:
            raise b.missing("function")
        fn = b.as_map(obj["function"], "struct ChatCompletionFunctionDefinition")
        tools.append(
            {
                "name": b.get_str(fn, "name", required=True),
                "description": b.get_str(fn, "description"),
                "parameters": fn.get("parameters"),
                "strict": b.get_bool(fn, "strict"),
            }
        )
    return tools


def _decode_tool_choice(value: Any) -> str | dict[str, str]:
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise b.body_error("expected one of `none`, `auto`, `required` or a tool")
        return value
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is not None and kind != "function":
            if isinstance(kind, str):
                raise b.body_error(f"field `type`: unknown variant `{kind}`, expected `function`")
            raise b.body_error(
                f"field `type`: invalid type: {b.describe(kind)}, expected variant identifier"
            )
        fn = value.get("function")
        if not isinstance(fn, dict):
            expected = "struct ChatCompletionToolChoiceFunction"
            raise b.body_error(
                f"field `function`: invalid type: {b.describe(fn)}, expected {expected}"
            )
        name = fn.get("name")
        if not isinstance(name, str):
            if name is None:
                raise b.body_error("field `function`: missing field `name`")
            raise b.body_error(
                f"field `function`: invalid type: {b.describe(name)}, expected a string"
            )
        return {"name": name}
    raise b.body_error("expected one of `none`, `auto`, `required` or a tool")


def _decode_response_format(value: Any) -> dict[str, Any]:
    obj = b.as_map(value, "internally tagged enum ChatCompletionResponseFormat")
    if "type" not in obj:
        raise b.missing("type")
    kind = b.variant(obj["type"], ["json_object", "json_schema", "regex", "text"])
    if kind == "json_schema":
        if "json_schema" not in obj:
            raise b.missing("json_schema")
        js = b.as_map(obj["json_schema"], "struct ChatCompletionResponseFormatJsonSchema")
        if "schema" not in js:
            raise b.missing("schema")
        return {"type": kind, "schema": js["schema"], "strict": b.get_bool(js, "strict")}
    if kind == "regex":
        if "regex" not in obj:
            raise b.missing("regex")
        return {"type": kind, "regex": b.get_str(obj, "regex", required=True)}
    return {"type": kind}


#: The body's fields in declaration order (which orders the missing-field reports); `null`
#: means absent for all but the required two.  Unknown fields are ignored, as by serde.
_FIELDS = [
    s.required("model", s.string),
    s.required("messages", s.seq(b.decode_message)),
    s.Field("thinking", _thinking),
    s.Field("reasoning_effort", _effort),
    s.Field("tools", _decode_tools),
    s.Field("tool_choice", _decode_tool_choice),
    s.Field("response_format", _decode_response_format),
    s.Field("max_tokens", s.uint(32)),
    s.Field("n", s.uint(8)),
    s.Field("temperature", s.f32),
    s.Field("top_p", s.f32),
    s.Field("frequency_penalty", s.f32),
    s.Field("presence_penalty", s.f32),
    s.Field("seed", s.uint(64)),
    s.defaulted("logprobs", _flag, False),
    s.Field("top_logprobs", s.uint(8)),
    s.defaulted("stream", _flag, False),
    s.Field("stream_options", _stream_options),
    s.Field("stop", _stop),
]
_BY_NAME = {f.name: f for f in _FIELDS}
