"""From checked request settings to a `ConversationRequest`, the same for every protocol.

Once a converter has its conversation, what the model is asked for follows one
set of rules whatever the protocol: the thinking switch and effort, how a tool
choice narrows the tools, the sampling defaults of each model, the output
constraint and where the stream parser starts.  Keeping them here keeps the
three converters from drifting apart.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe.conversation import Conversation, ReasoningEffort, ToolChoice
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.messages import ToolDefinition
from deepseek_recipe.options import ConversionOptions, ModelVersion
from deepseek_recipe.parsing_options import ParsingOptions, ThinkingInitialStage
from deepseek_recipe.protocol_json import to_f32
from deepseek_recipe.pyjson import dumps_compact
from deepseek_recipe.request import ConversationRequest, InferenceOptions, OutputConstraint

_EFFORT_MAP: dict[str, ReasoningEffort] = {
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",
    "ultra": "max",
}


def thinking_enabled(
    options: ConversionOptions, effort: str | None, switch: str | None = None
) -> bool:
    """Thinking mode: an explicit switch wins over an effort, which wins over the default.

    Any effort but `none` turns thinking on; any switch but `disabled` does too.
    """
    thinking = options.default_thinking_mode
    if effort is not None:
        thinking = effort != "none"
    if switch is not None:
        thinking = switch != "disabled"
    return thinking


def reasoning_effort(thinking: bool, requested: str | None) -> ReasoningEffort | None:
    """The prompt's effort level; `high` when none is named (or `none` was overridden)."""
    if not thinking:
        return None
    return _EFFORT_MAP.get(requested or "high", "high")


def resolve_tool_choice(
    raw: str | dict[str, str] | None, tools: list[ToolDefinition], thinking: bool
) -> tuple[ToolChoice, list[ToolDefinition]]:
    """The conversation's tool choice and the tools it leaves on offer.

    Naming a function narrows the tools to it; forcing a call is not possible in
    thinking mode.  Without tools there is nothing to force or name, so any
    choice but `none` means `auto` (and is not checked against thinking mode).
    """
    if raw == "none":
        return "none", []
    if raw is None or raw == "auto" or not tools:
        return "auto", tools
    if isinstance(raw, dict):
        name = raw["name"]
        tools = [t for t in tools if t.name == name]
        if not tools:
            raise ConversionError(
                f"Invalid value for 'tool_call': no function named '{name}' was specified "
                "in the 'tools' parameter."
            )
    if thinking:
        raise ConversionError("Thinking mode does not support this tool_choice")
    return "required", tools


def output_constraint(
    conv: Conversation, response_format: dict[str, Any], schema: Any
) -> OutputConstraint | None:
    """What constrained decoding may enforce: the offered tools, else the response format."""
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
    if response_format["type"] == "json_object":
        return OutputConstraint("json", "")
    if response_format["type"] == "json_schema":
        return OutputConstraint("json", dumps_compact(schema))
    if response_format["type"] == "regex":
        return OutputConstraint("regex", response_format["regex"])
    return None


def sampling(
    version: ModelVersion,
    thinking: bool,
    has_tools: bool,
    temperature: float | None,
    top_p: float | None,
) -> tuple[float, float]:
    """Temperature and top-p as each model runs them; thinking mode fixes most of them."""
    if version is ModelVersion.DeepseekV4Pro:
        if thinking:
            return 1.0, to_f32(0.95) if has_tools else 1.0
        return to_f32(1.0 if temperature is None else temperature), to_f32(
            1.0 if top_p is None else top_p
        )
    if thinking:
        return 1.0, 1.0 if top_p is None else to_f32(max(top_p, 0.95))
    return to_f32(1.0 if temperature is None else temperature), 1.0


def initial_stage(conv: Conversation) -> ThinkingInitialStage:
    """Where a thinking-mode reply starts: fresh reasoning, or continuing a prefix message."""
    messages = conv.messages
    if messages and messages[-1].prefix:
        if messages[-1].content:
            return ThinkingInitialStage.ContentContinuation
        if messages[-1].reasoning_content:
            return ThinkingInitialStage.ReasoningContinuation
    return ThinkingInitialStage.ReasoningStart


def assemble_request(
    conversation: Conversation,
    version: ModelVersion,
    options: ConversionOptions,
    *,
    response_format: dict[str, Any],
    constraint_schema: Any,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    logprobs: bool,
    top_logprobs: int | None,
    seed: int | None,
    stop_sequences: list[str],
    stream: bool,
) -> ConversationRequest:
    """The converted request: sampling, output constraint and parser settings.

    `temperature` and `top_p` are the requested values, before the model
    defaults apply; `constraint_schema` is the JSON schema to enforce, if any.
    """
    thinking = conversation.thinking_mode
    has_tools = bool(conversation.tools)
    active_tools = has_tools and conversation.tool_choice != "none"
    constraint = output_constraint(conversation, response_format, constraint_schema)
    temperature, top_p = sampling(version, thinking, has_tools, temperature, top_p)
    inference = InferenceOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        seed=seed,
        output_constraint=constraint,
    )
    parsing = ParsingOptions(
        parse_tool_calls=active_tools,
        starts_in_tool_calls=active_tools and conversation.tool_choice == "required",
        parse_json_output=response_format["type"] == "json_object",
        thinking_initial_stage=initial_stage(conversation) if thinking else None,
        stop_sequences=stop_sequences,
        special_tokens=options.special_tokens,
    )
    return ConversationRequest(
        conversation,
        version,
        inference_options=inference,
        parsing_options=parsing,
        stream=stream,
    )
