"""Strict ``response_format`` and strict tools enforce the user's schema as given.

The recipe rewrites a strict schema into OpenAI's strict subset for the prompt's checks, which
keeps no ``maxLength``, ``minItems``... The constraint must still be the user's schema (closed
the way strict mode closes it). Independent checks: every finished output validates under
``jsonschema`` against the user's schema as written and against the same schema with what
strict mode promises written out (closed objects, every property present).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from deepinfer.chat import ChatFormatter
from deepinfer.sampling_params import SamplingParams

#: The Shakespeare-trained tiny model writes long strings: a 20-character bound is tested.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "lines": {
            "type": "array",
            "items": {"type": "string", "minLength": 2, "maxLength": 12},
            "maxItems": 2,
        },
        "act": {"type": "integer", "minimum": 1, "maximum": 5},
    },
}
#: SCHEMA as strict mode reads it: every object closed, every property required.
STRICT = {**SCHEMA, "required": ["name", "lines", "act"], "additionalProperties": False}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "speaker", "schema": SCHEMA, "strict": True},
}
SEEDS = range(12)


def check(text: str, schema: dict[str, Any], strict: dict[str, Any]) -> None:
    """``text`` is JSON valid under the user's schema and under its strict reading."""
    instance = json.loads(text)
    jsonschema.Draft202012Validator(schema).validate(instance)
    jsonschema.Draft202012Validator(strict).validate(instance)


@pytest.mark.parametrize("thinking", [False, True])
def test_strict_response_format_keeps_max_length(trained, thinking: bool) -> None:  # type: ignore[no-untyped-def]
    """Many seeds, thinking off and on (the reasoning bounded by a budget so that the answer
    comes); every finished answer is checked."""
    formatter = ChatFormatter(trained.tokenizer_path)
    prompts, params = [], []
    for seed in SEEDS:
        body: dict[str, Any] = {
            "model": "DeepSeek-V4.1-Flash",
            "messages": [{"role": "user", "content": f"Who speaks in scene {seed}? In JSON."}],
            "thinking": {"type": "disabled"},
            "response_format": RESPONSE_FORMAT,
        }
        if thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": 4 + seed}
        prompt = formatter.prompt(body)
        sp = SamplingParams(temperature=1.0, max_tokens=120, seed=seed)
        sp.structured_outputs = prompt.constraint
        prompts.append(prompt)
        params.append(sp)
    outs = trained.generate([p.token_ids for p in prompts], params, use_tqdm=False)
    finished = 0
    for prompt, out in zip(prompts, outs, strict=True):
        completion = out.outputs[0]
        if completion.finish_reason == "length":
            continue
        assert completion.finish_reason == "stop", completion
        message = formatter.parse(prompt, completion.token_ids[:-1], "stop")
        assert (message.reasoning_content is not None) == thinking
        check(message.content, SCHEMA, STRICT)
        finished += 1
    assert finished >= len(SEEDS) // 2, finished


def test_llm_chat_strict_response_format(trained) -> None:  # type: ignore[no-untyped-def]
    outs = trained.chat(
        [[{"role": "user", "content": f"Who speaks in scene {i}? In JSON."}] for i in range(4)],
        SamplingParams(temperature=1.0, max_tokens=120, seed=5),
        response_format=RESPONSE_FORMAT,
        use_tqdm=False,
    )
    finished = [out for out in outs if out.outputs[0].finish_reason == "stop"]
    assert finished  # the check below must see outputs
    for out in finished:
        check(out.outputs[0].text, SCHEMA, STRICT)


@pytest.mark.parametrize("model_name", ["DeepSeek-V4.1-Flash", "DeepSeek-V4-Pro"])
def test_strict_tool_arguments_keep_the_declared_bounds(trained, model_name: str) -> None:  # type: ignore[no-untyped-def]
    parameters = {
        "type": "object",
        "properties": {
            "speaker": {"type": "string", "maxLength": 20},
            "act": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["speaker", "act"],
        "additionalProperties": False,
    }
    tools = [
        {
            "type": "function",
            "function": {"name": "cue", "parameters": parameters, "strict": True},
        }
    ]
    outs = trained.chat(
        [[{"role": "user", "content": f"Cue the speaker of scene {i}."}] for i in range(6)],
        SamplingParams(temperature=1.0, max_tokens=240, seed=1),
        tools=tools,
        tool_choice="required",
        model_name=model_name,
        use_tqdm=False,
    )
    finished = 0
    for out in outs:
        if out.outputs[0].finish_reason == "length":
            continue
        calls = out.tool_calls[0]
        assert calls
        for call in calls:
            check(call["function"]["arguments"], parameters, parameters)
        finished += 1
    assert finished >= 3, finished
