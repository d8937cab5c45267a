"""Responses input items → conversation messages.

Responses spreads one assistant turn over several items (reasoning, message,
function calls); the prompt needs them as one assistant message.  Items are
gathered into a turn in that order; an item that would go back in the order
(reasoning after text, text after a call) starts a new turn, as in the official
converter.  Tool outputs must answer the calls of the turn right before them
and are put in call order.  On V4.1 a tool search call and its output are a
call and a result like any other, and the tools the output loads are announced
by a system message after the turn's results (see `responses_tool_search`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepseek_recipe import serde_decode as s
from deepseek_recipe.content_segments import (
    PART_SEPARATOR,
    UNSUPPORTED_IMAGE,
    merge_text,
    segments_text,
    url_image_source,
)
from deepseek_recipe.deferred_tools import loading_message
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history_options import HistoryOptions
from deepseek_recipe.history_reasoning import settle_reasoning
from deepseek_recipe.messages import (
    AssistantMessage,
    ImagePlaceholder,
    ImageSource,
    Message,
    Segment,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from deepseek_recipe.options import ModelVersion
from deepseek_recipe.protocol_json import dumps
from deepseek_recipe.responses_tool_search import ToolSearchLoader, search_call
from deepseek_recipe.responses_tools import qualified_name

UNSUPPORTED_DOCUMENT = "[Unsupported Document]"


@dataclass
class _Turn:
    """An assistant turn being gathered from consecutive items."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    has_message: bool = False


def _image_url(part: dict[str, Any], path: str) -> str:
    """The URL of a V4.1 `input_image` part; uploaded files cannot be fetched."""
    url, file_id = part["image_url"], part["file_id"]
    if url is None and file_id is None:
        raise ConversionError(f"{path}: input_image must have image_url or file_id")
    if url is not None and file_id is not None:
        raise ConversionError(f"{path}: input_image cannot have both image_url and file_id")
    if url is None:
        raise ConversionError(
            f"{path}: file_id is not supported. Pass the image as a base64 data url instead."
        )
    return url


def content_segments(
    content: str | list[dict[str, Any]],
    index: int,
    opts: HistoryOptions,
    *,
    assistant: bool = False,
) -> tuple[list[Segment], list[ImageSource]]:
    """Flatten content parts: text joined by a blank line, images as placeholders."""
    if isinstance(content, str):
        return ([content] if content else []), []
    segments: list[Segment] = []
    sources: list[ImageSource] = []
    item_path = f"input[{index}]"
    for k, part in enumerate(content):
        if k:
            segments.append(PART_SEPARATOR)
        kind = part["type"]
        if kind in ("input_text", "output_text"):
            if part["text"]:
                segments.append(part["text"])
        elif kind == "input_file":
            segments.append(UNSUPPORTED_DOCUMENT)
        elif opts.version is not ModelVersion.DeepseekV41Flash:
            segments.append(UNSUPPORTED_IMAGE)
        else:
            if assistant:
                raise ConversionError(f"{item_path}: Image in assistant message is unsupported")
            url = _image_url(part, f"{item_path}.content[{k}]")
            sources.append(url_image_source(url, part["detail"] or "high", item_path))
            segments.append(ImagePlaceholder(opts.image_token))
    return merge_text(segments), sources


