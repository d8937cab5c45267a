"""Grammar backend ``llguidance``: JSON schema, regex, Lark/GBNF grammars, choice and DSML tool
calls, compiled by llguidance (the library vLLM's ``llguidance`` backend uses).

llguidance compiles a schema by intersecting what each keyword allows and refuses, with an
error, what it cannot represent, where xgrammar loosens such a schema and says so at best; it
is the backend for schemas xgrammar would enforce inexactly (``auto``). Its exactness is
measured like xgrammar's (``llguidance_policy``).

- The vocabulary is built from the engine's tokenizer, byte by byte. Every added token (BOS,
  chat markup, ``</think>``, ``｜DSML｜``...) is marked special (llguidance's 0xFF prefix): no
  text rule can produce it, so under a grammar it is never text, only a ``<[id]>`` reference
  in a Lark grammar (the DSML tags) or a stop token.
- JSON is generated without free whitespace, with the ``", "`` and ``": "`` separators the
  xgrammar backend uses, so both write the same text.
- ``grammar`` takes a Lark grammar (llguidance's dialect: ``start:`` rule, ``/regex/``
  terminals, ``%json``) or a GBNF grammar (``root ::= ...``, converted by llguidance). GBNF
  is close to xgrammar's EBNF but not the same language: xgrammar's extensions (lookahead
  ``(= ...)``, its ``TagDispatch``) are refused. Regexes use Rust's ``regex`` syntax (no
  lookaround or backreferences; ``\\d`` and ``\\w`` are Unicode-aware).
- ``json_object`` is any JSON object (``{"type": "object"}``, as vLLM's llguidance backend
  reads it); xgrammar's builtin JSON grammar also allows a top-level array.
- A constraint llguidance cannot compile, or compiles only with a warning, fails its request
  alone with an ``InvalidRequestError`` naming the construct.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer.structured import ReplyConstraint
from deepinfer_structured.backend import LibraryBackend
from deepinfer_structured.bits import unpack_words
from deepinfer_structured.dsml import tool_call_lark
from deepinfer_structured.llguidance_policy import (
    UNENFORCED_KEYWORDS,
    LLGuidanceSchemaError,
    drop_format,
    prepare_schema,
    unknown_format,
)
from deepinfer_structured.matcher import Matcher, draft_masks
from deepinfer_structured.utf8 import token_bytes

#: llguidance's JSON options, applied over whatever the schema's own ``x-guidance`` says.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": False,
    "lenient": False,
}


class LLGuidanceCompileError(ValueError):
    """llguidance refused the grammar (or warned that it compiled it inexactly)."""


class LLGuidanceMatcher:
    """One sequence's position in an llguidance grammar.

    llguidance's matcher enters a permanent error state on a token it rejects, so
    :meth:`accept` tries the token first and leaves the matcher unchanged when it is rejected.
    A matcher in an error state (a parser limit hit mid-way) allows nothing, so the engine
    aborts the request rather than emitting text the grammar did not check.
    """

    def __init__(self, matcher: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self._stops = frozenset(stop_token_ids)
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self._ended: list[bool] = []  # per accepted token: whether it was a stop token

    def _compute(self, words: np.ndarray) -> None:
        self._m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if self._m.is_error():
            words[:] = 0

    def allowed(self) -> Tensor:
        if self.is_terminated():
            return torch.zeros(self.vocab_size, dtype=torch.bool)
        self._compute(self._words)
        return unpack_words(self._words, self.vocab_size)

    def fill_bitmask(self, bitmask: Tensor, row: int) -> None:
        target = bitmask[row].numpy()  # a CPU bitmask, as the xgrammar backend's
        if self.is_terminated():
            target[:] = 0
        elif target.nbytes == self._words.nbytes and target.flags["C_CONTIGUOUS"]:
            self._compute(target)
        else:
            self._compute(self._words)
            target[:] = 0
            width = min(target.size, self._words.size)
            target[:width] = self._words[:width]

    def accept(self, token_id: int) -> bool:
        if self.is_terminated() or self._m.is_error():
            return False
        if token_id in self._stops:
            # A stop token ends a complete text; it is kept here, not in llguidance's matcher,
            # which does not count it among the tokens a rollback undoes.
            if not self._m.is_accepting():
                return False
        elif self._m.try_consume_tokens([token_id]) != 1 or self._m.is_error():
            return False
        self._ended.append(token_id in self._stops)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            if num_tokens > len(self._ended):
                raise ValueError(f"cannot roll back {num_tokens} tokens")
            undone = self._ended[-num_tokens:]
            del self._ended[-num_tokens:]
            text_tokens = num_tokens - sum(undone)
            if text_tokens:
                self._m.rollback(text_tokens)

    def is_terminated(self) -> bool:
        return bool(self._ended) and self._ended[-1]

    def draft_masks(self, draft: list[int]) -> tuple[Tensor, int]:
        return draft_masks(self, draft)


def _choice_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class LLGuidanceBackend(LibraryBackend):
    """Builds llguidance's tokenizer once and compiles constraints against it."""

    name = "llguidance"
    library = "llguidance"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        import llguidance

        super().__init__(tokenizer, vocab_size, stop_token_ids)
        self._llg = llguidance
        self.ll_tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Vocabulary(tokenizer, vocab_size, self.stop_token_ids)),
            n_vocab=vocab_size,
            eos_token=self.stop_token_ids,
        )
        #: The refusal policy (``llguidance_policy``); an evaluation may loosen it to probe.
        self.refused_keywords: frozenset[str] = UNENFORCED_KEYWORDS
        self.refuse_warnings = True

    def policy(self) -> tuple[Any, ...]:
        return (self.refused_keywords, self.refuse_warnings)

    # -- compiling ----------------------------------------------------------------------------

    def _check(self, grammar: str) -> None:
        """Raise LLGuidanceCompileError with llguidance's message if it refuses ``grammar``."""
        error, messages = self._llg.LLMatcher.validate_grammar_with_warnings(
            grammar, self.ll_tokenizer
        )
        if error:
            raise LLGuidanceCompileError(_reason(messages[0] if messages else "invalid grammar"))
        if messages and self.refuse_warnings:
            raise LLGuidanceCompileError(f"not enforced exactly: {_reason(messages[0])}")

    def json_schema(self, schema: Any) -> tuple[Any, str]:
        """(the schema as compiled, its grammar): the policy applied, unknown formats dropped."""
        if schema is False:
            raise LLGuidanceCompileError("the schema 'false' cannot accept any value")
        try:
            schema = prepare_schema(schema, self.refused_keywords)
        except LLGuidanceSchemaError as exc:
            raise LLGuidanceCompileError(str(exc)) from exc
        dropped: set[str] = set()
        while True:
            text = json.dumps(schema)
            grammar = self._llg.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
            try:
                self._check(grammar)
            except LLGuidanceCompileError as exc:
                name = unknown_format(str(exc))
                if name is None or name in dropped:
                    raise
                dropped.add(name)  # an annotation llguidance would assert: drop it
                schema = drop_format(schema, name)
                continue
            return schema, grammar

    def json_value_lark(self, schema: Any, where: str) -> str:
        """The Lark expression of one JSON value under ``schema`` (a DSML argument)."""
        try:
            compiled, _ = self.json_schema(schema)
        except (LLGuidanceCompileError, ValueError, TypeError) as exc:
            raise InvalidRequestError(where, f"cannot be compiled: {exc}") from exc
        return "%json " + json.dumps({**compiled, "x-guidance": JSON_OPTIONS})

    def grammar(self, kind: str, value: Any, constraint: StructuredOutputsParams) -> str:
        """The llguidance grammar of a constraint (checked: raises LLGuidanceCompileError)."""
        llm = self._llg.LLMatcher
        if kind == "json":
            parsed = json.loads(value) if isinstance(value, str) else value
            return self.json_schema(parsed)[1]
        if kind == "json_object":
            return self.json_schema({"type": "object"})[1]
        if kind == "regex":
            grammar = llm.grammar_from_regex(value)
        elif kind == "grammar":
            try:
                grammar = self._llg.grammar_from("grammar", value)
            except ValueError as exc:
                raise LLGuidanceCompileError(str(exc)) from exc
        elif kind == "choice":
            grammar = llm.grammar_from_lark(_choice_lark(value))
        elif kind == "tool_calls":
            assert isinstance(constraint, ReplyConstraint)
            dsml = self.require_dsml()
            lark = tool_call_lark(value, constraint.dsml, dsml, self.json_value_lark)
            grammar = llm.grammar_from_lark(lark)
        else:
            raise ValueError(f"unknown constraint kind {kind!r}")
        self._check(grammar)
        return grammar

    def _build(self, kind: str, value: Any, constraint: StructuredOutputsParams) -> Any:
        """A started llguidance matcher for ``constraint`` (copied per sequence)."""
        grammar = self.grammar(kind, value, constraint)
        compiled = self._llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if compiled.is_error():
            raise LLGuidanceCompileError(_reason(compiled.get_error()))
        return compiled

    def _reason(self, exc: Exception) -> str:
        return _reason(str(exc))

    def _start(self, compiled: Any) -> Matcher:
        return LLGuidanceMatcher(compiled.deep_copy(), self.vocab_size, self.stop_token_ids)


def _reason(message: str) -> str:
    """llguidance's message without the source excerpts it indents below it."""
    lines = [line.strip() for line in str(message).splitlines() if line[:1].strip()]
    return " ".join(lines)[:500] or "invalid grammar"


class _Vocabulary:
    """The tokenizer as llguidance's ``TokenizerWrapper`` reads it: each token's bytes, added
    tokens marked special (0xFF + their name), and an encoder for the text llguidance forces."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        added = tokenizer.get_added_tokens_decoder()
        table = token_bytes(tokenizer, vocab_size)
        tokens: list[bytes] = []
        for index, data in enumerate(table):
            if index in added:
                tokens.append(b"\xff" + added[index].content.encode())
            else:
                tokens.append(data or b"")
        self.tokens = tokens
        self.eos_token_id = stop_token_ids[0] if stop_token_ids else None
        self.bos_token_id = None
        self.special_token_ids = sorted(i for i in added if i < vocab_size)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance then passes text, never partial UTF-8
            raise TypeError("the vocabulary encodes text only")
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
