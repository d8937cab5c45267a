"""Anthropic Messages request → `ConversationRequest`.

Anthropic clients send `max_tokens` on every request, often larger than the
model allows, so an oversized value is lowered to the configured bound instead
of rejected (Chat Completions and Responses reject it).  Thinking follows
`thinking.type`, then `output_config.effort`, then the configured default.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe.conversation import Conversation, ReasoningEffort
from deepseek_recipe.conversion import (
    _EFFORT_MAP,
    _initial_stage,
    _output_constraint,
    _range_error,
    _resolve_tool_choice,
    _sampling,
    _stop_sequences,
)
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.messages import ToolDefinition
from deepseek_recipe.messages_body import REQUEST_FIELDS, decode_messages_request
from deepseek_recipe.messages_history import HistoryOptions, build_messages
from deepseek_recipe.options import (
    ConversionOptions,
    ModelVersion,
    ReasoningContentBehavior,
    WebSearchBehavior,
)
from deepseek_recipe.parsing_options import ParsingOptions
from deepseek_recipe.protocol_request import (
    check_object_schema,
    model_version,
    parse_protocol_body,
)
from deepseek_recipe.request import ConversationRequest, InferenceOptions
from deepseek_recipe.responses_tools import check_tool_name_at


class MessagesRequest:
    """An Anthropic Messages request; conversion consumes it, even when it fails."""

    def __init__(self, body: bytes | str | dict[str, Any]) -> None:
        raw = parse_protocol_body(body, "MessagesRequest", REQUEST_FIELDS)
        self._decoded = decode_messages_request(raw)
        self._consumed = False

    def _check(self) -> dict[str, Any]:
        if self._consumed:
            raise RuntimeError("protocol request has been consumed")
        return self._decoded

    @property
    def model(self) -> str:
        """The requested model name; read it before `convert` consumes the request."""
        return self._check()["model"]

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        d = self._check()
        self._consumed = True
        return _convert(d, options)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str) -> Any:
        from deepseek_recipe.messages_stream import MessagesChunkGenerator

        thinking = request.parsing_options.thinking_initial_stage is not None
        return MessagesChunkGenerator(id, model, thinking)


def _tools(
    raw: list[dict[str, Any]] | None,
    version: ModelVersion,
    options: ConversionOptions,
) -> list[dict[str, Any]]:
    """Client tools in declaration order; server tools are dropped or rejected."""
    if not raw:
        return []
    drop = options.messages_web_search is WebSearchBehavior.Drop
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        if not tool["server"]:
            check_tool_name_at(f"tools[{i}].name", tool["name"])
        else:
            # Only web search can be dropped; other server tools would change what the model can do.
            if not (drop and tool["type"].startswith("web_search")):
                raise ConversionError(f"tools[{i}]: server tools are not supported")
            continue
        if tool["defer_loading"] and version is ModelVersion.DeepseekV41Flash:
            raise NotImplementedError(
                "Messages tools with defer_loading (deferred tool loading) are not implemented "
                "by this deepseek-recipe for DeepSeek-V4.1"
            )
        out.append(tool)
    return out


def _build_tools(tools: list[dict[str, Any]]) -> list[ToolDefinition]:
    """Check each tool in turn: unique name, then its input schema (which is required)."""
    out: list[ToolDefinition] = []
    seen: set[str] = set()
    for t in tools:
        if t["name"] in seen:
            raise ConversionError("Tool names must be unique.")
        seen.add(t["name"])
        schema = t["input_schema"]
        if schema is None:
            raise ConversionError(
                f"Invalid schema for function '{t['name']}': null is not of types \"boolean\", "
                '"object"'
            )
        check_object_schema(t["name"], schema)
        out.append(ToolDefinition(t["name"], t["description"], schema, None))
    return out


def _tool_choice(raw: dict[str, Any] | None, dropped: set[str]) -> str | dict[str, str] | None:
    """Anthropic's choice as a Chat Completions one; naming a dropped server tool means `auto`."""
    if raw is None:
        return None
    kind = raw["type"]
    if kind == "any":
        return "auto"  # The official converter offers the tools without forcing a call.
    if kind == "tool":
        return "auto" if raw["name"] in dropped else {"name": raw["name"]}
    return kind


def _convert(d: dict[str, Any], options: ConversionOptions) -> ConversationRequest:
    version = model_version(d["model"], options)
    declared = _tools(d["tools"], version, options)
    thinking = options.default_thinking_mode
    output_config = d["output_config"] or {}
    requested_effort = output_config.get("effort")
    if requested_effort is not None:
        thinking = requested_effort != "none"
    if d["thinking"] is not None:
        thinking = d["thinking"]["type"] != "disabled"
    opts = HistoryOptions(
        version=version,
        thinking=thinking,
        reject_missing_reasoning=(
            options.reasoning_content_behavior is ReasoningContentBehavior.Reject
        ),
        drop_server_blocks=options.messages_web_search is WebSearchBehavior.Drop,
        image_token=options.special_tokens.get("image"),
        has_tools=bool(declared),
        tool_names=frozenset(t["name"] for t in declared),
    )
    messages = build_messages(d["system"], d["messages"], opts)
    dropped = {t["name"] for t in d["tools"] or [] if t["server"] and t["name"] is not None}
    raw_choice = _tool_choice(d["tool_choice"], dropped)
    # With tool choice `none` the tools are not offered, so their schemas are not checked.
    tools = [] if raw_choice == "none" else _build_tools(declared)
    if not tools and raw_choice != "none":
        raw_choice = "auto"  # Nothing to call: forcing a call is impossible.
    choice, tools = _resolve_tool_choice(raw_choice, tools, thinking)
    if d["temperature"] is not None and not 0 <= d["temperature"] <= 2:
        raise _range_error("temperature", "[0, 2]")
    if d["top_p"] is not None and not 0 < d["top_p"] <= 1:
        raise _range_error("top_p", "(0, 1.0]")
    stops = _stop_sequences(d["stop_sequences"])
    bound = (
        options.thinking_max_tokens_upper_bound
        if thinking
        else options.non_thinking_max_tokens_upper_bound
    )
    max_tokens = d["max_tokens"]
    if max_tokens is not None:
        if max_tokens < 1:
            raise _range_error("max_tokens", f"[1, {bound}]")
        max_tokens = min(max_tokens, bound)
    effort: ReasoningEffort | None = None
    if thinking:
        effort = _EFFORT_MAP.get(requested_effort or "high", "high")
    conversation = Conversation(
        messages,
        thinking_mode=thinking,
        tools=tools,
        tool_choice=choice,
        reasoning_effort=effort,
    )
    active_tools = bool(tools) and choice != "none"
    constraint = _output_constraint(conversation, {"type": "text"}, None)
    temperature, top_p = _sampling(version, thinking, bool(tools), d["temperature"], d["top_p"])
    inference = InferenceOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        logprobs=False,
        top_logprobs=None,
        seed=None,
        output_constraint=constraint,
    )
    parsing = ParsingOptions(
        parse_tool_calls=active_tools,
        starts_in_tool_calls=active_tools and choice == "required",
        parse_json_output=False,
        thinking_initial_stage=_initial_stage(conversation) if thinking else None,
        stop_sequences=stops,
        special_tokens=options.special_tokens,
    )
    return ConversationRequest(
        conversation,
        version,
        inference_options=inference,
        parsing_options=parsing,
        stream=bool(d["stream"]),
    )
