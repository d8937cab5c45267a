"""Pieces: the protocol-neutral form of parsed model output that every generator renders.

The stream processor turns parser fragments into pieces through a generator's
`translate` (shared by all three protocols, so their delta boundaries agree)
and merges neighbouring pieces of one input unit; each protocol's generator
then renders the pieces as its own chunks or events.
"""

from __future__ import annotations

import copy
import random
import string
from dataclasses import dataclass
from typing import Self

from deepseek_recipe.inference import InferenceFinishReason
from deepseek_recipe.pyjson import quote
from deepseek_recipe.state_machine import Action, Kind

#: Piece kinds whose neighbours of the same kind in one unit are sent as one delta.
#: Adjacent JSON-mode spaces collapse into one.
MERGEABLE = frozenset({"content", "reasoning", "args_raw", "args_string", "space"})
#: Piece kinds that are answer text (JSON-mode spaces and labels included).
ANSWER_KINDS = frozenset({"content", "space", "label"})
_TEXT_KINDS = {Kind.RAW: "content", Kind.REASONING: "reasoning", Kind.TOOL_NAME: "name"}


@dataclass
class Piece:
    """Part of a delta: `data` is raw bytes for model text, a string for generated text."""

    kind: str
    data: bytes | str
    index: int


def renders_nothing(kind: str, text: str) -> bool:
    """A `break` only stops merging; an empty piece renders nothing unless it is a call header."""
    return kind == "break" or (text == "" and kind != "header")


def argument_json(kind: str, text: str) -> str:
    """Argument text as JSON: a string argument's text is escaped as the inside of a string."""
    return quote(text)[1:-1] if kind == "args_string" else text


_ALPHABET = string.ascii_letters + string.digits


_LABEL_PIECES = {
    0: [("args_open", "{")],
    1: [("args_comma", ", ")],
    2: [("args_colon", ": ")],
    3: [("args_quote", '"')],
    4: [("args_quote", '"')],
}


def _call_id(index: int, empty_thinking: bool = False) -> str:
    """A tool-call id; calls made in thinking mode without any reasoning are marked `ET_`."""
    rng = random.SystemRandom()
    body = "".join(rng.choice(_ALPHABET) for _ in range(20))
    digits = "".join(rng.choice(string.digits) for _ in range(4))
    marker = "ET_" if empty_thinking else ""
    return f"call_{index:02d}_{marker}{body}{digits}"


class PieceTranslator:
    """Turns parser fragments into pieces; the part every protocol generator shares.

    A generator adds `start`, `render` and `finish`, which shape pieces into its
    protocol's chunks or events.
    """

    def __init__(self, thinking: bool = False) -> None:
        self._tool_index = -1
        self._tool_name = b""
        self._tool_calls = 0
        #: The stop sequence that ended the output, for protocols that report it.
        self.stop_sequence: str | None = None
        self._thinking_mode = thinking
        self._reasoning_seen = False
        #: Indexes of tool calls made in thinking mode before any reasoning text.
        self._empty_thinking_calls: set[int] = set()
        #: Set once a `with_*` method has made a new generator from this one.
        self._consumed = False

    def call_id(self, index: int) -> str:
        return _call_id(index, index in self._empty_thinking_calls)

    def _take_over(self) -> Self:
        """A copy that carries on from here; this generator cannot make another."""
        if self._consumed:
            raise RuntimeError("chunk generator has been consumed")
        self._consumed = True
        new = copy.copy(self)
        new._consumed = False
        return new

    def stopped_after_tool_calls(self, reason: InferenceFinishReason, explicit: bool) -> bool:
        """The model itself stopped after calling tools: every protocol reports a tool stop."""
        return explicit and reason is InferenceFinishReason.Stop and self._tool_calls > 0

    def translate(self, action: Action, data: bytes) -> list[Piece]:
        """Turn one parser fragment into pieces; a `break` piece renders nothing, stops merging."""
        kind = action.kind
        if kind in (Kind.RAW, Kind.REASONING):
            if kind is Kind.REASONING and data:
                self._reasoning_seen = True
            return [self._piece(_TEXT_KINDS[kind], data)]
        if kind is Kind.TO_SPACE:
            return [self._piece("space", " ")]
        if kind is Kind.LABEL:
            return [self._piece("label", action.text)]
        if kind is Kind.TOOL_CALL_BEGIN:
            self._tool_index += 1
            self._tool_name = b""
            if self._thinking_mode and not self._reasoning_seen:
                self._empty_thinking_calls.add(self._tool_index)
            return [self._piece("break", "")]
        if kind is Kind.TOOL_NAME:
            self._tool_name += data
            return []
        if kind is Kind.TOOL_NAME_END:
            self._tool_calls += 1
            return [self._piece("header", self._tool_name.decode("utf-8", errors="replace"))]
        if kind is Kind.ARGS_LABEL:
            return [self._piece(k, v) for k, v in _LABEL_PIECES[action.label_id]]
        if kind is Kind.ARGS_RAW:
            return [self._piece("args_string" if action.string else "args_raw", data)]
        if kind is Kind.ARGS_END:
            return [self._piece("args_close", action.text)]
        if kind is Kind.STOP_SEQUENCE:
            self.stop_sequence = action.text
        return [self._piece("break", "")]

    def _piece(self, kind: str, data: bytes | str) -> Piece:
        if kind in MERGEABLE and isinstance(data, str):
            data = data.encode("utf-8")
        return Piece(kind, data, self._tool_index)
