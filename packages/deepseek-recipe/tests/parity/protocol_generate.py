"""Seeded generators of Responses and Messages parity cases.

Requests cover the places where a re-implementation drifts: how items or
content blocks become messages, tool declarations (namespaces, `apply_patch`,
server tools), tool choices, formats, effort and sampling rules, images,
validation messages and their order; outputs cover reasoning, text, function
and custom tool calls, finish reasons and stop sequences, split across chunks.

Deferred tool loading is covered on both models: Responses tool search
declarations (client and server), `tool_search_call` / `tool_search_output`
items loading functions, namespaces, `apply_patch` and tools that cannot be
loaded, Messages `defer_loading` tools, `tool_reference` results and
`tool_addition` blocks, and their broken forms.
"""

from __future__ import annotations

import json
import random
import runpy
from pathlib import Path
from typing import Any

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]

BASE = load("generate")
SCHEMAS = load("schemas")
BROKEN = load("problems")
MODELS = ["DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"]
EFFORTS = [None, "none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
PNG_DATA = BASE.PNG.split(",", 1)[1]
PATCHES = [
    "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch",
    '*** Begin Patch\n*** Update File: src/app.py\n@@ def f():\n-print("Hi")\n+print("Hé\\n")\n'
    "*** End Patch",
    "",
    "tab\there \\ back\u0001ctrl 😀",
]


def _text(rng: random.Random, n: int = 3) -> str:
    return BASE._text(rng, n)


def _schema(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return rng.choice([{"type": "string"}, {"properties": {}}, 5, True])
    props = {
        f"p{i}": {"type": rng.choice(["string", "integer", "number"])}
        for i in range(rng.randint(0, 3))
    }
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if rng.random() < 0.3:
        schema["description"] = _text(rng)
    if rng.random() < 0.2:
        schema["properties"]["x"] = {"type": "number", "minimum": 1.5, "default": 1e21}
    return schema


# Responses --------------------------------------------------------------------------------


def _r_function(rng: random.Random, name: str, strict: bool | None) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "function", "name": name}
    if rng.random() < 0.6:
        tool["description"] = _text(rng, 4)
    schema = _schema(rng)
    if schema is not None or rng.random() < 0.3:
        tool["parameters"] = schema
    if strict is not None:
        tool["strict"] = strict
        if strict:
            schemas = SCHEMAS.FORMAT_SCHEMAS if rng.random() < 0.3 else SCHEMAS.STRICT_SCHEMAS[:6]
            tool["parameters"] = rng.choice(schemas)
    return tool


def _r_tools(rng: random.Random, model: str) -> list[dict[str, Any]]:
    strict = rng.choice([None, None, None, True, False])
    tools: list[dict[str, Any]] = []
    for i in range(rng.choice([0, 0, 1, 2, 3, 4])):
        roll = rng.random()
        if roll < 0.45:
            tools.append(_r_function(rng, rng.choice([f"fn_{i}", "lookup", "get_w"]), strict))
        elif roll < 0.6:
            inner = [
                _r_function(rng, rng.choice(["g", "h", "k"]), strict)
                for _ in range(rng.randint(0, 2))
            ]
            space: dict[str, Any] = {"type": "namespace", "name": rng.choice(["ns", "crm", "a_"])}
            if rng.random() < 0.5:
                space["description"] = _text(rng)
            space["tools"] = inner
            tools.append(space)
        elif roll < 0.72:
            tool = {"type": "custom", "name": "apply_patch"}
            if rng.random() < 0.3:
                tool["description"] = "mine"
            tools.append(tool)
        elif roll < 0.82:
            kind = rng.choice(["web_search", "web_search_2025_08_26"])
            tool = {"type": kind}
            if rng.random() < 0.5:
                tool["search_context_size"] = rng.choice(["low", "medium", "high"])
            if rng.random() < 0.3:
                tool["user_location"] = {"type": "approximate", "city": "Paris"}
            tools.append(tool)
        elif roll < 0.9:
            tool = {"type": "tool_search"}
            execution = rng.choice([None, "server", "client", "client"])
            if execution:
                tool["execution"] = execution
            if rng.random() < 0.3:
                tool["description"] = "search"
            if rng.random() < 0.2:
                tool["parameters"] = rng.choice(
                    [{"type": "object", "properties": {"query": {"type": "string"}}}, {}, None]
                )
            tools.append(tool)
        else:
            tools.append({"type": rng.choice(["file_search", "computer_use_preview", "mcp"])})
    return tools


def _function_names(tools: list[dict[str, Any]], model: str) -> list[tuple[str, str | None]]:
    """(name, namespace) pairs that calls in the history may use."""
    names: list[tuple[str, str | None]] = []
    for t in tools:
        if t["type"] == "function":
            names.append((t["name"], None))
        elif t["type"] == "namespace":
            names += [(inner["name"], t["name"]) for inner in t["tools"]]
    return names or [("lookup", None)]


def _r_content(rng: random.Random, allow_images: bool, output_text: bool = False) -> Any:
    if rng.random() < 0.5:
        return _text(rng)
    parts: list[Any] = []
    for _ in range(rng.randint(0, 3)):
        roll = rng.random()
        if roll < 0.6 or not allow_images:
            kind = "output_text" if output_text and rng.random() < 0.7 else "input_text"
            parts.append({"type": kind, "text": _text(rng)})
        elif roll < 0.85:
            image: dict[str, Any] = {"type": "input_image"}
            which = rng.random()
            if which < 0.45:
                image["image_url"] = BASE.PNG
            elif which < 0.9:
                image["image_url"] = "https://example.com/a.png"
            else:
                image["file_id"] = "file-1"
            if rng.random() < 0.3:
                image["detail"] = rng.choice(["low", "high", "auto", "original"])
            parts.append(image)
        else:
            parts.append({"type": "input_file", "file_id": "f1"})
    return parts


def _r_output(rng: random.Random) -> Any:
    if rng.random() < 0.6:
        return _text(rng)
    parts: list[Any] = []
    for _ in range(rng.randint(0, 3)):
        roll = rng.random()
        if roll < 0.6:
            parts.append({"type": "input_text", "text": _text(rng)})
        elif roll < 0.85:
            parts.append({"type": "input_image", "image_url": "https://example.com/r.png"})
        else:
            parts.append({"type": "input_file", "file_id": "f1"})
    return parts


def _reasoning_item(rng: random.Random) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "summary": []}
    roll = rng.random()
    if roll < 0.7:
        item["content"] = [
            {"type": "reasoning_text", "text": _text(rng)} for _ in range(rng.randint(1, 2))
        ]
    elif roll < 0.8:
        item["content"] = []
    if rng.random() < 0.3:
        item["summary"] = [{"type": "summary_text", "text": "sum"}]
    if rng.random() < 0.2:
        item["encrypted_content"] = "enc"
    return item


