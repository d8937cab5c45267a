"""Chat Completions chunk generation and response accumulation.

The generator turns parser output into OpenAI-style deltas.  Tool-call
arguments are rebuilt as JSON text from the DSML attributes; adjacent pieces of
the same kind within one input unit are merged into one delta, others are sent
separately, matching the official chunking.
"""

from __future__ import annotations

import json
import time
from typing import Any

from deepseek_recipe.inference import InferenceFinishReason, PromptUsage
from deepseek_recipe.parsing_options import ThinkingInitialStage
from deepseek_recipe.protocol_chunk import ProtocolChunk
from deepseek_recipe.request import ConversationRequest
from deepseek_recipe.stream_pieces import (
    ANSWER_KINDS,
    PieceTranslator,
    argument_json,
    renders_nothing,
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ChatCompletionChunk(ProtocolChunk):
    """One `chat.completion.chunk`; `accumulate` consumes it, as in the official API."""

    def _serialize(self, payload: dict[str, Any]) -> str:
        return _dumps(payload)

    def to_dict(self) -> dict[str, Any]:
        return self._get()


class ChatCompletionChunkGenerator(PieceTranslator):
    """Builds chunks for one response; consumed by `StreamProcessor`."""

    def __init__(self, id: str, model: str, request: ConversationRequest) -> None:
        stage = request.parsing_options.thinking_initial_stage
        super().__init__(stage is not None)
        #: A thinking-mode continuation of a prefix answer opens with content, not reasoning.
        self._opens_in_content = stage is ThinkingInitialStage.ContentContinuation
        self._id = id
        self._model = model
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
        return [self._chunk({"role": "assistant", **self._opening_delta()})]

    def _opening_delta(self) -> dict[str, Any]:
        """The first delta's text fields: empty text of the kind the reply starts with."""
        if not self._thinking_mode:
            return {"content": ""}
        if self._opens_in_content:
            return {"content": "", "reasoning_content": None}
        return {"content": None, "reasoning_content": ""}

    def _content(self, text: str) -> dict[str, Any]:
        if self._thinking_mode:
            return {"content": text, "reasoning_content": None}
        return {"content": text}

    def render(self, kind: str, text: str, index: int) -> list[ChatCompletionChunk]:
        """The chunk for one finished piece (none for empty text or a break)."""
        if renders_nothing(kind, text):
            return []
        if kind in ANSWER_KINDS:
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
        arguments = argument_json(kind, text)
        return [
            self._chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
        ]

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
        if self.stopped_after_tool_calls(reason, explicit):
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
        # Reasoning appears only once some arrived: a prefix answer's continuation has none.
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
