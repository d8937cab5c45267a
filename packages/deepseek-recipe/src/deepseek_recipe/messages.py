"""Conversation messages, tool calls, tool definitions and image sources.

Message content is kept as a list of segments rather than one string so that an
image placeholder produced from a real image part can be told apart from the
same spelling typed by a user: only the former is a special token when the
prompt is encoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deepseek_recipe._image_args import expect_instance
from deepseek_recipe.image_sources import (
    BytesImageSource,
    DataUrlImageSource,
    ImageDetail,
    ImageSource,
    UrlImageSource,
)
from deepseek_recipe.reprs import rust_str as _rust_str
from deepseek_recipe.tokens import DEFAULT_SPELLINGS

__all__ = [
    "AssistantMessage",
    "BytesImageSource",
    "DataUrlImageSource",
    "ImageDetail",
    "ImagePlaceholder",
    "ImageSource",
    "LatestReminderMessage",
    "Message",
    "Segment",
    "SystemMessage",
    "ToolCall",
    "ToolDefinition",
    "ToolMessage",
    "UrlImageSource",
    "UserMessage",
    "join_segments",
    "split_placeholders",
]


@dataclass(frozen=True)
class ImagePlaceholder:
    """A content segment that stands for one image source."""

    spelling: str


Segment = str | ImagePlaceholder


class ToolCall:
    """A historical tool call; `arguments` is expected to be a JSON object but is not validated."""

    def __init__(self, id: str, name: str, arguments: str) -> None:
        self._id = id
        self._name = name
        self._arguments = arguments

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._name

    @property
    def arguments(self) -> str:
        return self._arguments

    def __repr__(self) -> str:
        args = _rust_str(self._arguments)
        return f"ToolCall(id={_rust_str(self._id)}, name={_rust_str(self._name)}, arguments={args})"


class ToolDefinition:
    """A client tool definition; `strict` is passed through unchanged."""

    def __init__(
        self,
        name: str,
        description: str | None = None,
        parameters: Any = None,
        strict: bool | None = None,
        defer_loading: bool = False,
    ) -> None:
        self._name = name
        self._description = description
        self._parameters = parameters
        self._strict = strict
        self._defer_loading = defer_loading

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str | None:
        return self._description

    @property
    def parameters(self) -> Any:
        return self._parameters

    @property
    def strict(self) -> bool | None:
        return self._strict

    @property
    def defer_loading(self) -> bool:
        return self._defer_loading

    def __repr__(self) -> str:
        desc = "None" if self._description is None else f"Some({_rust_str(self._description)})"
        strict = "None" if self._strict is None else f"Some({str(self._strict).lower()})"
        return f"ToolDefinition(name={_rust_str(self._name)}, description={desc}, strict={strict})"


def split_placeholders(content: str, n_images: int, image_token: str | None) -> list[Segment]:
    """Turn the first `n_images` occurrences of the image spelling into placeholders."""
    token = DEFAULT_SPELLINGS["image"] if image_token is None else image_token
    if token == "":
        raise ValueError("image_token must not be empty")
    segments: list[Segment] = []
    rest = content
    for _ in range(n_images):
        at = rest.find(token)
        if at < 0:
            break
        if at:
            segments.append(rest[:at])
        segments.append(ImagePlaceholder(token))
        rest = rest[at + len(token) :]
    if rest:
        segments.append(rest)
    return segments


def join_segments(segments: Sequence[Segment]) -> str:
    return "".join(s.spelling if isinstance(s, ImagePlaceholder) else s for s in segments)


class Message:
    """Base class of conversation messages; role-specific properties have fixed values elsewhere."""

    _role: str = ""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self._segments: list[Segment] = list(segments)

    @property
    def role(self) -> str:
        return self._role

    @property
    def content(self) -> str:
        return join_segments(self._segments)

    @property
    def segments(self) -> list[Segment]:
        """Content split into text and image placeholders (extension of the official API)."""
        return list(self._segments)

    @property
    def reasoning_content(self) -> str | None:
        return None

    @property
    def tool_calls(self) -> list[ToolCall] | None:
        return None

    @property
    def tool_call_id(self) -> str | None:
        return None

    @property
    def image_sources(self) -> list[ImageSource]:
        return []

    @property
    def prefix(self) -> bool:
        return False


class _ImageMessage(Message):
    def __init__(
        self,
        content: str | Sequence[Segment],
        image_sources: Sequence[ImageSource] | None,
        image_token: str | None,
    ) -> None:
        if not isinstance(content, (str, list, tuple)):
            # Text, as in the official API; a segment list is this package's extension.
            expect_instance(content, str, "content")
        sources = list(image_sources or [])
        if isinstance(content, str):
            segments = split_placeholders(content, len(sources), image_token)
        else:
            segments = list(content)
        super().__init__(segments)
        self._image_sources = sources

    @property
    def image_sources(self) -> list[ImageSource]:
        return list(self._image_sources)


class SystemMessage(_ImageMessage):
    """A system message; `tools` are tools it loads mid-conversation (V4.1 shows their schemas)."""

    _role = "system"

    def __init__(
        self,
        content: str | Sequence[Segment],
        image_sources: Sequence[ImageSource] | None = None,
        tools: Sequence[ToolDefinition] | None = None,
        *,
        image_token: str | None = None,
    ) -> None:
        super().__init__(content, image_sources, image_token)
        self._tools = None if tools is None else list(tools)

    @property
    def tools(self) -> list[ToolDefinition] | None:
        return None if self._tools is None else list(self._tools)

    def __repr__(self) -> str:
        return f"SystemMessage({_rust_str(self.content)})"


class UserMessage(_ImageMessage):
    """A user message."""

    _role = "user"

    def __init__(
        self,
        content: str | Sequence[Segment],
        image_sources: Sequence[ImageSource] | None = None,
        *,
        image_token: str | None = None,
    ) -> None:
        super().__init__(content, image_sources, image_token)

    def __repr__(self) -> str:
        return f"UserMessage({_rust_str(self.content)}, image_sources={len(self._image_sources)})"


class ToolMessage(_ImageMessage):
    """A tool result message."""

    _role = "tool"

    def __init__(
        self,
        content: str | Sequence[Segment],
        tool_call_id: str | None = None,
        image_sources: Sequence[ImageSource] | None = None,
        *,
        image_token: str | None = None,
    ) -> None:
        super().__init__(content, image_sources, image_token)
        self._tool_call_id = tool_call_id

    @property
    def tool_call_id(self) -> str | None:
        return self._tool_call_id

    def __repr__(self) -> str:
        tid = "None" if self._tool_call_id is None else f"Some({_rust_str(self._tool_call_id)})"
        n = len(self._image_sources)
        return f"ToolMessage({_rust_str(self.content)}, tool_call_id={tid}, image_sources={n})"


class AssistantMessage(Message):
    """An assistant message; `prefix` marks a partial turn the model should continue."""

    _role = "assistant"

    def __init__(
        self,
        content: str,
        reasoning_content: str | None = None,
        tool_calls: Sequence[ToolCall] | None = None,
        prefix: bool = False,
    ) -> None:
        # The official constructor refuses anything but text (even `None`) as content: a
        # message with no answer is spelled with empty content.
        expect_instance(content, str, "content")
        if reasoning_content is not None:
            expect_instance(reasoning_content, str, "reasoning_content")
        calls = None if tool_calls is None else list(tool_calls)
        for call in calls or []:
            expect_instance(call, ToolCall, "tool_calls")
        expect_instance(prefix, bool, "prefix")
        super().__init__([content] if content else [])
        self._reasoning_content = reasoning_content
        self._tool_calls = calls
        self._prefix = prefix

    @property
    def reasoning_content(self) -> str | None:
        return self._reasoning_content

    @property
    def tool_calls(self) -> list[ToolCall] | None:
        return None if self._tool_calls is None else list(self._tool_calls)

    @property
    def prefix(self) -> bool:
        return self._prefix

    def __repr__(self) -> str:
        has_reasoning = str(self._reasoning_content is not None)
        n_calls = len(self._tool_calls or [])
        return (
            f"AssistantMessage({_rust_str(self.content)}, reasoning_content={has_reasoning}, "
            f"tool_calls={n_calls}, prefix={self._prefix})"
        )


class LatestReminderMessage(Message):
    """A reminder message carrying additional instructions for the next turn."""

    _role = "latest_reminder"

    def __init__(self, content: str) -> None:
        expect_instance(content, str, "content")
        super().__init__([content] if content else [])

    def __repr__(self) -> str:
        return f"LatestReminderMessage({_rust_str(self.content)})"