def _found_tools(rng: random.Random) -> list[Any]:
    """What a tool search output lists: mostly loadable tools, sometimes ones that are not."""
    found: list[Any] = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        roll = rng.random()
        if roll < 0.45:
            found.append(_r_function(rng, f"found_{rng.randint(0, 99)}", None))
        elif roll < 0.65:
            space: dict[str, Any] = {"type": "namespace", "name": rng.choice(["crm", "ns"])}
            if rng.random() < 0.5:
                space["description"] = rng.choice(["", _text(rng)])
            space["tools"] = [
                _r_function(rng, rng.choice(["get", "put", "g"]), None)
                for _ in range(rng.randint(0, 2))
            ]
            found.append(space)
        elif roll < 0.73:
            found.append({"type": "custom", "name": "apply_patch"})
        elif roll < 0.83:
            tool: dict[str, Any] = {"type": rng.choice(["web_search", "web_search_2025_08_26"])}
            if rng.random() < 0.4:
                tool["user_location"] = {"type": "approximate", "city": "Paris"}
            found.append(tool)
        elif roll < 0.93:
            search: dict[str, Any] = {"type": "tool_search"}
            if rng.random() < 0.7:
                search["execution"] = rng.choice(["client", "server"])
            if rng.random() < 0.3:
                search["description"] = "find"
            found.append(search)
        elif roll < 0.97:
            found.append(_r_function(rng, "found_s", True))
        else:
            found.append({"type": rng.choice(["mcp", "file_search"])})
    return found


