"""Anthropic Messages stream events and response accumulation.

The generator turns parser pieces into content blocks: a thinking block (opened
at once in thinking mode, as Anthropic does, and closed with a signature), text
blocks, and one `tool_use` block per call whose input streams as JSON text.
Delta boundaries come from the shared piece machinery, so they match the Chat
Completions deltas of the same output.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from deepseek_recipe.inference import InferenceFinishReason, PromptUsage
from deepseek_recipe.protocol_chunk import ProtocolChunk, TypedEventFraming
from deepseek_recipe.protocol_json import dumps
from deepseek_recipe.stream_pieces import (
    ANSWER_KINDS,
    PieceTranslator,
    argument_json,
    renders_nothing,
)

_STOP_REASONS = {
    InferenceFinishReason.Stop: "end_turn",
    InferenceFinishReason.Length: "max_tokens",
    InferenceFinishReason.ContentFilter: "refusal",
}


def _usage(prompt_tokens: int, cache_hit: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": max(0, prompt_tokens - cache_hit),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cache_hit,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def message_object(id: str, model: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


class MessagesStreamEvent(ProtocolChunk):
    """One Messages stream event; `MessagesResponse.accumulate` consumes it."""


class MessagesChunkGenerator(PieceTranslator):
    """Builds Messages events for one response; consumed by `StreamProcessor`."""

    def __init__(self, id: str, model: str, thinking_mode: bool) -> None:
        super().__init__(thinking_mode)
        self._id = id
        self._model = model
        self._signature = id
        self._index = -1
        self._open: str | None = None
        self._pinged = False
        self._usage = PromptUsage()

    def with_signature(self, signature: str) -> MessagesChunkGenerator:
        """Consume this generator; the new one ends each thinking block with `signature`."""
        new = self._take_over()
        new._signature = signature
        return new

    def _event(self, payload: dict[str, Any]) -> MessagesStreamEvent:
        return MessagesStreamEvent(payload)

    def _start_block(self, kind: str, block: dict[str, Any]) -> list[MessagesStreamEvent]:
        self._index += 1
        self._open = kind
        out = [
            self._event(
                {"type": "content_block_start", "index": self._index, "content_block": block}
            )
        ]
        if not self._pinged:
            self._pinged = True
            out.append(self._event({"type": "ping"}))
        return out

    def _delta(self, delta: dict[str, Any]) -> MessagesStreamEvent:
        return self._event({"type": "content_block_delta", "index": self._index, "delta": delta})

    def _stop_block(self) -> list[MessagesStreamEvent]:
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": self._signature}))
        out.append(self._event({"type": "content_block_stop", "index": self._index}))
        self._open = None
        return out

    def start(
        self, fingerprint: str | None, usage: PromptUsage | None = None
    ) -> list[MessagesStreamEvent]:
        self._usage = usage or PromptUsage()
        u = self._usage
        message = message_object(
            self._id, self._model, _usage(u.prompt_tokens, u.prompt_cache_hit_tokens, 0)
        )
        out = [self._event({"type": "message_start", "message": message})]
        if self._thinking_mode:
            out += self._start_block(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""}
            )
        return out

    def render(self, kind: str, text: str, index: int) -> list[MessagesStreamEvent]:
        """The events for one finished piece (none for empty text or a break)."""
        if renders_nothing(kind, text):
            return []
        out: list[MessagesStreamEvent] = []
        if kind == "reasoning":
            if self._open != "thinking":
                out += self._stop_block()
                out += self._start_block(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
            return [*out, self._delta({"type": "thinking_delta", "thinking": text})]
        if kind in ANSWER_KINDS:
            if self._open != "text":
                out += self._stop_block()
                out += self._start_block("text", {"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": text})]
        if kind == "header":
            out += self._stop_block()
            block = {"type": "tool_use", "id": self.call_id(index), "name": text, "input": {}}
            return out + self._start_block("tool_use", block)
        if self._open != "tool_use":
            return out
        partial = argument_json(kind, text)
        return [self._delta({"type": "input_json_delta", "partial_json": partial})]

    def finish(
        self,
        reason: InferenceFinishReason,
        *,
        explicit: bool,
        usage: PromptUsage,
        completion_tokens: int,
        reasoning_tokens: int | None,
    ) -> list[MessagesStreamEvent]:
        out = self._stop_block()
        stop_reason = _STOP_REASONS[reason]
        stop_sequence = None
        if self.stopped_after_tool_calls(reason, explicit):
            stop_reason = "tool_use"
        elif not explicit and self.stop_sequence is not None:
            stop_reason, stop_sequence = "stop_sequence", self.stop_sequence
        u = _usage(usage.prompt_tokens, usage.prompt_cache_hit_tokens, completion_tokens)
        out.append(
            self._event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": u,
                }
            )
        )
        out.append(self._event({"type": "message_stop"}))
        return out


def _parse_input(text: str) -> Any:
    """The accumulated tool input; anything that is not a JSON object becomes `{}`."""

    def reject(_: str) -> Any:
        raise ValueError("non-standard JSON constant")

    def finite(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise ValueError("number out of range")
        return value

    try:
        value = json.loads(text, parse_constant=reject, parse_float=finite)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class MessagesResponse(TypedEventFraming):
    """A Messages response object built by accumulating stream events."""

    def __init__(
        self, id: str, model: str, created: int, prompt_tokens: int, prompt_cache_hit_tokens: int
    ) -> None:
        usage = _usage(prompt_tokens, prompt_cache_hit_tokens, 0)
        self._message = message_object(id, model, usage)
        self._inputs: dict[int, str] = {}

    def accumulate(self, chunk: MessagesStreamEvent) -> None:
        """Consume this event and apply it to the response."""
        event = chunk._take()
        kind = event["type"]
        msg = self._message
        if kind == "message_start":
            self._message = copy.deepcopy(event["message"])
            self._inputs = {}
        elif kind == "content_block_start":
            msg["content"].append(copy.deepcopy(event["content_block"]))
            if event["content_block"]["type"] == "tool_use":
                self._inputs[len(msg["content"]) - 1] = ""
        elif kind == "content_block_delta":
            index = event["index"]
            if not 0 <= index < len(msg["content"]):
                return
            block, delta = msg["content"][index], event["delta"]
            dtype = delta["type"]
            if dtype == "text_delta":
                block["text"] += delta["text"]
            elif dtype == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif dtype == "signature_delta":
                block["signature"] += delta["signature"]
            elif dtype == "input_json_delta" and index in self._inputs:
                self._inputs[index] += delta["partial_json"]
        elif kind == "content_block_stop":
            index = event["index"]
            if index in self._inputs:
                msg["content"][index]["input"] = _parse_input(self._inputs.pop(index))
        elif kind == "message_delta":
            msg["stop_reason"] = event["delta"]["stop_reason"]
            msg["stop_sequence"] = event["delta"]["stop_sequence"]
            msg["usage"] = copy.deepcopy(event["usage"])

    def to_json(self) -> str:
        return dumps(self._message)
