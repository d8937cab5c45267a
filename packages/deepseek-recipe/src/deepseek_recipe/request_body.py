"""Type-checking decode of a Chat Completions body, field by field.

Everything a body can get wrong at the type level is reported here, before
any semantic validation, because that is the order the official package uses
(its deserializer runs first).
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import body as b

_EFFORT_NAMES = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


def decode_request(obj: dict[str, Any]) -> dict[str, Any]:
    """Type-check every field up front, like deserialization does."""
    out: dict[str, Any] = {}
    out["model"] = b.get_str(obj, "model", required=True)
    if "messages" not in obj:
        raise b.missing("messages")
    messages = obj["messages"]
    if not isinstance(messages, list):
        raise b.invalid_type(messages, "a sequence")
    out["messages"] = [b.decode_message(m) for m in messages]
    thinking = obj.get("thinking")
    out["thinking"] = None
    if thinking is not None:
        t = b.as_map(thinking, "struct ChatCompletionThinking")
        if "type" not in t:
            raise b.missing("type")
        out["thinking"] = b.variant(t["type"], ["adaptive", "enabled", "disabled"])
    effort = obj.get("reasoning_effort")
    out["reasoning_effort"] = None
    if effort is not None:
        if isinstance(effort, dict):
            key = next(iter(effort), "")
            raise b.unknown_variant(key, _EFFORT_NAMES)
        if not isinstance(effort, str):
            raise b.invalid_type(effort, "string or map")
        out["reasoning_effort"] = b.variant(effort, _EFFORT_NAMES)
    out["tools"] = _decode_tools(obj.get("tools"))
    out["tool_choice"] = _decode_tool_choice(obj.get("tool_choice"))
    out["response_format"] = _decode_response_format(obj.get("response_format"))
    out["max_tokens"] = b.get_uint(obj, "max_tokens", 32)
    out["n"] = b.get_uint(obj, "n", 8)
    out["temperature"] = b.get_float(obj, "temperature")
    out["top_p"] = b.get_float(obj, "top_p")
    out["frequency_penalty"] = b.get_float(obj, "frequency_penalty")
    out["presence_penalty"] = b.get_float(obj, "presence_penalty")
    out["seed"] = b.get_uint(obj, "seed", 64)
    out["logprobs"] = bool(b.get_bool(obj, "logprobs"))
    out["top_logprobs"] = b.get_uint(obj, "top_logprobs", 8)
    out["stream"] = bool(b.get_bool(obj, "stream"))
    stream_options = obj.get("stream_options")
    if stream_options is not None:
        b.as_map(stream_options, "struct ChatCompletionStreamOptions")
    out["stream_options"] = stream_options
    stop = obj.get("stop")
    if stop is None:
        out["stop"] = None
    elif isinstance(stop, str):
        out["stop"] = stop
    elif isinstance(stop, list):
        for item in stop:
            if not isinstance(item, str):
                raise b.invalid_type(item, "a string")
        out["stop"] = list(stop)
    else:
        raise b.body_error("expected a string or a list")
    return out


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