def _search_arguments(rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.15:
        return {}
    if roll < 0.7:
        return {"query": _text(rng, 2)}
    return {f"a{i}": BASE._value(rng) for i in range(rng.randint(1, 3))}


def _r_items(rng: random.Random, tools: list[dict[str, Any]], model: str) -> list[Any]:
    items: list[Any] = []
    names = _function_names(tools, model)
    searches = rng.random() < (0.35 if model == "DeepSeek-V4.1-Flash" else 0.12)
    if rng.random() < 0.3:
        items.append({"role": rng.choice(["system", "developer"]), "content": _text(rng)})
    call_no = 0
    for _ in range(rng.randint(1, 4)):
        msg: dict[str, Any] = {"role": "user", "content": _r_content(rng, True)}
        if rng.random() < 0.3:
            msg["type"] = "message"
        items.append(msg)
        if rng.random() < 0.1:
            items.append({"role": rng.choice(["system", "developer"]), "content": _text(rng)})
        if rng.random() < 0.3:
            break
        ids: list[str] = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.3:
                items.append(_reasoning_item(rng))
            elif roll < 0.6:
                content = _r_content(rng, False, output_text=True)
                items.append({"type": "message", "role": "assistant", "content": content})
            elif roll < 0.9 and searches and rng.random() < 0.4:
                cid = f"ts_{call_no}"
                call_no += 1
                ids.append(cid)
                search_call: dict[str, Any] = {
                    "type": "tool_search_call",
                    "call_id": cid,
                    "arguments": _search_arguments(rng),
                }
                if rng.random() < 0.3:
                    search_call["execution"] = rng.choice(["client", "server"])
                items.append(search_call)
            elif roll < 0.9:
                cid = f"call_{call_no}"
                call_no += 1
                ids.append(cid)
                name, space = rng.choice(names)
                call: dict[str, Any] = {
                    "type": "function_call",
                    "call_id": cid,
                    "name": name,
                    "arguments": BASE._arguments(rng),
                }
                if space is not None:
                    call["namespace"] = space
                items.append(call)
            else:
                cid = f"ctc_{call_no}"
                call_no += 1
                ids.append(cid)
                items.append(
                    {
                        "type": "custom_tool_call",
                        "call_id": cid,
                        "name": "apply_patch",
                        "input": rng.choice(PATCHES),
                    }
                )
        if rng.random() < 0.1:
            items.append(rng.choice([{"type": "web_search_call", "id": "ws"}, {"type": "item_x"}]))
        order = ids[:]
        if rng.random() < 0.5:
            rng.shuffle(order)
        for cid in order:
            if cid.startswith("ts_"):
                items.append(
                    {"type": "tool_search_output", "call_id": cid, "tools": _found_tools(rng)}
                )
                continue
            kind = "custom_tool_call_output" if cid.startswith("ctc") else "function_call_output"
            items.append({"type": kind, "call_id": cid, "output": _r_output(rng)})
    return items


def responses_body(rng: random.Random) -> dict[str, Any]:
    """A mostly valid Responses request."""
    model = rng.choice(MODELS)
    tools = _r_tools(rng, model)
    body: dict[str, Any] = {"model": model}
    roll = rng.random()
    if roll < 0.15:
        body["input"] = _text(rng)
    elif roll < 0.97:
        body["input"] = _r_items(rng, tools, model)
    if rng.random() < 0.3 or "input" not in body:
        body["instructions"] = rng.choice(["Be brief. json", "", _text(rng)])
    if tools or rng.random() < 0.05:
        body["tools"] = tools
    names = [n for n, space in _function_names(tools, model) if space is None] or ["lookup"]
    roll = rng.random()
    if tools and roll < 0.15:
        body["tool_choice"] = "none"
    elif tools and roll < 0.25:
        body["tool_choice"] = "required"
    elif tools and roll < 0.35:
        body["tool_choice"] = {"type": "function", "name": rng.choice(names)}
    elif roll < 0.4:
        body["tool_choice"] = rng.choice(
            [{"type": "custom", "name": "apply_patch"}, {"type": "web_search"}, "auto"]
        )
    elif not tools and roll < 0.5:
        # Nothing to force or name: the official converter falls back to `auto`.
        body["tool_choice"] = rng.choice(["required", {"type": "function", "name": "lookup"}])
    reasoning: dict[str, Any] = {}
    effort = rng.choice(EFFORTS)
    if effort is not None:
        reasoning["effort"] = effort
    if rng.random() < 0.2:
        reasoning[rng.choice(["summary", "generate_summary"])] = rng.choice(
            ["auto", "concise", "detailed"]
        )
    if reasoning or rng.random() < 0.1:
        body["reasoning"] = reasoning
    roll = rng.random()
    if roll < 0.1:
        body["text"] = {"format": {"type": "json_object"}}
    elif roll < 0.2:
        fmt: dict[str, Any] = {
            "type": "json_schema",
            "name": "out",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
        }
        if rng.random() < 0.5:
            fmt["strict"] = rng.choice([True, False])
            if fmt["strict"] and rng.random() < 0.5:
                fmt["schema"] = SCHEMAS.strict_schema(rng)
        if rng.random() < 0.3:
            fmt["description"] = "d"
        body["text"] = {"format": fmt}
    elif roll < 0.25:
        body["text"] = {"format": {"type": "text"}}
    if "text" in body and rng.random() < 0.3:
        body["text"]["verbosity"] = rng.choice(["low", "medium", "high"])
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0.0, 0.3, 0.7, 1.3, 2.0])
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.1, 0.5, 0.9, 0.97, 1.0])
    if rng.random() < 0.3:
        body["max_output_tokens"] = rng.choice([1, 100, 4096, 393216])
    if rng.random() < 0.15:
        body["top_logprobs"] = rng.choice([0, 3, 20])
    if rng.random() < 0.1:
        body["user"] = "user-1"
    if rng.random() < 0.15:
        body["stream"] = rng.choice([True, False])
    if rng.random() < 0.1:
        body.update({"store": True, "metadata": {"k": "v"}, "parallel_tool_calls": False})
    return body


def _search_call(call_id: str, arguments: Any = "default") -> dict[str, Any]:
    args = {"query": "x"} if arguments == "default" else arguments
    return {"type": "tool_search_call", "call_id": call_id, "arguments": args}


def _search_output(call_id: str, tools: list[Any]) -> dict[str, Any]:
    return {"type": "tool_search_output", "call_id": call_id, "tools": tools}


def _search_exchange(*found: Any, call_id: str = "t") -> list[Any]:
    """A user turn, a tool search call and its output listing `found`."""
    return [
        {"role": "user", "content": "q"},
        _search_call(call_id),
        _search_output(call_id, list(found)),
    ]


