"""Grammar backend registered under ``deepinfer.grammars`` as ``xgrammar``.

Registered so that a request asking for a constraint finds the plugin; compiling constraints into
token bitmasks is not implemented yet, so constructing it raises rather than letting a constrained
request run unconstrained.
"""

from __future__ import annotations

from typing import Any

from deepinfer.plugins import Availability


class XGrammarBackend:
    """Regex / JSON-schema / EBNF / choice constraints compiled by xgrammar."""

    name = "xgrammar"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(False, "not implemented in deepinfer-structured 0.1")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "structured outputs are not implemented in deepinfer-structured 0.1: "
            "grammar compilation, per-request matchers and token bitmasks are still missing"
        )
