"""The request settings a Responses response object reports back.

A Responses response repeats the request's settings (instructions, sampling,
tools, text format ...) as the client sent them, not as conversion resolved
them, so they are captured from the decoded body before conversion.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe.protocol_json import F32
from deepseek_recipe.responses_tools import echo_tools


class ResponsesEcho:
    """Request settings that Responses response objects report, as the request specified them.

    The constructor builds the settings of an unspecified request: no
    instructions, output token limit, or user; temperature and `top_p` of 1.0;
    zero `top_logprobs`.  The reasoning, text, tool choice, and tool settings
    are reported only through the response.
    """

    def __init__(self) -> None:
        self._instructions: str | None = None
        self._max_output_tokens: int | None = None
        self._temperature = F32(1.0)
        self._top_p = F32(1.0)
        self._top_logprobs = 0
        self._user: str | None = None
        self._reasoning: dict[str, Any] = {"effort": None, "summary": None}
        self._text: dict[str, Any] = {"format": {"type": "text"}, "verbosity": None}
        self._tool_choice: Any = "auto"
        self._tools: list[dict[str, Any]] = []

    @staticmethod
    def from_request(decoded: dict[str, Any]) -> ResponsesEcho:
        echo = ResponsesEcho()
        echo._instructions = decoded["instructions"]
        echo._max_output_tokens = decoded["max_output_tokens"]
        if decoded["temperature"] is not None:
            echo._temperature = F32(decoded["temperature"])
        if decoded["top_p"] is not None:
            echo._top_p = F32(decoded["top_p"])
        if decoded["top_logprobs"] is not None:
            echo._top_logprobs = decoded["top_logprobs"]
        echo._user = decoded["user"]
        reasoning = decoded["reasoning"]
        if reasoning is not None:
            summary = reasoning["summary"]
            if summary is None:
                summary = reasoning["generate_summary"]
            echo._reasoning = {"effort": reasoning["effort"], "summary": summary}
        text = decoded["text"]
        if text is not None:
            fmt = text["format"] or {"type": "text"}
            if fmt["type"] == "json_schema":
                fmt = {
                    "type": "json_schema",
                    "name": fmt["name"],
                    "schema": fmt["schema"],
                    "description": fmt["description"],
                    "strict": fmt["strict"],
                }
            else:
                fmt = {"type": fmt["type"]}
            echo._text = {"format": fmt, "verbosity": text["verbosity"]}
        choice = decoded["tool_choice"]
        if isinstance(choice, dict):
            choice = {
                "type": choice["type"],
                **({"name": choice["name"]} if "name" in choice else {}),
            }
        if choice is not None:
            echo._tool_choice = choice
        echo._tools = echo_tools(decoded["tools"])
        return echo

    @property
    def instructions(self) -> str | None:
        return self._instructions

    @property
    def max_output_tokens(self) -> int | None:
        return self._max_output_tokens

    @property
    def temperature(self) -> float:
        """The requested temperature or 1.0, not the sampling temperature."""
        return float(self._temperature)

    @property
    def top_p(self) -> float:
        """The requested `top_p` or 1.0, not the sampling `top_p`."""
        return float(self._top_p)

    @property
    def top_logprobs(self) -> int:
        """The requested `top_logprobs`, or 0."""
        return self._top_logprobs

    @property
    def user(self) -> str | None:
        return self._user

    def response_fields(self) -> dict[str, Any]:
        """The echoed part of a response object, keyed by its field names."""
        return {
            "instructions": self._instructions,
            "max_output_tokens": self._max_output_tokens,
            "reasoning": dict(self._reasoning),
            "temperature": self._temperature,
            "text": self._text,
            "tool_choice": self._tool_choice,
            "tools": self._tools,
            "top_logprobs": self._top_logprobs,
            "top_p": self._top_p,
            "user": self._user,
        }
