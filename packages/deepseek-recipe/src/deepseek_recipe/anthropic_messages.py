"""Anthropic Messages request → `ConversationRequest`.

Anthropic clients send `max_tokens` on every request, often larger than the
model allows, so an oversized value is lowered to the configured bound instead
of rejected (Chat Completions and Responses reject it).  Thinking follows
`thinking.type`, then `output_config.effort`, then the configured default.
On V4.1 a tool with `defer_loading` is offered but left out of the opening
tools block until the history loads it (see `deferred_tools`); V4 has no
deferred loading and offers it like any other tool.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe.consumable_request import ConsumableRequest
from deepseek_recipe.conversation import Conversation
from deepseek_recipe.deferred_tools import ALL_DEFERRED, resolve_loaded_tools
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history_options import HistoryOptions
from deepseek_recipe.messages import ToolDefinition
from deepseek_recipe.messages_body import REQUEST_FIELDS, decode_messages_request
from deepseek_recipe.messages_history import build_messages
from deepseek_recipe.options import ConversionOptions, ModelVersion, WebSearchBehavior
from deepseek_recipe.protocol_request import parse_protocol_body
from deepseek_recipe.request import ConversationRequest
from deepseek_recipe.request_assembly import (
    assemble_request,
    reasoning_effort,
    resolve_tool_choice,
    thinking_enabled,
)
from deepseek_recipe.request_checks import (
    check_sampling_ranges,
    max_tokens_bound,
    model_version,
    range_error,
    stop_sequences,
)
from deepseek_recipe.responses_tools import check_tool_name_at
from deepseek_recipe.schema import check_parameters


class MessagesRequest(ConsumableRequest):
    """An Anthropic Messages request; conversion consumes it, even when it fails."""

    def __init__(self, body: bytes | str | dict[str, Any]) -> None:
        raw = parse_protocol_body(body, "MessagesRequest", REQUEST_FIELDS)
        super().__init__(decode_messages_request(raw), _convert)

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
    """Client tools in declaration order; server tools are dropped or rejected.

    On V4.1 a tool keeps its `defer_loading`, and one tool at least must not be deferred:
    the model would otherwise start without any tool to call.
    """
    if not raw:
        return []
    drop = options.messages_web_search is WebSearchBehavior.Drop
    v41 = version is ModelVersion.DeepseekV41Flash
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        if not tool["server"]:
            check_tool_name_at(f"tools[{i}].name", tool["name"])
        else:
            # Only web search can be dropped; other server tools would change what the model can do.
            if not (drop and tool["type"].startswith("web_search")):
                raise ConversionError(f"tools[{i}]: server tools are not supported")
            continue
        out.append({**tool, "defer_loading": v41 and bool(tool["defer_loading"])})
    if out and all(t["defer_loading"] for t in out):
        raise ConversionError(ALL_DEFERRED)
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
        check_parameters(t["name"], schema)
        out.append(ToolDefinition(t["name"], t["description"], schema, None, t["defer_loading"]))
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
    output_config = d["output_config"] or {}
    requested_effort = output_config.get("effort")
    switch = None if d["thinking"] is None else d["thinking"]["type"]
    thinking = thinking_enabled(options, requested_effort, switch)
    opts = HistoryOptions.from_conversion(
        version,
        thinking,
        options,
        has_tools=bool(declared),
        drop_server_blocks=options.messages_web_search is WebSearchBehavior.Drop,
        tool_names=frozenset(t["name"] for t in declared),
    )
    messages = build_messages(d["system"], d["messages"], opts)
    dropped = {t["name"] for t in d["tools"] or [] if t["server"] and t["name"] is not None}
    raw_choice = _tool_choice(d["tool_choice"], dropped)
    # With tool choice `none` the tools are not offered, so their schemas are not checked.
    tools = [] if raw_choice == "none" else _build_tools(declared)
    choice, tools = resolve_tool_choice(raw_choice, tools, thinking)
    messages = resolve_loaded_tools(messages, tools)
    check_sampling_ranges(d["temperature"], d["top_p"])
    stops = stop_sequences(d["stop_sequences"])
    bound = max_tokens_bound(options, thinking)
    max_tokens = d["max_tokens"]
    if max_tokens is not None:
        if max_tokens < 1:
            raise range_error("max_tokens", f"[1, {bound}]")
        max_tokens = min(max_tokens, bound)
    conversation = Conversation(
        messages,
        thinking_mode=thinking,
        tools=tools,
        tool_choice=choice,
        reasoning_effort=reasoning_effort(thinking, requested_effort),
    )
    return assemble_request(
        conversation,
        version,
        options,
        response_format={"type": "text"},
        constraint_schema=None,
        temperature=d["temperature"],
        top_p=d["top_p"],
        max_tokens=max_tokens,
        logprobs=False,
        top_logprobs=None,
        seed=None,
        stop_sequences=stops,
        stream=bool(d["stream"]),
    )
