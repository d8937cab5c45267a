"""The ``auto`` backend (the engine's default): xgrammar where it is exact, llguidance where
xgrammar would be inexact, a refusal naming the keyword where neither enforces it.

Independent checks: the grammar must reject every instance ``jsonschema`` marks invalid, and
outputs sampled under it (several seeds) must validate under ``jsonschema``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from test_schema_suite import accepts_text

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams, StructuredOutputsParams
from deepinfer_structured.auto_backend import AutoBackend

#: Schemas xgrammar's policy refuses (inexact there) that llguidance enforces; each with
#: instances on both sides.
FALLBACK: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "overlapping patternProperties": (
        {
            "type": "object",
            "properties": {"foo": {"type": "integer", "maximum": 9}},
            "patternProperties": {"^f": {"type": "integer", "minimum": 3}},
            "additionalProperties": False,
        },
        [{"foo": 1}, {"foo": 4}, {"foo": 10}, {"fa": 2}, {"fa": 3}, {"b": 1}],
    ),
    "two patternProperties": (
        {
            "type": "object",
            "patternProperties": {"^a": {"type": "integer"}, "^b": {"type": "boolean"}},
            "additionalProperties": False,
            "maxProperties": 3,
        },
        [{"a1": 1}, {"a1": True}, {"b": True}, {"b": 1}, {"c": 1}],
    ),
    "patternProperties beside additionalProperties": (
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "boolean"}},
            "additionalProperties": {"type": "integer", "maximum": 99},
            "maxProperties": 3,
        },
        [{"x-a": True}, {"x-a": 1}, {"b": 1}, {"b": True}],
    ),
    "pattern beside maxLength": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        ["abc", "abcd", "ab1", ""],
    ),
    "keyword beside enum": ({"enum": [1, 2, 3, "x"], "minimum": 2}, [1, 2, "x", 4]),
    "multipleOf on numbers": (
        {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 2},
        [0.5, 0.3, 2.25, 1],
    ),
}


@pytest.fixture
def auto(make_engine) -> AutoBackend:  # type: ignore[no-untyped-def]
    backend = make_engine().grammar_backend()  # "auto" is the default
    assert isinstance(backend, AutoBackend)
    return backend


@pytest.mark.parametrize("label", sorted(FALLBACK))
def test_fallback_to_llguidance_is_exact(auto, label: str) -> None:  # type: ignore[no-untyped-def]
    schema, instances = FALLBACK[label]
    constraint = StructuredOutputsParams(json=schema)
    with pytest.raises(InvalidRequestError):
        auto.xgrammar.matcher(constraint)  # refused there: it would be inexact
    assert auto.backend_for(constraint).name == "llguidance"
    check = jsonschema.Draft202012Validator(schema)
    for instance in instances:
        if not check.is_valid(instance):
            assert not accepts_text(auto, schema, json.dumps(instance)), instance


def test_fallback_outputs_validate(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_num_batched_tokens=96)
    jobs = {}
    for i, (schema, _) in enumerate(FALLBACK.values()):
        for seed in range(4):
            params = SamplingParams(
                temperature=1.0, seed=seed, max_tokens=160, structured_outputs={"json": schema}
            )
            jobs[engine.add_request([7 + i, 300 + seed, 77], params)] = schema
    final = engine.run(list(jobs))
    finished = 0
    for rid, schema in jobs.items():
        out = final[rid].outputs[0]
        if out.finish_reason == "length":  # a random model rambles inside a key: no verdict
            continue
        assert out.finish_reason == "stop", out
        jsonschema.validate(json.loads(out.text), schema)
        finished += 1
    assert finished >= len(jobs) // 2, finished


def test_exact_schemas_stay_on_xgrammar(auto) -> None:  # type: ignore[no-untyped-def]
    for constraint in (
        StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "string"}}}),
        StructuredOutputsParams(regex="[a-z]{3}"),
        StructuredOutputsParams(grammar='root ::= "a" | "b"'),
        StructuredOutputsParams(choice=["x", "y"]),
    ):
        assert auto.backend_for(constraint).name == "xgrammar"


def test_lark_grammars_reach_llguidance(auto) -> None:  # type: ignore[no-untyped-def]
    constraint = StructuredOutputsParams(grammar='start: "x" DIGITS\nDIGITS: /[0-9]{1,3}/')
    assert auto.backend_for(constraint).name == "llguidance"
    for text, valid in (("x12", True), ("x1234", False), ("y1", False)):
        matcher = auto.matcher(constraint)
        ids = auto.tokenizer.encode(text, add_special_tokens=False).ids
        taken = all(matcher.accept(t) for t in ids) and matcher.accept(1)
        assert taken == valid == bool(re.fullmatch(r"x[0-9]{1,3}", text)), text


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "integer", "not": {"const": 3}}, "not"),
        (
            {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": ["b"]}},
            "dependentRequired",
        ),
    ],
)
def test_refused_only_when_neither_enforces_naming_the_keyword(
    auto,  # type: ignore[no-untyped-def]
    schema: Any,
    keyword: str,
) -> None:
    with pytest.raises(InvalidRequestError) as err:
        auto.matcher(StructuredOutputsParams(json=schema))
    assert err.value.field == "structured_outputs.json"
    reason = err.value.reason
    assert "xgrammar: " in reason and "llguidance: " in reason
    xgrammar_part, llguidance_part = reason.split("; llguidance: ")
    assert keyword in xgrammar_part and keyword in llguidance_part, reason
