"""The stream chunk every protocol hands out: a JSON payload that accumulating consumes.

The official objects move their payload into the response when accumulated, so
a chunk can be read until then and fails afterwards; all three protocols share
that rule and its error message.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe.protocol_json import dumps


class ProtocolChunk:
    """One chunk or event of a stream; a response's `accumulate` takes its payload."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self._payload: dict[str, Any] | None = payload

    def _get(self) -> dict[str, Any]:
        if self._payload is None:
            raise RuntimeError("protocol chunk has been consumed")
        return self._payload

    def _take(self) -> dict[str, Any]:
        payload = self._get()
        self._payload = None
        return payload

    def _serialize(self, payload: dict[str, Any]) -> str:
        """The payload as text, like serde_json; Chat Completions chunks write it their own way."""
        return dumps(payload)

    def to_json(self) -> str:
        return self._serialize(self._get())

    def __repr__(self) -> str:
        body = self.to_json() if self._payload is not None else "<consumed>"
        return f"{type(self).__name__}({body})"


class TypedEventFraming:
    """SSE framing shared by the Responses and Messages responses.

    Each of their events is sent under its `type`, and neither stream ends with a
    `[DONE]` data message as Chat Completions does.
    """

    @staticmethod
    def sse_event_name(chunk: ProtocolChunk) -> str | None:
        return chunk._get()["type"]

    @staticmethod
    def sse_done_data() -> str | None:
        return None
