"""Annotations and undefined keywords never cause a refusal, in any backend.

JSON Schema ignores keywords it does not define and annotations (``title``, ``description``,
``examples``, ``$comment``, ``deprecated``, ``readOnly``, ``writeOnly``, ``x-*``): a schema with
them accepts exactly the instances it accepts without them. Independent check: random walks
through every backend's grammar validate under ``jsonschema``, and the two real cases from the
SchemaStore catalog (a vendor ``x-intellij-enum-metadata`` beside ``enum``, an unknown
``readonly``) compile.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from matcher_walks import random_walk
from schema_suite import validator
from schemastore_sample import store_schema, store_validator

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams

BACKENDS = ("xgrammar", "llguidance", "auto")
ANNOTATIONS: dict[str, Any] = {
    "title": "Name",
    "description": "Who speaks",
    "examples": ["Lear", 7],
    "$comment": "not for the model",
    "deprecated": True,
    "readOnly": True,
    "writeOnly": False,
    "default": {"any": "thing"},
    "readonly": True,
    "x-intellij-enum-metadata": {"a": {"description": "A"}},
    "x-vendor": {"not": {}, "required": ["x"], "minimum": 9, "enum": []},
    "markdownDescription": "*who*",
    "contentSchema": {"not": {}},
    "x-guidance": {"lenient": True, "whitespace_flexible": True},
}


def places(key: str, value: Any) -> list[Any]:
    """``key`` beside ``enum``, beside a combinator, beside a ``$ref``, in a property."""
    return [
        {"type": "string", "enum": ["a", "bb"], key: value},
        {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "string", "maxLength": 2}]}
        | {key: value},
        {"$defs": {"n": {"type": "integer", "minimum": 2, "maximum": 99}}, "$ref": "#/$defs/n"}
        | {key: value},
        {
            "type": "object",
            "properties": {"a": {"type": "string", "maxLength": 3, key: value}},
            "required": ["a"],
            "additionalProperties": False,
        },
    ]


def walks_validate(backend: Any, schema: Any, check: Any, count: int = 6) -> None:
    """Random walks through the backend's grammar for ``schema`` all validate."""
    rng = random.Random(json.dumps(schema, sort_keys=True))
    done = 0
    for _ in range(count):
        matcher = backend.matcher(StructuredOutputsParams(json=schema))
        ids = random_walk(matcher, 1, rng, steps=48)
        if ids is not None:
            done += 1
            text = backend.tokenizer.decode(ids)
            assert check.is_valid(json.loads(text)), (schema, text)
    assert done, schema


@pytest.mark.parametrize("name", BACKENDS)
def test_annotations_and_vendor_keys_refuse_nothing(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    backend = make_engine(structured_outputs_backend=name).grammar_backend()
    for key, value in ANNOTATIONS.items():
        for schema in places(key, value):
            walks_validate(backend, schema, validator(schema), count=3)


@pytest.mark.parametrize("name", BACKENDS)
def test_real_vendor_key_beside_enum_and_unknown_readonly(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    """From SchemaStore's ``monade-stack-config.json``: ``nginx`` has ``enum``, ``oneOf`` of
    consts and ``x-intellij-enum-metadata``. xgrammar cannot enforce ``enum`` beside a
    combinator (and says so, naming it); with the vendor key alone beside ``enum`` every backend
    compiles it, as it does an unknown ``readonly`` beside ``type``."""
    backend = make_engine(structured_outputs_backend=name).grammar_backend()
    full = store_schema("monade-stack-config.json")
    nginx = {"$schema": full["$schema"], **full["properties"]["nginx"]}
    metadata = nginx["x-intellij-enum-metadata"]
    plain = {"type": "string", "enum": ["system", "local"], "x-intellij-enum-metadata": metadata}
    readonly = {
        "type": "object",
        "properties": {"path": {"type": "string", "maxLength": 8, "readonly": True}},
        "required": ["path"],
        "readonly": False,
    }
    for schema in (plain, readonly):
        walks_validate(backend, schema, validator(schema))
    try:
        walks_validate(backend, nginx, store_validator(nginx))
    except InvalidRequestError as exc:
        assert name == "xgrammar", exc
        assert "'enum' beside" in exc.reason and "x-intellij" not in exc.reason


@pytest.mark.parametrize("name", BACKENDS)
def test_keywords_that_constrain_nothing_are_not_refused(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    """``uniqueItems: false``, ``then`` without ``if``, ``minContains`` without ``contains``:
    valid keywords with no effect as written."""
    backend = make_engine(structured_outputs_backend=name).grammar_backend()
    for schema in (
        {"type": "array", "items": {"type": "integer"}, "maxItems": 3, "uniqueItems": False},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 1, "uniqueItems": True},
        {"type": "integer", "then": {"const": 3}, "else": {"const": 4}},
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 2, "minContains": 5},
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "additionalProperties": False,
            "dependentRequired": {},
        },
    ):
        walks_validate(backend, schema, validator(schema), count=3)


@pytest.mark.parametrize("name", BACKENDS)
def test_declared_draft_and_references_into_vendor_keys(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    """Draft 7 ignores keywords beside ``$ref`` (its validator is the reference here), and a
    ``$ref`` may point into a vendor key's value, which is then a schema like any other."""
    import jsonschema

    backend = make_engine(structured_outputs_backend=name).grammar_backend()
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"small": {"type": "integer", "minimum": 0, "maximum": 9}},
        "type": "object",
        "properties": {"n": {"$ref": "#/definitions/small", "type": "string", "uniqueItems": True}},
        "required": ["n"],
        "additionalProperties": False,
    }
    walks_validate(backend, draft7, jsonschema.Draft7Validator(draft7))
    vendor = {
        "x-library": {"code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
        "type": "array",
        "items": {"$ref": "#/x-library/code"},
        "maxItems": 2,
    }
    walks_validate(backend, vendor, validator(vendor))
