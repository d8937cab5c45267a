"""Exception types shared by conversion, encoding and streaming.

The official bindings raise `ConversionError` for requests that are well formed
but semantically invalid (an HTTP 400 with an OpenAI-style error body), and plain
`ValueError` for bodies that cannot be decoded at all.  Callers branch on that
distinction to choose between a 400 with a body and a generic decode error, so we
keep it.
"""

from __future__ import annotations

import json


class ConversionError(Exception):
    """Raised when a protocol request is invalid or cannot be converted."""

    status_code: int
    body: str

    def __init__(
        self, message: str, status_code: int = 400, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = json.dumps(
            {
                "error": {
                    "message": message,
                    "type": error_type,
                    "param": None,
                    "code": error_type,
                }
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )


class ImageError(Exception):
    """A failure to resolve, fetch, or preprocess images."""

    kind: str
    is_retryable: bool

    def __init__(self, message: str, kind: str = "Other", is_retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.is_retryable = is_retryable


class CalcResizeError(ValueError):
    """The image token calculation did not converge."""


def body_error(message: str) -> ValueError:
    """Build the `ValueError` the official decoder raises for an undecodable body."""
    return ValueError(f"invalid request body: {message}")
