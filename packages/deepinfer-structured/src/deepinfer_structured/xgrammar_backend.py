"""Grammar backend ``xgrammar``: regex, JSON schema, EBNF, choice and DSML tool-call constraints.

Compiled grammars are cached per constraint for the engine's tokenizer, so a thousand requests
with one schema compile it once. Each sequence gets its own matcher.

- JSON is generated without free whitespace (``", "`` and ``": "`` separators): a model can
  otherwise spend its whole token budget on spaces without ever closing the object.
- The tokenizer's added tokens (BOS, chat markup, ``</think>``, ``｜DSML｜``, ...) are never text
  under a grammar: the detokenizer drops the special ones and the chat parser reads the others
  as markup, so text made of them would not be the text the grammar checked. They are blanked
  in xgrammar's vocabulary, which makes them unselectable (the stop tokens excepted).
- A constraint is refused at submit time, with the reason, when xgrammar cannot enforce it
  exactly: a schema construct it does not implement (``schema_policy``, which also types
  typeless schemas so that xgrammar checks their keywords), or any warning xgrammar prints
  while compiling (it warns when it falls back to a looser grammar: ``oneOf`` read as
  ``anyOf``, an unresolvable ``$ref``, a ``multipleOf`` or regex construct it ignores). Its
  own compile cache is off: a cache hit would compile silently, past that check.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from tokenizers import Tokenizer

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer.structured import ReplyConstraint
from deepinfer_structured.backend import LibraryBackend
from deepinfer_structured.dsml import tool_call_tag
from deepinfer_structured.matcher import Matcher, XGrammarMatcher
from deepinfer_structured.schema_policy import (
    UNENFORCED_KEYWORDS,
    UnenforcedSchemaError,
    prepare_schema,
    unenforced_keyword,
)
from deepinfer_structured.utf8 import Utf8Guard


class InexactGrammarError(ValueError):
    """xgrammar compiled the constraint only by loosening it (it said so on stderr)."""


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to file descriptor 2 while the block runs.

    xgrammar reports a constraint it cannot represent exactly only as a log line from C++,
    so the descriptor itself is redirected; whatever was captured is written back afterwards.
    """
    lines: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr: compile without the check
        yield lines
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())
    others = [line for line in lines if "Warning:" not in line]
    if others:
        sys.stderr.write("\n".join(others) + "\n")


def exactly(build: Callable[[], Any], refuse: bool = True) -> Any:
    """Run a grammar build; raise InexactGrammarError if xgrammar warned it loosened something
    (``refuse`` False only collects the warnings: ``(result, warnings)``)."""
    with _native_stderr() as lines:
        result = build()
    warnings = [line.split("Warning:", 1)[1].strip() for line in lines if "Warning:" in line]
    if not refuse:
        return result, warnings
    if warnings:
        raise InexactGrammarError(f"not enforced exactly: {warnings[0]}")
    return result


def _choice_regex(choices: list[str]) -> str:
    special = set(r"\.^$|?*+()[]{}/")
    escaped = ["".join("\\" + c if c in special else c for c in choice) for choice in choices]
    return "(" + "|".join(escaped) + ")"


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    reason = text.splitlines()[-1] if text else type(exc).__name__
    # xgrammar prefixes messages with a timestamp and a C++ source location.
    return reason.split(": ", 1)[-1] if reason.startswith("[") else reason


class XGrammarBackend(LibraryBackend):
    """Builds xgrammar's tokenizer info once and compiles constraints against it."""

    name = "xgrammar"
    library = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        super().__init__(tokenizer, vocab_size, stop_token_ids)
        self._xgr = xgr
        encoded = [""] * vocab_size
        for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
            if index < vocab_size:
                encoded[index] = token
        for index in tokenizer.get_added_tokens_decoder():
            if index < vocab_size and index not in stop_token_ids:
                encoded[index] = ""  # empty text: xgrammar treats the token as special
        threads = max(1, min(8, os.cpu_count() or 1))

        def compiler(vocab: list[str]) -> Any:
            info = xgr.TokenizerInfo(
                vocab,
                xgr.VocabType.BYTE_LEVEL,
                vocab_size=vocab_size,
                stop_token_ids=stop_token_ids,
            )
            return xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)

        #: The refusal policy (module docstring); an evaluation may loosen it to probe xgrammar.
        self.refused_keywords: frozenset[str] = UNENFORCED_KEYWORDS
        self.rewrite_schemas = True
        self.refuse_inexact = True
        self.compiler = compiler(encoded)
        self.utf8 = Utf8Guard(tokenizer, vocab_size, self.stop_token_ids)
        self._tool_vocab = encoded
        self._tool_compiler: Any = None
        self._make_compiler = compiler

    def policy(self) -> tuple[Any, ...]:
        return (self.refused_keywords, self.rewrite_schemas, self.refuse_inexact)

    # -- compiling ----------------------------------------------------------------------------

    def _tool_calls_compiler(self) -> Any:
        """A compiler whose vocabulary gives the DSML token an impossible byte (0xFF, written
        ``ÿ`` in byte-level form): no text rule can match it, only the grammar's token
        references, so DSML tags come out as the control token the chat parser looks for."""
        if self._tool_compiler is None:
            vocab = list(self._tool_vocab)
            vocab[self.require_dsml()] = "ÿ"
            self._tool_compiler = self._make_compiler(vocab)
        return self._tool_compiler

    def json_value_grammar(self, schema: Any, where: str) -> str:
        """EBNF of one JSON value under ``schema`` (a DSML argument), refused when inexact."""
        try:
            schema = prepare_schema(schema, self.refused_keywords, self.rewrite_schemas)
            grammar = self._exactly(
                lambda: self._xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
            )
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidRequestError(where, f"cannot be compiled: {_reason(exc)}") from exc
        return str(grammar)

    def _exactly(self, build: Callable[[], Any]) -> Any:
        if self.refuse_inexact:
            return exactly(build)
        return build()

    def _build(self, kind: str, value: Any, constraint: StructuredOutputsParams) -> Any:
        if kind == "json":
            parsed = json.loads(value) if isinstance(value, str) else value
            schema = json.dumps(prepare_schema(parsed, self.refused_keywords, self.rewrite_schemas))
            return self._exactly(
                lambda: self.compiler.compile_json_schema(schema, any_whitespace=False)
            )
        if kind == "json_object":
            return self.compiler.compile_builtin_json_grammar()
        if kind == "regex":
            return self._exactly(lambda: self.compiler.compile_regex(value))
        if kind == "grammar":
            return self._exactly(lambda: self.compiler.compile_grammar(value))
        if kind == "choice":
            return self.compiler.compile_regex(_choice_regex(value))
        if kind == "tool_calls":
            assert isinstance(constraint, ReplyConstraint)
            compiler = self._tool_calls_compiler()
            dsml = self.require_dsml()
            tag = tool_call_tag(value, constraint.dsml, dsml, self.json_value_grammar)
            return self._exactly(lambda: compiler.compile_structural_tag(tag))
        raise ValueError(f"unknown constraint kind {kind!r}")

    def _reason(self, exc: Exception) -> str:
        return _reason(exc)

    def _start(self, compiled: Any) -> Matcher:
        return XGrammarMatcher(self._xgr, compiled, self.vocab_size, self.utf8)


__all__ = [
    "UNENFORCED_KEYWORDS",
    "UnenforcedSchemaError",
    "XGrammarBackend",
    "prepare_schema",
    "unenforced_keyword",
]
