"""Constrained generation on the tiny model: every output satisfies its constraint.

Independent checks: ``re.fullmatch`` for regexes and choices, ``jsonschema.validate`` for
schemas, and a hand-written recursive-descent recogniser for the EBNF grammar.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from deepinfer import plugins
from deepinfer.errors import InvalidRequestError, PluginNotFoundError
from deepinfer.plugins import Registry
from deepinfer.sampling_params import SamplingParams

REGEX = r"[0-9]{3}-[a-z]{2,4}( [A-Z][a-z]{1,5}){0,2}"
CHOICES = ["yes", "no", "maybe", "to be or not to be"]
EBNF = 'root ::= "(" item ("," item){0,3} ")"\nitem ::= "a" | "bb" | "ccc" | root'
# Bounded strings and small integers keep a random-weight model from rambling forever.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "wroth"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}


def accepts_ebnf(text: str) -> bool:
    """Recursive descent for the EBNF above, written from its rules."""

    def item(i: int) -> int | None:
        for lit in ("ccc", "bb", "a"):
            if text.startswith(lit, i):
                return i + len(lit)
        return root(i)

    def root(i: int) -> int | None:
        if not text.startswith("(", i):
            return None
        j = item(i + 1)
        if j is None:
            return None
        for _ in range(3):
            if text.startswith(",", j):
                k = item(j + 1)
                if k is None:
                    return None
                j = k
        return j + 1 if text.startswith(")", j) else None

    return root(0) == len(text)


def constrained(kind: str, value: object, seed: int, n: int = 1) -> SamplingParams:
    return SamplingParams(
        temperature=1.0, seed=seed, max_tokens=200, n=n, structured_outputs={kind: value}
    )


@pytest.mark.parametrize("backend", ["auto", "xgrammar"])
def test_every_output_satisfies_its_constraint(make_engine, backend: str) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(max_num_batched_tokens=64, structured_outputs_backend=backend)
    prompts = [[5 + i, 300 + i, 77] for i in range(6)]
    jobs = []
    for seed in range(6):
        p = prompts[seed]
        jobs.append(("regex", engine.add_request(p, constrained("regex", REGEX, seed))))
        jobs.append(("choice", engine.add_request(p, constrained("choice", CHOICES, seed))))
        jobs.append(("grammar", engine.add_request(p, constrained("grammar", EBNF, seed))))
        jobs.append(("json", engine.add_request(p, constrained("json", SCHEMA, seed))))
        jobs.append(("free", engine.add_request(p, SamplingParams(max_tokens=8, seed=seed))))
    final = engine.run()
    for kind, rid in jobs:
        out = final[rid].outputs[0]
        if kind == "free":
            continue
        assert out.finish_reason == "stop", (kind, out)
        text = out.text
        if kind == "regex":
            assert re.fullmatch(REGEX, text), text
        elif kind == "choice":
            assert text in CHOICES
        elif kind == "grammar":
            assert accepts_ebnf(text), text
        else:
            jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_n_samples_preemption_and_prefix_cache_keep_constraints(make_engine, backend: str) -> None:  # type: ignore[no-untyped-def]
    from deepinfer.cache.pools import state_bytes

    engine0 = make_engine()
    budget = 3 * state_bytes(engine0.model.cfg, engine0.model.dtype, 150)
    engine = make_engine(
        max_num_batched_tokens=48, state_memory_bytes=budget, structured_outputs_backend=backend
    )
    prefix = [(i * 37) % 8000 + 3 for i in range(140)]
    ids = [
        engine.add_request([*prefix, i], constrained("json", SCHEMA, seed=i, n=2)) for i in range(4)
    ]
    final = engine.run(ids)
    for rid in ids:
        for out in final[rid].outputs:
            jsonschema.validate(json.loads(out.text), SCHEMA)
    assert engine.prefix_cache.stats.hits > 0
    # Seeded constrained sampling is reproducible alone.
    alone = make_engine(structured_outputs_backend=backend)
    rid = alone.add_request([*prefix, 0], constrained("json", SCHEMA, seed=0, n=2))
    assert alone.run([rid])[rid].outputs[0].token_ids == final[ids[0]].outputs[0].token_ids


@pytest.mark.parametrize(
    ("kind", "value", "construct"),
    [
        ("regex", "(abc", "parenthesis"),
        ("json", {"type": "strin"}, "strin"),
        ("grammar", "root ::= x", '"x"'),
    ],
)
def test_bad_constraints_fail_at_submit_alone(make_engine, kind, value, construct) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine()
    good = engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request([5, 6, 7], constrained(kind, value, 0))
    assert err.value.field == f"structured_outputs.{kind}"
    assert construct in str(err.value)
    assert len(engine.run([good])[good].outputs[0].token_ids) == 3


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "llguidance"])
def test_missing_plugin_names_the_extra(make_engine, monkeypatch, backend: str) -> None:  # type: ignore[no-untyped-def]
    empty = Registry("deepinfer.grammars_none", "grammar backend", plugins.grammars.hints)
    monkeypatch.setattr(plugins, "grammars", empty)
    engine = make_engine(structured_outputs_backend=backend)
    with pytest.raises(PluginNotFoundError, match=r"pip install 'deepinfer\[structured\]'"):
        engine.add_request([5], constrained("regex", "a+", 0))


def test_draft_masks_truncate_at_the_first_violation(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine()
    tok = engine.tokenizer
    matcher = engine.grammar_backend().matcher(
        constrained("regex", "[0-9]{3}-[a-z]{2}", 0).structured_outputs
    )
    digit = [tok.token_to_id(c) for c in "123"]
    dash, letter, bad = tok.token_to_id("-"), tok.token_to_id("a"), tok.token_to_id("x")
    before = matcher.allowed()
    masks, accepted = matcher.draft_masks([*digit, dash, letter, letter])
    assert accepted == 6 and masks.shape[0] == 7
    assert torch.equal(masks[0], before)  # the matcher ended where it started
    assert torch.equal(matcher.allowed(), before)
    assert masks[3][dash] and not masks[3][letter]
    masks, accepted = matcher.draft_masks([digit[0], digit[1], letter, digit[2]])
    assert accepted == 2 and masks.shape[0] == 3
    assert not masks[2][letter] and masks[2][digit[2]]
    assert bad is not None and not masks[0][bad]


def test_async_scheduling_reads_tokens_before_masking(make_engine) -> None:  # type: ignore[no-untyped-def]
    """A mask for step n+1 needs step n's token: an asynchronous engine reads it first, so
    constrained outputs equal the synchronous engine's, free requests beside them too."""
    outputs = []
    for async_scheduling in (False, True):
        engine = make_engine(max_num_batched_tokens=64, async_scheduling=async_scheduling)
        ids = []
        for seed in range(3):
            p = [9 + seed, 400 + seed, 77]
            ids.append(engine.add_request(p, constrained("regex", REGEX, seed)))
            ids.append(engine.add_request(p, constrained("json", SCHEMA, seed)))
            ids.append(engine.add_request(p, SamplingParams(max_tokens=12, seed=seed)))
        final = engine.run()
        outputs.append([final[i].outputs[0] for i in ids])
    sync, overlapped = outputs
    assert [o.token_ids for o in overlapped] == [o.token_ids for o in sync]
    for i, out in enumerate(overlapped):
        if i % 3 == 0:
            assert re.fullmatch(REGEX, out.text), out.text
        elif i % 3 == 1:
            jsonschema.validate(json.loads(out.text), SCHEMA)
