"""Which JSON schemas xgrammar enforces exactly, and the rewrite that makes more of them so.

xgrammar compiles many schemas it does not enforce: some keywords it never checks, some only
in some contexts, and some it drops without a warning. Measured over the official
JSON-Schema-Test-Suite (``benchmarks/structured_schema_battery.py``: the grammar must reject the
suite's invalid instances, and fuzzed and model-sampled outputs must validate), it

- ignores type-specific keywords (``minimum``, ``maxLength``, ``pattern``, ``minItems``,
  ``minProperties``, ``patternProperties``, ``propertyNames``, ``required`` ...) in a schema
  with no ``type``, but enforces them once ``type`` names the type: so a typeless schema gets
  the types its keywords constrain (a subset of its instances, all valid);
- applies neither ``type`` nor any sibling keyword to ``enum``/``const``: the values are
  filtered by ``type`` here, and other siblings are refused;
- enforces ``multipleOf`` on integers only: an integral divisor makes the type ``integer``
  (a number divisible by an integer is one), and any other is refused;
- generates from one combinator (``allOf``/``anyOf``/``oneOf``) alone, dropping a second one
  and every sibling keyword but ``type``, which it applies only through the branches: the
  ``type`` is copied into typeless branches, and anything else is refused;
- lets raw control characters into length-bounded strings (invalid JSON): the bounds become a
  pattern over non-control characters;
- ignores ``required`` names missing from ``properties`` (strict mode then forbids them), and
  every keyword beside a ``$ref``; it cannot resolve a ``$ref`` that is not a local JSON pointer;
- writes a key twice where ``additionalProperties``/``patternProperties`` allow it, so a
  ``minProperties`` above 1 that the required properties do not meet is refused;
- never checks the keywords of :data:`UNENFORCED_KEYWORDS`.

Before that, keywords that constrain nothing as written are dropped
(``schema_keywords.drop_noops``), as are keywords beside ``$ref`` where the declared draft
(4, 6 or 7) ignores them, and a ``oneOf`` whose branches provably exclude each other becomes
``anyOf`` (``one_of``). What it loosens with a warning (``oneOf`` read as ``anyOf``,
``multipleOf`` with a range or on numbers, ...) is caught by the backend, which refuses any
compile that warns. Annotations and keys no draft defines (``x-*``, ``readonly``) are never
read: JSON Schema ignores them, so they neither count as siblings of ``enum``, a combinator or
``$ref`` nor have their values searched for keywords.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from deepinfer_structured.one_of import normalize
from deepinfer_structured.schema_keywords import (
    COUNTS,
    ONE_SCHEMA,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    VALIDATING,
    pointer_parts,
    repeated_keys_may_count,
    resolve_pointer,
    schema_location,
    walk,
)

#: Keywords xgrammar does not enforce, so a schema using them (at any depth) is refused rather
#: than allowed to generate output that fails validation. Each stays listed because the grammar
#: accepted instances the official test suite marks invalid, or sampled outputs failed
#: validation (``benchmarks/results/structured_schema_battery.json``, ``per_refused_keyword``);
#: ``dependencies`` and ``$recursiveRef`` (drafts before 2020-12) xgrammar does not read at all.
UNENFORCED_KEYWORDS = frozenset(
    {
        "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "uniqueItems",
        "contains", "minContains", "maxContains", "$dynamicRef", "dependencies",
        "$recursiveRef",
    }
)  # fmt: skip
_COMBINATORS = frozenset({"allOf", "anyOf", "oneOf"})
#: Largest ``maxLength`` checked exact (as a pattern repetition) on xgrammar 0.2.9.
_MAX_STRING_BOUND = 4096
#: Keywords that constrain one type only, by the type they constrain.
_TYPE_FAMILIES = {
    "number": frozenset(
        {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    ),
    "string": frozenset({"minLength", "maxLength", "pattern"}),
    "array": frozenset(
        {
            "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
            "minContains", "maxContains", "unevaluatedItems",
        }
    ),
    "object": frozenset(
        {
            "properties", "patternProperties", "additionalProperties", "required",
            "minProperties", "maxProperties", "propertyNames", "dependentRequired",
            "dependentSchemas", "unevaluatedProperties",
        }
    ),
}  # fmt: skip


class UnenforcedSchemaError(ValueError):
    """The schema uses something xgrammar would not enforce; the message says what."""


def unenforced_keyword(schema: Any, refused: frozenset[str] = UNENFORCED_KEYWORDS) -> str | None:
    """The first keyword of ``schema`` (at any depth) in ``refused``; keys are read at keyword
    positions only, so a vendor key's value (``x-...``: data) never counts."""
    for _, node in walk(schema):
        for key in node:
            if key in refused:
                return key
    return None


