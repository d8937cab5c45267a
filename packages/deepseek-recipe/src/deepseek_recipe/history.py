"""Decoded chat messages → conversation messages, with the history checks.

The checks mirror the public API: tool results must answer the immediately
preceding assistant tool calls, an assistant message needs content or tool
calls, (optionally) thinking-mode tool-call turns must carry their reasoning
back, and a prefix message must be the final assistant message.
"""

from __future__ import annotations

from deepseek_recipe.body import ContentPart, DecodedMessage
from deepseek_recipe.content_segments import (
    PART_SEPARATOR,
    UNSUPPORTED_IMAGE,
    merge_text,
    segments_text,
    url_image_source,
)
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history_options import HistoryOptions
from deepseek_recipe.history_reasoning import carried_reasoning
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
from deepseek_recipe.options import ConversionOptions, ModelVersion

_UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to "
    "each 'tool_call_id'. (insufficient tool messages following tool_calls message)"
)
_ORPHAN_RESULT = (
    "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
)


class _ToolTurns:
    """Follows tool calls through the history: each call answered, right after it, once.

    The official converter checks this message by message, interleaved with the
    other per-message checks, so `visit` is called once per message in order and
    `finish` after the last.
    """

    def __init__(self) -> None:
        self._pending: list[str] | None = None
        self._answered: set[str] = set()

    def visit(self, index: int, msg: DecodedMessage) -> None:
        if msg.role == "tool":
            self._answer(msg.tool_call_id or "")
            return
        if self._pending is not None:
            raise ConversionError(_UNANSWERED)
        if msg.role == "assistant" and msg.tool_calls is not None:
            self._open(index, [c.id for c in msg.tool_calls])

    def finish(self) -> None:
        if self._pending is not None:
            raise ConversionError(_UNANSWERED)

    def _answer(self, call_id: str) -> None:
        if self._pending is None:
            raise ConversionError(_ORPHAN_RESULT)
        if call_id not in self._pending:
            raise ConversionError(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id', The following tool_call_ids did not have "
                f"response messages: {call_id}"
            )
        if call_id in self._answered:
            raise ConversionError(_ORPHAN_RESULT)
        self._answered.add(call_id)
        if self._answered >= set(self._pending):
            self._pending = None

    def _open(self, index: int, ids: list[str]) -> None:
        if not ids:
            raise ConversionError(
                f"Invalid 'messages[{index}].tool_calls': empty array. Expected an array with "
                "minimum length 1, but got an empty array instead."
            )
        for call_id in ids:
            if ids.count(call_id) > 1:
                raise ConversionError(
                    f"Duplicate value for 'tool_call_id' of {call_id} in message[{index}]"
                )
        self._pending = ids
        self._answered = set()


def _check_answer(msg: DecodedMessage) -> None:
    """An assistant message must say something: content (even empty) or tool calls."""
    if msg.role == "assistant" and msg.content is None and msg.tool_calls is None:
        raise ConversionError("Invalid assistant message: content or tool_calls must be set")


def _check_prefix(messages: list[DecodedMessage]) -> None:
    for index, msg in enumerate(messages):
        if msg.prefix and (index != len(messages) - 1 or msg.role != "assistant"):
            raise ConversionError(
                "Invalid completion message: prefix set true with message which is not final "
                "message "
                "or message role is not assistant"
            )


def _segments(
    content: str | list[ContentPart] | None,
    version: ModelVersion,
    image_token: str,
    path: str,
    role: str,
) -> tuple[list[Segment], list[ImageSource]]:
    """Flatten content parts; text parts join with a blank line, images become placeholders."""
    if content is None:
        return [], []
    if isinstance(content, str):
        return ([content] if content else []), []
    segments: list[Segment] = []
    sources: list[ImageSource] = []
    for i, part in enumerate(content):
        if i:
            segments.append(PART_SEPARATOR)
        if part.kind == "text":
            if part.text:
                segments.append(part.text)
        elif part.kind == "file" and version is ModelVersion.DeepseekV41Flash:
            raise ConversionError(f"{path}: file must have a file_id or file_data")
        elif part.kind == "image_url" and version is ModelVersion.DeepseekV41Flash:
            if role == "assistant":
                raise ConversionError("Image in assistant message is not supported")
            sources.append(url_image_source(part.url, part.detail, path))  # type: ignore[arg-type]
            segments.append(ImagePlaceholder(image_token))
        else:
            segments.append(UNSUPPORTED_IMAGE)
    return merge_text(segments), sources


def build_messages(
    decoded: list[DecodedMessage],
    version: ModelVersion,
    thinking: bool,
    options: ConversionOptions,
    has_tools: bool,
) -> list[Message]:
    """Validate the history and build conversation messages.

    Checks run in the official order: one pass over the messages (tool-call
    pairing, then content, then the assistant's answer), then the carried
    reasoning, then the prefix placement.
    """
    opts = HistoryOptions.from_conversion(version, thinking, options, has_tools=has_tools)
    turns = _ToolTurns()
    converted: list[tuple[list[Segment], list[ImageSource]]] = []
    for index, msg in enumerate(decoded):
        turns.visit(index, msg)
        path = f".messages[{index}]"
        converted.append(_segments(msg.content, version, opts.image_token, path, msg.role))
        _check_answer(msg)
    turns.finish()
    last_user = max((i for i, m in enumerate(decoded) if m.role == "user"), default=-1)
    out: list[Message] = []
    for index, (msg, (segments, sources)) in enumerate(zip(decoded, converted, strict=True)):
        if msg.role == "system":
            if not segments:
                continue
            out.append(SystemMessage(segments, sources))
        elif msg.role == "user":
            out.append(UserMessage(segments, sources))
        elif msg.role == "tool":
            out.append(ToolMessage(segments, msg.tool_call_id, sources))
        elif msg.role == "latest_reminder":
            out.append(LatestReminderMessage(msg.content if isinstance(msg.content, str) else ""))
        else:
            calls = None
            if msg.tool_calls is not None:
                calls = [ToolCall(c.id, c.name, c.arguments) for c in msg.tool_calls]
            reasoning = carried_reasoning(
                msg.reasoning_content,
                opts,
                has_calls=bool(calls),
                after_last_user=index > last_user,
                field="reasoning_content",
            )
            out.append(AssistantMessage(segments_text(segments), reasoning, calls, msg.prefix))
    _check_prefix(decoded)
    return out
