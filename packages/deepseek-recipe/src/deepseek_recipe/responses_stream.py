"""Responses stream events and response accumulation.

The generator turns parser pieces into Responses output items: a reasoning
item, a message item, and one item per tool call, each opened by its first
text and closed (with its `done` events) when the next item starts or the
response ends.  Delta boundaries come from the shared piece machinery, so they
match the Chat Completions deltas of the same output.  When the request
declares a client-executed tool search, a call of `tool_search` is a tool
search call item instead: its arguments are a JSON object, reported whole when
the item is done, so it has no delta events.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from deepseek_recipe.custom_tool_input import CustomInputDecoder
from deepseek_recipe.inference import InferenceFinishReason, PromptUsage
from deepseek_recipe.protocol_chunk import ProtocolChunk, TypedEventFraming
from deepseek_recipe.protocol_json import dumps, loads
from deepseek_recipe.request import ConversationRequest
from deepseek_recipe.responses_echo import ResponsesEcho
from deepseek_recipe.responses_tools import TOOL_SEARCH
from deepseek_recipe.stream_pieces import (
    ANSWER_KINDS,
    PieceTranslator,
    argument_json,
    renders_nothing,
)

_CALL_KINDS = ("function_call", "custom_tool_call", "tool_search_call")
_INCOMPLETE = {
    InferenceFinishReason.Length: "max_output_tokens",
    InferenceFinishReason.ContentFilter: "content_filter",
}


class ResponsesStreamEvent(ProtocolChunk):
    """One Responses stream event; `ResponsesResponse.accumulate` consumes it."""


def response_object(
    id: str, model: str, created: int, echo: ResponsesEcho | None = None
) -> dict[str, Any]:
    """A response object in progress, with the request settings it reports."""
    fields = (echo or ResponsesEcho()).response_fields()
    return {
        "id": id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "background": False,
        "completed_at": None,
        "content_filters": None,
        "error": None,
        "frequency_penalty": 0.0,
        "incomplete_details": None,
        "instructions": fields["instructions"],
        "max_output_tokens": fields["max_output_tokens"],
        "max_tool_calls": None,
        "model": model,
        "moderation": None,
        "output": [],
        "parallel_tool_calls": True,
        "presence_penalty": 0.0,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "prompt_cache_retention": None,
        "reasoning": fields["reasoning"],
        "safety_identifier": None,
        "service_tier": "default",
        "store": False,
        "temperature": fields["temperature"],
        "text": fields["text"],
        "tool_choice": fields["tool_choice"],
        "tools": fields["tools"],
        "top_logprobs": fields["top_logprobs"],
        "top_p": fields["top_p"],
        "truncation": "disabled",
        "usage": None,
        "user": fields["user"],
        "metadata": {},
    }


class _Item:
    """The output item being streamed."""

    def __init__(self, kind: str, index: int, item_id: str) -> None:
        self.kind = kind
        self.index = index
        self.id = item_id
        self.text = ""
        self.call_id = ""
        self.name = ""
        self.namespace: str | None = None
        self.decoder: CustomInputDecoder | None = None
        #: A tool search call's arguments, parsed when the call is done.
        self.arguments: dict[str, Any] = {}


class ResponsesChunkGenerator(PieceTranslator):
    """Builds Responses events for one response; consumed by `StreamProcessor`."""

    def __init__(self, id: str, model: str, request: ConversationRequest | None = None) -> None:
        thinking = (
            request is not None and request.parsing_options.thinking_initial_stage is not None
        )
        super().__init__(thinking)
        self._id = id
        self._model = model
        self._echo = getattr(request, "responses_echo", None) or ResponsesEcho()
        self._namespaces: dict[str, tuple[str, str]] = dict(
            getattr(request, "namespace_map", {}) or {}
        )
        self._custom: set[str] = set(getattr(request, "custom_names", set()) or set())
        self._tool_search = bool(getattr(request, "client_tool_search", False))
        self._created = int(time.time())
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        self._item: _Item | None = None

    def with_namespace_tool_map(
        self, namespace_tool_map: dict[str, tuple[str, str]]
    ) -> ResponsesChunkGenerator:
        """Consume this generator; the new one splits these namespace tool names."""
        new = self._take_over()
        new._namespaces = {k: (v[0], v[1]) for k, v in namespace_tool_map.items()}
        return new

    def with_echo(self, echo: ResponsesEcho) -> ResponsesChunkGenerator:
        """Consume this generator; the new one reports these request settings."""
        new = self._take_over()
        new._echo = echo
        return new

    def _event(self, kind: str, **fields: Any) -> ResponsesStreamEvent:
        payload: dict[str, Any] = {"type": kind}
        payload.update(fields)
        payload["sequence_number"] = self._sequence
        self._sequence += 1
        return ResponsesStreamEvent(payload)

    def _ordered_event(self, kind: str, fields: list[tuple[str, Any]]) -> ResponsesStreamEvent:
        """An event whose fields follow the official order, `sequence_number` included."""
        payload: dict[str, Any] = {"type": kind}
        for key, value in fields:
            payload[key] = self._sequence if key == "sequence_number" else value
        self._sequence += 1
        return ResponsesStreamEvent(payload)

    def _snapshot(self, status: str, usage: Any = None, **extra: Any) -> dict[str, Any]:
        obj = response_object(self._id, self._model, self._created, self._echo)
        obj["status"] = status
        obj["output"] = copy.deepcopy(self._output)
        obj["usage"] = usage
        obj.update(extra)
        return obj

    def start(
        self, fingerprint: str | None, usage: PromptUsage | None = None
    ) -> list[ResponsesStreamEvent]:
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    # Items ------------------------------------------------------------------------------

    def _item_object(self, item: _Item, status: str, phase: str = "final_answer") -> dict[str, Any]:
        if item.kind == "reasoning":
            content = (
                [] if status == "in_progress" else [{"type": "reasoning_text", "text": item.text}]
            )
            return {
                "type": "reasoning",
                "id": item.id,
                "status": status,
                "content": content,
                "summary": [],
                "encrypted_content": f"{self._id}-{item.index}",
            }
        if item.kind == "message":
            content = [] if status == "in_progress" else [_output_text(item.text)]
            return {
                "type": "message",
                "id": item.id,
                "status": status,
                "role": "assistant",
                "phase": phase,
                "content": content,
            }
        if item.kind == "tool_search_call":
            return {
                "type": item.kind,
                "id": item.id,
                "status": status,
                "call_id": item.call_id,
                "execution": "client",
                "arguments": item.arguments,
            }
        obj: dict[str, Any] = {
            "type": item.kind,
            "id": item.id,
            "status": status,
            "call_id": item.call_id,
            "name": item.name,
        }
        if item.kind == "function_call":
            if item.namespace is not None:
                obj["namespace"] = item.namespace
            obj["arguments"] = "" if status == "in_progress" else item.text
        else:
            obj["input"] = "" if status == "in_progress" else item.text
        return obj

    def _open(self, kind: str, prefix: str) -> list[ResponsesStreamEvent]:
        index = len(self._output)
        item = _Item(kind, index, f"{prefix}_{self._id}_{index}")
        self._item = item
        return self._open_item(item)

    def _open_item(self, item: _Item) -> list[ResponsesStreamEvent]:
        obj = self._item_object(item, "in_progress")
        self._output.append(obj)
        out = [
            self._event(
                "response.output_item.added", item=copy.deepcopy(obj), output_index=item.index
            )
        ]
        if item.kind in ("reasoning", "message"):
            part = (
                {"type": "reasoning_text", "text": ""}
                if item.kind == "reasoning"
                else _output_text("")
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    content_index=0,
                    item_id=item.id,
                    output_index=item.index,
                    part=part,
                )
            )
        return out

    def _close(self, status: str = "completed", phase: str = "final_answer") -> list[Any]:
        item = self._item
        if item is None:
            return []
        self._item = None
        out: list[ResponsesStreamEvent] = []
        if item.kind == "reasoning":
            out.append(
                self._ordered_event(
                    "response.reasoning_text.done",
                    [
                        ("content_index", 0),
                        ("item_id", item.id),
                        ("output_index", item.index),
                        ("sequence_number", None),
                        ("text", item.text),
                    ],
                )
            )
            out.append(self._part_done(item, {"type": "reasoning_text", "text": item.text}))
        elif item.kind == "message":
            out.append(
                self._ordered_event(
                    "response.output_text.done",
                    [
                        ("content_index", 0),
                        ("item_id", item.id),
                        ("logprobs", []),
                        ("output_index", item.index),
                        ("sequence_number", None),
                        ("text", item.text),
                    ],
                )
            )
            out.append(self._part_done(item, _output_text(item.text)))
        elif item.kind == "tool_search_call":
            status = self._settle_search(item, status)
        elif item.kind == "function_call":
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    arguments=item.text,
                    item_id=item.id,
                    output_index=item.index,
                )
            )
        else:
            if item.decoder is not None:
                tail = item.decoder.finish()
                if tail:
                    out.append(self._custom_delta(item, tail))
                item.text = item.decoder.value
            out.append(
                self._event(
                    "response.custom_tool_call_input.done",
                    input=item.text,
                    item_id=item.id,
                    output_index=item.index,
                )
            )
        obj = self._item_object(item, status, phase)
        self._output[item.index] = obj
        out.append(
            self._event(
                "response.output_item.done", item=copy.deepcopy(obj), output_index=item.index
            )
        )
        return out

    @staticmethod
    def _settle_search(item: _Item, status: str) -> str:
        """A finished tool search call's arguments and status.

        Only a call of a completed response reports its arguments; arguments that
        are not a JSON object make the call incomplete.
        """
        if status != "completed":
            return status
        try:
            value = loads(item.text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            return "incomplete"
        item.arguments = value
        return status

    def _part_done(self, item: _Item, part: dict[str, Any]) -> ResponsesStreamEvent:
        return self._event(
            "response.content_part.done",
            content_index=0,
            item_id=item.id,
            output_index=item.index,
            part=part,
        )

    def _custom_delta(self, item: _Item, text: str) -> ResponsesStreamEvent:
        return self._event(
            "response.custom_tool_call_input.delta",
            delta=text,
            item_id=item.id,
            output_index=item.index,
        )

    # Rendering --------------------------------------------------------------------------

    def render(self, kind: str, text: str, index: int) -> list[ResponsesStreamEvent]:
        """The events for one finished piece (none for empty text or a break)."""
        if renders_nothing(kind, text):
            return []
        out: list[ResponsesStreamEvent] = []
        item = self._item
        if kind == "reasoning":
            if item is None or item.kind != "reasoning":
                out += self._close()
                out += self._open("reasoning", "rs")
            return out + self._text_delta("response.reasoning_text.delta", text)
        if kind in ANSWER_KINDS:
            if item is None or item.kind != "message":
                out += self._close()
                out += self._open("message", "msg")
            return out + self._text_delta("response.output_text.delta", text, logprobs=True)
        if kind == "header":
            out += self._close(phase="commentary")
            return out + self._open_call(text, index)
        if item is None or item.kind not in _CALL_KINDS:
            return out
        text = argument_json(kind, text)
        if item.kind == "tool_search_call":
            item.text += text
            return []
        if item.decoder is not None:
            delta = item.decoder.feed(text)
            return [self._custom_delta(item, delta)] if delta else []
        item.text += text
        return [
            self._event(
                "response.function_call_arguments.delta",
                delta=text,
                item_id=item.id,
                output_index=item.index,
            )
        ]

    def _text_delta(
        self, kind: str, text: str, logprobs: bool = False
    ) -> list[ResponsesStreamEvent]:
        item = self._item
        assert item is not None
        item.text += text
        fields: list[tuple[str, Any]] = [
            ("content_index", 0),
            ("delta", text),
            ("item_id", item.id),
        ]
        if logprobs:
            fields.append(("logprobs", []))
        fields += [("output_index", item.index), ("sequence_number", None)]
        return [self._ordered_event(kind, fields)]

    def _open_call(self, name: str, tool_index: int) -> list[ResponsesStreamEvent]:
        index = len(self._output)
        if self._tool_search and name == TOOL_SEARCH:
            item = _Item("tool_search_call", index, f"tsc_{self._id}_{index}")
            item.call_id = self.call_id(tool_index)
            self._item = item
            return self._open_item(item)
        custom = name in self._custom
        kind = "custom_tool_call" if custom else "function_call"
        item = _Item(kind, index, f"{'ctc' if custom else 'fc'}_{self._id}_{index}")
        item.call_id = self.call_id(tool_index)
        item.name = name
        if name in self._namespaces:
            item.namespace, item.name = self._namespaces[name]
        if custom:
            item.decoder = CustomInputDecoder()
        self._item = item
        return self._open_item(item)

    def finish(
        self,
        reason: InferenceFinishReason,
        *,
        explicit: bool,
        usage: PromptUsage,
        completion_tokens: int,
        reasoning_tokens: int | None,
    ) -> list[ResponsesStreamEvent]:
        incomplete = _INCOMPLETE.get(reason) if explicit else None
        out = self._close("incomplete" if incomplete else "completed")
        prompt = usage.prompt_tokens
        body = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": usage.prompt_cache_hit_tokens},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens or 0},
            "total_tokens": prompt + completion_tokens,
        }
        done = int(time.time())
        if incomplete:
            snapshot = self._snapshot(
                "incomplete",
                body,
                completed_at=done,
                incomplete_details={"reason": incomplete},
            )
            out.append(self._event("response.incomplete", response=snapshot))
        else:
            snapshot = self._snapshot("completed", body, completed_at=done)
            out.append(self._event("response.completed", response=snapshot))
        return out


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


class ResponsesResponse(TypedEventFraming):
    """A Responses response object built by accumulating stream events."""

    def __init__(
        self, id: str, model: str, created: int, prompt_tokens: int, prompt_cache_hit_tokens: int
    ) -> None:
        self._response = response_object(id, model, created)

    def accumulate(self, chunk: ResponsesStreamEvent) -> None:
        """Consume this event and apply it to the response."""
        event = chunk._take()
        kind = event["type"]
        response = self._response
        if "response" in event:
            self._response = copy.deepcopy(event["response"])
            return
        output = response["output"]
        if kind == "response.output_item.added":
            output.append(copy.deepcopy(event["item"]))
            return
        index = event.get("output_index", 0)
        if not 0 <= index < len(output):
            return
        item = output[index]
        if kind == "response.output_item.done":
            output[index] = copy.deepcopy(event["item"])
        elif kind == "response.content_part.added":
            item.setdefault("content", []).append(copy.deepcopy(event["part"]))
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            parts = item.get("content") or []
            if event["content_index"] < len(parts):
                parts[event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            item["arguments"] += event["delta"]
        elif kind == "response.custom_tool_call_input.delta":
            item["input"] += event["delta"]
        elif kind == "response.function_call_arguments.done":
            item["arguments"] = event["arguments"]
        elif kind == "response.custom_tool_call_input.done":
            item["input"] = event["input"]

    def to_json(self) -> str:
        return dumps(self._response)
