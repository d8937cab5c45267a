"""Settings handed from conversion to the output parser."""

from __future__ import annotations

from collections.abc import Sequence

from deepseek_recipe.options import _NamedEnum
from deepseek_recipe.tokens import SpecialTokens


class ThinkingInitialStage(_NamedEnum):
    """Where parsing begins in thinking mode.

    A prefix continuation must not lose the newlines the caller already sent, so
    only a fresh turn (`ReasoningStart`) strips leading newlines.
    """

    ReasoningStart = "reasoning_start"
    ReasoningContinuation = "reasoning_continuation"
    ContentContinuation = "content_continuation"

    def starts_in_reasoning(self) -> bool:
        """Return whether parsing begins in reasoning content."""
        return self is not ThinkingInitialStage.ContentContinuation


class ParsingOptions:
    """Settings passed to the stream parser."""

    def __init__(
        self,
        *,
        parse_tool_calls: bool = True,
        starts_in_tool_calls: bool = False,
        parse_json_output: bool = False,
        thinking_initial_stage: ThinkingInitialStage | None = None,
        stop_sequences: Sequence[str] | None = None,
        special_tokens: SpecialTokens | None = None,
    ) -> None:
        self.parse_tool_calls = parse_tool_calls
        self.starts_in_tool_calls = starts_in_tool_calls
        self.parse_json_output = parse_json_output
        self.thinking_initial_stage = thinking_initial_stage
        self._stop_sequences = list(stop_sequences or [])
        self._special_tokens = special_tokens or SpecialTokens()

    @property
    def stop_sequences(self) -> list[str]:
        return list(self._stop_sequences)

    @stop_sequences.setter
    def stop_sequences(self, value: Sequence[str]) -> None:
        self._stop_sequences = list(value)

    @property
    def special_tokens(self) -> SpecialTokens:
        return self._special_tokens

    @special_tokens.setter
    def special_tokens(self, value: SpecialTokens) -> None:
        self._special_tokens = value

    def __repr__(self) -> str:
        return (
            f"ParsingOptions(parse_tool_calls={self.parse_tool_calls}, "
            f"starts_in_tool_calls={self.starts_in_tool_calls}, "
            f"parse_json_output={self.parse_json_output}, "
            f"thinking_initial_stage={self.thinking_initial_stage}, "
            f"stop_sequences={self._stop_sequences!r})"
        )
