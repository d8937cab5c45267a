"""The model-independent conversation that the encodings render."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from deepseek_recipe.messages import Message, ToolDefinition
from deepseek_recipe.reprs import rust_str as _rust_str

ToolChoice = Literal["auto", "none", "required"]
ReasoningEffort = Literal["low", "high", "xhigh", "max"]
ResponseFormat = Literal["text", "json_object", "json_schema", "regex"]

_TOOL_CHOICES = ("auto", "none", "required")
_EFFORTS = ("low", "high", "xhigh", "max")


class Conversation:
    """A conversation plus the prompt settings that shape how it renders.

    `response_schema` and `response_regex` select their formats implicitly, as in
    the official API, so a caller cannot build a contradictory combination.
    """

    def __init__(
        self,
        messages: Sequence[Message] | None = None,
        *,
        thinking_mode: bool = True,
        tools: Sequence[ToolDefinition] | None = None,
        tool_choice: ToolChoice = "auto",
        reasoning_effort: ReasoningEffort | None = None,
        response_format: Literal["text", "json_object"] = "text",
        response_schema: Any | None = None,
        response_regex: str | None = None,
    ) -> None:
        if tool_choice not in _TOOL_CHOICES:
            raise ValueError(f"unknown tool_choice {tool_choice!r}")
        if reasoning_effort is not None and reasoning_effort not in _EFFORTS:
            raise ValueError(f"unknown reasoning_effort {reasoning_effort!r}")
        if response_format not in ("text", "json_object"):
            raise ValueError(f"unknown response_format {response_format!r}")
        if response_schema is not None and response_regex is not None:
            raise ValueError("response_schema and response_regex are mutually exclusive")
        if response_format == "json_object" and (
            response_schema is not None or response_regex is not None
        ):
            raise ValueError(
                "response_format json_object excludes response_schema and response_regex"
            )
        self._messages = list(messages or [])
        self._thinking_mode = thinking_mode
        self._tools = list(tools or [])
        self._tool_choice: ToolChoice = tool_choice
        self._reasoning_effort = reasoning_effort
        self._response_schema = response_schema
        self._response_regex = response_regex
        fmt: ResponseFormat = response_format
        if response_schema is not None:
            fmt = "json_schema"
        elif response_regex is not None:
            fmt = "regex"
        self._response_format: ResponseFormat = fmt

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)

    @property
    def thinking_mode(self) -> bool:
        return self._thinking_mode

    @property
    def tools(self) -> list[ToolDefinition]:
        return list(self._tools)

    @property
    def tool_choice(self) -> ToolChoice:
        return self._tool_choice

    @property
    def reasoning_effort(self) -> ReasoningEffort | None:
        return self._reasoning_effort

    @property
    def response_format(self) -> ResponseFormat:
        return self._response_format

    @property
    def response_schema(self) -> Any | None:
        return self._response_schema

    @property
    def response_regex(self) -> str | None:
        return self._response_regex

    def __repr__(self) -> str:
        effort = (
            "None"
            if self._reasoning_effort is None
            else f"Some({_rust_str(self._reasoning_effort)})"
        )
        return (
            f"Conversation(messages={len(self._messages)}, thinking_mode={self._thinking_mode!s}, "
            f"tools={len(self._tools)}, tool_choice={_rust_str(self._tool_choice)}, "
            f"reasoning_effort={effort}, response_format={_rust_str(self._response_format)})"
        )
