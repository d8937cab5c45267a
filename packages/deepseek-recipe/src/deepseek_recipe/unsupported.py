"""Parts of the official API this package does not implement yet.

They exist so that `from deepseek_recipe import ResponsesRequest` keeps working
in code written for the official package, and fail loudly on use instead of
behaving differently.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _unsupported(name: str, why: str) -> NoReturn:
    raise NotImplementedError(f"{name} is not implemented by this deepseek-recipe: {why}")


class _Unsupported:
    _why = "only the Chat Completions path is implemented"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unsupported(type(self).__name__, self._why)


class ResponsesRequest(_Unsupported):
    """OpenAI Responses API request (not implemented)."""


class ResponsesResponse(_Unsupported):
    """OpenAI Responses API response (not implemented)."""


class ResponsesEcho(_Unsupported):
    """Responses request settings echo (not implemented)."""


class MessagesRequest(_Unsupported):
    """Anthropic Messages API request (not implemented)."""


class MessagesResponse(_Unsupported):
    """Anthropic Messages API response (not implemented)."""


class MessagesChunkGenerator(_Unsupported):
    """Anthropic Messages stream generator (not implemented)."""


class ImageResolver(_Unsupported):
    """Image fetching and preprocessing (not implemented)."""

    _why = "image fetching and preprocessing are not implemented; resolve images yourself"


class ReqwestImageFetcher(_Unsupported):
    """Image URL fetcher (not implemented)."""

    _why = "this package never downloads; fetch images yourself"


class OpenCvImagePreprocessor(_Unsupported):
    """Image preprocessing (not implemented)."""

    _why = "image preprocessing is not implemented"


class PreprocessOptions(_Unsupported):
    """Image preprocessing options (not implemented)."""

    _why = "image preprocessing is not implemented"


class ImageQuota(_Unsupported):
    """Per-request image quota (not implemented)."""

    _why = "image resolution is not implemented"


class ResponsesChunkGenerator(_Unsupported):
    """OpenAI Responses stream generator (not implemented)."""


class ResponsesStreamEvent(_Unsupported):
    """OpenAI Responses stream event (not implemented)."""


class MessagesStreamEvent(_Unsupported):
    """Anthropic Messages stream event (not implemented)."""
