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


@pytest.mark.parametrize(
    "body",
    [
        {"model": V41, "input": "q", "tools": [{"type": "tool_search", "execution": "client"}]},
        {
            "model": V41,
            "input": [
                {"role": "user", "content": "q"},
                {"type": "tool_search_call", "call_id": "t", "arguments": {"q": "x"}},
                {"type": "tool_search_output", "call_id": "t", "tools": []},
            ],
        },
    ],
)
def test_responses_deferred_loading_is_not_implemented(body: dict[str, Any]) -> None:
    with pytest.raises(NotImplementedError, match="deferred tool loading"):
        dr.ResponsesRequest(body).convert(dr.ConversionOptions())


@pytest.mark.parametrize(
    "body",
    [
        {
            "model": V41,
            "messages": [{"role": "user", "content": "q"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "defer_loading": True}],
        },
        {
            "model": "DeepSeek-V4-Pro",
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}
                    ],
                },
                {"role": "user", "content": "q"},
            ],
        },
    ],
)
def test_messages_deferred_loading_is_not_implemented(body: dict[str, Any]) -> None:
    with pytest.raises(NotImplementedError, match="deferred tool loading"):
        dr.MessagesRequest(body).convert(dr.ConversionOptions())


def test_requests_are_consumed_by_conversion() -> None:
    request = dr.ResponsesRequest({"model": "unknown", "input": "q"})
    with pytest.raises(dr.ConversionError):
        request.convert(dr.ConversionOptions())
    with pytest.raises(RuntimeError, match="consumed"):
        request.echo()
