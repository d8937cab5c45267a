"""Responses and Messages converters against values produced by the official deepseek-recipe 0.2.0.

tests/data/protocol_golden.json holds requests, model outputs and what the
official package made of them (regenerate with
tests/parity/build_protocol_golden.py under the oracle interpreter); the
broader comparison runs in tests/parity/test_protocol_parity.py.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest

import deepseek_recipe as dr

HERE = Path(__file__).parent
GOLDEN = json.loads((HERE / "data" / "protocol_golden.json").read_text(encoding="utf-8"))
CASES = list(zip(GOLDEN["cases"], GOLDEN["results"], strict=True))
load = runpy.run_path(str(HERE / "parity" / "_oracle.py"))["load"]


@pytest.mark.parametrize(
    ("case", "expected"),
    CASES,
    ids=[f"{i}-{c['kind']}-{c['protocol']}" for i, (c, _) in enumerate(CASES)],
)
def test_golden_case(case: dict[str, Any], expected: dict[str, Any]) -> None:
    ours = json.loads(json.dumps(load("protocol_dump").run_all(dr, [case])[0], ensure_ascii=False))
    assert ours == expected


V41 = "DeepSeek-V4.1-Flash"
UPDATED = "### Updated Tool Schemas"
SEARCH_HISTORY: list[Any] = [
    {"role": "user", "content": "q"},
    {"type": "tool_search_call", "call_id": "t", "arguments": {"query": "late"}},
    {
        "type": "tool_search_output",
        "call_id": "t",
        "tools": [{"type": "function", "name": "late", "parameters": {"type": "object"}}],
    },
]


def _prompt(request: Any) -> str:
    return dr.DeepseekV41Encoding().render_conversation(request.conversation).prompt


def test_responses_tool_search_loads_deferred_tools() -> None:
    body = {
        "model": V41,
        "input": SEARCH_HISTORY,
        "tools": [{"type": "tool_search", "execution": "client"}],
    }
    request = dr.ResponsesRequest(body).convert(dr.ConversionOptions())
    assert [(t.name, t.defer_loading) for t in request.conversation.tools] == [
        ("tool_search", False),
        ("late", True),
    ]
    roles = [m.role for m in request.conversation.messages]
    assert roles == ["user", "assistant", "tool", "system"]
    head, _, loaded = _prompt(request).partition("<tool_result>")
    assert '"name": "late"' not in head
    assert f'{UPDATED}\n\n{{"name": "late", "description": "", ' in loaded
    assert '"defer_loading":true' in request.inference_options.output_constraint.schema


def test_responses_tool_search_is_left_out_on_v4() -> None:
    body = {"model": "DeepSeek-V4-Pro", "input": SEARCH_HISTORY}
    request = dr.ResponsesRequest(body).convert(dr.ConversionOptions())
    assert [m.role for m in request.conversation.messages] == ["user"]


def test_responses_tool_search_call_is_streamed_as_one_item() -> None:
    body = {
        "model": V41,
        "input": "q",
        "tools": [{"type": "tool_search", "execution": "client"}],
        "reasoning": {"effort": "none"},
    }
    request = dr.ResponsesRequest(body).convert(dr.ConversionOptions())
    processor = dr.StreamProcessor(
        dr.ResponsesRequest.chunk_generator(request, "r", "m"), request.parsing_options
    )
    text = (
        '<｜DSML｜ calls>\n<｜DSML｜ invoke name="tool_search">\n'
        '<｜DSML｜ parameter name="limit" string="false">3</｜DSML｜ parameter>\n'
        "</｜DSML｜ invoke>\n</｜DSML｜ calls>"
    )
    chunks = processor.push(dr.InferenceChunk.text(text))
    chunks += processor.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
    items = [json.loads(c.to_json()) for c in chunks]
    done = [e["item"] for e in items if e["type"] == "response.output_item.done"]
    assert done[0]["type"] == "tool_search_call"
    assert done[0]["arguments"] == {"limit": 3}
    assert not any("arguments.delta" in e["type"] for e in items)


def test_messages_deferred_tools_are_loaded_where_referenced() -> None:
    reference = {"type": "tool_reference", "tool_name": "late"}
    addition = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "late"}}
    call = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [reference]}
    body = {
        "model": V41,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
            {"role": "system", "content": [addition]},
        ],
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}},
            {"name": "late", "input_schema": {"type": "object"}, "defer_loading": True},
        ],
    }
    request = dr.MessagesRequest(body).convert(dr.ConversionOptions())
    systems = [m for m in request.conversation.messages if m.role == "system"]
    assert [[t.name for t in m.tools or []] for m in systems] == [["late"], ["late"]]
    prompt = _prompt(request)
    assert prompt.count(UPDATED) == 2
    assert '"name": "late"' not in prompt.partition("<｜User｜>")[0]


def test_messages_tools_cannot_all_be_deferred_on_v41() -> None:
    tool = {"name": "late", "input_schema": {"type": "object"}, "defer_loading": True}
    body = {"model": V41, "messages": [{"role": "user", "content": "q"}], "tools": [tool]}
    with pytest.raises(dr.ConversionError, match="All tools cannot be deferred"):
        dr.MessagesRequest(body).convert(dr.ConversionOptions())
    body["model"] = "DeepSeek-V4-Pro"
    request = dr.MessagesRequest(body).convert(dr.ConversionOptions())
    assert [t.defer_loading for t in request.conversation.tools] == [False]


def test_requests_are_consumed_by_conversion() -> None:
    request = dr.ResponsesRequest({"model": "unknown", "input": "q"})
    with pytest.raises(dr.ConversionError):
        request.convert(dr.ConversionOptions())
    with pytest.raises(RuntimeError, match="consumed"):
        request.echo()
