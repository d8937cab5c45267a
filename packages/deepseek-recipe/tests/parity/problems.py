"""Broken Chat Completions requests for the parity generators, and how to apply them.

Each problem is a patch to a minimal valid request that adds one known
problem (or a near miss the official package accepts).  Applying two at once
shows which problem the official converter reports first.
"""

from __future__ import annotations

import copy
from typing import Any


def merge(
    body: dict[str, Any], problem: dict[str, Any], joined: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`body` with `problem` applied, both copied (a problem may be applied again).

    Lists under `joined` keys are extended, so two problems can each bring their
    messages or tools; every other key is replaced.
    """
    out = copy.deepcopy(body)
    for key, value in copy.deepcopy(problem).items():
        old = out.get(key)
        if key in joined and isinstance(old, list) and isinstance(value, list):
            out[key] = old + value
        else:
            out[key] = value
    return out


def _problems() -> list[dict[str, Any]]:
    """Patches to a minimal valid request, each adding one known problem."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    problems: list[dict[str, Any]] = [
        {"model": "gpt-4o"},
        {"messages": []},
        {"messages": [{"role": "developer", "content": "x"}]},
        {"messages": [{"content": "x"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        {"messages": [{"role": "user", "content": [{"text": "a"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}
            ]
        },
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "tool", "tool_call_id": "a", "content": "x"}]},
        {"messages": [{"role": "latest_reminder", "content": [{"type": "text", "text": "a"}]}]},
        {"n": 2},
        {"n": 0},
        {"max_tokens": 0},
        {"max_tokens": 393217},
        {"max_tokens": -5},
        {"max_tokens": 1.5},
        {"max_tokens": "10"},
        {"temperature": 2.5},
        {"top_p": 0},
        {"top_p": 1.5},
        {"frequency_penalty": 3},
        {"presence_penalty": -2.5},
        {"seed": -1},
        {"top_logprobs": 3},
        {"top_logprobs": 25, "logprobs": True},
        {"stop": ""},
        {"stop": ["a", ""]},
        {"stop": ["s"] * 17},
        {"stop": 3},
        {"reasoning_effort": 5},
        {"reasoning_effort": "huge"},
        {"thinking": {"type": "auto"}},
        {"tools": [tool], "tool_choice": "required"},
        {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}},
        {
            "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
            "thinking": {"type": "disabled"},
        },
        {"tools": [tool], "tool_choice": "sometimes"},
        {"tools": [tool, tool]},
        {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
        {"tools": [{"type": "function", "function": {"name": ""}}]},
        {"tools": [{"type": "web", "function": {"name": "f"}}]},
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
            ]
        },
        {"tools": [{"type": "function", "function": {"name": "f", "strict": True}}, tool]},
        {"tools": [tool], "response_format": {"type": "json_object"}},
        {"response_format": {"type": "xml"}},
        {"response_format": {"type": "json_schema"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a", "prefix": True},
                {"role": "user", "content": "b"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": []},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f"}}],
                },
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        },
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "r"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "zz", "content": "r"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                },
            ]
        },
    ]
    problems += [
        {"model": 5},
        {"messages": "hi"},
        {"messages": ["hi"]},
        {"messages": [{"role": 1, "content": "x"}]},
        {"temperature": "0.5"},
        {"n": "2"},
        {"seed": 1.5},
        {"stream": "yes"},
        {"tools": {"a": 1}},
        {"tools": ["f"]},
        {"tools": [{"type": "function", "function": "f"}]},
        {"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
        {"tools": [tool], "tool_choice": {"type": "function"}, "thinking": {"type": "disabled"}},
        {"tools": [tool], "tool_choice": {"type": "x", "function": {"name": "f"}}},
        {"response_format": "json_object"},
        {"response_format": {}},
        {"response_format": {"type": "regex"}},
        {"thinking": "enabled"},
        {"thinking": {}},
        {"reasoning_effort": ["low"]},
        {"stop": [1]},
        {"messages": [{"role": "user", "content": True}]},
        {"messages": [{"role": "user", "content": ["hi"]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "max"}}],
                }
            ]
        },
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 5}]},
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "x", "tool_calls": {"id": "a"}},
            ]
        },
        {"stream": True, "stream_options": "x"},
        {"stream_options": {"include_usage": True}},
        {"max_tokens": 2**40},
    ]
    return problems + _more_problems()


def _more_problems() -> list[dict[str, Any]]:
    """Problems, and near misses the official package accepts, in four corners of conversion.

    A tool choice that forces or names a call while no tools are declared; an
    assistant message with neither content nor tool calls; strict schemas with a
    string `format` outside the supported set (or not a string); and prefix
    messages whose content is only newlines.
    """
    q = {"role": "user", "content": "q json"}
    result = {"role": "tool", "tool_call_id": "k", "content": "r"}
    call = {"id": "k", "type": "function", "function": {"name": "f", "arguments": "{}"}}

    def strict_format(value: Any) -> dict[str, Any]:
        return {"type": "object", "properties": {"s": {"type": "string", "format": value}}}

    any_format = {"type": "string", "format": "ipv5"}

    def strict_tool(schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "s", "parameters": schema, "strict": True}}

    def strict_format_rf(value: Any) -> dict[str, Any]:
        spec = {"name": "n", "schema": strict_format(value), "strict": True}
        return {"type": "json_schema", "json_schema": spec}

    return [
        {"tool_choice": "required"},
        {"tool_choice": "required", "tools": []},
        {"tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": []},
        {"tool_choice": "required", "thinking": {"type": "disabled"}},
        {"messages": [q, {"role": "assistant"}]},
        {"messages": [q, {"role": "assistant", "content": None, "reasoning_content": "r"}, q]},
        {"messages": [q, {"role": "assistant", "content": None, "tool_calls": [call]}, result]},
        {"messages": [q, {"role": "assistant", "tool_calls": None}, q]},
        {"messages": [q, {"role": "assistant", "prefix": True}]},
        {"messages": [q, {"role": "assistant", "content": "\n\n", "prefix": True}]},
        {"response_format": strict_format_rf("date-time")},
        {"response_format": strict_format_rf(5)},
        {"response_format": strict_format_rf({"email": None})},
        {"tools": [strict_tool(strict_format("uri"))]},
        {"tools": [strict_tool(strict_format(None))]},
        {"tools": [strict_tool({"type": "object", "properties": {"a": {"anyOf": [any_format]}}})]},
    ]


#: Every patch, each adding one problem (or a near miss) to a minimal valid request.
PROBLEMS = _problems()