class _Builder:
    """Walks the items once, keeping the open turn and the calls awaiting output."""

    def __init__(self, opts: HistoryOptions, loader: ToolSearchLoader) -> None:
        self.opts = opts
        self.loader = loader
        self.messages: list[Message] = []
        self.turn: _Turn | None = None
        self.pending: list[str] = []
        self.answered: dict[str, ToolMessage] = {}
        #: Messages announcing the tools that this turn's outputs loaded, in output order.
        self.loading: list[Message] = []
        self.seen_calls: set[str] = set()
        self.user_indexes: list[int] = []

    def flush_turn(self) -> None:
        turn = self.turn
        if turn is None:
            return
        self.turn = None
        if not (turn.has_message or turn.reasoning or turn.calls):
            return
        reasoning = "\n".join(turn.reasoning) if turn.reasoning else None
        # The official converter keys a turn's calls by id, so they come out in id order.
        calls = sorted(turn.calls, key=lambda c: c.id) or None
        self.messages.append(AssistantMessage(PART_SEPARATOR.join(turn.content), reasoning, calls))
        self.pending = [c.id for c in calls or []]
        self.answered = {}

    def interrupt(self) -> None:
        """An item other than an output after calls ends the turn: its outputs must be there."""
        if self.turn is not None and self.turn.calls:
            self.flush_turn()
            self.close_outputs()

    def close_outputs(self) -> None:
        """Before any non-output item: every call of the last turn must have its output."""
        if not self.pending:
            return
        for call_id in self.pending:
            if call_id not in self.answered:
                raise ConversionError(f"No tool output found for tool call {call_id}.")
        self.messages += [self.answered[c] for c in self.pending]
        self.messages += self.loading
        self.pending = []
        self.answered = {}
        self.loading = []

    def open_turn(self) -> _Turn:
        self.close_outputs()
        if self.turn is None:
            self.turn = _Turn()
        return self.turn

    def add_call(self, index: int, call: ToolCall) -> None:
        if call.id == "":
            raise ConversionError(
                f"Invalid 'input[{index}].call_id': empty string. Expected a string with minimum "
                "length 1, but got an empty string instead."
            )
        if call.id in self.seen_calls:
            raise ConversionError(f"Duplicate 'call_id': {call.id}.")
        self.seen_calls.add(call.id)
        self.open_turn().calls.append(call)

    def add_output(self, index: int, item: dict[str, Any]) -> None:
        call_id = item["call_id"]
        if call_id is None:
            # An output that names no call answers nothing: it stands alone, like a user turn.
            self.flush_turn()
            self.close_outputs()
            segments, sources = content_segments(item["output"], index, self.opts)
            self.messages.append(ToolMessage(segments, None, sources))
            return
        self.expect_output(call_id)
        segments, sources = content_segments(item["output"], index, self.opts)
        self.answered[call_id] = ToolMessage(segments, call_id, sources)

    def expect_output(self, call_id: str) -> None:
        """An output for `call_id` arrives: it must answer a call of the turn, once."""
        self.flush_turn()
        if call_id in self.answered:
            raise ConversionError(f"Duplicate tool output for call_id: {call_id}.")
        if call_id not in self.pending:
            raise ConversionError(f"No tool call found for tool output with call_id {call_id}.")

    def add_search_output(self, index: int, item: dict[str, Any]) -> None:
        """A tool search output: the found tools as the result, then offered as deferred."""
        tools = item["tools"]
        call_id = item["call_id"]
        self.expect_output(call_id)
        result = self.loader.result_text(index, tools)
        self.answered[call_id] = ToolMessage([result], call_id)
        names = self.loader.load(tools)
        if names:
            self.loading.append(loading_message(names))

    def add(self, index: int, item: Any) -> None:
        if item is s.UNSUPPORTED:
            return
        kind = item["type"]
        if kind == "web_search_call":
            self.interrupt()
            return
        if kind == "message" and item["role"] == "assistant":
            self.interrupt()
            turn = self.open_turn()
            segments, _ = content_segments(item["content"], index, self.opts, assistant=True)
            text = segments_text(segments)
            if text:
                turn.content.append(text)
            turn.has_message = True
        elif kind == "reasoning":
            self.interrupt()
            text = "\n".join(p["text"] for p in item["content"] or [])
            if text:
                turn = self.open_turn()
                if turn.content:
                    self.flush_turn()
                    turn = self.open_turn()
                turn.reasoning.append(text)
        elif kind == "function_call":
            name = item["name"]
            if item["namespace"] is not None:
                name = qualified_name(item["namespace"], name, self.opts.version)
            self.add_call(index, ToolCall(item["call_id"], name, item["arguments"]))
        elif kind == "custom_tool_call":
            arguments = dumps({"input": item["input"]})
            self.add_call(index, ToolCall(item["call_id"], item["name"], arguments))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.add_output(index, item)
        elif kind in ("tool_search_call", "tool_search_output"):
            if self.opts.version is not ModelVersion.DeepseekV41Flash:
                return  # V4 has no deferred tool loading: the search exchange is left out.
            if kind == "tool_search_call":
                self.add_call(index, search_call(item))
            else:
                self.add_search_output(index, item)
        else:
            self.flush_turn()
            self.close_outputs()
            segments, sources = content_segments(item["content"], index, self.opts)
            # V4.1 has mid-conversation system turns for developer messages; V4 reads them as user.
            developer_is_system = self.opts.version is ModelVersion.DeepseekV41Flash
            if item["role"] == "system" or (item["role"] == "developer" and developer_is_system):
                self.messages.append(SystemMessage(segments, sources))
            else:
                self.user_indexes.append(len(self.messages))
                self.messages.append(UserMessage(segments, sources))

    def finish(self) -> list[Message]:
        self.flush_turn()
        self.close_outputs()
        return self.messages


def build_messages(
    instructions: str | None,
    items: str | list[Any],
    opts: HistoryOptions,
    loader: ToolSearchLoader,
) -> list[Message]:
    """The conversation messages of a request, with the history checks.

    The tools that tool search outputs load are collected by `loader`; their
    declarations are checked before the history is read, so a bad one is reported
    before any problem of the history itself.
    """
    if opts.version is ModelVersion.DeepseekV41Flash and not isinstance(items, str):
        for index, item in enumerate(items):
            if item is not s.UNSUPPORTED and item["type"] == "tool_search_output":
                loader.check(index, item["tools"])
    builder = _Builder(opts, loader)
    if instructions:
        builder.messages.append(SystemMessage([instructions]))
    if isinstance(items, str):
        builder.user_indexes.append(len(builder.messages))
        builder.messages.append(UserMessage([items] if items else []))
    else:
        for index, item in enumerate(items):
            builder.add(index, item)
    messages = builder.finish()
    last_user = builder.user_indexes[-1] if builder.user_indexes else -1
    return settle_reasoning(messages, range(len(messages)), last_user, opts, "reasoning_text")
