"""Grammar backend ``auto`` (the engine's default): xgrammar where it enforces the constraint
exactly, llguidance where xgrammar would not.

xgrammar is tried first: it is the faster of the two per step and the one this package has
measured longest. Whatever it refuses (a schema keyword ``schema_policy`` knows it loosens, a
compile on which it warns, a construct it cannot compile) goes to llguidance, which enforces
more of JSON Schema exactly (overlapping or several ``patternProperties``, keywords beside
``enum`` or a combinator, ``oneOf`` it can prove exclusive, ``multipleOf`` on numbers, ``allOf``
intersections...). A constraint neither enforces is refused with both reasons, each naming the
construct. The choice is made once per constraint and cached.
"""

from __future__ import annotations

from collections import OrderedDict

from tokenizers import Tokenizer

from deepinfer.errors import InvalidRequestError
from deepinfer.plugins import Availability
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer_structured.backend import LibraryBackend, constraint_key
from deepinfer_structured.llguidance_backend import LLGuidanceBackend
from deepinfer_structured.matcher import Matcher
from deepinfer_structured.xgrammar_backend import XGrammarBackend

CACHE_SIZE = 1024
_PREFIX = "cannot be compiled: "


class AutoBackend:
    """xgrammar first, llguidance for what xgrammar refuses."""

    name = "auto"

    @classmethod
    def availability(cls) -> Availability:
        """xgrammar is needed; without llguidance (a dependency, so only in a broken install)
        every constraint xgrammar refuses is refused."""
        return XGrammarBackend.availability()

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.xgrammar = XGrammarBackend(tokenizer, vocab_size, stop_token_ids)
        self._llguidance: LLGuidanceBackend | None = None
        self._chosen: OrderedDict[str, LibraryBackend] = OrderedDict()

    @property
    def llguidance(self) -> LLGuidanceBackend:
        """Built on the first constraint xgrammar refuses."""
        if self._llguidance is None:
            self._llguidance = LLGuidanceBackend(
                self.tokenizer, self.vocab_size, self.stop_token_ids
            )
        return self._llguidance

    def backend_for(self, constraint: StructuredOutputsParams) -> LibraryBackend:
        """The backend that enforces ``constraint`` (compiled there, cached); raises
        InvalidRequestError with both backends' reasons when neither does."""
        if constraint.kind == "reasoning":
            return self.xgrammar
        key = constraint_key(constraint)
        chosen = self._chosen.get(key)
        if chosen is not None:
            self._chosen.move_to_end(key)
            return chosen
        try:
            self.xgrammar.compile(constraint)
            backend: LibraryBackend = self.xgrammar
        except InvalidRequestError as first:
            if not LLGuidanceBackend.availability().ok:
                raise InvalidRequestError(
                    first.field, f"{first.reason} (llguidance, the fallback, is not installed)"
                ) from first
            try:
                self.llguidance.compile(constraint)
            except InvalidRequestError as second:
                raise InvalidRequestError(
                    first.field,
                    f"{_PREFIX}xgrammar: {_strip(first.reason)}; "
                    f"llguidance: {_strip(second.reason)}",
                ) from second
            backend = self.llguidance
        self._chosen[key] = backend
        if len(self._chosen) > CACHE_SIZE:
            self._chosen.popitem(last=False)
        return backend

    def matcher(self, constraint: StructuredOutputsParams) -> Matcher:
        return self.backend_for(constraint).matcher(constraint)


def _strip(reason: str) -> str:
    return reason[len(_PREFIX) :] if reason.startswith(_PREFIX) else reason
