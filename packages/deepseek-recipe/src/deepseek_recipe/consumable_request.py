"""The consume-once rule that the three protocol request classes share.

The official request objects move their decoded body into the conversion, so
after `convert` (even one that fails) nothing can be read from them any more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepseek_recipe.options import ConversionOptions
from deepseek_recipe.request import ConversationRequest

#: A protocol's conversion of its decoded body.
Converter = Callable[[dict[str, Any], ConversionOptions], ConversationRequest]


class ConsumableRequest:
    """A decoded request body that one `convert` call consumes."""

    def __init__(self, decoded: dict[str, Any], converter: Converter) -> None:
        self._decoded = decoded
        self._converter = converter
        self._consumed = False

    def _check(self) -> dict[str, Any]:
        """The decoded body, while the request has not been converted."""
        if self._consumed:
            raise RuntimeError("protocol request has been consumed")
        return self._decoded

    @property
    def model(self) -> str:
        """The requested model name; read it before `convert` consumes the request."""
        return self._check()["model"]

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        d = self._check()
        self._consumed = True
        return self._converter(d, options)
