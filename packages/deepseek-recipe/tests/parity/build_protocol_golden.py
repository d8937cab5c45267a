"""Regenerate tests/data/protocol_golden.json from the official deepseek-recipe 0.2.0.

The golden file lets the fast (non-parity) test suite check the Responses and
Messages converters against values the official package produced, without
needing its interpreter.  Run with the oracle interpreter:

    .venv-recipe-oracle/bin/python packages/deepseek-recipe/tests/parity/build_protocol_golden.py
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUT = HERE.parent / "data" / "protocol_golden.json"

R = "DeepSeek-V4-Pro"
R41 = "DeepSeek-V4.1-Flash"
FN = {"type": "function", "name": "get_w", "parameters": {"type": "object"}}


def _call(name: str, params: list[tuple[str, str, str]], v41: bool = False) -> str:
    block, invoke, param = (
        (" calls", " invoke", " parameter") if v41 else ("tool_calls", "invoke", "parameter")
    )
    inner = "\n".join(
        f'<｜DSML｜{param} name="{n}" string="{flag}">{v}</｜DSML｜{param}>'
        for n, flag, v in params
    )
    return (
        f'<｜DSML｜{block}>\n<｜DSML｜{invoke} name="{name}">\n{inner}\n'
        f"</｜DSML｜{invoke}>\n</｜DSML｜{block}>"
    )


def convert_cases() -> list[dict[str, Any]]:
    responses: list[dict[str, Any]] = [
        {"model": R, "input": "hi", "instructions": "be brief", "reasoning": {"effort": "low"}},
        {
            "model": R41,
            "input": [
                {"role": "developer", "content": "dev"},
                {"role": "user", "content": [{"type": "input_text", "text": "look"}]},
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]},
                {"type": "function_call", "call_id": "b", "name": "get_w", "arguments": "{}"},
                {
                    "type": "function_call",
                    "call_id": "a",
                    "name": "g",
                    "arguments": "{}",
                    "namespace": "ns",
                },
                {"type": "function_call_output", "call_id": "b", "output": "ob"},
                {"type": "function_call_output", "call_id": "a", "output": "oa"},
            ],
            "tools": [
                FN,
                {
                    "type": "namespace",
                    "name": "ns",
                    "description": "N",
                    "tools": [FN | {"name": "g"}],
                },
                {"type": "custom", "name": "apply_patch"},
                {"type": "web_search"},
            ],
        },
        {
            "model": R,
            "input": "q",
            "tools": [{"type": "namespace", "name": "a_", "tools": [FN | {"name": "h"}]}, FN],
            "tool_choice": {"type": "function", "name": "get_w"},
            "reasoning": {"effort": "none"},
            "temperature": 0.3,
            "top_p": 0.7,
            "top_logprobs": 2,
        },
        {"model": R, "input": "json please", "text": {"format": {"type": "json_object"}}},
        {"model": R, "input": "no word", "text": {"format": {"type": "json_object"}}},
        {"model": R, "input": [{"role": "user", "content": "q"}, FN | {"type": "function_call"}]},
        {"model": R, "input": "q", "tools": [{"type": "custom", "name": "other"}]},
        {"model": R, "input": "q", "tools": [{"type": "function", "name": "bad name"}]},
        {"model": R, "input": [], "max_output_tokens": 0},
        {"model": R, "input": 5},
    ]
    messages: list[dict[str, Any]] = [
        {
            "model": R,
            "max_tokens": 500000,
            "system": "sys",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "t1", "name": "get_w", "input": {"a": [1, 2.5]}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
                },
                {"role": "system", "content": "reminder"},
            ],
            "tools": [{"name": "get_w", "input_schema": {"type": "object"}}],
            "output_config": {"effort": "max"},
        },
        {
            "model": R41,
            "messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "mid"}],
            "thinking": {"type": "disabled"},
            "temperature": 0.5,
            "stop_sequences": ["END"],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        {
            "model": R,
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {"role": "user", "content": "no result"},
            ],
        },
        {"model": R, "messages": []},
        {"model": R, "messages": [{"role": "tool", "content": "x"}]},
    ]
    cases = [{"kind": "convert", "protocol": "responses", "body": b} for b in responses]
    cases.append(
        {
            "kind": "convert",
            "protocol": "responses",
            "body": responses[1],
            "options": {"responses_web_search": "reject"},
        }
    )
    cases += [{"kind": "convert", "protocol": "messages", "body": b} for b in messages]
    cases.append(
        {
            "kind": "convert",
            "protocol": "messages",
            "body": messages[1],
            "options": {"messages_web_search": "drop"},
        }
    )
    return cases


def deferred_cases() -> list[dict[str, Any]]:
    """Deferred tool loading: tool search on Responses, deferred tools on Messages."""
    search = {"type": "tool_search", "execution": "client", "description": "Find tools"}
    found = [
        {"type": "function", "name": "late", "description": "L", "parameters": {"type": "object"}},
        {
            "type": "namespace",
            "name": "crm",
            "description": "CRM",
            "tools": [{"type": "function", "name": "get"}],
        },
        {"type": "custom", "name": "apply_patch"},
        {"type": "web_search"},
    ]
    history = [
        {"role": "user", "content": "find a tool"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "search"}]},
        {"type": "tool_search_call", "call_id": "ts", "arguments": {"query": "crm"}},
        {"type": "tool_search_output", "call_id": "ts", "tools": found},
        {"type": "function_call", "call_id": "c", "name": "late", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "done"},
    ]
    responses: list[dict[str, Any]] = [
        {"model": R41, "input": history, "tools": [FN, search]},
        {"model": R, "input": history, "tools": [FN, search]},
        {"model": R41, "input": history, "tools": [FN], "tool_choice": "none"},
        {
            "model": R41,
            "input": [*history[:3], {**history[3], "tools": [{"type": "mcp"}]}],
        },
        {
            "model": R41,
            "input": [*history[:3], {**history[3], "tools": [FN]}],
            "tools": [FN],
        },
    ]
    deferred = {"name": "late", "input_schema": {"type": "object"}, "defer_loading": True}
    shown = {"name": "get_w", "input_schema": {"type": "object"}}
    addition = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "late"}}
    reference = {"type": "tool_reference", "tool_name": "late"}
    conversation = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_w", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [reference]},
                {"type": "text", "text": "go on"},
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "Also:"}, addition]},
    ]
    messages: list[dict[str, Any]] = [
        {"model": R41, "messages": conversation, "tools": [shown, deferred]},
        {"model": R, "messages": conversation, "tools": [shown, deferred]},
        {"model": R41, "messages": conversation[:1], "tools": [deferred]},
        {
            "model": R,
            "messages": [
                {
                    "role": "system",
                    "content": [{**addition, "tool": {**addition["tool"], "name": "zz"}}],
                }
            ],
            "tools": [shown],
        },
    ]
    cases = [{"kind": "convert", "protocol": "responses", "body": b} for b in responses]
    cases += [{"kind": "convert", "protocol": "messages", "body": b} for b in messages]
    search_call = _call("tool_search", [("query", "true", "crm"), ("limit", "false", "3")], True)
    for text in (
        "r</think>" + search_call,
        "r</think>" + _call("tool_search", [("q", "false", "x")], True),
    ):
        cases.append(
            {
                "kind": "stream",
                "protocol": "responses",
                "body": {"model": R41, "input": history, "tools": [FN, search]},
                "units": [{"text": text[i : i + 7], "count": 1} for i in range(0, len(text), 7)],
                "finish": "Stop",
                "ready": [30, 10, "fp"],
                "modifiers": [],
            }
        )
    return cases


def stream_cases() -> list[dict[str, Any]]:
    patch = '*** Begin Patch\n*** Add File: a.txt\n+hé "q"\n*** End Patch'
    r_body = {
        "model": R,
        "input": "hi",
        "tools": [FN, {"type": "custom", "name": "apply_patch"}],
        "instructions": "ins",
        "temperature": 0.7,
    }
    m_body = {
        "model": R,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_w", "input_schema": {"type": "object"}}],
        "stop_sequences": ["STOP"],
    }
    outputs = [
        (
            "r</think>answer " + _call("get_w", [("city", "true", "Paris"), ("n", "false", "2")]),
            "Stop",
        ),
        ("think</think>" + _call("apply_patch", [("input", "true", patch)]), "Stop"),
        ("reasoning only", "Length"),
        ("</think>text then STOP and more", None),
        (_call("get_w", []), "ContentFilter"),
    ]
    cases: list[dict[str, Any]] = []
    for protocol, body in (("responses", r_body), ("messages", m_body)):
        for text, finish in outputs:
            units = [{"text": text[i : i + 5], "count": 1} for i in range(0, len(text), 5)]
            cases.append(
                {
                    "kind": "stream",
                    "protocol": protocol,
                    "body": body,
                    "units": units,
                    "finish": finish,
                    "ready": [30, 10, "fp"],
                    "modifiers": ["signature:sig"] if protocol == "messages" else [],
                }
            )
    return cases


def main() -> None:
    import deepseek_recipe as dr

    load = runpy.run_path(str(HERE / "_oracle.py"))["load"]
    cases = convert_cases() + stream_cases() + deferred_cases()
    results = load("protocol_dump").run_all(dr, cases)
    OUT.write_text(
        json.dumps({"cases": cases, "results": results}, ensure_ascii=False, indent=1) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
