"""Required and named ``tool_choice``: the DSML tool-call grammar on the trained tiny model.

Independent checks: every reply goes through ``deepseek_recipe``'s own output parser (which
finds DSML tags by the control token) and every call's arguments must satisfy the tool's JSON
schema under ``jsonschema``; random walks through the grammar are parsed the same way.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest

from deepinfer.chat import ChatFormatter
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 30},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "filters": {"$ref": "#/$defs/filters"},
    },
    "required": ["query"],
    "$defs": {
        "filters": {
            "type": "object",
            "properties": {"year": {"type": "integer", "minimum": 1590, "maximum": 1613}},
        }
    },
}
NOTE = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 12}}}
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH, "note": NOTE}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
QUESTIONS = ["Weather in Verona?", "Find the sonnets.", "What news?", "Who is there?"]


def check_calls(calls: list[dict[str, Any]] | None, names: set[str]) -> None:
    assert calls, "a required tool call produced none"
    for call in calls:
        name = call["function"]["name"]
        assert name in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize(
    ("model_name", "conversations"), [("DeepSeek-V4.1-Flash", 4), ("DeepSeek-V4-Pro", 2)]
)
def test_required_and_named_tool_calls_parse_and_validate(
    trained,  # type: ignore[no-untyped-def]
    model_name: str,
    conversations: int,
) -> None:
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS[:conversations]]
    named = {"type": "function", "function": {"name": "search"}}
    cut = done = 0
    for choice, names in (("required", set(SCHEMAS)), (named, {"search"})):
        for seed in (0,):
            outs = trained.chat(
                convs,
                SamplingParams(max_tokens=160, seed=seed),
                tools=TOOLS,
                tool_choice=choice,
                model_name=model_name,
                use_tqdm=False,
            )
            for out in outs:
                if out.outputs[0].finish_reason == "length":
                    cut += 1  # a cut reply holds a partial call; not a verdict
                    continue
                assert out.outputs[0].finish_reason == "stop"
                check_calls(out.tool_calls[0], names)
                done += 1
    assert done >= max(2, cut), (done, cut)


def backend_named(trained: Any, name: str) -> Any:
    """A grammar backend of the trained model's vocabulary (its engine uses ``auto``)."""
    from deepinfer import plugins

    engine = trained.engine
    cls = plugins.grammars.load(name)
    return cls(engine.tokenizer, engine.model.cfg.vocab_size, sorted(engine.eos_token_ids))


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_random_walks_through_the_tool_grammar_parse_and_validate(trained, name: str) -> None:  # type: ignore[no-untyped-def]
    formatter = ChatFormatter(trained.tokenizer_path)
    prompt = formatter.prompt(
        {
            "model": "DeepSeek-V4.1-Flash",
            "messages": [{"role": "user", "content": "Go."}],
            "tools": TOOLS,
            "tool_choice": "required",
            "thinking": {"type": "disabled"},
        }
    )
    assert prompt.constraint is not None
    backend = backend_named(trained, name)
    rng = random.Random(0)
    complete = 0
    for _ in range(40):
        matcher = backend.matcher(prompt.constraint)
        ids: list[int] = []
        for _ in range(400):
            allowed = matcher.allowed().nonzero()[:, 0].tolist()
            token = 1 if 1 in allowed else rng.choice(allowed)
            assert matcher.accept(token)
            if token == 1:
                break
            ids.append(token)
        if not matcher.is_terminated():
            continue
        complete += 1
        message = formatter.parse(prompt, ids, "stop")
        check_calls(message.tool_calls, set(SCHEMAS))
    assert complete >= 30


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_tags_are_the_control_token_and_values_never_hold_it(trained, name: str) -> None:  # type: ignore[no-untyped-def]
    formatter = ChatFormatter(trained.tokenizer_path)
    prompt = formatter.prompt(
        {
            "model": "DeepSeek-V4.1-Flash",
            "messages": [{"role": "user", "content": "Go."}],
            "tools": [TOOLS[2]],
            "tool_choice": "required",
            "thinking": {"type": "disabled"},
        }
    )
    tok = trained.tokenizer
    dsml = tok.token_to_id("｜DSML｜")
    added = set(tok.get_added_tokens_decoder())
    matcher = backend_named(trained, name).matcher(prompt.constraint)
    for token in tok.encode("<", add_special_tokens=False).ids:
        assert matcher.accept(token)
    assert matcher.allowed().nonzero()[:, 0].tolist() == [dsml]  # the tag needs the token
    head = ' invoke name="note">\n<'
    assert matcher.accept(dsml)
    for token in tok.encode(head, add_special_tokens=False).ids:
        assert matcher.accept(token)
    assert matcher.accept(dsml)
    for token in tok.encode(
        ' parameter name="text" string="true">a</', add_special_tokens=False
    ).ids:
        assert matcher.accept(token)
    inside = matcher.allowed()  # inside a raw string value that just wrote "a</"
    assert inside[dsml]  # closing the parameter
    assert inside.sum() > 100  # or more text
    matcher.rollback(1)  # back inside the value: text only, never a control token
    assert not matcher.allowed()[sorted(added)].any()


@pytest.mark.parametrize(
    ("parameters", "construct"),
    [
        ({"type": "object", "properties": {"a": {}}, "minProperties": 1}, "minProperties"),
        ({"type": "object", "required": ["b"], "properties": {"a": {}}}, "'b'"),
        (
            {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
            "'uniqueItems'",
        ),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
    ],
)
def test_unenforceable_tool_schemas_fail_at_submit(
    trained, parameters: Any, construct: str
) -> None:  # type: ignore[no-untyped-def]
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    with pytest.raises(InvalidRequestError) as err:
        trained.chat(
            [{"role": "user", "content": "Hi"}], tools=tools, tool_choice="required", use_tqdm=False
        )
    assert err.value.field.startswith("tools"), err.value
    assert construct in str(err.value)
    assert not trained.engine.has_unfinished_requests()


def test_parameters_without_schema_mean_no_arguments(trained) -> None:  # type: ignore[no-untyped-def]
    tools = [{"type": "function", "function": {"name": "ping"}}]
    outs = trained.chat(
        [{"role": "user", "content": "Ping."}],
        SamplingParams(max_tokens=40, seed=0),
        tools=tools,
        tool_choice="required",
        use_tqdm=False,
    )
    calls = outs[0].tool_calls[0]
    assert calls and all(c["function"]["name"] == "ping" for c in calls)
    assert all(json.loads(c["function"]["arguments"]) == {} for c in calls)
