"""`StreamProcessor`: backend chunks → parsed, protocol-shaped chunks.

Output is attributed to the input unit (one text chunk, a run of ordinary
tokens, or one control token) that produced it.  A unit's output is released
once the parser has decided every byte of it; before that, everything except
the pieces of the latest segment (which may still grow) goes out.  That is why
a delta never straddles two units and why a marker split across units is held
back rather than leaked.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from deepseek_recipe.inference import InferenceChunk, InferenceFinishReason, PromptUsage
from deepseek_recipe.parsing_options import ParsingOptions
from deepseek_recipe.state_machine import Action, Kind, StateMachine, byte_encoder, symbol_encoder
from deepseek_recipe.stream_pieces import MERGEABLE, Piece
from deepseek_recipe.tokenizer import Tokenizer

#: Control tokens become parser symbols above the byte range.
_SYMBOL_BASE = 256

#: Actions whose bytes are output text and so are divided between the units that produced them.
#: A run of JSON-mode surrounding text becomes one space in every unit it covers.
_SPLIT_KINDS = frozenset({Kind.RAW, Kind.REASONING, Kind.TOOL_NAME, Kind.ARGS_RAW, Kind.TO_SPACE})


@dataclass
class _Unit:
    """One input unit and the output pieces attributed to it so far."""

    size: int
    consumed: int = 0
    pieces: list[Piece] = field(default_factory=list)
    emitted: int = 0
    held_from: int = 0

    @property
    def resolved(self) -> bool:
        return self.consumed == self.size


def _utf8_length(lead: int) -> int:
    """Sequence length announced by a UTF-8 lead byte (1 for ASCII or invalid bytes)."""
    if lead >> 5 == 0b110:
        return 2
    if lead >> 4 == 0b1110:
        return 3
    if lead >> 3 == 0b11110:
        return 4
    return 1


def _incomplete_utf8(data: bytes) -> bool:
    """Whether `data` ends part-way through a UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:
            return _utf8_length(byte) > back
    return False


