"""Chat Completions chunk generation and response accumulation.

The generator turns parser output into OpenAI-style deltas.  Tool-call
arguments are rebuilt as JSON text from the DSML attributes; adjacent pieces of
the same kind within one input unit are merged into one delta, others are sent
separately, matching the official chunking.
"""

from __future__ import annotations

import json
import random
import string
import time
from dataclasses import dataclass
from typing import Any

from deepseek_recipe.inference import InferenceFinishReason, PromptUsage
from deepseek_recipe.pyjson import quote
from deepseek_recipe.request import ConversationRequest
from deepseek_recipe.state_machine import Action, Kind

#: Piece kinds whose neighbours of the same kind in one unit are sent as one delta.
#: Adjacent JSON-mode spaces collapse into one.
MERGEABLE = frozenset({"content", "reasoning", "args_raw", "args_string", "space"})
_TEXT_KINDS = {Kind.RAW: "content", Kind.REASONING: "reasoning", Kind.TOOL_NAME: "name"}


@dataclass
class Piece:
    """Part of a delta: `data` is raw bytes for model text, a string for generated text."""

    kind: str
    data: bytes | str
    index: int


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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ChatCompletionChunk:
    """One `chat.completion.chunk`; `accumulate` consumes it, as in the official API."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self._payload: dict[str, Any] | None = payload

    def _take(self) -> dict[str, Any]:
        if self._payload is None:
            raise RuntimeError("protocol chunk has been consumed")
        payload = self._payload
        self._payload = None
        return payload

    def to_dict(self) -> dict[str, Any]:
        if self._payload is None:
            raise RuntimeError("protocol chunk has been consumed")
        return self._payload

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    def __repr__(self) -> str:
        return (
            f"ChatCompletionChunk({self.to_json() if self._payload is not None else '<consumed>'})"
        )


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

    def call_id(self, index: int) -> str:
        return _call_id(index, index in self._empty_thinking_calls)

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


class ChatCompletionChunkGenerator(PieceTranslator):
    """Builds chunks for one response; consumed by `StreamProcessor`."""

    def __init__(self, id: str, model: str, request: ConversationRequest) -> None:
        super().__init__(request.parsing_options.thinking_initial_stage is not None)
        self._id = id
        self._model = model
        self._thinking = request.parsing_options.thinking_initial_stage is not None
        self._streamed = request.stream
        self._created = int(time.time())
        self._fingerprint: str | None = None

    def _chunk(
        self, delta: dict[str, Any], finish: str | None = None, usage: Any = None
    ) -> ChatCompletionChunk:
        payload: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "system_fingerprint": self._fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        # A streamed request reports usage only on the final chunk; others carry an explicit null.
        if usage is not None or not self._streamed:
            payload["usage"] = usage
        return ChatCompletionChunk(payload)

    def start(
        self, fingerprint: str | None, usage: PromptUsage | None = None
    ) -> list[ChatCompletionChunk]:
        self._fingerprint = fingerprint
        if self._thinking:
            return [self._chunk({"role": "assistant", "content": None, "reasoning_content": ""})]
        return [self._chunk({"role": "assistant", "content": ""})]

    def _content(self, text: str) -> dict[str, Any]:
        if self._thinking:
            return {"content": text, "reasoning_content": None}
        return {"content": text}

    def render(self, kind: str, text: str, index: int) -> list[ChatCompletionChunk]:
        """The chunk for one finished piece (none for empty text or a break)."""
        if kind == "break" or (text == "" and kind != "header"):
            return []
        if kind in ("content", "space", "label"):
            return [self._chunk(self._content(text))]
        if kind == "reasoning":
            return [self._chunk({"content": None, "reasoning_content": text})]
        if kind == "header":
            call = {
                "index": index,
                "id": self.call_id(index),
                "type": "function",
                "function": {"name": text, "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if kind == "args_string":
            text = quote(text)[1:-1]
        return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]})]

    def finish(
        self,
        reason: InferenceFinishReason,
        *,
        explicit: bool,
        usage: PromptUsage,
        completion_tokens: int,
        reasoning_tokens: int | None,
    ) -> list[ChatCompletionChunk]:
        finish = {
            InferenceFinishReason.Stop: "stop",
            InferenceFinishReason.Length: "length",
            InferenceFinishReason.ContentFilter: "content_filter",
        }[reason]
        if explicit and reason is InferenceFinishReason.Stop and self._tool_calls:
            finish = "tool_calls"
        prompt = usage.prompt_tokens
        hit = usage.prompt_cache_hit_tokens
        body: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": hit},
        }
        if reasoning_tokens is not None:
            body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        body["prompt_cache_hit_tokens"] = hit
        body["prompt_cache_miss_tokens"] = max(0, prompt - hit)
        return [self._chunk(self._content(""), finish, body)]


class ChatCompletionResponse:
    """A non-streamed `chat.completion` built by accumulating chunks."""

    def __init__(
        self, id: str, model: str, created: int, prompt_tokens: int, prompt_cache_hit_tokens: int
    ) -> None:
        self._id = id
        self._model = model
        self._created = created
        self._message: dict[str, Any] | None = None
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._fingerprint: str | None = None
        self._tool_calls: list[dict[str, Any]] = []

    def accumulate(self, chunk: ChatCompletionChunk) -> None:
        """Consume this chunk and apply its delta to the response."""
        payload = chunk._take()
        self._fingerprint = payload.get("system_fingerprint")
        choice = payload["choices"][0]
        delta = choice["delta"]
        if self._message is None:
            self._message = {"role": "assistant", "content": None}
        msg = self._message
        if "reasoning_content" in delta and "reasoning_content" not in msg:
            msg["reasoning_content"] = None
        for key in ("content", "reasoning_content"):
            value = delta.get(key)
            if value is not None:
                msg[key] = (msg.get(key) or "") + value
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                self._tool_calls.append(json.loads(json.dumps(call)))
            else:
                self._tool_calls[call["index"]]["function"]["arguments"] += call["function"][
                    "arguments"
                ]
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        if payload.get("usage") is not None:
            self._usage = payload["usage"]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
        }
        if self._message is None:
            out["choices"] = []
        else:
            message = dict(self._message)
            if self._tool_calls:
                message["tool_calls"] = self._tool_calls
            out["choices"] = [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish}
            ]
        if self._usage is not None:
            out["usage"] = self._usage
        out["system_fingerprint"] = self._fingerprint
        return out

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    @staticmethod
    def sse_event_name(chunk: ChatCompletionChunk) -> str | None:
        """Chat Completions SSE events are unnamed."""
        return None

    @staticmethod
    def sse_done_data() -> str | None:
        return "[DONE]"
