"""Grammar backend ``xgrammar``: regex, JSON schema, EBNF and choice constraints as token masks.

Compiled grammars are cached per (constraint kind, constraint text) for the engine's tokenizer,
so a thousand requests with one schema compile it once. Each sequence gets its own matcher.
JSON is generated compact (no free whitespace): a model can otherwise spend its whole token
budget on spaces without ever closing the object.
"""

from __future__ import annotations

import importlib.util
import json
from collections import OrderedDict
from typing import Any

from tokenizers import Tokenizer

from deepinfer.errors import InvalidRequestError
from deepinfer.plugins import Availability
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer_structured.matcher import XGrammarMatcher

CACHE_SIZE = 256

#: Keywords whose meaning a token grammar cannot (or xgrammar does not) enforce exactly: a schema
#: using them is refused rather than generating output that fails validation. Conservative;
#: a keyword leaves this list once generation over the schema suite shows it exact.
UNENFORCED_KEYWORDS = frozenset(
    {
        "not", "if", "then", "else", "dependentSchemas", "dependentRequired",
        "unevaluatedProperties", "unevaluatedItems", "uniqueItems", "contains", "minContains",
        "maxContains", "multipleOf", "$dynamicRef", "$dynamicAnchor",
    }
)  # fmt: skip
#: Keys whose values map names to subschemas, and keys whose values are data, not schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_DATA_KEYS = frozenset({"enum", "const", "default", "examples", "required", "description"})


def unenforced_keyword(schema: Any) -> str | None:
    """The first keyword of ``schema`` (at any depth) that the grammar would not enforce."""
    if isinstance(schema, list):
        return next((k for item in schema if (k := unenforced_keyword(item))), None)
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if key in UNENFORCED_KEYWORDS:
            return key
        if key in _DATA_KEYS:
            continue
        children = value.values() if key in _SCHEMA_MAPS and isinstance(value, dict) else [value]
        for child in children:
            found = unenforced_keyword(child)
            if found:
                return found
    return None


def _choice_regex(choices: list[str]) -> str:
    special = set(r"\.^$|?*+()[]{}/")
    escaped = ["".join("\\" + c if c in special else c for c in choice) for choice in choices]
    return "(" + "|".join(escaped) + ")"


class XGrammarBackend:
    """Builds xgrammar's tokenizer info once and compiles constraints against it."""

    name = "xgrammar"

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("xgrammar") is None:
            return Availability(
                False, "xgrammar is not installed: pip install 'deepinfer[structured]'"
            )
        return Availability(True)

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        self._xgr = xgr
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
        self.info = xgr.TokenizerInfo.from_huggingface(
            hf, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(self.info)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def compile(self, constraint: StructuredOutputsParams) -> Any:
        kind = constraint.kind
        value = getattr(constraint, kind)
        key = (kind, json.dumps(value, sort_keys=True))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        try:
            if kind == "json":
                parsed = json.loads(value) if isinstance(value, str) else value
                if (keyword := unenforced_keyword(parsed)) is not None:
                    raise ValueError(f"keyword '{keyword}' is not supported by this backend")
                schema = value if isinstance(value, str) else json.dumps(value)
                compiled = self.compiler.compile_json_schema(schema, any_whitespace=False)
            elif kind == "json_object":
                compiled = self.compiler.compile_builtin_json_grammar()
            elif kind == "regex":
                compiled = self.compiler.compile_regex(value)
            elif kind == "grammar":
                compiled = self.compiler.compile_grammar(value)
            else:
                compiled = self.compiler.compile_regex(_choice_regex(value))
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            # xgrammar prefixes messages with a timestamp and a C++ source location.
            reason = reason.split(": ", 1)[-1] if reason.startswith("[") else reason
            raise InvalidRequestError(
                f"structured_outputs.{kind}", f"cannot be compiled: {reason}"
            ) from exc
        self._cache[key] = compiled
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def matcher(self, constraint: StructuredOutputsParams) -> XGrammarMatcher:
        return XGrammarMatcher(self._xgr, self.compile(constraint), self.vocab_size)


__all__ = ["XGrammarBackend"]