R_PROBLEMS: list[dict[str, Any]] = [
    {"model": "gpt-4o"},
    {"model": 5},
    {"input": []},
    {"input": 5},
    {"input": {}},
    {"input": [5]},
    {"input": [{"content": "x"}]},
    {"input": [{"role": "tool", "content": "x"}]},
    {"input": [{"role": 5, "content": "x"}]},
    {"input": [{"role": {}, "content": "x"}]},
    {"input": [{"role": {"user": None}, "content": "x"}]},
    {"input": [{"role": "user"}]},
    {"input": [{"type": "message", "content": "x"}]},
    {"input": [{"role": "user", "content": 5}]},
    {"input": [{"role": "user", "content": [{"type": "refusal", "refusal": "r"}]}]},
    {"input": [{"role": "user", "content": [{"text": "x"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "detail": "huge"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
    {
        "input": [
            {"role": "user", "content": [{"type": "input_image", "file_id": "f", "image_url": "u"}]}
        ]
    },
    {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]},
    {"input": [{"type": "function_call"}]},
    {"input": [{"type": "function_call", "arguments": "{}", "name": "f"}]},
    {"input": [{"type": "function_call", "arguments": {}, "call_id": "c", "name": "f"}]},
    {"input": [{"type": "function_call_output", "output": 5}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
    {"input": [{"type": "function_call_output", "output": "x"}]},
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "", "output": "x"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
            {"type": "function_call_output", "call_id": "c", "output": "y"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"role": "user", "content": "interrupt"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
        ]
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r2"}]},
            {"type": "function_call", "call_id": "d", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
            {"type": "function_call_output", "call_id": "d", "output": "x"},
        ]
    },
    {"input": [{"type": "reasoning", "content": [{"type": "x"}]}]},
    {"input": [{"type": "reasoning", "content": 5}]},
    {"input": [{"type": "custom_tool_call", "call_id": "c"}]},
    {"input": [{"type": "custom_tool_call_output"}]},
    {"input": [{"type": 5}]},
    {"instructions": 5},
    {"max_output_tokens": 0},
    {"max_output_tokens": 393217},
    {"max_output_tokens": -1},
    {"max_output_tokens": 1.5},
    {"temperature": 3},
    {"temperature": "x"},
    {"top_p": 0},
    {"top_p": 1.5},
    {"top_logprobs": 21},
    {"top_logprobs": 300},
    {"stream": "yes"},
    {"user": 5},
    {"reasoning": 5},
    {"reasoning": {"effort": 5}},
    {"reasoning": {"effort": "huge"}},
    {"reasoning": {"effort": {}}},
    {"reasoning": {"effort": {"x": 1}}},
    {"reasoning": {"summary": "x"}},
    {"text": 5},
    {"text": {"format": 5}},
    {"text": {"format": {}}},
    {"text": {"format": {"type": "regex"}}},
    {"text": {"format": {"type": "json_schema", "name": "n"}}},
    {"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
    {"text": {"verbosity": "x"}},
    {"text": {"format": {"type": "json_object"}}, "input": "no j-word", "instructions": "x"},
    {
        "text": {
            "format": {
                "type": "json_schema",
                "name": "n",
                "schema": {"type": "object"},
                "strict": True,
            }
        }
    },
    {"tool_choice": "x"},
    {"tool_choice": 5},
    {"tool_choice": {}},
    {"tool_choice": {"type": "function"}},
    {"tool_choice": {"type": "allowed_tools"}},
    {
        "tool_choice": {"type": "function", "name": "zz"},
        "tools": [{"type": "function", "name": "y"}],
    },
    {"tool_choice": "required", "tools": [{"type": "function", "name": "w"}]},
    {"tools": 5},
    {"tools": [5]},
    {"tools": [{"name": "f"}]},
    {"tools": [{"type": 5}]},
    {"tools": [{"type": "function"}]},
    {"tools": [{"type": "function", "name": 5}]},
    {"tools": [{"type": "function", "name": "f", "strict": 5}]},
    {"tools": [{"type": "function", "name": "bad name"}]},
    {"tools": [{"type": "function", "name": ""}]},
    {"tools": [{"type": "function", "name": "x"}, {"type": "function", "name": "x"}]},
    {"tools": [{"type": "function", "name": "x", "parameters": {"type": "string"}}]},
    {"tools": [{"type": "function", "name": "x", "parameters": 5}]},
    {"tools": [{"type": "function", "name": "x", "parameters": True}]},
    {"tools": [{"type": "function", "name": "x", "parameters": {"properties": {}}}]},
    {"tools": [{"type": "custom", "name": "other"}]},
    {"tools": [{"type": "custom"}]},
    {"tools": [{"type": "namespace", "name": "ns"}]},
    {"tools": [{"type": "namespace", "name": "bad name", "tools": []}]},
    {"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]},
    {
        "tools": [
            {
                "type": "namespace",
                "name": "ns",
                "tools": [{"type": "custom", "name": "apply_patch"}],
            }
        ]
    },
    {
        "tools": [
            {
                "type": "namespace",
                "name": "ns",
                "tools": [{"type": "function", "name": "g"}, {"type": "function", "name": "g"}],
            }
        ]
    },
    {
        "tools": [
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "a b"}]}
        ]
    },
    {"tools": [{"type": "web_search", "search_context_size": "huge"}]},
    {"tools": [{"type": "web_search", "user_location": 5}]},
    {"tools": [{"type": "tool_search", "execution": "x"}]},
    {"tools": [{"type": "tool_search", "execution": "client", "parameters": {"type": "string"}}]},
    {"tools": [{"type": "tool_search", "execution": "client"}] * 2},
    {
        "tools": [{"type": "tool_search", "execution": "client"}],
        "tool_choice": {"type": "function", "name": "tool_search"},
        "reasoning": {"effort": "none"},
    },
    {"tools": [{"type": "tool_search", "execution": "client"}], "tool_choice": "none"},
    {"input": [{"role": "user", "content": "q"}, _search_call("t", "{}")]},
    {"input": [{"role": "user", "content": "q"}, _search_call("t", None)]},
    {"input": [{"role": "user", "content": "q"}, {"type": "tool_search_call", "arguments": {}}]},
    {"input": [{"role": "user", "content": "q"}, _search_call("t")]},
    {"input": [{"role": "user", "content": "q"}, _search_output("t", [])]},
    {"input": [*_search_exchange({"type": "function", "name": "f"}), _search_output("t", [])]},
    {"input": _search_exchange({"type": "function", "name": "f"}, call_id="")},
    {"input": _search_exchange({"type": "mcp"})},
    {"input": _search_exchange({"type": "mcp"}, {"type": "function", "name": "bad name"})},
    {"input": _search_exchange({"type": "custom", "name": "other"})},
    {"input": _search_exchange({"type": "web_search", "search_context_size": "low"})},
    {
        "input": _search_exchange(
            {
                "type": "namespace",
                "name": "ns",
                "tools": [{"type": "custom", "name": "apply_patch"}],
            }
        )
    },
    {
        "input": _search_exchange(
            {"type": "function", "name": "f"}, {"type": "function", "name": "f"}
        )
    },
    {
        "input": _search_exchange(
            {"type": "function", "name": "x", "parameters": {"type": "string"}}
        )
    },
    {
        "input": _search_exchange(
            {
                "type": "function",
                "name": "s",
                "strict": True,
                "parameters": SCHEMAS.STRICT_SCHEMAS[0],
            }
        )
    },
    {
        "input": _search_exchange({"type": "function", "name": "late"}),
        "tool_choice": {"type": "function", "name": "late"},
        "reasoning": {"effort": "none"},
    },
    {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "tool_search_output", "call_id": "t", "tools": 5},
        ]
    },
    {
        "tools": [
            {
                "type": "function",
                "name": "s1",
                "strict": True,
                "parameters": SCHEMAS.STRICT_SCHEMAS[0],
            },
            {"type": "function", "name": "s2"},
        ]
    },
    {
        "tools": [
            {
                "type": "function",
                "name": "s1",
                "strict": True,
                "parameters": SCHEMAS.STRICT_SCHEMAS[0],
            }
        ],
        "text": {"format": {"type": "text"}},
    },
]


def _merge(body: dict[str, Any], problem: dict[str, Any]) -> dict[str, Any]:
    """`body` with `problem` applied; a problem's tools are added to the body's."""
    return BROKEN.merge(body, problem, joined=("tools",))


def responses_cases(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        body = responses_body(rng)
        if i % 4 == 3:
            body = _merge(body, rng.choice(R_PROBLEMS))
            if rng.random() < 0.3:
                body = _merge(body, rng.choice(R_PROBLEMS))
        case: dict[str, Any] = {"kind": "convert", "protocol": "responses", "body": body}
        case["options"] = _options(rng)
        cases.append(case)
    return cases


def _options(rng: random.Random) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if rng.random() < 0.15:
        opts["reject_missing_reasoning"] = True
    if rng.random() < 0.08:
        opts["default_thinking_mode"] = False
    if rng.random() < 0.15:
        opts["responses_web_search"] = "reject"
    if rng.random() < 0.2:
        opts["messages_web_search"] = "drop"
    if rng.random() < 0.05:
        opts["thinking_bound"] = 1000
        opts["non_thinking_bound"] = 50
    if rng.random() < 0.05:
        opts["aliases"] = {"gpt-4o": "DeepseekV41Flash"}
    return opts


# Messages ---------------------------------------------------------------------------------


def _m_tools(rng: random.Random) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for i in range(rng.choice([0, 0, 1, 2, 3])):
        roll = rng.random()
        if roll < 0.85:
            tool: dict[str, Any] = {"name": rng.choice([f"fn_{i}", "lookup", "get_w"])}
            if rng.random() < 0.6:
                tool["description"] = _text(rng, 4)
            schema = _schema(rng)
            if schema is not None or rng.random() < 0.5:
                tool["input_schema"] = schema if schema is not None else {"type": "object"}
            if rng.random() < 0.1:
                tool["strict"] = True
            if rng.random() < 0.3:
                tool["defer_loading"] = rng.choice([True, True, False, None])
            tools.append(tool)
        else:
            kind = rng.choice(["web_search_20250305", "web_search_20260209", "web_fetch_20250910"])
            tools.append({"type": kind, "name": "web_search"})
    return tools


def _image_block(rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.5:
        source = {"type": "base64", "media_type": "image/png", "data": PNG_DATA}
        if rng.random() < 0.1:
            source["data"] = "not base64!"
    elif roll < 0.9:
        source = {"type": "url", "url": "https://example.com/a.png"}
    else:
        source = {"type": "file", "file_id": "file-1"}
    return {"type": "image", "source": source}


def _m_user_blocks(rng: random.Random) -> Any:
    if rng.random() < 0.5:
        return _text(rng)
    blocks: list[Any] = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.65:
            blocks.append({"type": "text", "text": _text(rng)})
        elif roll < 0.9:
            blocks.append(_image_block(rng))
        else:
            source: dict[str, Any] = {"type": "base64", "data": "x"}
            if rng.random() < 0.7:
                source["media_type"] = rng.choice(["application/pdf", "text/plain"])
            blocks.append({"type": "document", "source": source})
    return blocks


def _m_result_content(rng: random.Random, names: list[str]) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return _text(rng)
    if roll < 0.6:
        return None
    blocks: list[Any] = []
    for _ in range(rng.randint(0, 3)):
        kind = rng.random()
        if kind < 0.5:
            blocks.append({"type": "text", "text": _text(rng)})
        elif kind < 0.7:
            blocks.append(_image_block(rng))
        elif kind < 0.8:
            blocks.append({"type": "document", "source": {"media_type": "application/pdf"}})
        else:
            blocks.append({"type": "tool_reference", "tool_name": rng.choice(names)})
    return blocks


def _tool_addition(name: str) -> dict[str, Any]:
    return {"type": "tool_addition", "tool": {"type": "tool_reference", "name": name}}


def _m_system(rng: random.Random, names: list[str]) -> dict[str, Any]:
    """A mid-conversation system message; some load tools with `tool_addition` blocks."""
    roll = rng.random()
    if roll < 0.4:
        return {"role": "system", "content": _text(rng)}
    if roll < 0.55:
        return {"role": "system", "content": [{"type": "text", "text": "s"}]}
    blocks: list[Any] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.55:
            blocks.append(_tool_addition(rng.choice(names)))
        elif kind < 0.85:
            blocks.append({"type": "text", "text": rng.choice(["", _text(rng)])})
        elif kind < 0.95:
            blocks.append(_image_block(rng))
        else:
            blocks.append(_tool_addition("unknown_tool"))
    return {"role": "system", "content": blocks}


def _m_messages(rng: random.Random, tools: list[dict[str, Any]], model: str) -> list[Any]:
    names = [t["name"] for t in tools if "input_schema" in t or "type" not in t] or ["lookup"]
    msgs: list[Any] = []
    call_no = 0
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.15:
            msgs.append(_m_system(rng, names))
        msgs.append({"role": "user", "content": _m_user_blocks(rng)})
        if rng.random() < 0.3:
            break
        blocks: list[Any] = []
        if rng.random() < 0.6:
            for _ in range(rng.randint(1, 2)):
                blocks.append({"type": "thinking", "thinking": _text(rng), "signature": "sig"})
        if rng.random() < 0.7:
            for _ in range(rng.randint(1, 2)):
                blocks.append({"type": "text", "text": _text(rng)})
        if rng.random() < 0.1:
            blocks.append(
                {"type": "server_tool_use", "id": "srv", "name": "web_search", "input": {"q": "x"}}
            )
            blocks.append({"type": "web_search_tool_result", "tool_use_id": "srv", "content": []})
        ids = []
        if rng.random() < 0.45:
            for _ in range(rng.randint(1, 3)):
                cid = f"toolu_{call_no}"
                call_no += 1
                ids.append(cid)
                tool_input = rng.choice(
                    [{}, {"a": 1}, {"city": "Paris", "n": [1, 2.5, None]}, {"s": 'é\n"q"'}]
                )
                blocks.append(
                    {"type": "tool_use", "id": cid, "name": rng.choice(names), "input": tool_input}
                )
        if rng.random() < 0.15 or not blocks:
            msgs.append({"role": "assistant", "content": _text(rng)})
        else:
            msgs.append({"role": "assistant", "content": blocks})
        if ids:
            order = ids[:]
            if rng.random() < 0.4:
                rng.shuffle(order)
            results: list[Any] = []
            for cid in order:
                result: dict[str, Any] = {"type": "tool_result", "tool_use_id": cid}
                content = _m_result_content(rng, names)
                if content is not None or rng.random() < 0.5:
                    result["content"] = content
                if rng.random() < 0.2:
                    result["is_error"] = True
                results.append(result)
            if rng.random() < 0.3:
                results.append({"type": "text", "text": _text(rng)})
            msgs.append({"role": "user", "content": results})
    return msgs


def messages_body(rng: random.Random) -> dict[str, Any]:
    """A mostly valid Messages request."""
    model = rng.choice(MODELS)
    tools = _m_tools(rng)
    body: dict[str, Any] = {"model": model, "messages": _m_messages(rng, tools, model)}
    if rng.random() < 0.8:
        body["max_tokens"] = rng.choice([1, 1024, 8192, 500000])
    if rng.random() < 0.4:
        body["system"] = rng.choice(
            [_text(rng), "", [{"type": "text", "text": "s1"}, {"type": "text", "text": _text(rng)}]]
        )
    if tools:
        body["tools"] = tools
        roll = rng.random()
        if roll < 0.15:
            body["tool_choice"] = {"type": "none"}
        elif roll < 0.3:
            body["tool_choice"] = {"type": "any"}
        elif roll < 0.45:
            body["tool_choice"] = {"type": "tool", "name": tools[-1].get("name", "x")}
        elif roll < 0.55:
            body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    elif rng.random() < 0.1:
        body["tool_choice"] = rng.choice([{"type": "any"}, {"type": "tool", "name": "get_w"}])
    roll = rng.random()
    if roll < 0.3:
        body["thinking"] = {"type": "disabled"}
    elif roll < 0.5:
        body["thinking"] = {"type": rng.choice(["enabled", "adaptive"]), "budget_tokens": 2048}
    effort = rng.choice(EFFORTS)
    if effort is not None:
        body["output_config"] = {"effort": effort}
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0.0, 0.3, 0.7, 1.3, 2.0])
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.1, 0.5, 0.9, 0.97, 1.0])
    if rng.random() < 0.2:
        body["stop_sequences"] = rng.choice([["END"], ["a", "STOP"], []])
    if rng.random() < 0.15:
        body["stream"] = rng.choice([True, False])
    if rng.random() < 0.1:
        body["metadata"] = {"user_id": "u-1"}
    if rng.random() < 0.05:
        body["top_k"] = 5
    return body


