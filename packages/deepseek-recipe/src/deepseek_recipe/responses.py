"""OpenAI Responses request → `ConversationRequest`.

Checks run in the order the official converter uses (tool declarations,
history, tool schemas and choice, text format, and sampling ranges last), so a
request with several problems reports the same first one.  Tools that tool
search outputs in the history load (V4.1) are offered after the declared ones.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe.consumable_request import ConsumableRequest
from deepseek_recipe.conversation import Conversation
from deepseek_recipe.deferred_tools import resolve_loaded_tools
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history_options import HistoryOptions
from deepseek_recipe.messages import Message, ToolDefinition
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
)
from deepseek_recipe.responses_body import REQUEST_FIELDS, decode_responses_request
from deepseek_recipe.responses_echo import ResponsesEcho
from deepseek_recipe.responses_history import build_messages
from deepseek_recipe.responses_tool_search import ToolSearchLoader
from deepseek_recipe.responses_tools import (
    DeclaredTool,
    DeclaredTools,
    declare_tools,
    namespace_map,
)
from deepseek_recipe.schema import tool_parameters
from deepseek_recipe.strict_schema import normalize_strict


class ResponsesConversationRequest(ConversationRequest):
    """A converted Responses request; it keeps what the response side reports and maps back."""

    def __init__(
        self,
        base: ConversationRequest,
        echo: ResponsesEcho,
        namespace_map: dict[str, tuple[str, str]],
        custom_names: set[str],
        client_tool_search: bool = False,
    ) -> None:
        super().__init__(
            base.conversation,
            base.model_version,
            inference_options=base.inference_options,
            parsing_options=base.parsing_options,
            stream=base.stream,
        )
        self.responses_echo = echo
        self.namespace_map = dict(namespace_map)
        self.custom_names = set(custom_names)
        #: Calls of `tool_search` are reported as tool search calls, not function calls.
        self.client_tool_search = client_tool_search


class ResponsesRequest(ConsumableRequest):
    """A Responses request; conversion consumes it, even when it fails."""

    def __init__(self, body: bytes | str | dict[str, Any]) -> None:
        raw = parse_protocol_body(body, "ResponsesRequest", REQUEST_FIELDS)
        super().__init__(decode_responses_request(raw), _convert)

    def namespace_tool_map(self, options: ConversionOptions) -> dict[str, tuple[str, str]]:
        """Function names of the declared namespace tools → `(namespace, local name)`."""
        d = self._check()
        version = model_version(d["model"], options)
        return namespace_map(d["tools"], version)

    def echo(self) -> ResponsesEcho:
        """The request settings that response objects report."""
        return ResponsesEcho.from_request(self._check())

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str) -> Any:
        from deepseek_recipe.responses_stream import ResponsesChunkGenerator

        return ResponsesChunkGenerator(id, model, request)


def _build_tools(declared: list[DeclaredTool]) -> list[ToolDefinition]:
    """Check each tool in turn: unique name, then its schema (strict ones are normalized)."""
    tools: list[ToolDefinition] = []
    seen: set[str] = set()
    for t in declared:
        if t.name in seen:
            raise ConversionError("Tool names must be unique.")
        seen.add(t.name)
        params = tool_parameters(t.name, t.parameters, t.strict)
        tools.append(ToolDefinition(t.name, t.description, params, t.strict, t.deferred))
    return tools


def _named_choice(raw: str | dict[str, Any] | None) -> str | dict[str, str] | None:
    """Function and custom choices name a tool; web-search choices fall back to `auto`."""
    if isinstance(raw, dict):
        if raw["type"] in ("function", "custom"):
            return {"name": raw["name"]}
        return "auto"
    return raw


def _messages(
    d: dict[str, Any],
    version: ModelVersion,
    thinking: bool,
    options: ConversionOptions,
    declared: DeclaredTools,
) -> tuple[list[Message], DeclaredTools]:
    """The history's messages and the tools its tool search outputs loaded."""
    items = d["input"]
    if items is None and not d["instructions"]:
        raise ConversionError("Either input or instructions must be provided")
    if isinstance(items, list) and not items:
        raise ConversionError("Input items array must not be empty")
    opts = HistoryOptions.from_conversion(
        version, thinking, options, has_tools=bool(declared.tools)
    )
    reject_web_search = options.responses_web_search is WebSearchBehavior.Reject
    loader = ToolSearchLoader(declared, reject_web_search)
    messages = build_messages(d["instructions"], [] if items is None else items, opts, loader)
    return messages, loader.loaded


