"""The ``llguidance`` backend: every constraint kind, the matcher protocol, refusals.

Independent checks: ``re.fullmatch`` for regexes and choices, a recursive-descent recogniser
for the grammar, ``jsonschema`` for schemas, ``deepseek_recipe``'s parser for DSML tool calls,
Python's UTF-8 decoder and the tokenizer's added-token list for what may be emitted; a matcher
rolled back must allow what a fresh matcher replaying the same tokens allows.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import pytest
import torch
from matcher_walks import rollback_walk
from test_constrained import CHOICES, EBNF, REGEX, SCHEMA, accepts_ebnf, constrained
from test_vocabulary import decodes

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer.structured import ReplyConstraint
from deepinfer_structured.llguidance_backend import LLGuidanceBackend
from deepinfer_structured.utf8 import token_bytes

#: The EBNF above in Lark, llguidance's own grammar syntax.
LARK = 'start: "(" item ("," item){0,3} ")"\nitem: "a" | "bb" | "ccc" | start'


@pytest.fixture
def backend(make_engine) -> LLGuidanceBackend:  # type: ignore[no-untyped-def]
    found = make_engine(structured_outputs_backend="llguidance").grammar_backend()
    assert isinstance(found, LLGuidanceBackend)
    return found


def test_every_kind_is_enforced(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(structured_outputs_backend="llguidance", max_num_batched_tokens=64)
    jobs = []
    for seed in range(5):
        p = [5 + seed, 300 + seed, 77]
        for kind, value in (
            ("regex", REGEX),
            ("choice", CHOICES),
            ("grammar", EBNF),
            ("grammar", LARK),
            ("json", SCHEMA),
        ):
            jobs.append((kind, value, engine.add_request(p, constrained(kind, value, seed))))
    final = engine.run()
    for kind, value, rid in jobs:
        out = final[rid].outputs[0]
        assert out.finish_reason == "stop", (kind, out)
        if kind == "regex":
            assert re.fullmatch(REGEX, out.text), out.text
        elif kind == "choice":
            assert out.text in CHOICES
        elif kind == "grammar":
            assert accepts_ebnf(out.text), (value, out.text)
        else:
            jsonschema.validate(json.loads(out.text), SCHEMA)


def test_json_object_is_any_object(backend) -> None:  # type: ignore[no-untyped-def]
    for text, valid in (('{"a": [1, {"b": null}], "c": "d"}', True), ("{}", True), ("[1]", False)):
        matcher = backend.matcher(StructuredOutputsParams(json_object=True))
        ids = backend.tokenizer.encode(text, add_special_tokens=False).ids
        taken = all(matcher.accept(t) for t in ids) and matcher.accept(1)
        assert taken == (valid and isinstance(json.loads(text), dict)), text


def test_rollback_draft_masks_and_bitmask_rows_agree_with_a_replay(backend) -> None:  # type: ignore[no-untyped-def]
    tok = backend.tokenizer
    constraint = StructuredOutputsParams(json=SCHEMA)
    text = '{"name": "Lear", "age": 80, "mood": "wroth", "tags": [true]}'
    tokens = [*tok.encode(text, add_special_tokens=False).ids, 1]
    matcher = backend.matcher(constraint)
    for t in tokens:
        assert matcher.accept(t)
    assert matcher.is_terminated() and not matcher.accept(5)
    bitmask = torch.zeros(2, (backend.vocab_size + 31) // 32, dtype=torch.int32)

    def bitmask_and_rejection_agree(matcher: Any, allowed: torch.Tensor) -> None:
        matcher.fill_bitmask(bitmask, 1)
        bits = ((bitmask[1].view(-1, 1) >> torch.arange(32)) & 1).flatten().bool()
        assert torch.equal(bits[: backend.vocab_size], allowed)
        rejected = int((~allowed).nonzero()[0, 0])
        assert not matcher.accept(rejected)  # refused, and nothing changed
        assert torch.equal(matcher.allowed(), allowed)

    position = rollback_walk(
        backend, constraint, matcher, tokens, check=bitmask_and_rejection_agree
    )
    matcher.rollback(position)
    before = matcher.allowed()
    masks, accepted = matcher.draft_masks([*tokens[:5], tok.token_to_id("x"), *tokens[6:8]])
    assert accepted == 5 and masks.shape[0] == 6  # cut at the first token the grammar rejects
    assert torch.equal(masks[0], before) and torch.equal(matcher.allowed(), before)


def test_text_is_utf8_and_never_a_control_token(backend) -> None:  # type: ignore[no-untyped-def]
    added = sorted(backend.tokenizer.get_added_tokens_decoder())
    table = token_bytes(backend.tokenizer, backend.vocab_size)
    rng = random.Random(1)
    for schema in ({"type": "string", "maxLength": 12}, {"type": "string", "pattern": "^é.+$"}):
        for _ in range(10):
            matcher = backend.matcher(StructuredOutputsParams(json=schema))
            data = b""
            for _ in range(30):
                allowed = matcher.allowed()
                if allowed[1]:
                    break
                assert not allowed[added].any()  # BOS, </think>, ｜DSML｜... are never text
                token = rng.choice(allowed.nonzero()[:, 0].tolist())
                assert matcher.accept(token)
                data += table[token] or b""
                assert decodes(data), data


@pytest.mark.parametrize(
    ("kind", "value", "construct"),
    [
        ("json", {"type": "integer", "not": {"const": 3}}, "not"),
        ("json", {"x-guidance": {"lenient": True}, "uniqueItems": True, "type": "array"}, "unique"),
        ("json", {"oneOf": [{"type": "integer"}, {"minimum": 2}]}, "oneOf"),
        ("json", {"$ref": "https://example.com/s.json"}, "example.com"),
        ("regex", "(?=a)b", "look-around"),
        ("regex", "(abc", "unclosed group"),
        ("grammar", "start: x", "unknown name"),
        ("grammar", "root ::= x", "'x'"),
    ],
)
def test_refusals_name_the_construct(backend, kind: str, value: Any, construct: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequestError) as err:
        backend.matcher(StructuredOutputsParams(**{kind: value}))
    assert err.value.field == f"structured_outputs.{kind}"
    assert construct in err.value.reason, err.value.reason


def test_annotation_formats_are_dropped_and_known_ones_kept(backend) -> None:  # type: ignore[no-untyped-def]
    """``format`` is an annotation: an unknown one (``uri-reference``) must not refuse the
    schema; a known one (``date``) may narrow it, never widen it."""
    rng = random.Random(2)
    for schema in (
        {"type": "string", "format": "uri-reference", "maxLength": 6},
        {"type": "string", "format": "date"},
    ):
        for _ in range(6):
            matcher = backend.matcher(StructuredOutputsParams(json=schema))
            ids: list[int] = []
            while not matcher.allowed()[1]:
                ids.append(rng.choice(matcher.allowed().nonzero()[:, 0].tolist()))
                assert matcher.accept(ids[-1])
            check = jsonschema.Draft202012Validator(schema)
            assert check.is_valid(json.loads(backend.tokenizer.decode(ids)))


def test_reasoning_budget_then_the_constraint(backend) -> None:  # type: ignore[no-untyped-def]
    tok = backend.tokenizer
    end = tok.token_to_id("</think>")
    matcher = backend.matcher(
        ReplyConstraint(regex="ok|no", reasoning_end="</think>", reasoning_budget=2)
    )
    free = matcher.allowed()
    assert free[end] and not free[1] and free.sum() == free.numel() - 1
    for t in tok.encode("a b", add_special_tokens=False).ids[:2]:
        assert matcher.accept(t)
    assert matcher.allowed().nonzero()[:, 0].tolist() == [end]
    assert matcher.accept(end)
    answer = matcher.allowed().nonzero()[:, 0].tolist()
    assert answer and all(tok.decode([t]) in ("o", "ok", "n", "no") for t in answer)