def _has_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        if isinstance(value, float):
            return math.isfinite(value) and value.is_integer()
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    return name == "object" and isinstance(value, dict)


def _contains_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_contains_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_contains_ref(v) for v in schema)
    return False


def prepare_schema(
    schema: Any, refused: frozenset[str] = UNENFORCED_KEYWORDS, rewrite: bool = True
) -> Any:
    """A schema xgrammar enforces exactly whose every instance ``schema`` accepts.

    Raises UnenforcedSchemaError naming the construct when there is none. ``rewrite`` False
    applies only the keyword list (the policy before the typing rewrite, for comparison).
    """
    schema = normalize(schema)
    if (keyword := unenforced_keyword(schema, refused)) is not None:
        raise UnenforcedSchemaError(f"keyword '{keyword}' is not supported by this backend")
    if not rewrite:
        return schema
    has_ref = _contains_ref(schema)
    out = _prepare(schema, "#", has_ref, root=True)
    # A reference may point into a key no draft defines ("#/definitions/a/full"): the walk
    # above left that schema as data, so prepare it where it is.
    targets = sorted({ref for ref in _local_refs(schema) if not schema_location(ref)})
    for ref in targets:
        target = resolve_pointer(schema, ref)
        if target is None:
            raise UnenforcedSchemaError(f"reference {ref!r} cannot be resolved")
        out = _place(out, ref, _prepare(target, ref, has_ref))
    return out


def _local_refs(schema: Any) -> list[str]:
    """Every local ``$ref`` of ``schema``'s schema objects (vendor keys followed by ``walk``)."""
    return [n["$ref"] for _, n in walk(schema) if isinstance(n.get("$ref"), str)]


def _place(document: Any, ref: str, value: Any) -> Any:
    """A copy of ``document`` with ``value`` at the JSON pointer ``ref`` (copying the path)."""
    parts = pointer_parts(ref)
    root = copy.copy(document)
    node = root
    for part in parts[:-1]:
        key: Any = int(part) if isinstance(node, list) else part
        node[key] = copy.copy(node[key])
        node = node[key]
    node[int(parts[-1]) if isinstance(node, list) else parts[-1]] = value
    return root