def _m_tail(blocks: list[Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": blocks}]


M_PROBLEMS: list[dict[str, Any]] = [
    {"model": "gpt-4o"},
    {"model": 5},
    {"messages": []},
    {"messages": 5},
    {"messages": [5]},
    {"messages": [{}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"content": "x"}]},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": 5, "content": "x"}]},
    {"messages": [{"content": 5, "role": "bad"}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "user", "content": []}]},
    {"messages": [{"role": "user", "content": [5]}]},
    {"messages": [{"role": "user", "content": [{}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "text"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "document", "source": 5}]}]},
    {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "i", "name": "n"}]}]},
    {
        "messages": [
            {"role": "user", "content": [{"type": "tool_use", "id": "i", "name": "n", "input": {}}]}
        ]
    },
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
    {
        "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": 5}]}
        ]
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "web_search_tool_result", "tool_use_id": "s", "content": []}],
            }
        ]
    },
    {
        "messages": [
            {"role": "user", "content": [{"type": "web_search_tool_result", "tool_use_id": "s"}]}
        ]
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}
                ],
            }
        ]
    },
    {"messages": _m_tail([{"type": "tool_use", "id": "t1", "name": "f", "input": {}}])},
    {
        "messages": [
            *_m_tail([{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]),
            {"role": "assistant", "content": "x"},
        ]
    },
    {
        "messages": [
            *_m_tail(
                [
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
                ]
            ),
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]},
        ]
    },
    {
        "messages": [
            *_m_tail(
                [
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
                ]
            ),
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t2"},
                    {"type": "text", "text": "mid"},
                    {"type": "tool_result", "tool_use_id": "t1"},
                ],
            },
        ]
    },
    {
        "messages": [
            *_m_tail([{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]),
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1"},
                    {"type": "tool_result", "tool_use_id": "t1"},
                ],
            },
        ]
    },
    {
        "messages": [
            *_m_tail([{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]),
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1"},
                    {"type": "tool_result", "tool_use_id": "t9"},
                ],
            },
        ]
    },
    {
        "messages": _m_tail(
            [
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
            ]
        )
    },
    {
        "messages": _m_tail(
            [
                {"type": "text", "text": "a"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                {"type": "text", "text": "b"},
            ]
        )
    },
    {"messages": _m_tail([{"type": "tool_result", "tool_use_id": "t1"}])},
    {"messages": _m_tail([{"type": "image", "source": {"type": "url", "url": "http://x"}}])},
    {"messages": _m_tail([{"type": "image", "source": {"type": "file", "file_id": "x"}}])},
    {
        "messages": _m_tail(
            [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]
        )
    },
    {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": [{"type": "thinking", "thinking": "x"}]},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": [_tool_addition("zz")]},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "x"}}]},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": [{"type": "tool_addition"}]},
        ]
    },
    {"messages": _m_tail([_tool_addition("lookup")])},
    {
        "messages": [
            *_m_tail([{"type": "text", "text": "a"}]),
            {
                "role": "system",
                "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}],
            },
        ]
    },
    {
        "messages": [
            {"role": "system", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
            {"role": "user", "content": "q"},
        ]
    },
    {"system": [_tool_addition("lookup")]},
    {"tools": [{"name": "d1", "input_schema": {"type": "object"}, "defer_loading": True}]},
    {
        "tools": [
            {"name": "d1", "input_schema": {"type": "object"}, "defer_loading": True},
            {"name": "d2", "input_schema": {"type": "string"}, "defer_loading": True},
        ],
        "tool_choice": {"type": "none"},
    },
    {
        "tools": [
            {"name": "d0", "input_schema": {"type": "object"}},
            {"name": "d1", "input_schema": {"type": "object"}, "defer_loading": True},
        ],
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": [_tool_addition("d1"), {"type": "text", "text": "t"}]},
        ],
        "tool_choice": {"type": "tool", "name": "d0"},
        "thinking": {"type": "disabled"},
    },
    {"system": 5},
    {"system": [5]},
    {"system": [{"type": "image"}]},
    {"system": [{"type": "text"}]},
    {"max_tokens": 0},
    {"max_tokens": -1},
    {"max_tokens": 1.5},
    {"temperature": 2.5},
    {"top_p": 0},
    {"top_p": "x"},
    {"stop_sequences": "x"},
    {"stop_sequences": [""]},
    {"stop_sequences": ["s"] * 17},
    {"stop_sequences": [5]},
    {"stream": "x"},
    {"tools": 5},
    {"tools": [5]},
    {"tools": [{}]},
    {"tools": [{"name": 5, "input_schema": {}}]},
    {"tools": [{"name": "f", "input_schema": {}, "description": 5}]},
    {"tools": [{"name": "f", "input_schema": {}, "defer_loading": 5}]},
    {"tools": [{"name": "f"}]},
    {"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]},
    {"tools": [{"name": "", "input_schema": {"type": "object"}}]},
    {"tools": [{"name": "f", "input_schema": {"type": "string"}}]},
    {"tools": [{"name": "f", "input_schema": 5}]},
    {"tools": [{"name": "f", "input_schema": {"properties": {}}}]},
    {
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}},
            {"name": "f", "input_schema": {"type": "object"}},
        ]
    },
    {"tools": [{"type": "bash_20250124", "name": "bash"}]},
    {"tools": [{"type": "custom", "name": "f", "input_schema": {}}]},
    {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    {"tool_choice": 5},
    {"tool_choice": "auto"},
    {"tool_choice": {}},
    {"tool_choice": {"type": "x"}},
    {"tool_choice": {"type": "tool"}},
    {"tool_choice": {"type": "auto", "disable_parallel_tool_use": 5}},
    {
        "tool_choice": {"type": "tool", "name": "zz"},
        "tools": [{"name": "y", "input_schema": {"type": "object"}}],
    },
    {
        "tool_choice": {"type": "tool", "name": "y"},
        "tools": [{"name": "y", "input_schema": {"type": "object"}}],
        "thinking": {"type": "enabled"},
    },
    {"thinking": 5},
    {"thinking": {}},
    {"thinking": {"type": "x"}},
    {"thinking": {"type": "enabled", "budget_tokens": "x"}},
    {"output_config": 5},
    {"output_config": {"effort": "x"}},
    {"output_config": {"effort": 5}},
    {"metadata": {"user_id": 5}},
]