class StreamProcessor:
    """Feed `InferenceChunk`s with `push`; collect protocol chunks from the return values."""

    def __init__(
        self, generator: Any, options: ParsingOptions, tokenizer: Tokenizer | None = None
    ) -> None:
        self._gen = generator
        self._options = options
        self._tokenizer = tokenizer
        self._sm: StateMachine | None = None
        self._symbol_bytes: dict[int, bytes] = {}
        self._buffer: list[int] = []
        self._units: deque[_Unit] = deque()
        self._started = False
        self._finished = False
        self._closed = False
        self._stopped = False
        self._completion_tokens = 0
        self._reasoning_text: list[str] = []
        self._usage = PromptUsage()
        self._fingerprint: str | None = None
        self._pending = b""
        self._pending_count = 0

    @property
    def finished(self) -> bool:
        """Whether processing completed normally and the processor remains unclosed."""
        return self._finished and not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("stream processor is closed")
        if self._finished:
            raise RuntimeError("stream processor has finished")

    def _start(self, out: list[Any]) -> None:
        if not self._started:
            self._started = True
            out += self._gen.start(self._fingerprint, self._usage)

    def push(self, chunk: InferenceChunk) -> list[Any]:
        self._check_open()
        out: list[Any] = []
        if chunk.kind == "ready":
            if not self._started:
                self._usage = chunk.prompt_usage or PromptUsage()
                self._fingerprint = chunk.system_fingerprint
                self._start(out)
            return out
        if chunk.kind == "finish":
            self._start(out)
            out += self._complete(chunk.finish_reason or InferenceFinishReason.Stop, explicit=True)
            return out
        if chunk.kind == "text":
            self._machine(tokens=False)
            self._feed([(list((chunk.content or "").encode("utf-8")), chunk.token_count or 0)], out)
        else:
            out += self._push_tokens(chunk)
        return out

    def _push_tokens(self, chunk: InferenceChunk) -> list[Any]:
        if self._tokenizer is None:
            self._closed = True
            raise RuntimeError("token chunk received without a tokenizer")
        ids = chunk.token_ids or []
        if chunk.logprobs is not None and len(chunk.logprobs) != len(ids):
            self._closed = True
            raise RuntimeError(
                f"invalid log probabilities: {len(chunk.logprobs)} log probabilities for "
                f"{len(ids)} token IDs"
            )
        # Ordinary tokens of one chunk form one unit; each added (control) token is its own
        # unit. Text ending inside a UTF-8 sequence waits, with its token count, for the rest.
        self._machine(tokens=True)
        units: list[tuple[list[int], int]] = []
        for token_id in ids:
            if not self._tokenizer.is_known(token_id):
                continue
            data = self._tokenizer.token_bytes(token_id)
            symbol = _SYMBOL_BASE + token_id
            if self._tokenizer.is_added(token_id):
                if self._pending:
                    units.append((list(self._pending), self._pending_count))
                    self._pending, self._pending_count = b"", 0
                units.append(([symbol] if symbol in self._symbol_bytes else list(data), 1))
                continue
            self._pending += data
            self._pending_count += 1
        if self._pending and not _incomplete_utf8(self._pending):
            units.append((list(self._pending), self._pending_count))
            self._pending, self._pending_count = b"", 0
        out: list[Any] = []
        self._feed(units, out)
        return out

    def _machine(self, tokens: bool) -> StateMachine:
        """Create the parser on first output; token input matches control tokens as symbols."""
        if self._sm is None:
            encoder = byte_encoder
            if tokens and self._tokenizer is not None:
                specials = {
                    spelling: _SYMBOL_BASE + token_id
                    for spelling, token_id in self._tokenizer.added_tokens().items()
                }
                self._symbol_bytes = {
                    sym: spelling.encode("utf-8") for spelling, sym in specials.items()
                }
                encoder = symbol_encoder(specials)
            self._sm = StateMachine(self._options, encoder)
        return self._sm

    def _bytes(self, symbols: list[int]) -> bytes:
        try:
            return bytes(symbols)
        except ValueError:  # a control-token symbol is among them
            pass
        return b"".join(
            self._symbol_bytes[s] if s >= _SYMBOL_BASE else bytes((s,)) for s in symbols
        )

    def _feed(self, units: list[tuple[list[int], int]], out: list[Any]) -> None:
        """Parse units in order; input after a stop sequence is neither parsed nor counted."""
        sm = self._machine(tokens=False)
        for data, tokens in units:
            if self._stopped:
                return
            if not data:
                self._completion_tokens += tokens
                continue
            self._start(out)
            self._completion_tokens += tokens
            self._units.append(_Unit(len(data)))
            self._buffer += data
            self._assign(sm.feed(data))
            out += self._release()
            if self._stopped:
                out += self._complete(InferenceFinishReason.Stop, explicit=False)
                return

    def _assign(self, segments: list[tuple[Action, int]]) -> None:
        """Split parser segments over the units whose bytes they cover."""
        for action, length in segments:
            if action.kind is Kind.STOP_SEQUENCE:
                self._stopped = True
            remaining = length
            covered: list[_Unit] = []
            for unit in self._units:
                if remaining == 0:
                    break
                room = unit.size - unit.consumed
                if room == 0:
                    continue
                take = min(room, remaining)
                data = self._bytes(self._buffer[:take])
                del self._buffer[:take]
                if action.kind in _SPLIT_KINDS:
                    self._add(unit, action, data)
                covered.append(unit)
                unit.consumed += take
                remaining -= take
            if action.kind not in _SPLIT_KINDS and covered:
                # A marker is one event however many units spelled it: it belongs to its first unit.
                self._add(covered[0], action, b"")

    def _add(self, unit: _Unit, action: Action, data: bytes) -> None:
        """Attach one segment's pieces; they stay held until a later segment or the unit's end."""
        unit.held_from = len(unit.pieces)
        for piece in self._gen.translate(action, data):
            last = unit.pieces[-1] if len(unit.pieces) > unit.emitted else None
            if (
                last is not None
                and last.kind == piece.kind
                and piece.kind in MERGEABLE
                and last.index == piece.index
            ):
                if piece.kind != "space":
                    last.data += piece.data
                unit.held_from = min(unit.held_from, len(unit.pieces) - 1)
            else:
                unit.pieces.append(piece)

    def _release(self, final: bool = False) -> list[Any]:
        out: list[Any] = []
        while self._units:
            unit = self._units[0]
            done = unit.resolved or final
            end = len(unit.pieces) if done else max(unit.emitted, unit.held_from)
            for piece in unit.pieces[unit.emitted : end]:
                out += self._render(piece)
            unit.emitted = end
            if not done:
                break
            self._units.popleft()
        return out

    def _render(self, piece: Piece) -> list[Any]:
        data = piece.data
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        if piece.kind == "reasoning":
            self._reasoning_text.append(text)
        return self._gen.render(piece.kind, text, piece.index)

    def _complete(self, reason: InferenceFinishReason, explicit: bool) -> list[Any]:
        out: list[Any] = []
        if self._pending and not self._stopped:
            # Tokens that never completed a character are decoded lossily at the end.
            units = [(list(self._pending), self._pending_count)]
            self._pending, self._pending_count = b"", 0
            self._feed(units, out)
            if self._finished:
                return out
        if not self._stopped and self._sm is not None:
            self._assign(self._sm.finish())
        out += self._release(final=True)
        self._units.clear()
        self._finished = True
        thinking = self._options.thinking_initial_stage is not None
        reasoning = None
        if thinking and self._tokenizer is not None:
            # Reported as the token count of the whole reasoning text, as the official one does.
            reasoning = len(self._tokenizer.encode("".join(self._reasoning_text)))
        out += self._gen.finish(
            reason,
            explicit=explicit,
            usage=self._usage,
            completion_tokens=self._completion_tokens,
            reasoning_tokens=reasoning,
        )
        return out

    def finish(self) -> list[Any]:
        """Close the input and process buffered output; calls after completion yield nothing."""
        if self._closed:
            raise RuntimeError("stream processor is closed")
        if self._finished:
            return []
        out: list[Any] = []
        self._start(out)
        out += self._complete(InferenceFinishReason.Stop, explicit=False)
        return out

    def close(self) -> None:
        """Release processing state without producing successful completion."""
        self._closed = True
        self._units.clear()
        self._buffer.clear()
