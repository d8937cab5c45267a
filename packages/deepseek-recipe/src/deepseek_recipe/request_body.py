"""Type-checking decode of a Chat Completions body, field by field.

Everything a body can get wrong at the type level is reported here, before
any semantic validation, because that is the order the official package uses
(its deserializer runs first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepseek_recipe import body as b

_EFFORT_NAMES = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


def decode_request(obj: dict[str, Any]) -> dict[str, Any]:
    """Type-check every field up front, like deserialization does.

    As serde does, fields are checked in the order the body lists them, and a
    missing required field is reported only after all present ones passed.
    """
    out: dict[str, Any] = dict(_DEFAULTS)
    for key in obj:
        decode = _FIELDS.get(key)
        if decode is not None:
            out[key] = decode(obj)
    for key in ("model", "messages"):
        if key not in obj:
            raise b.missing(key)
    return out


def _messages(obj: dict[str, Any]) -> list[b.DecodedMessage]:
    messages = obj["messages"]
    if not isinstance(messages, list):
        raise b.invalid_type(messages, "a sequence")
    return [b.decode_message(m) for m in messages]


def _thinking(obj: dict[str, Any]) -> str | None:
    thinking = obj.get("thinking")
    if thinking is None:
        return None
    t = b.as_map(thinking, "struct ChatCompletionThinking")
    if "type" not in t:
        raise b.missing("type")
    return b.variant(t["type"], ["adaptive", "enabled", "disabled"])


def _effort(obj: dict[str, Any]) -> str | None:
    effort = obj.get("reasoning_effort")
    if effort is None:
        return None
    if isinstance(effort, dict):
        key = next(iter(effort), "")
        raise b.unknown_variant(key, _EFFORT_NAMES)
    if not isinstance(effort, str):
        raise b.invalid_type(effort, "string or map")
    return b.variant(effort, _EFFORT_NAMES)


def _stream_options(obj: dict[str, Any]) -> Any:
    stream_options = obj.get("stream_options")
    if stream_options is not None:
        b.as_map(stream_options, "struct ChatCompletionStreamOptions")
    return stream_options


def _stop(obj: dict[str, Any]) -> str | list[str] | None:
    stop = obj.get("stop")
    if stop is None or isinstance(stop, str):
        return stop
    if isinstance(stop, list):
        for item in stop:
            if not isinstance(item, str):
                raise b.invalid_type(item, "a string")
        return list(stop)
    raise b.body_error("expected a string or a list")


_DEFAULTS: dict[str, Any] = {
    "model": None,
    "messages": [],
    "thinking": None,
    "reasoning_effort": None,
    "tools": None,
    "tool_choice": None,
    "response_format": None,
    "max_tokens": None,
    "n": None,
    "temperature": None,
    "top_p": None,
    "frequency_penalty": None,
    "presence_penalty": None,
    "seed": None,
    "logprobs": False,
    "top_logprobs": None,
    "stream": False,
    "stream_options": None,
    "stop": None,
}
#: How each known field is read from the body (unknown fields are ignored, as by serde).
_FIELDS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model": lambda o: b.get_str(o, "model", required=True),
    "messages": _messages,
    "thinking": _thinking,
    "reasoning_effort": _effort,
    "tools": lambda o: _decode_tools(o.get("tools")),
    "tool_choice": lambda o: _decode_tool_choice(o.get("tool_choice")),
    "response_format": lambda o: _decode_response_format(o.get("response_format")),
    "max_tokens": lambda o: b.get_uint(o, "max_tokens", 32),
    "n": lambda o: b.get_uint(o, "n", 8),
    "temperature": lambda o: b.get_float(o, "temperature"),
    "top_p": lambda o: b.get_float(o, "top_p"),
    "frequency_penalty": lambda o: b.get_float(o, "frequency_penalty"),
    "presence_penalty": lambda o: b.get_float(o, "presence_penalty"),
    "seed": lambda o: b.get_uint(o, "seed", 64),
    "logprobs": lambda o: bool(b.get_bool(o, "logprobs")),
    "top_logprobs": lambda o: b.get_uint(o, "top_logprobs", 8),
    "stream": lambda o: bool(b.get_bool(o, "stream")),
    "stream_options": _stream_options,
    "stop": _stop,
}


def _decode_tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
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


def _decode_tool_choice(value: Any) -> str | dict[str, str] | None:
    if value is None:
        return None
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


def _decode_response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
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