def messages_cases(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        body = messages_body(rng)
        if i % 4 == 3:
            body = _merge(body, rng.choice(M_PROBLEMS))
            if rng.random() < 0.3:
                body = _merge(body, rng.choice(M_PROBLEMS))
        cases.append(
            {"kind": "convert", "protocol": "messages", "body": body, "options": _options(rng)}
        )
    return cases


# Streams ----------------------------------------------------------------------------------


def _custom_call(rng: random.Random, v41: bool) -> str:
    block, invoke, param = (
        (" calls", " invoke", " parameter") if v41 else ("tool_calls", "invoke", "parameter")
    )
    roll = rng.random()
    if roll < 0.6:
        params = [("input", "true", rng.choice(PATCHES))]
    elif roll < 0.7:
        params = [("input", "false", json.dumps(rng.choice(PATCHES), ensure_ascii=False))]
    elif roll < 0.8:
        params = [("input", "false", "[1, 2]")]
    elif roll < 0.9:
        params = [("x", "true", "abc"), ("input", "true", "def")]
    else:
        params = []
    inner = "\n".join(
        f'<｜DSML｜{param} name="{n}" string="{flag}">{v}</｜DSML｜{param}>'
        for n, flag, v in params
    )
    return (
        f'<｜DSML｜{block}>\n<｜DSML｜{invoke} name="apply_patch">\n{inner}\n'
        f"</｜DSML｜{invoke}>\n</｜DSML｜{block}>"
    )


def _stream_body(rng: random.Random, protocol: str) -> tuple[dict[str, Any], list[str], bool]:
    model = rng.choice(MODELS)
    v41 = model == "DeepSeek-V4.1-Flash"
    thinking = rng.random() < 0.6
    names: list[str] = []
    if protocol == "responses":
        body: dict[str, Any] = {"model": model, "input": "Give json please"}
        tools: list[dict[str, Any]] = []
        if rng.random() < 0.6:
            tools.append({"type": "function", "name": "get_w"})
            names.append("get_w")
        if rng.random() < 0.4:
            tools.append(
                {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]}
            )
            names.append("ns::g" if v41 else "ns__g")
        if rng.random() < 0.4:
            tools.append({"type": "custom", "name": "apply_patch"})
            names.append("apply_patch")
        if rng.random() < 0.3:
            tools.append({"type": "tool_search", "execution": "client"})
            names.append("tool_search")
        if v41 and rng.random() < 0.3:
            # Tools loaded by an earlier tool search are called and split like declared ones.
            found: list[dict[str, Any]] = [
                {"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "get"}]}
            ]
            names.append("crm::get")
            if "apply_patch" not in names:
                found.append({"type": "custom", "name": "apply_patch"})
                names.append("apply_patch")
            body["input"] = [
                {"role": "user", "content": "Give json please"},
                {"type": "tool_search_call", "call_id": "ts", "arguments": {"query": "crm"}},
                {"type": "tool_search_output", "call_id": "ts", "tools": found},
            ]
        if tools:
            body["tools"] = tools
        if not thinking:
            body["reasoning"] = {"effort": "none"}
        elif rng.random() < 0.3:
            body["reasoning"] = {"effort": rng.choice(["low", "max"])}
        if tools and not thinking and rng.random() < 0.2:
            body["tool_choice"] = "required"
        if rng.random() < 0.15:
            body["text"] = {"format": {"type": "json_object"}}
        if rng.random() < 0.3:
            body.update({"instructions": "ins", "temperature": 0.7, "top_p": 0.3, "user": "u"})
        if rng.random() < 0.2:
            body["max_output_tokens"] = 77
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 99}
        if rng.random() < 0.6:
            body["tools"] = [{"name": "get_w", "input_schema": {"type": "object"}}]
            names.append("get_w")
            if rng.random() < 0.25:
                body["tools"][0]["defer_loading"] = True
                body["tools"].append({"name": "aux", "input_schema": {"type": "object"}})
                names.append("aux")
        if not thinking:
            body["thinking"] = {"type": "disabled"}
        if names and not thinking and rng.random() < 0.2:
            body["tool_choice"] = {"type": "tool", "name": "get_w"}
        if rng.random() < 0.3:
            body["stop_sequences"] = ["END", "STOP"]
    return body, names, thinking


