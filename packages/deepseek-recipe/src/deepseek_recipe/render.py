"""Conversation → prompt pieces, shared by the V4 and V4.1 encodings.

The two encodings differ only in data (`Flavor`): DSML tag spellings, whether a
system message may appear mid-conversation, and how effort is phrased.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deepseek_recipe.conversation import Conversation
from deepseek_recipe.messages import (
    AssistantMessage,
    ImagePlaceholder,
    ImageSource,
    LatestReminderMessage,
    Message,
    Segment,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from deepseek_recipe.pieces import Piece, special, text
from deepseek_recipe.prompt_text import (
    SCHEMA_FORMAT_HEADER,
    tools_block,
    updated_tools_text,
)
from deepseek_recipe.pyjson import dumps_python
from deepseek_recipe.tokens import SpecialTokens

_SEP = "\n\n"


@dataclass(frozen=True)
class Flavor:
    """What distinguishes one prompt encoding from the other."""

    mid_conversation_system: bool
    block: str
    invoke: str
    parameter: str
    blank_line_in_empty_invoke: bool
    json_object_format: str
    effort_prefix: Callable[[str | None], str]
    system_token: bool
    tool_after_user_opens_turn: bool
    float_format: Callable[[float], str]
    #: V4 keys history reasoning on whether the message carries any; V4.1 on thinking mode.
    reasoning_by_presence: bool
    #: V4 lists an assistant's tool calls (and so their results) in call-id order.
    sort_calls_by_id: bool = False
    #: V4 ends every line of the tools block's schema list with a newline; V4.1 joins them.
    schema_lines_end_with_newline: bool = False
    #: V4 writes a tool-call block for any call list, even an empty one; V4.1 only for calls.
    block_for_empty_calls: bool = False


def _join(parts: Sequence[Sequence[Segment]]) -> list[Segment]:
    out: list[Segment] = []
    for i, segs in enumerate(parts):
        if i:
            out.append(_SEP)
        out.extend(segs)
    return out


def _hoist_systems(messages: list[Message]) -> list[Message]:
    systems = [m for m in messages if isinstance(m, SystemMessage)]
    if not systems:
        return messages
    non_empty = [m.segments for m in systems if m.segments]
    sources = [s for m in systems for s in m.image_sources]
    head = SystemMessage(_join(non_empty), sources)
    return [head] + [m for m in messages if not isinstance(m, SystemMessage)]


def _merge_users(messages: list[Message], skip_empty: bool) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if isinstance(m, UserMessage) and out and isinstance(out[-1], UserMessage):
            prev = out[-1]
            parts = [segs for segs in (prev.segments, m.segments) if segs or not skip_empty]
            out[-1] = UserMessage(_join(parts), prev.image_sources + m.image_sources)
        else:
            out.append(m)
    return out


def _drop_repeated_reminders(messages: list[Message]) -> list[Message]:
    """V4.1 keeps only the first of consecutive latest-reminder messages."""
    out: list[Message] = []
    for m in messages:
        if (
            isinstance(m, LatestReminderMessage)
            and out
            and isinstance(out[-1], LatestReminderMessage)
        ):
            continue
        out.append(m)
    return out


def _sort_tool_results(messages: list[Message], whole_run: bool) -> list[Message]:
    """Put tool results in the order of the calls they answer.

    V4.1 sorts across a whole run of user-side messages (tool positions only);
    V4 sorts each block of consecutive tool messages.
    """
    out = list(messages)
    order: list[str] = []
    i = 0
    while i < len(out):
        m = out[i]
        if isinstance(m, AssistantMessage) and m.tool_calls:
            order = [c.id for c in m.tool_calls]
            i += 1
            continue
        in_run = (UserMessage, ToolMessage) if whole_run else (ToolMessage,)
        if not isinstance(m, in_run):
            i += 1
            continue
        start = i
        while i < len(out) and isinstance(out[i], in_run):
            i += 1
        idxs = [k for k in range(start, i) if isinstance(out[k], ToolMessage)]
        if len(idxs) > 1 and order:
            tools = [out[k] for k in idxs]
            tools.sort(key=lambda t: order.index(t.tool_call_id) if t.tool_call_id in order else 0)
            for k, t in zip(idxs, tools, strict=True):
                out[k] = t
    return out


def _calls_by_id(messages: list[Message]) -> list[Message]:
    """Assistant messages with their tool calls in call-id order (string order)."""
    out: list[Message] = []
    for m in messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            calls = sorted(m.tool_calls, key=lambda c: c.id)
            out.append(AssistantMessage(m.content, m.reasoning_content, calls, m.prefix))
        else:
            out.append(m)
    return out


def _content(segments: Sequence[Segment]) -> list[Piece]:
    return [special(s.spelling) if isinstance(s, ImagePlaceholder) else text(s) for s in segments]


def _parse_arguments(arguments: str) -> dict[str, Any]:
    def reject(_: str) -> Any:
        raise ValueError("non-standard JSON constant")

    try:
        value = json.loads(arguments, parse_constant=reject)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict):
        return value
    return {"arguments": arguments}


class Renderer:
    """Renders one conversation with one flavor and one token spelling table."""

    def __init__(self, flavor: Flavor, tokens: SpecialTokens) -> None:
        self.f = flavor
        self.t = tokens

    def _tok(self, key: str) -> Piece:
        return special(self.t.get(key))

    def _tool_calls(self, calls: Sequence[ToolCall]) -> list[Piece]:
        f = self.f
        dsml = self._tok("dsml")
        out: list[Piece] = [text("\n\n<"), dsml, text(f"{f.block}>\n")]
        for call in calls:
            out += [text("<"), dsml, text(f'{f.invoke} name="{call.name}">\n')]
            params = _parse_arguments(call.arguments)
            for k, (key, value) in enumerate(params.items()):
                if k:
                    out.append(text("\n"))
                is_str = isinstance(value, str)
                shown = value if is_str else dumps_python(value, f.float_format)
                flag = "true" if is_str else "false"
                out += [
                    text("<"),
                    dsml,
                    text(f'{f.parameter} name="{key}" string="{flag}">{shown}</'),
                ]
                out += [dsml, text(f"{f.parameter}>")]
            if params or f.blank_line_in_empty_invoke:
                out.append(text("\n"))
            out += [text("</"), dsml, text(f"{f.invoke}>\n")]
        out += [text("</"), dsml, text(f"{f.block}>")]
        return out

    def _head_additions(self, conv: Conversation, tools_active: bool) -> list[Piece]:
        out: list[Piece] = []
        if tools_active:
            out.append(text(_SEP))
            out += tools_block(conv.tools, self.t, self.f)
        if conv.response_format == "json_object":
            out.append(text(_SEP + self.f.json_object_format))
        elif conv.response_format == "json_schema":
            schema = dumps_python(conv.response_schema, self.f.float_format)
            out.append(text(_SEP + SCHEMA_FORMAT_HEADER + schema))
        return out

    def render(self, conv: Conversation) -> tuple[list[Piece], list[ImageSource]]:
        f = self.f
        messages = conv.messages
        if not f.mid_conversation_system:
            messages = _hoist_systems(messages)
        if f.sort_calls_by_id:
            messages = _calls_by_id(messages)
        messages = _merge_users(messages, skip_empty=f.tool_after_user_opens_turn)
        if f.mid_conversation_system:
            messages = _drop_repeated_reminders(messages)
        messages = _sort_tool_results(messages, whole_run=not f.tool_after_user_opens_turn)
        tools_active = bool(conv.tools) and conv.tool_choice != "none"
        additions = self._head_additions(conv, tools_active)
        if additions and not (messages and isinstance(messages[0], SystemMessage)):
            messages = [SystemMessage(""), *messages]
        thinking = conv.thinking_mode
        out: list[Piece] = [self._tok("bos")]
        if not messages and thinking and not f.system_token:
            out.append(text(f.effort_prefix(conv.reasoning_effort)))
        prev: Message | None = None
        last = len(messages) - 1
        for i, m in enumerate(messages):
            if i == 0:
                effort = f.effort_prefix(conv.reasoning_effort) if thinking else ""
                if f.system_token and (effort or isinstance(m, SystemMessage)):
                    out.append(self._tok("system"))
                out.append(text(effort))
            if isinstance(m, SystemMessage):
                if i > 0 and f.system_token:
                    out.append(self._tok("system"))
                out += _content(m.segments)
                if i == 0:
                    out += additions
                if m.tools:
                    # Tools loaded mid-conversation are announced where they were loaded; V4
                    # hoists system messages into one head without their tools.
                    out.append(text(updated_tools_text(m.tools, f)))
            elif isinstance(m, UserMessage):
                joins = isinstance(prev, (UserMessage, ToolMessage))
                out.append(text(_SEP) if joins else self._tok("user"))
                out += _content(m.segments)
            elif isinstance(m, ToolMessage):
                if f.tool_after_user_opens_turn:
                    joins = isinstance(prev, ToolMessage)
                else:
                    joins = isinstance(prev, (UserMessage, ToolMessage))
                out.append(text(_SEP) if joins else self._tok("user"))
                out += [text("<tool_result>"), *_content(m.segments), text("</tool_result>")]
            elif isinstance(m, AssistantMessage):
                # V4.1 treats an opening assistant message as outside thinking mode.
                in_thinking = thinking and (i > 0 or not f.system_token)
                out += self._assistant(
                    m, in_thinking, tools_active, is_prefix=m.prefix and i == last
                )
            else:
                out += [self._tok("latest_reminder"), text(m.content)]
            prev = m
        if not (messages and messages[-1].prefix and isinstance(messages[-1], AssistantMessage)):
            out += [
                self._tok("assistant"),
                self._tok("thinking_start" if thinking else "thinking_end"),
            ]
        if conv.tool_choice == "required" and conv.tools:
            # Opened even after a prefix message: a required call always starts the block.
            out += [text("\n\n<"), self._tok("dsml"), text(f"{f.block}>\n")]
        sources = [s for m in messages for s in m.image_sources]
        return out, sources

    def _assistant(
        self, m: AssistantMessage, thinking: bool, tools_active: bool, is_prefix: bool
    ) -> list[Piece]:
        out: list[Piece] = [self._tok("assistant")]
        reasoning = m.reasoning_content or ""
        by_presence = self.f.reasoning_by_presence
        if is_prefix:
            opened = m.reasoning_content is not None if by_presence else thinking
            if opened:
                out += [self._tok("thinking_start"), text(reasoning)]
            # The model continues inside the thinking section only in thinking mode with no content.
            if m.content or not thinking:
                out += [self._tok("thinking_end"), text(m.content)]
            if self._writes_calls(m):
                out += self._tool_calls(m.tool_calls or [])
            return out
        keep = m.reasoning_content is not None if by_presence else thinking
        if keep and tools_active:
            out += [self._tok("thinking_start"), text(reasoning), self._tok("thinking_end")]
        else:
            out.append(self._tok("thinking_end"))
        out.append(text(m.content))
        if self._writes_calls(m):
            out += self._tool_calls(m.tool_calls or [])
        out.append(self._tok("eos"))
        return out

    def _writes_calls(self, m: AssistantMessage) -> bool:
        """Whether the message gets a tool-call block (an empty list counts in V4)."""
        if self.f.block_for_empty_calls:
            return m.tool_calls is not None
        return bool(m.tool_calls)
