"""Property: no request can break the engine.

Random values of random types for every ``SamplingParams`` field, and random prompt objects,
each submitted in one ``generate`` call beside a good request. Either the call is refused with
:class:`InvalidRequestError` before anything is queued, or both requests run to a normal end;
the good request's tokens always equal its token-by-token reference, and nothing stays queued.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from reference import greedy_reference

from deepinfer.errors import InvalidRequestError
from deepinfer.llm import LLM
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams

GOOD_PROMPT = "ROMEO:"
GOOD = SamplingParams(temperature=0, max_tokens=4)
#: Short sequences, so a request without max_tokens ends soon.
MAX_MODEL_LEN = 24
VOCAB = 8192

_SETTINGS = settings(
    max_examples=500,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays reproducible
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu", max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def good_tokens(llm: LLM) -> list[int]:
    ids = llm.tokenizer.encode(GOOD_PROMPT, add_special_tokens=False).ids
    return greedy_reference(llm.engine.model, ids, GOOD.max_tokens or 0, eos=1)


# -- strategies --------------------------------------------------------------------------------

_ids = st.integers(-3, VOCAB + 3)
#: Values of any type: what a confused caller or a JSON body might send.
_anything = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 50),
        st.integers(),
        st.floats(),
        st.text(max_size=4),
        st.binary(max_size=3),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner),
        st.dictionaries(st.one_of(st.text(max_size=3), _ids), inner, max_size=3),
    ),
    max_leaves=6,
)
_token_lists = st.lists(_ids, max_size=4)
_constraints = st.sampled_from(
    [
        {"regex": "[a-z]{1,4}"},
        {"choice": ["yes", "no"]},
        {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        {"json_object": True},
        {"regex": "[a-z"},  # does not compile
        {"json": "{not json"},
        {"grammar": "root ::= "},
        {"regex": "a", "choice": ["a"]},
        {"yaml": "x"},
        {},
    ]
)
#: Per field: valid values (their ranges' edges included), and values just past the edges.
_FIELDS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "n": (st.integers(1, 3), st.just(0)),
    "temperature": (st.one_of(st.just(0.0), st.floats(0, 2)), st.just(-0.01)),
    "top_p": (st.one_of(st.just(1.0), st.floats(0.001, 1)), st.just(0.0)),
    "top_k": (st.integers(-1, 50), st.just(-2)),
    "min_p": (st.floats(0, 1), st.just(1.01)),
    "presence_penalty": (st.floats(-2, 2), st.just(2.01)),
    "frequency_penalty": (st.floats(-2, 2), st.just(-2.01)),
    "repetition_penalty": (st.floats(0.01, 10), st.just(0.0)),
    "seed": (st.integers(0, 2**63 - 1), st.sampled_from([-1, 2**63])),
    "stop": (
        st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3))),
        st.just([""]),
    ),
    "stop_token_ids": (st.lists(st.integers(0, VOCAB - 1), max_size=4), st.just([VOCAB])),
    "include_stop_str_in_output": (st.booleans(), st.just(1)),
    "ignore_eos": (st.booleans(), st.just(0)),
    "max_tokens": (st.one_of(st.none(), st.integers(1, 8)), st.just(0)),
    "min_tokens": (st.integers(0, 2), st.just(-1)),
    "logprobs": (st.one_of(st.none(), st.integers(0, 20)), st.just(21)),
    "prompt_logprobs": (st.one_of(st.none(), st.integers(0, 20)), st.just(-1)),
    "skip_special_tokens": (st.booleans(), st.just(None)),
    "structured_outputs": (st.one_of(st.none(), _constraints), st.just({})),
    "logit_bias": (
        st.dictionaries(
            st.one_of(st.integers(0, VOCAB - 1), st.integers(0, VOCAB - 1).map(str)),
            st.one_of(st.integers(-100, 100), st.floats(-100, 100)),
            max_size=3,
        ),
        st.sampled_from([{VOCAB: 1}, {5: 100.5}, {"-1": 0}]),
    ),
    "allowed_token_ids": (
        st.one_of(st.none(), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)),
        st.sampled_from([[], [VOCAB], [-1]]),
    ),
    "bad_words": (
        st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=4), max_size=2)),
        st.just([" "]),
    ),
    "truncate_prompt_tokens": (st.one_of(st.none(), st.integers(1, 6)), st.just(0)),
}


def test_every_field_has_a_strategy() -> None:
    assert set(_FIELDS) == {f.name for f in dataclasses.fields(SamplingParams)}


#: Half wild (any field may hold anything), half valid field by field (requests that run,
#: unless two fields disagree, e.g. min_tokens above max_tokens, or a constraint is bad).
_params = st.one_of(
    st.fixed_dictionaries(
        {}, optional={k: st.one_of(ok, edge, _anything) for k, (ok, edge) in _FIELDS.items()}
    ),
    st.fixed_dictionaries({}, optional={k: ok for k, (ok, _) in _FIELDS.items()}),
)

_prompts = st.one_of(
    _anything,
    st.text(max_size=12),
    st.lists(_ids, max_size=8),
    st.lists(st.one_of(_ids, st.booleans(), st.floats()), max_size=4),
    st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=8), _anything)}),
    st.fixed_dictionaries({"prompt_token_ids": st.one_of(st.lists(_ids, max_size=6), _anything)}),
    st.dictionaries(
        st.sampled_from(["prompt", "prompt_token_ids", "multi_modal_data", "x"]),
        _anything,
        max_size=2,
    ),
)


# -- the property ------------------------------------------------------------------------------


def assert_idle(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests() and not engine.groups
    assert engine.pool.used_bytes == 0
    assert not llm._owned and not llm._latest


def run_beside_good(llm: LLM, good_tokens: list[int], prompt: Any, params: Any) -> None:
    try:
        outs = llm.generate([GOOD_PROMPT, prompt], [GOOD, params], use_tqdm=False)
    except InvalidRequestError as exc:
        event(f"refused by generate: {exc.field}")
        assert_idle(llm)  # refused before anything was queued
        return
    event("ran beside the good request")
    good, other = outs
    assert good.outputs[0].token_ids == good_tokens
    assert good.outputs[0].finish_reason == "length" and good.outputs[0].error is None
    assert other.finished
    for sample in other.outputs:
        assert sample.error is None, sample.error  # validation let through a breaking request
        assert sample.finish_reason in ("stop", "length")
        assert all(0 <= t < VOCAB for t in sample.token_ids)
        assert len(other.prompt_token_ids) + len(sample.token_ids) <= MAX_MODEL_LEN
    assert_idle(llm)


@settings(_SETTINGS, max_examples=300)  # each accepted example generates: the slow half
@given(kwargs=_params)
def test_random_sampling_params(llm: LLM, good_tokens: list[int], kwargs: dict[str, Any]) -> None:
    try:
        params = SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        event(f"refused by SamplingParams: {exc.field.split('.')[0]}")
        assert_idle(llm)
        return
    run_beside_good(llm, good_tokens, "JULIET:", params)


@_SETTINGS
@given(prompt=_prompts)
def test_random_prompts(llm: LLM, good_tokens: list[int], prompt: Any) -> None:
    run_beside_good(llm, good_tokens, prompt, SamplingParams(temperature=0, max_tokens=3))


def test_engine_serves_after_the_fuzzing(llm: LLM, good_tokens: list[int]) -> None:
    outs: list[RequestOutput] = llm.generate([GOOD_PROMPT] * 3, GOOD, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [good_tokens] * 3
    assert_idle(llm)
