"""Decoded chat messages → conversation messages, with the history checks.

The checks mirror the public API: tool results must answer the immediately
preceding assistant tool calls, a prefix message must be the final assistant
message, and (optionally) thinking-mode tool-call turns must carry their
reasoning back.
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


def _check_tool_sequence(messages: list[DecodedMessage]) -> None:
    pending: list[str] | None = None
    answered: set[str] = set()
    for index, msg in enumerate(messages):
        if msg.role == "tool":
            if pending is None:
                raise ConversionError(
                    "Messages with role 'tool' must be a response to a preceding message with "
                    "'tool_calls'"
                )
            call_id = msg.tool_call_id or ""
            if call_id not in pending:
                raise ConversionError(
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to "
                    "each 'tool_call_id', The following tool_call_ids did not have response "
                    f"messages: {call_id}"
                )
            if call_id in answered:
                raise ConversionError(
                    "Messages with role 'tool' must be a response to a preceding message with "
                    "'tool_calls'"
                )
            answered.add(call_id)
            if answered >= set(pending):
                pending = None
            continue
        if pending is not None:
            raise ConversionError(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each "
                "'tool_call_id'. (insufficient tool messages following tool_calls message)"
            )
        if msg.role == "assistant" and msg.tool_calls is not None:
            if not msg.tool_calls:
                raise ConversionError(
                    f"Invalid 'messages[{index}].tool_calls': empty array. Expected an array "
                    "with minimum "
                    "length 1, but got an empty array instead."
                )
            ids = [c.id for c in msg.tool_calls]
            for call_id in ids:
                if ids.count(call_id) > 1:
                    raise ConversionError(
                        f"Duplicate value for 'tool_call_id' of {call_id} in message[{index}]"
                    )
            pending = ids
            answered = set()
    if pending is not None:
        raise ConversionError(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each "
            "'tool_call_id'. (insufficient tool messages following tool_calls message)"
        )


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
    """Validate the history and build conversation messages."""
    opts = HistoryOptions.from_conversion(version, thinking, options, has_tools=has_tools)
    converted = [
        _segments(msg.content, version, opts.image_token, f".messages[{index}]", msg.role)
        for index, msg in enumerate(decoded)
    ]
    _check_tool_sequence(decoded)
    _check_prefix(decoded)
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
    return out
