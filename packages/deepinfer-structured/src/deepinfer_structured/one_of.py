"""``oneOf`` whose branches provably exclude each other is ``anyOf``: rewrite it so.

Neither backend enforces ``oneOf`` in general (xgrammar reads it as ``anyOf`` and warns;
llguidance refuses what it cannot prove exclusive, and proves little: two ``const`` branches
defeat it). When no instance can match two branches, "exactly one" and "at least one" are the
same, so the rewrite is exact. The proof here is deliberately simple and sound:

- two branches are disjoint when the JSON types they can match are (from ``type``,
  ``const``/``enum`` values, local ``$ref`` targets, ``allOf``/``anyOf``/``oneOf``; integers
  count as numbers);
- or when both are value lists (``const``/``enum``) with no value in common (JSON Schema
  equality: ``1`` equals ``1.0``, ``true`` does not equal ``1``), or one is a value list
  whose values are all of types the other cannot match;
- or when both are objects that require one property whose value lists are disjoint (a
  discriminator, ``"kind": {"const": "a"}``).

Anything it cannot prove stays ``oneOf`` (and is refused, or enforced, as before).
:func:`normalize` applies it after the rewrites of ``schema_keywords`` (keywords the draft
ignores beside ``$ref`` and keywords that constrain nothing dropped): the schema that both
backends' policies then judge.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from deepinfer_structured.schema_keywords import (
    drop_noops,
    drop_ref_siblings,
    resolve_pointer,
    walk,
)

_ALL = frozenset({"null", "boolean", "string", "array", "object", "number"})
_DEPTH = 16


def _canonical(value: Any) -> Any:
    """A hashable key under JSON Schema equality (1 == 1.0; True != 1)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", int(value) if float(value).is_integer() else value)
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z",)
    if isinstance(value, list):
        return ("a", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("o", tuple(sorted((k, _canonical(v)) for k, v in value.items())))
    return ("?", repr(value))


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


class _Prover:
    def __init__(self, root: Any) -> None:
        self.root = root

    def resolve(self, schema: Any, depth: int) -> Any:
        """The target of a local ``$ref`` (followed; None when it cannot be). Keywords beside
        the reference are left out: they only narrow it from 2020-12 on, and draft 7 and
        earlier ignore them, so the target alone is a superset either way."""
        while isinstance(schema, dict) and "$ref" in schema and depth < _DEPTH:
            ref = schema["$ref"]
            schema = resolve_pointer(self.root, ref) if isinstance(ref, str) else None
            depth += 1
        return schema

    def values(self, schema: Any, depth: int = 0) -> set[Any] | None:
        """The values ``schema`` may take, when it lists them (``const``/``enum``)."""
        schema = self.resolve(schema, depth)
        if not isinstance(schema, dict):
            return None
        found: set[Any] | None = None
        if isinstance(schema.get("enum"), list):
            found = {_canonical(v) for v in schema["enum"]}
        if "const" in schema:
            const = {_canonical(schema["const"])}
            found = const if found is None else found & const
        return found

    def types(self, schema: Any, depth: int = 0) -> frozenset[str]:
        """A superset of the JSON types ``schema`` can match."""
        if depth > _DEPTH:
            return _ALL
        if schema is False:
            return frozenset()
        schema = self.resolve(schema, depth)
        if not isinstance(schema, dict):
            return _ALL
        out = _ALL
        kind = schema.get("type")
        if isinstance(kind, str):
            kind = [kind]
        if isinstance(kind, list):
            out &= frozenset("number" if t == "integer" else t for t in kind)
        for key in ("enum", "const"):
            if key in schema:
                listed = schema[key] if key == "enum" else [schema[key]]
                if isinstance(listed, list):
                    out &= frozenset(_type_of(v) for v in listed)
        for branch in schema.get("allOf") or []:
            out &= self.types(branch, depth + 1)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                union = frozenset().union(*(self.types(b, depth + 1) for b in schema[key]))
                out &= union
        return out

    def disjoint(self, a: Any, b: Any) -> bool:
        if not self.types(a) & self.types(b):
            return True
        va, vb = self.values(a), self.values(b)
        if va is not None and vb is not None:
            return not va & vb
        for values, other in ((va, b), (vb, a)):
            if values is not None and not {v[0] for v in values} & self._tags(other):
                return True
        return self._discriminated(a, b)

    def _tags(self, schema: Any) -> set[str]:
        names = {"null": "z", "boolean": "b", "string": "s", "array": "a", "object": "o"}
        return {names.get(t, "n") for t in self.types(schema)}

    def _discriminated(self, a: Any, b: Any) -> bool:
        a, b = self.resolve(a, 0), self.resolve(b, 0)
        if not isinstance(a, dict) or not isinstance(b, dict):
            return False
        if not self.types(a) <= {"object"} or not self.types(b) <= {"object"}:
            return False
        both = set(a.get("required") or []) & set(b.get("required") or [])
        for name in sorted(both):
            pa = (a.get("properties") or {}).get(name)
            pb = (b.get("properties") or {}).get(name)
            va, vb = self.values(pa), self.values(pb)
            if va is not None and vb is not None and not va & vb:
                return True
        return False


def exclusive_one_of(schema: Any) -> Any:
    """A copy of ``schema`` with every provably exclusive ``oneOf`` turned into ``anyOf``
    (kept as ``oneOf`` where the node already has an ``anyOf``)."""
    schema = copy.deepcopy(schema)
    prover = _Prover(schema)
    for _, node in walk(schema):
        branches = node.get("oneOf")
        if not isinstance(branches, list) or "anyOf" in node:
            continue
        if all(prover.disjoint(x, y) for x, y in itertools.combinations(branches, 2)):
            node["anyOf"] = node.pop("oneOf")
    return schema


def normalize(schema: Any) -> Any:
    """A copy of ``schema`` with the same instances that both policies judge instead of it:
    keywords its draft ignores beside ``$ref`` and keywords that constrain nothing dropped,
    provably exclusive ``oneOf`` made ``anyOf``. Shared so that the two backends refuse or
    accept a schema for its constraints, never for how it happens to be written."""
    return exclusive_one_of(drop_noops(drop_ref_siblings(schema)))
