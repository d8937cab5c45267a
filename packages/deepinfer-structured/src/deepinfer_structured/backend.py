"""What the grammar backends share, whichever library compiles the grammar.

Both backends refuse a tokenizer that is not byte-level, cache compiled constraints by the
constraint and the refusal policy in force, turn a library's compile error into the request's
``InvalidRequestError`` (naming the request field), and put the same free-reasoning matcher in
front of the answer's (``matcher.sequence_matcher``). :class:`LibraryBackend` holds that once,
so a library backend only says how to compile a constraint and start a matcher on the result;
``auto`` keys its choice of backend with the same :func:`constraint_key`.
"""

from __future__ import annotations

import importlib.util
import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, ClassVar

from tokenizers import Tokenizer

from deepinfer.errors import InvalidRequestError
from deepinfer.plugins import Availability
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer.structured import ReplyConstraint
from deepinfer_structured.matcher import Matcher, sequence_matcher
from deepinfer_structured.utf8 import require_byte_level

CACHE_SIZE = 256
DSML_TOKEN = "｜DSML｜"


def library_availability(module: str) -> Availability:
    """Whether the grammar library a backend wraps is importable, with the install hint."""
    if importlib.util.find_spec(module) is None:
        return Availability(
            False, f"{module} is not installed: pip install 'deepinfer[structured]'"
        )
    return Availability(True)


def constraint_key(constraint: StructuredOutputsParams) -> str:
    """The constraint as text, equal for equal constraints: the key of the compile caches.
    A tool-call constraint is keyed by its dialect and its tools' names and schemas."""
    kind = constraint.kind
    value = getattr(constraint, kind, None)
    if kind == "tool_calls":
        assert isinstance(constraint, ReplyConstraint)
        return json.dumps([kind, constraint.dsml, [[t.name, t.parameters] for t in value]])
    return json.dumps([kind, value], sort_keys=True)


class LibraryBackend(ABC):
    """A grammar backend over one library: the tokenizer checks, the compile cache and the
    per-sequence matcher, around the library steps a subclass supplies."""

    name: ClassVar[str]
    #: The module the backend wraps (its availability is that module's).
    library: ClassVar[str]

    @classmethod
    def availability(cls) -> Availability:
        return library_availability(cls.library)

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        require_byte_level(tokenizer)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.dsml_token_id = tokenizer.token_to_id(DSML_TOKEN)
        self._cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    # -- what a library backend supplies ------------------------------------------------------

    @abstractmethod
    def policy(self) -> tuple[Any, ...]:
        """The refusal settings a compiled grammar depends on (an evaluation may loosen them
        between compiles, so they are part of the cache key)."""

    @abstractmethod
    def _build(self, kind: str, value: Any, constraint: StructuredOutputsParams) -> Any:
        """The library's compiled form of ``constraint``; raises RuntimeError, ValueError or
        TypeError when it cannot be enforced (exactly)."""

    @abstractmethod
    def _reason(self, exc: Exception) -> str:
        """The library's error as one short line for the request's error."""

    @abstractmethod
    def _start(self, compiled: Any) -> Matcher:
        """A fresh matcher on a compiled grammar (which stays in the cache, unchanged)."""

    # -- shared -------------------------------------------------------------------------------

    def require_dsml(self) -> int:
        """The DSML control token's id, which a tool-call grammar places; refuses tool calls
        for a tokenizer without it."""
        if self.dsml_token_id is None:
            raise InvalidRequestError(
                "tool_choice", f"the tokenizer has no {DSML_TOKEN} token for tool calls"
            )
        return self.dsml_token_id

    def compile(self, constraint: StructuredOutputsParams) -> Any:
        """The compiled constraint (cached); raises InvalidRequestError naming the request
        field and the construct when the library cannot enforce it."""
        kind = constraint.kind
        key = (constraint_key(constraint), *self.policy())
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        try:
            compiled = self._build(kind, getattr(constraint, kind), constraint)
        except InvalidRequestError:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            field = "tools" if kind == "tool_calls" else f"structured_outputs.{kind}"
            raise InvalidRequestError(field, f"cannot be compiled: {self._reason(exc)}") from exc
        self._cache[key] = compiled
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def matcher(self, constraint: StructuredOutputsParams) -> Matcher:
        return sequence_matcher(
            constraint,
            lambda: self._start(self.compile(constraint)),
            self.tokenizer,
            self.stop_token_ids,
            self.vocab_size,
        )