def _convert(d: dict[str, Any], options: ConversionOptions) -> ResponsesConversationRequest:
    version = model_version(d["model"], options)
    declared: DeclaredTools = declare_tools(d["tools"], version, options)
    reasoning = d["reasoning"] or {}
    requested_effort = reasoning.get("effort")
    thinking = thinking_enabled(options, requested_effort)
    messages, loaded = _messages(d, version, thinking, options, declared)
    choice_raw = d["tool_choice"]
    rejects_web_search = options.responses_web_search is WebSearchBehavior.Reject
    web_search_choice = isinstance(choice_raw, dict) and choice_raw["type"].startswith("web_search")
    if web_search_choice and rejects_web_search:
        raise ConversionError("Server tools are not supported")
    text = d["text"] or {}
    fmt = text.get("format") or {"type": "text"}
    # With tool choice `none` the tools are not offered, so their schemas are not checked.
    offered = [] if choice_raw == "none" else declared.tools + loaded.tools
    tools = _build_tools(offered)
    choice, tools = resolve_tool_choice(_named_choice(choice_raw), tools, thinking)
    messages = resolve_loaded_tools(messages, tools)
    strict_schema = fmt["type"] == "json_schema" and bool(fmt.get("strict"))
    schema = fmt["schema"] if fmt["type"] == "json_schema" else None
    constraint_schema = normalize_strict(schema, for_tool=False) if strict_schema else schema
    if fmt["type"] == "json_object" and not any("json" in m.content.lower() for m in messages):
        raise ConversionError(
            "Response input messages must contain the word 'json' in some form to use "
            "'text.format' of type 'json_object'."
        )
    if len({bool(t.strict) for t in tools}) > 1:
        raise ConversionError("Cannot use strict tool with non-strict tool in the same request")
    if fmt["type"] != "text" and any(t.strict for t in tools):
        raise ConversionError("response_format should not be used with tools")
    check_sampling_ranges(d["temperature"], d["top_p"])
    if d["top_logprobs"] is not None and d["top_logprobs"] > 20:
        raise ConversionError(
            "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20]."
        )
    bound = max_tokens_bound(options, thinking)
    max_tokens = d["max_output_tokens"]
    if max_tokens is not None and not 1 <= max_tokens <= bound:
        raise range_error("max_tokens", f"[1, {bound}]")
    conversation = Conversation(
        messages,
        thinking_mode=thinking,
        tools=tools,
        tool_choice=choice,
        reasoning_effort=reasoning_effort(thinking, requested_effort),
        response_format="json_object" if fmt["type"] == "json_object" else "text",
        response_schema=schema,
    )
    base = assemble_request(
        conversation,
        version,
        options,
        response_format={"type": fmt["type"]},
        constraint_schema=constraint_schema,
        temperature=d["temperature"],
        top_p=d["top_p"],
        max_tokens=max_tokens,
        logprobs=d["top_logprobs"] is not None,
        top_logprobs=d["top_logprobs"],
        seed=None,
        stop_sequences=[],
        stream=bool(d["stream"]),
    )
    return ResponsesConversationRequest(
        base,
        ResponsesEcho.from_request(d),
        declared.namespace_map | loaded.namespace_map,
        declared.custom_names | loaded.custom_names,
        declared.client_tool_search,
    )
