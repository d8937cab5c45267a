"""Chat Completions request → `ConversationRequest`.

Validation runs in the order the official converter uses so that a request
with several problems reports the same first one.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe.conversation import Conversation, ReasoningEffort, ToolChoice
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history import build_messages
from deepseek_recipe.messages import ToolDefinition
from deepseek_recipe.options import ConversionOptions, ModelVersion
from deepseek_recipe.parsing_options import ParsingOptions, ThinkingInitialStage
from deepseek_recipe.pyjson import dumps_compact
from deepseek_recipe.request import ConversationRequest, InferenceOptions, OutputConstraint, f32
from deepseek_recipe.request_body import decode_request
from deepseek_recipe.schema import (
    check_parameters,
    check_schema_kinds,
    check_tool_name,
    normalize_strict,
)

_EFFORT_MAP: dict[str, ReasoningEffort] = {
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",
    "ultra": "max",
}
_MAX_STOP_SEQUENCES = 16


class ChatCompletionRequest:
    """A Chat Completions request; conversion consumes it, as in the official API."""

    def __init__(self, body: bytes | str | dict[str, Any]) -> None:
        self._body = b.parse_body(body)
        self._decoded = decode_request(self._body)
        self._consumed = False

    @property
    def model(self) -> str:
        """The requested model name; read it before `convert` consumes the request."""
        if self._consumed:
            raise RuntimeError("protocol request has been consumed")
        return self._decoded["model"]

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        if self._consumed:
            raise RuntimeError("protocol request has been consumed")
        self._consumed = True
        return _convert(self._decoded, options)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str) -> Any:
        from deepseek_recipe.chat_stream import ChatCompletionChunkGenerator

        return ChatCompletionChunkGenerator(id, model, request)


def _range_error(name: str, rng: str) -> ConversionError:
    return ConversionError(f"Invalid {name} value, the valid range of {name} is {rng}")


def _convert(d: dict[str, Any], options: ConversionOptions) -> ConversationRequest:
    models = options.model_versions_by_name
    version = models.get(d["model"])
    if version is None:
        names = ", ".join(models)
        raise ConversionError(
            f"The supported API model names are {names}, but you passed {d['model']}."
        )
    thinking = options.default_thinking_mode
    if d["reasoning_effort"] is not None:
        thinking = d["reasoning_effort"] != "none"
    if d["thinking"] is not None:
        thinking = d["thinking"] != "disabled"
    if d["stream_options"] is not None and not d["stream"]:
        raise ConversionError("stream_options should be set along with stream = true")
    if d["n"] is not None and d["n"] != 1:
        raise ConversionError("Invalid n value (currently only n = 1 is supported)")
    bound = (
        options.thinking_max_tokens_upper_bound
        if thinking
        else options.non_thinking_max_tokens_upper_bound
    )
    if d["max_tokens"] is not None and not 1 <= d["max_tokens"] <= bound:
        raise _range_error("max_tokens", f"[1, {bound}]")
    if d["temperature"] is not None and not 0 <= d["temperature"] <= 2:
        raise _range_error("temperature", "[0, 2]")
    if d["top_p"] is not None and not 0 < d["top_p"] <= 1:
        raise _range_error("top_p", "(0, 1.0]")
    for name in ("frequency_penalty", "presence_penalty"):
        if d[name] is not None and not -2 <= d[name] <= 2:
            raise _range_error(name, "[-2, 2]")
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
    if d["seed"] is not None and d["seed"] >= 2**63:
        raise ConversionError("Invalid seed value, the valid range of seed is [0, 2^63)")
    stops = _stop_sequences(d["stop"])
    if not d["messages"]:
        raise ConversionError("Empty input messages")
    messages = build_messages(d["messages"], version, thinking, options, bool(d["tools"]))
    rf = d["response_format"] or {"type": "text"}
    if rf["type"] == "json_object" and not any("json" in m.content.lower() for m in messages):
        raise ConversionError(
            "Prompt must contain the word 'json' in some form to use 'response_format' of type "
            "'json_object'."
        )
    tools = _build_tools(d["tools"], normalize=d["tool_choice"] != "none")
    choice, tools = _resolve_tool_choice(d["tool_choice"], tools, thinking)
    strict_schema = rf["type"] == "json_schema" and bool(rf.get("strict"))
    if strict_schema:
        check_schema_kinds(rf["schema"], for_tool=False)
    if messages and messages[-1].prefix:  # empty system messages leave no message at all
        if rf["type"] == "json_object":
            raise ConversionError("response_format json_object should not be used with prefix")
        if d["tools"] or any(m.tool_calls for m in messages):
            raise ConversionError("Function call should not be used with prefix")
    schema = rf["schema"] if rf["type"] == "json_schema" else None
    constraint_schema = normalize_strict(schema, for_tool=False) if strict_schema else schema
    effort: ReasoningEffort | None = None
    if thinking:
        effort = _EFFORT_MAP.get(d["reasoning_effort"] or "high", "high")  # "none" with thinking on
    active_tools = bool(tools) and choice != "none"
    if d["response_format"] is not None and any(t.strict for t in tools):
        raise ConversionError("response_format should not be used with tools")
    conversation = Conversation(
        messages,
        thinking_mode=thinking,
        tools=tools,
        tool_choice=choice,
        reasoning_effort=effort,
        response_format="json_object" if rf["type"] == "json_object" else "text",
        response_schema=schema,
        response_regex=rf.get("regex") if rf["type"] == "regex" else None,
    )
    constraint = _output_constraint(conversation, rf, constraint_schema)
    temperature, top_p = _sampling(version, thinking, bool(tools), d["temperature"], d["top_p"])
    inference = InferenceOptions(
        max_tokens=d["max_tokens"],
        temperature=temperature,
        top_p=top_p,
        logprobs=d["logprobs"],
        top_logprobs=d["top_logprobs"],
        seed=d["seed"],
        output_constraint=constraint,
    )
    parsing = ParsingOptions(
        parse_tool_calls=active_tools,
        starts_in_tool_calls=active_tools and choice == "required",
        parse_json_output=rf["type"] == "json_object",
        thinking_initial_stage=_initial_stage(conversation) if thinking else None,
        stop_sequences=stops,
        special_tokens=options.special_tokens,
    )
    return ConversationRequest(
        conversation,
        version,
        inference_options=inference,
        parsing_options=parsing,
        stream=d["stream"],
    )


def _stop_sequences(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        if stop == "":
            raise ConversionError(
                "Invalid 'stop': empty string. Expected a string with minimum length 1, "
                "but got an empty string instead."
            )
        return [stop]
    if len(stop) > _MAX_STOP_SEQUENCES:
        raise ConversionError(f"Stop string array too long: {len(stop)}")
    for i, item in enumerate(stop):
        if item == "":
            raise ConversionError(
                f"Invalid 'stop[{i}]': empty string. Expected a string with minimum length 1, "
                "but got an empty string instead."
            )
    return list(stop)


def _build_tools(raw: list[dict[str, Any]] | None, normalize: bool) -> list[ToolDefinition]:
    if not raw:
        return []
    stricts = {bool(t["strict"]) for t in raw}
    tools: list[ToolDefinition] = []
    seen: set[str] = set()
    for i, t in enumerate(raw):
        check_tool_name(i, t["name"])
        check_parameters(t["name"], t["parameters"])
        if t["name"] in seen:
            raise ConversionError("Tool names must be unique.")
        seen.add(t["name"])
        params = {} if t["parameters"] is None else t["parameters"]
        if t["strict"] and normalize:
            params = normalize_strict(params or {"type": "object"}, for_tool=True)
        tools.append(ToolDefinition(t["name"], t["description"], params, t["strict"]))
    if len(stricts) > 1:
        raise ConversionError("Cannot use strict tool with non-strict tool in the same request")
    return tools


def _resolve_tool_choice(
    raw: str | dict[str, str] | None, tools: list[ToolDefinition], thinking: bool
) -> tuple[ToolChoice, list[ToolDefinition]]:
    if raw is None or raw == "auto":
        return "auto", tools
    if raw == "none":
        return "none", []
    if isinstance(raw, dict):
        name = raw["name"]
        if tools:
            picked = [t for t in tools if t.name == name]
            if not picked:
                raise ConversionError(
                    f"Invalid value for 'tool_call': no function named '{name}' was specified "
                    "in the 'tools' parameter."
                )
            tools = picked
    if thinking:
        raise ConversionError("Thinking mode does not support this tool_choice")
    return "required", tools


def _output_constraint(
    conv: Conversation, rf: dict[str, Any], schema: Any
) -> OutputConstraint | None:
    if conv.tools and conv.tool_choice != "none":
        listed = []
        for t in conv.tools:
            fn: dict[str, Any] = {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": t.strict,
            }
            entry: dict[str, Any] = {"type": "function", "function": fn}
            if t.defer_loading:
                entry["defer_loading"] = True
            listed.append(entry)
        kind = "tool_call_required" if conv.tool_choice == "required" else "tool_call"
        return OutputConstraint(kind, dumps_compact(listed))
    if rf["type"] == "json_object":
        return OutputConstraint("json", "")
    if rf["type"] == "json_schema":
        return OutputConstraint("json", dumps_compact(schema))
    if rf["type"] == "regex":
        return OutputConstraint("regex", rf["regex"])
    return None


def _sampling(
    version: ModelVersion,
    thinking: bool,
    has_tools: bool,
    temperature: float | None,
    top_p: float | None,
) -> tuple[float, float]:
    if version is ModelVersion.DeepseekV4Pro:
        if thinking:
            return 1.0, f32(0.95) if has_tools else 1.0
        return f32(1.0 if temperature is None else temperature), f32(
            1.0 if top_p is None else top_p
        )
    if thinking:
        return 1.0, 1.0 if top_p is None else f32(max(top_p, 0.95))
    return f32(1.0 if temperature is None else temperature), 1.0


def _initial_stage(conv: Conversation) -> ThinkingInitialStage:
    messages = conv.messages
    if messages and messages[-1].prefix:
        if messages[-1].content:
            return ThinkingInitialStage.ContentContinuation
        if messages[-1].reasoning_content:
            return ThinkingInitialStage.ReasoningContinuation
    return ThinkingInitialStage.ReasoningStart
