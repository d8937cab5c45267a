"""The JSON Schema vocabulary both grammar backends' policies share: which keys of a schema
constrain instances, which only annotate them, and where subschemas sit.

JSON Schema ignores keywords it does not know: a vendor key (``x-intellij-enum-metadata``), a
misspelling (``readonly``) or an annotation (``title``, ``readOnly``) changes no verdict, so a
policy that refuses a schema must look only at :data:`VALIDATING` keys and must never read a
vendor key's value as a schema. The list covers every draft from 4 to 2020-12, since a schema
that declares an older draft (``$schema``) is validated by that draft's keywords
(``dependencies``, ``additionalItems``, ``$recursiveRef``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

#: Keys that constrain instances under some draft (assertions and applicators); ``format`` is
#: an annotation by default and is listed apart.
VALIDATING = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "items", "additionalItems",
        "prefixItems", "maxItems", "minItems", "uniqueItems", "contains", "maxContains",
        "minContains", "unevaluatedItems", "maxProperties", "minProperties", "required",
        "properties", "patternProperties", "additionalProperties", "dependencies",
        "dependentRequired", "dependentSchemas", "propertyNames", "unevaluatedProperties",
        "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef",
        "$recursiveRef",
    }
)  # fmt: skip
#: Annotations and identifiers: they never change whether an instance is valid.
ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary",
        "$comment", "$defs", "definitions", "title", "description", "default", "examples",
        "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
        "contentSchema", "format",
    }
)  # fmt: skip

#: Keys whose value maps names to subschemas.
SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
#: Keys whose value is a list of subschemas.
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
#: Keys whose value is one subschema (``items`` may also be a list, in drafts before 2020-12).
#: ``contentSchema`` is left out: it annotates the decoded content and constrains nothing.
ONE_SCHEMA = frozenset(
    {
        "items", "additionalItems", "additionalProperties", "not", "if", "then", "else",
        "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    }
)  # fmt: skip


def is_vendor_key(key: str) -> bool:
    """Whether ``key`` is neither a keyword nor an annotation (``x-*``, ``readonly``, ...)."""
    return key not in VALIDATING and key not in ANNOTATIONS


def children(schema: Any) -> Iterator[tuple[str, Any]]:
    """(JSON-pointer suffix, subschema) of every direct subschema of ``schema``, read only at
    keyword positions: a vendor key's value is data, never a schema."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield f"/{_escape(key)}/{_escape(name)}", sub
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield f"/{key}/{i}", sub
        elif key == "items" and isinstance(value, list):
            for i, sub in enumerate(value):
                yield f"/items/{i}", sub
        elif key == "dependencies" and isinstance(value, dict):
            for name, sub in value.items():
                if isinstance(sub, dict | bool):  # a list there names required properties
                    yield f"/dependencies/{_escape(name)}", sub
        elif key in ONE_SCHEMA:
            yield f"/{key}", value