def _prepare(
    schema: Any, where: str, has_ref: bool, root: bool = False, inherited: Any = None
) -> Any:
    """``inherited``: the ``type`` of the schema whose combinator holds this one, which xgrammar
    would not apply (it generates from the combinator alone)."""
    if not isinstance(schema, dict):
        if schema is True and inherited is not None:
            return {"type": inherited}
        return schema
    if inherited is not None and "type" not in schema and "$ref" not in schema:
        schema = {**schema, "type": inherited}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _prepare(v, f"{where}/{key}/{k}", has_ref) for k, v in value.items()}
        elif key in _COMBINATORS and isinstance(value, list):
            parent = schema.get("type")
            out[key] = [
                _prepare(v, f"{where}/{key}/{i}", has_ref, inherited=parent)
                for i, v in enumerate(value)
            ]
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_prepare(v, f"{where}/{key}/{i}", has_ref) for i, v in enumerate(value)]
        elif key in ONE_SCHEMA:
            out[key] = _prepare(value, f"{where}/{key}", has_ref)
        elif key in COUNTS and isinstance(value, float) and value.is_integer():
            out[key] = int(value)
        else:
            out[key] = value
    validating = {key for key in out if key in VALIDATING}  # annotations and vendor keys: none
    combinators = sorted(_COMBINATORS & validating)
    if combinators:
        _check_combinator(out, combinators, validating, where)
    if "$id" in out and not root and has_ref:
        raise UnenforcedSchemaError(f"'$id' at {where} changes where references resolve")
    if "$ref" in out:
        ref = out["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise UnenforcedSchemaError(f"reference {ref!r} at {where} is not a local pointer")
        if validating - {"$ref"}:
            extra = sorted(validating - {"$ref"})[0]
            raise UnenforcedSchemaError(f"keyword '{extra}' beside '$ref' at {where}")
        return out
    types = out.get("type")
    type_names = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if "enum" in out or "const" in out:
        extra = validating - {"enum", "const", "type"}
        if extra:
            word = sorted(extra)[0]
            raise UnenforcedSchemaError(f"keyword '{word}' beside 'enum'/'const' at {where}")
        values = list(out.pop("enum", [])) + ([out.pop("const")] if "const" in out else [])
        if "enum" in schema and "const" in schema:
            const = values[-1]
            values = [v for v in values[:-1] if v == const and type(v) is type(const)]
        if type_names is not None:
            values = [v for v in values if any(_has_type(v, t) for t in type_names)]
            out.pop("type", None)
        if not values:
            raise UnenforcedSchemaError(f"no value of 'enum'/'const' at {where} is valid")
        out["enum"] = values
        return out
    if types is None:
        families = [t for t, words in _TYPE_FAMILIES.items() if words & validating]
        if families:
            out["type"] = families[0] if len(families) == 1 else families
            type_names = families
    divisor = out.get("multipleOf")
    if (
        type_names
        and "number" in type_names
        and isinstance(divisor, int | float)
        and not isinstance(divisor, bool)
        and float(divisor).is_integer()
    ):
        # Numbers that are multiples of an integer are integers: xgrammar enforces multipleOf
        # on integers only (it warns, and the compile is refused, on numbers).
        type_names = ["integer" if t == "number" else t for t in type_names]
        out["type"] = type_names[0] if len(type_names) == 1 else type_names
        out["multipleOf"] = int(divisor)
    if type_names and "string" in type_names and {"minLength", "maxLength"} & set(out):
        _bounded_string(out, where)
    if type_names and "object" in type_names:
        _check_object(out, where)
    return out


def _bounded_string(schema: dict[str, Any], where: str) -> None:
    """xgrammar's grammar for a length-bounded string lets raw control characters through
    (invalid JSON); the same bounds as a pattern over non-control characters are exact
    (a subset: control characters, which JSON must escape, are left out)."""
    if "pattern" in schema or "format" in schema:
        return  # xgrammar warns that it ignores the bounds there: the compile is refused
    low = schema.pop("minLength", 0)
    high = schema.pop("maxLength", None)
    if high is not None and high > _MAX_STRING_BOUND:
        raise UnenforcedSchemaError(
            f"'maxLength' above {_MAX_STRING_BOUND} at {where} is not enforced exactly"
        )
    schema["pattern"] = f"^[^\\x00-\\x1f]{{{low},{'' if high is None else high}}}$"


def _type_names(types: Any) -> set[str]:
    return {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()


def _check_combinator(
    schema: dict[str, Any], combinators: list[str], validating: set[str], where: str
) -> None:
    """xgrammar generates from one combinator alone: it drops a second combinator and every
    sibling keyword but ``type``, and applies that ``type`` only through the branches."""
    if len(combinators) > 1:
        raise UnenforcedSchemaError(
            f"'{combinators[0]}' and '{combinators[1]}' together at {where} are not enforced"
        )
    (combinator,) = combinators
    extra = sorted(validating - {combinator, "type"})
    if extra:
        raise UnenforcedSchemaError(
            f"keyword '{extra[0]}' beside '{combinator}' at {where} is not enforced"
        )
    if "type" not in schema:
        return
    parent = _type_names(schema["type"])
    if "number" in parent:
        parent.add("integer")
    for i, branch in enumerate(schema[combinator]):
        inner = _type_names(branch.get("type")) if isinstance(branch, dict) else set()
        if isinstance(branch, dict) and "enum" in branch:
            continue  # values already filtered by the inherited type
        if not inner or not inner <= parent:
            raise UnenforcedSchemaError(
                f"branch {where}/{combinator}/{i} may allow values outside the 'type' beside it"
            )


def _check_object(schema: dict[str, Any], where: str) -> None:
    """Object keywords xgrammar reads only partly: properties it would let through unchecked."""
    if repeated_keys_may_count(schema):
        raise UnenforcedSchemaError(
            f"'minProperties' at {where} could be met by a repeated key: not enforced"
        )
    required = schema.get("required") or []
    declared = schema.get("properties") or {}
    missing = [name for name in required if name not in declared]
    if missing:
        raise UnenforcedSchemaError(
            f"required property {missing[0]!r} at {where} is not declared in 'properties'"
        )
    additional = schema.get("additionalProperties", True)
    if additional is not True and _COMBINATORS & set(schema):
        # Properties a combinator declares are still "additional" to this schema.
        raise UnenforcedSchemaError(
            f"'additionalProperties' beside a combinator at {where} is not enforced"
        )
    patterns = schema.get("patternProperties") or {}
    if patterns:
        open_ended = "additionalProperties" in schema and additional is not False
        if len(patterns) > 1 or open_ended:
            raise UnenforcedSchemaError(
                f"'patternProperties' at {where} may overlap another property schema"
            )
        (pattern,) = patterns
        try:
            clash = [name for name in declared if re.search(pattern, name)]
        except re.error:
            clash = list(declared) or [""]
        if clash:
            raise UnenforcedSchemaError(
                f"property {clash[0]!r} at {where} also matches 'patternProperties' {pattern!r}"
            )
