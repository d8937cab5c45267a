"""The official JSON-Schema-Test-Suite (draft 2020-12) against both grammar backends.

Every schema compiles or is refused clearly at submit time; every compiled grammar rejects
every instance the suite marks invalid; and the trained tiny model, sampling under a spread
sample of the compiled schemas, produces only outputs ``jsonschema`` accepts. The full battery
(every schema, more seeds, fuzzing, real schemas) is ``benchmarks/structured_schema_battery.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from schema_suite import suite_cases, validator

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams, StructuredOutputsParams

#: Suite schemas each backend compiles at least (xgrammar 0.2.9, llguidance 1.9.1); the rest
#: use constructs it would not enforce exactly or cannot compile at all.
MIN_COMPILED = {"xgrammar": 160, "llguidance": 180, "auto": 210}


def compiled_cases(backend: Any) -> tuple[list[tuple[str, Any]], list[str]]:
    """(name, schema) of every suite schema the backend compiles, and the refused names."""
    compiled, refused = [], []
    for case in suite_cases():
        try:
            backend.matcher(StructuredOutputsParams(json=case.schema))
        except InvalidRequestError as exc:
            assert exc.field == "structured_outputs.json", case.name
            assert "cannot be compiled: " in str(exc) and len(exc.reason) > 25, (case.name, exc)
            refused.append(case.name)
            continue
        compiled.append((case.name, case.schema))
    return compiled, refused


def accepts_text(backend: Any, schema: Any, text: str) -> bool:
    """Whether the backend's grammar takes ``text`` (as the tokenizer splits it) and then
    the stop token."""
    matcher = backend.matcher(StructuredOutputsParams(json=schema))
    ids = backend.tokenizer.encode(text, add_special_tokens=False).ids
    return all(matcher.accept(t) for t in ids) and matcher.accept(backend.stop_token_ids[0])


@pytest.mark.parametrize("name", ["xgrammar", "llguidance", "auto"])
def test_every_suite_schema_compiles_or_fails_clearly(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    backend = make_engine(structured_outputs_backend=name).grammar_backend()
    compiled, refused = compiled_cases(backend)
    assert len(compiled) + len(refused) == len(suite_cases()) == 368
    assert len(compiled) >= MIN_COMPILED[name], (len(compiled), refused)


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_compiled_grammars_reject_every_invalid_suite_instance(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    backend = make_engine(structured_outputs_backend=name).grammar_backend()
    compiled, _ = compiled_cases(backend)
    checked = 0
    by_name = {c.name: c for c in suite_cases()}
    for case_name, schema in compiled:
        for instance, valid in by_name[case_name].tests:
            if valid:
                continue
            text = json.dumps(instance, ensure_ascii=False)  # the grammar's separators
            assert not accepts_text(backend, schema, text), (case_name, instance)
            checked += 1
    assert checked >= 150


def test_trained_model_outputs_validate_on_a_suite_sample(trained, make_engine) -> None:  # type: ignore[no-untyped-def]
    """Under ``auto`` (the trained engine's backend): xgrammar's and llguidance's schemas."""
    compiled, _ = compiled_cases(make_engine(structured_outputs_backend="auto").grammar_backend())
    sample = compiled[::5]  # spread over every keyword file
    engine = trained.engine
    prompt = trained.tokenizer.encode("KING LEAR:\n").ids
    jobs = {}
    for name, schema in sample:
        for seed in (0, 1):
            params = SamplingParams(
                temperature=1.0, seed=seed, max_tokens=96, structured_outputs={"json": schema}
            )
            jobs[engine.add_request(prompt, params)] = (name, schema)
    outputs = engine.run(list(jobs))
    cut = 0
    for rid, (name, schema) in jobs.items():
        out = outputs[rid].outputs[0]
        if out.finish_reason == "length":  # cut by max_tokens: not a verdict on validity
            cut += 1
            continue
        assert out.finish_reason == "stop", (name, out)
        assert validator(schema).is_valid(json.loads(out.text)), (name, out.text)
    assert cut <= len(jobs) // 4, cut


@pytest.mark.parametrize(
    ("schema", "construct"),
    [
        (False, "cannot accept any value"),
        ({"not": {}}, "'not'"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
        ({"type": "integer", "enum": [1, 2], "minimum": 2}, "'minimum' beside 'enum'"),
        ({"type": "object", "required": ["a"]}, "'a'"),
        ({"$ref": "https://example.com/s.json"}, "not a local pointer"),
        # Reached only through the walk (tuple ``items``, which the typing rewrite leaves as
        # data): refused as unresolvable, never looked up as a pointer into the schema.
        ({"type": "array", "items": [{"$ref": "https://e.com/s.json"}]}, "cannot be resolved"),
        ({"oneOf": [{"type": "integer"}, {"minimum": 2}]}, "oneOf"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        (
            {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
            "repeated key",
        ),
    ],
)
def test_unenforceable_schemas_are_refused_by_xgrammar(
    make_engine,  # type: ignore[no-untyped-def]
    schema: object,
    construct: str,
) -> None:
    backend = make_engine(structured_outputs_backend="xgrammar").grammar_backend()
    with pytest.raises(InvalidRequestError, match=r"structured_outputs\.json") as err:
        backend.matcher(StructuredOutputsParams(json=schema))  # type: ignore[arg-type]
    assert construct in str(err.value)


def test_typeless_and_enum_schemas_are_typed_exactly(make_engine) -> None:  # type: ignore[no-untyped-def]
    """Schemas xgrammar would under-enforce are rewritten, not refused: check by instances."""
    backend = make_engine(structured_outputs_backend="xgrammar").grammar_backend()
    cases: list[tuple[Any, list[Any]]] = [
        ({"minimum": 2}, [1, 3, 2.5]),
        ({"maxLength": 2}, ["abc", "ab", "b", "ü€", "😀😀😀"]),
        ({"properties": {"a": {"minimum": 1}}, "required": ["a"]}, [{}, {"a": 0}, {"a": 1}]),
        ({"type": "string", "enum": [1, "a", None]}, [1, "a", None]),
        ({"multipleOf": 3}, [3, 4, -9]),
        ({"type": "integer", "maxItems": 2.0}, [1]),
    ]
    for schema, instances in cases:
        for instance in instances:
            text = json.dumps(instance, ensure_ascii=False)  # as the grammar writes strings
            accepted = accepts_text(backend, schema, text)
            assert accepted == validator(schema).is_valid(instance), (schema, instance)