def stream_cases(seed: int, count: int, protocol: str, encode: Any) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        body, names, thinking = _stream_body(rng, protocol)
        v41 = body["model"] == "DeepSeek-V4.1-Flash"
        stops = body.get("stop_sequences", [])
        if "apply_patch" in names and rng.random() < 0.6:
            text = ""
            if thinking:
                text += _text(rng, 4) + "</think>"
            if rng.random() < 0.5:
                text += _text(rng, 3) + "\n\n"
            text += _custom_call(rng, v41)
            if rng.random() < 0.15:
                text = text[: rng.randint(0, len(text))]
        else:
            text = BASE.random_output(rng, thinking, v41, names, stops)
        tokens = rng.random() < 0.25
        if tokens:
            units: list[dict[str, Any]] = [{"tokens": [t]} for t in encode(text)]
            if rng.random() < 0.3 and units:
                units = [{"tokens": [u["tokens"][0] for u in units]}]
        else:
            units = [{"text": t, "count": rng.randint(0, 3)} for t in BASE.split_text(rng, text)]
        case: dict[str, Any] = {
            "kind": "stream",
            "protocol": protocol,
            "body": body,
            "units": units,
            "tokens": tokens,
            "finish": rng.choice(["Stop", "Stop", "Length", "ContentFilter", None]),
            "ready": [rng.randint(0, 50), rng.randint(0, 10), rng.choice([None, "fp_1"])]
            if rng.random() < 0.8
            else None,
        }
        modifiers: list[str] = []
        if protocol == "responses":
            roll = rng.random()
            if roll < 0.15:
                modifiers.append("echo_default")
            elif roll < 0.3:
                modifiers.append("echo_request")
            roll = rng.random()
            if roll < 0.15:
                modifiers.append("namespace_map")
            elif roll < 0.25:
                modifiers.append("namespace_map_empty")
        else:
            if rng.random() < 0.2:
                modifiers.append("signature:sig-" + str(rng.randint(0, 9)))
            if rng.random() < 0.15:
                case["direct"] = rng.choice(["thinking", "plain"])
        case["modifiers"] = modifiers
        cases.append(case)
    return cases