def walk(schema: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, schema object) of ``schema`` and every subschema under it, depth first, plus
    whatever a local ``$ref`` points at outside keyword positions (followed once)."""
    seen: set[str] = set()
    stack: list[tuple[str, Any]] = [(where, schema)]
    while stack:
        here, node = stack.pop()
        if not isinstance(node, dict) or here in seen:
            continue
        seen.add(here)
        yield here, node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/") and not schema_location(ref):
            target = resolve_pointer(schema, ref)
            if target is not None:
                stack.append((ref, target))
        stack.extend(reversed([(here + suffix, sub) for suffix, sub in children(node)]))


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def pointer_parts(ref: str) -> list[str]:
    """The unescaped reference tokens of a local JSON pointer (``#/a~1b/0``: ``a/b``, ``0``);
    none for ``#``, the whole document."""
    return [_unescape(part) for part in ref[2:].split("/")] if ref.startswith("#/") else []


def resolve_pointer(document: Any, ref: str) -> Any:
    """The value a local reference (``#``, ``#/a/b``) points at, or None when there is none
    (a remote or anchor reference points at nothing in ``document``)."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = document
    for part in pointer_parts(ref):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def schema_location(ref: str) -> bool:
    """Whether a local reference walks keyword positions only (``#/$defs/a/properties/b``), so
    that the walk from the root reaches its target as a schema."""
    if ref == "#":
        return True
    if not ref.startswith("#/"):
        return False
    parts = pointer_parts(ref)
    i = 0
    while i < len(parts):
        key = parts[i]
        if key in SCHEMA_MAPS or key == "dependencies" or key in SCHEMA_LISTS or key == "items":
            if key in ONE_SCHEMA and (i + 1 == len(parts) or not parts[i + 1].isdigit()):
                i += 1  # "items" as one schema
                continue
            if i + 1 == len(parts):
                return False
            i += 2
        elif key in ONE_SCHEMA:
            i += 1
        else:
            return False
    return True


#: Keywords whose value is a count, which both backends take only as an integer (2.0 means 2).
COUNTS = frozenset(
    {
        "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
        "minContains", "maxContains",
    }
)  # fmt: skip


def repeated_keys_may_count(node: dict[str, Any]) -> bool:
    """Whether ``minProperties`` here could be met by a key written twice.

    Neither backend keeps keys unique beyond the declared ``properties`` (a map schema may
    write ``{"a": 1, "a": 2}``), and a parser keeps one of them: the grammar would count two
    properties where the instance has one. The bound is safe when it is 1 (any key written
    makes one), when the required declared properties meet it alone, or when only declared
    properties (each written once) may appear.
    """
    low = node.get("minProperties")
    if not isinstance(low, int | float) or isinstance(low, bool):
        return False
    declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = {n for n in node.get("required") or [] if isinstance(n, str) and n in declared}
    if low <= max(1, len(required)):
        return False
    closed = node.get("additionalProperties") is False and not node.get("patternProperties")
    return not closed or bool({"allOf", "anyOf", "oneOf", "$ref"} & set(node))


def drop_noops(schema: Any) -> Any:
    """A copy of ``schema`` without keywords that constrain nothing as written, which a policy
    would otherwise refuse: ``uniqueItems: false`` (or true where at most one item fits),
    ``then``/``else`` with no ``if`` and an ``if`` with neither, ``minContains``/``maxContains``
    with no ``contains``, and empty ``dependentRequired``/``dependentSchemas``/``dependencies``.
    """
    schema = copy.deepcopy(schema)
    for _, node in walk(schema):
        high = node.get("maxItems")
        if node.get("uniqueItems") is False or (
            isinstance(high, int | float) and not isinstance(high, bool) and high <= 1
        ):
            node.pop("uniqueItems", None)
        if "if" not in node:
            node.pop("then", None)
            node.pop("else", None)
        elif "then" not in node and "else" not in node:
            del node["if"]
        if "contains" not in node:
            node.pop("minContains", None)
            node.pop("maxContains", None)
        for key in ("dependentRequired", "dependentSchemas", "dependencies"):
            if node.get(key) == {}:
                del node[key]
    return schema


def ignores_ref_siblings(schema: Any) -> bool:
    """Whether ``schema`` declares a draft (4, 6 or 7) in which keywords beside ``$ref`` are
    ignored: there the reference replaces the whole schema object."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    return isinstance(declared, str) and bool(
        re.search(r"json-schema\.org/draft-0[3-7]/schema", declared)
    )


def drop_ref_siblings(schema: Any) -> Any:
    """A copy of ``schema`` without the keywords its draft ignores beside ``$ref`` (none when
    it declares 2019-09 or later, or no draft, where they apply)."""
    if not ignores_ref_siblings(schema):
        return schema
    schema = copy.deepcopy(schema)
    for _, node in walk(schema):
        if "$ref" in node:
            for key in [k for k in node if k in VALIDATING and k != "$ref"]:
                del node[key]
    return schema
