"""Which JSON schemas llguidance enforces exactly, and the rewrite that keeps it exact.

llguidance refuses, by itself, every keyword it does not implement (``not``, ``if``,
``uniqueItems``, ``contains``, ``dependentRequired``...: "Unimplemented keys"), a ``oneOf`` it
cannot prove equal to an ``anyOf``, ``patternProperties`` whose patterns may overlap, and an
``allOf`` whose intersection it cannot build; it ignores keys no draft defines (vendor ``x-*``
keys, ``readonly``) and annotations, as JSON Schema does. Measured over the official
JSON-Schema-Test-Suite and a SchemaStore sample (``benchmarks/structured_schema_battery.py``:
the grammar must reject the suite's invalid instances, and fuzzed and model-sampled outputs
must validate) it is otherwise exact, except where this module steps in:

- a top-level ``x-guidance`` key is llguidance's own options (``lenient``, ``coerce_one_of``,
  whitespace): from a request it is an annotation, so it is dropped and the backend's options
  apply;
- ``format`` is an annotation in JSON Schema, but llguidance asserts the formats it knows and
  refuses the others ("Unknown format"): an unknown one is dropped (every string is valid
  under an annotation), a known one kept (its strings are a subset);
- ``$dynamicAnchor`` / ``$recursiveAnchor`` (refused by llguidance) are dropped when no
  ``$dynamicRef`` / ``$recursiveRef`` could use them: they then only name a location, as
  ``$anchor`` does;
- a ``oneOf`` whose branches provably exclude each other becomes ``anyOf`` (``one_of``), as
  in the xgrammar policy;
- keywords beside ``$ref`` in a schema that declares draft 4, 6 or 7 are dropped: that
  draft ignores them (``schema_keywords.drop_ref_siblings``), as in the xgrammar policy;
- keywords that constrain nothing as written (``uniqueItems: false``, ``then`` without
  ``if``...) are dropped (``schema_keywords.drop_noops``), as in the xgrammar policy;
- counts written as integral floats (``"maxLength": 2.0``) are made integers, which is all
  llguidance reads;
- ``minProperties`` is refused where a repeated key could meet it (``schema_keywords``);
- the keywords of :data:`UNENFORCED_KEYWORDS`, which it compiles but does not enforce.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from deepinfer_structured.one_of import normalize
from deepinfer_structured.schema_keywords import (
    COUNTS,
    repeated_keys_may_count,
    walk,
)

#: Keywords llguidance compiles without enforcing them, so a schema using them is refused.
#: None found: no compiled suite schema accepts an invalid suite instance and no fuzzed or
#: sampled output fails (``benchmarks/results/structured_schema_battery.json``,
#: ``backends.llguidance``); the hook stays for a future llguidance release.
UNENFORCED_KEYWORDS: frozenset[str] = frozenset()

_UNKNOWN_FORMAT = re.compile(r"Unknown format: (.+)$")


class LLGuidanceSchemaError(ValueError):
    """The schema uses something llguidance would not enforce; the message says what."""


def prepare_schema(schema: Any, refused: frozenset[str] = UNENFORCED_KEYWORDS) -> Any:
    """A copy of ``schema`` llguidance enforces exactly, whose instances ``schema`` accepts;
    raises LLGuidanceSchemaError naming the construct when there is none."""
    if schema is True:
        return {}  # llguidance applies its options to an object schema only
    schema = normalize(schema)
    nodes = list(walk(schema))
    for where, node in nodes:
        for key in list(node):
            if key in refused:
                raise LLGuidanceSchemaError(
                    f"keyword '{key}' at {where} is not supported by this backend"
                )
            value = node[key]
            if key in COUNTS and isinstance(value, float) and value.is_integer():
                node[key] = int(value)  # llguidance reads counts as integers only
        if repeated_keys_may_count(node):
            raise LLGuidanceSchemaError(
                f"'minProperties' at {where} could be met by a repeated key: not enforced"
            )
    for anchor, ref in (("$dynamicAnchor", "$dynamicRef"), ("$recursiveAnchor", "$recursiveRef")):
        if not any(ref in node for _, node in nodes):
            for _, node in nodes:  # an anchor only: llguidance refuses the key, nothing uses it
                node.pop(anchor, None)
    if isinstance(schema, dict):
        schema.pop("x-guidance", None)
    return schema


def drop_format(schema: Any, name: str) -> Any:
    """``schema`` without the annotation ``format: name`` wherever it is a keyword."""
    schema = copy.deepcopy(schema)
    for _, node in walk(schema):
        if node.get("format") == name:
            del node["format"]
    return schema


def unknown_format(message: str) -> str | None:
    """The format llguidance's error names as unknown, if that is the error."""
    match = _UNKNOWN_FORMAT.search(message.strip())
    return match.group(1).strip() if match else None
