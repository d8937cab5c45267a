"""Chat Completions request → `ConversationRequest`.

Validation runs in the order the official converter uses so that a request
with several problems reports the same first one: the model, the tool names,
the history, the response format and tools, stop sequences, and the numeric
settings last.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe.consumable_request import ConsumableRequest
from deepseek_recipe.conversation import Conversation
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history import build_messages
from deepseek_recipe.messages import ToolDefinition
from deepseek_recipe.options import ConversionOptions
from deepseek_recipe.request import ConversationRequest
from deepseek_recipe.request_assembly import (
    assemble_request,
    reasoning_effort,
    resolve_tool_choice,
    thinking_enabled,
)
from deepseek_recipe.request_body import decode_request
from deepseek_recipe.request_checks import (
    check_sampling_ranges,
    max_tokens_bound,
    model_version,
    range_error,
    stop_sequences,
)
from deepseek_recipe.schema import check_tool_name, tool_parameters
from deepseek_recipe.strict_schema import normalize_strict


class ChatCompletionRequest(ConsumableRequest):
    """A Chat Completions request; conversion consumes it, as in the official API."""

    def __init__(self, body: bytes | str | dict[str, Any]) -> None:
        super().__init__(decode_request(b.parse_body(body)), _convert)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str) -> Any:
        from deepseek_recipe.chat_stream import ChatCompletionChunkGenerator

        return ChatCompletionChunkGenerator(id, model, request)


def _convert(d: dict[str, Any], options: ConversionOptions) -> ConversationRequest:
    version = model_version(d["model"], options)
    thinking = thinking_enabled(options, d["reasoning_effort"], d["thinking"])
    raw_tools = d["tools"] or []
    for index, tool in enumerate(raw_tools):
        check_tool_name(index, tool["name"])
    if not d["messages"]:
        raise ConversionError("Empty input messages")
    messages = build_messages(d["messages"], version, thinking, options, bool(raw_tools))
    rf = d["response_format"] or {"type": "text"}
    if rf["type"] == "json_object" and not any("json" in m.content.lower() for m in messages):
        raise ConversionError(
            "Prompt must contain the word 'json' in some form to use 'response_format' of type "
            "'json_object'."
        )
    # Tools that are not offered (`tool_choice: none`) are dropped unchecked.
    offered = d["tool_choice"] != "none"
    tools = _build_tools(raw_tools) if offered else []
    choice, tools = resolve_tool_choice(d["tool_choice"], tools, thinking)
    if messages and messages[-1].prefix:  # empty system messages leave no message at all
        if rf["type"] == "json_object":
            raise ConversionError("response_format json_object should not be used with prefix")
        if raw_tools or any(m.tool_calls for m in messages):
            raise ConversionError("Function call should not be used with prefix")
    stops = stop_sequences(d["stop"])
    if d["stream_options"] is not None and not d["stream"]:
        raise ConversionError("stream_options should be set along with stream = true")
    schema = rf["schema"] if rf["type"] == "json_schema" else None
    constraint_schema = schema
    if rf["type"] == "json_schema" and rf.get("strict"):
        constraint_schema = normalize_strict(schema, for_tool=False)
    if offered and len({bool(t["strict"]) for t in raw_tools}) > 1:
        raise ConversionError("Cannot use strict tool with non-strict tool in the same request")
    if d["response_format"] is not None and any(t.strict for t in tools):
        raise ConversionError("response_format should not be used with tools")
    _check_settings(d, options, thinking)
    conversation = Conversation(
        messages,
        thinking_mode=thinking,
        tools=tools,
        tool_choice=choice,
        reasoning_effort=reasoning_effort(thinking, d["reasoning_effort"]),
        response_format="json_object" if rf["type"] == "json_object" else "text",
        response_schema=schema,
        response_regex=rf.get("regex") if rf["type"] == "regex" else None,
    )
    return assemble_request(
        conversation,
        version,
        options,
        response_format=rf,
        constraint_schema=constraint_schema,
        temperature=d["temperature"],
        top_p=d["top_p"],
        max_tokens=d["max_tokens"],
        logprobs=d["logprobs"],
        top_logprobs=d["top_logprobs"],
        seed=d["seed"],
        stop_sequences=stops,
        stream=d["stream"],
    )


def _check_settings(d: dict[str, Any], options: ConversionOptions, thinking: bool) -> None:
    """The numeric request settings, which the official converter checks last, in this order."""
    if d["n"] is not None and d["n"] != 1:
        raise ConversionError("Invalid n value (currently only n = 1 is supported)")
    for name in ("presence_penalty", "frequency_penalty"):
        if d[name] is not None and not -2 <= d[name] <= 2:
            raise range_error(name, "[-2, 2]")
    check_sampling_ranges(d["temperature"], d["top_p"])
    if d["top_logprobs"] is not None:
        if not d["logprobs"]:
            raise ConversionError(
                "Invalid top_logprobs and logprobs value, logprobs must be set to true if "
                "top_logprobs is used."
            )
        if d["top_logprobs"] > 20:
            raise ConversionError(
                "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20]."
            )
    bound = max_tokens_bound(options, thinking)
    if d["max_tokens"] is not None and not 1 <= d["max_tokens"] <= bound:
        raise range_error("max_tokens", f"[1, {bound}]")
    if d["seed"] is not None and d["seed"] >= 2**63:
        raise ConversionError("Invalid seed value, the valid range of seed is [0, 2^63)")


def _build_tools(raw: list[dict[str, Any]]) -> list[ToolDefinition]:
    """Check each offered tool in turn: a unique name, then its parameter schema.

    The names' spelling was checked up front.
    """
    tools: list[ToolDefinition] = []
    seen: set[str] = set()
    for t in raw:
        if t["name"] in seen:
            raise ConversionError("Tool names must be unique.")
        seen.add(t["name"])
        params = tool_parameters(t["name"], t["parameters"], t["strict"])
        tools.append(ToolDefinition(t["name"], t["description"], params, t["strict"]))
    return tools
