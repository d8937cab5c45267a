"""The V4 and V4.1 prompt encodings: render a conversation, then encode it."""

from __future__ import annotations

from dataclasses import dataclass, field

from deepseek_recipe.conversation import Conversation
from deepseek_recipe.messages import ImageSource
from deepseek_recipe.pieces import Piece, assemble
from deepseek_recipe.prompt_text import (
    SCHEMA_FORMAT_HEADER,
    V4_JSON_OBJECT_FORMAT,
    v4_effort_prefix,
    v41_effort_prefix,
)
from deepseek_recipe.pyjson import format_float, python_float
from deepseek_recipe.render import Flavor, Renderer
from deepseek_recipe.tokenizer import Tokenizer
from deepseek_recipe.tokens import SpecialTokens

V4_FLAVOR = Flavor(
    mid_conversation_system=False,
    block="tool_calls",
    invoke="invoke",
    parameter="parameter",
    blank_line_in_empty_invoke=False,
    json_object_format=V4_JSON_OBJECT_FORMAT,
    effort_prefix=v4_effort_prefix,
    system_token=False,
    tool_after_user_opens_turn=True,
    float_format=format_float,
    reasoning_by_presence=True,
    sort_calls_by_id=True,
    schema_lines_end_with_newline=True,
    block_for_empty_calls=True,
)

V41_FLAVOR = Flavor(
    mid_conversation_system=True,
    block=" calls",
    invoke=" invoke",
    parameter=" parameter",
    blank_line_in_empty_invoke=True,
    json_object_format=SCHEMA_FORMAT_HEADER + '{"type": "json_object"}',
    effort_prefix=v41_effort_prefix,
    system_token=True,
    tool_after_user_opens_turn=False,
    float_format=python_float,
    reasoning_by_presence=False,
)


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt, the code-point ranges of its special tokens, and its images."""

    prompt: str
    special_ranges: list[tuple[int, int]]
    image_sources: list[ImageSource] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list, repr=False, compare=False)

    def __repr__(self) -> str:
        n = len(self.image_sources)
        return f"RenderedPrompt(prompt=<{len(self.prompt)} characters>, image_sources={n})"


class _Encoding:
    _flavor: Flavor

    def __init__(self) -> None:
        self._tokenizer: Tokenizer | None = None
        self._tokens = SpecialTokens()

    def _clone(self) -> _Encoding:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def with_tokenizer(self, tokenizer: Tokenizer) -> _Encoding:
        """Return a new encoding that uses `tokenizer` for `encode`."""
        new = self._clone()
        new._tokenizer = tokenizer
        return new

    def with_special_tokens(self, special_tokens: SpecialTokens) -> _Encoding:
        """Return a new encoding that renders prompts with `special_tokens`."""
        new = self._clone()
        new._tokens = special_tokens
        return new

    def render_conversation(self, conversation: Conversation) -> RenderedPrompt:
        pieces, sources = Renderer(self._flavor, self._tokens).render(conversation)
        prompt, ranges, merged = assemble(pieces)
        return RenderedPrompt(prompt, ranges, sources, merged)

    def encode(self, conversation: Conversation) -> list[int]:
        """Encode into ids: special pieces map to their added-token ids, text uses plain BPE."""
        if self._tokenizer is None:
            raise RuntimeError("no tokenizer is attached to the encoding")
        return self._tokenizer.encode_pieces(self.render_conversation(conversation).pieces)


class DeepseekV4Encoding(_Encoding):
    """The V4 prompt encoding (DeepSeek-V4-Pro / V4-Flash)."""

    _flavor = V4_FLAVOR


class DeepseekV41Encoding(_Encoding):
    """The V4.1 prompt encoding (DeepSeek-V4.1-Flash)."""

    _flavor = V41_FLAVOR
