"""Seeded generators of parity cases: requests (valid and broken) and model outputs.

The cases aim at the places where a re-implementation drifts: message merging
and ordering, system placement, effort and sampling rules, tool markup, JSON
modes, images, validation messages and which of several problems is reported,
tool choices with no tools to choose, assistant messages without content,
string formats in strict schemas, continuations of prefix answers, and markers
split across chunks.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

MODELS = ["DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"]
WORDS = [
    "alpha",
    "beta",
    "Paris",
    "json",
    "日本",
    "naïve",
    "x",
    "😀",
    "<think>",
    "</think>",
    "<｜User｜>",
    "<｜image｜>",
    "｜DSML｜",
    "<｜end▁of▁sentence｜>",
    "a\nb",
    "tab\there",
    'quote"q',
    "back\\slash",
    "",
]
EFFORTS = [None, "none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAIAAAUA"
    "AaJPWgAAAABJRU5ErkJggg=="
)


STRICT_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "array",
                "items": {"type": "object", "properties": {"x": {"type": "string"}}},
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "anyOf": [
                    {"type": "object", "properties": {"y": {"type": "integer"}}},
                    {"type": "string"},
                ],
                "description": "d",
                "title": "t",
            }
        },
    },
    {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A", "description": "d"}},
        "$defs": {"A": {"type": "string"}},
    },
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "description": "top",
        "title": "T",
    },
    {"type": "object"},
    {"properties": {"a": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"type": "object"}}},
    {"type": "object", "properties": {"a": {"type": ["object", "null"]}}},
    {"type": "object", "properties": {"a": {"type": ["string", "null"], "enum": ["x", None]}}},
    {"anyOf": [{"type": "object", "properties": {"q": {"type": "string"}}}]},
    {
        "type": "object",
        "properties": {
            "s": {
                "type": "string",
                "format": "email",
                "pattern": "^a",
                "enum": ["a"],
                "default": "a",
                "minLength": 1,
                "description": "d",
            }
        },
    },
    {"type": "object", "properties": {"s": {"type": "string", "format": "date"}}},
    {
        "type": "object",
        "properties": {
            "n": {
                "type": "number",
                "minimum": 0,
                "maximum": 5,
                "exclusiveMinimum": 1,
                "exclusiveMaximum": 3,
                "multipleOf": 2,
                "default": 1,
                "enum": [1],
                "title": "t",
                "description": "d",
            },
            "i": {"type": "integer", "maximum": 3},
        },
    },
    {
        "type": "object",
        "properties": {
            "b": {"type": "boolean", "default": True},
            "z": {"type": "null"},
            "arr": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
        },
    },
    {"type": "object", "properties": {"arr": {"type": "array"}}},
    {"type": "object", "properties": {"c": {"const": "k"}}},
    {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["b", "a"],
    },
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},
]


def _string_format(value: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "format": value, **extra}


#: Strict schemas around `format`: supported and unsupported names, values that are not names
#: (serde also reads a one-key map as a name), formats in nested and `anyOf` nodes, and formats
#: beside problems the official converter only finds after decoding the whole schema.
FORMAT_SCHEMAS: list[dict[str, Any]] = (
    [
        {"type": "object", "properties": {"s": _string_format(f)}}
        for f in ("uuid", "hostname", "ipv4", "date-time", "uri", "time", "EMAIL", "")
    ]
    + [
        {"type": "object", "properties": {"s": _string_format(f)}}
        for f in (5, 1.5, True, None, ["email"], {}, {"ipv6": None}, {"ipv6": {}}, {"date": None})
    ]
    + [
        {"type": "object", "properties": {"s": _string_format({"email": 5})}},
        {"type": "object", "properties": {"s": _string_format({"email": None, "uuid": None})}},
        {"type": "object", "properties": {"n": {"type": "integer", "format": "date"}}},
        {"type": "object", "properties": {"s": {"type": ["string", "null"], "format": 5}}},
        {
            "type": "object",
            "properties": {"a": {"anyOf": [_string_format("uri"), {"type": "null"}]}},
        },
        {
            "type": "object",
            "properties": {
                "a": {"anyOf": [{"type": "object", "properties": {"b": _string_format("date")}}]}
            },
        },
        {"type": "object", "properties": {"a": {"type": "array", "items": _string_format("ipv5")}}},
        {
            "type": "object",
            "properties": {"o": {"type": "object", "properties": {"s": _string_format("uri")}}},
        },
        {
            "type": "object",
            "properties": {"s": _string_format("date"), "t": {"type": "string"}},
            "required": ["s"],
            "additionalProperties": True,
        },
        {"type": "object", "properties": {"o": {"type": "object"}, "s": _string_format("date")}},
        {"type": "object", "properties": {"s": _string_format("date"), "x": {"description": "d"}}},
        {"type": "object", "properties": {"s": {"description": 5, **_string_format("date")}}},
        {"type": "object", "properties": {"s": _string_format("uuid", pattern=5)}},
        {"type": "object", "properties": {"t": {"type": "wat"}, "s": _string_format("email")}},
        {"type": "string", "format": "date"},
        {
            "type": "object",
            "properties": {"s": _string_format("email", enum=["a@b.c", None], description=None)},
        },
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
        {
            "type": "object",
            "required": ["z"],
            "properties": {
                "o": {
                    "type": "object",
                    "properties": {"a": _string_format("email")},
                    "required": [],
                }
            },
        },
    ]
)


def strict_schema(rng: random.Random) -> dict[str, Any]:
    """A schema for a strict tool or response format; two in five are about `format`."""
    return rng.choice(FORMAT_SCHEMAS if rng.random() < 0.4 else STRICT_SCHEMAS)


def _text(rng: random.Random, n: int = 3) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, n)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        return rng.randint(-1000, 10**6)
    if kind == 1:
        return rng.choice([0.5, -2.25, 1e-7, 3.0, 1e21, 123.456])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return _text(rng, 2)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _tool(rng: random.Random, name: str, strict: bool | None) -> dict[str, Any]:
    props = {
        f"p{i}": {"type": rng.choice(["string", "integer", "boolean"])}
        for i in range(rng.randint(0, 3))
    }
    for prop in props.values():
        if prop["type"] == "string" and rng.random() < 0.2:
            prop["format"] = rng.choice(["date-time", "email", "uri"])
    fn: dict[str, Any] = {"name": name}
    if rng.random() < 0.7:
        fn["description"] = _text(rng, 4)
    if rng.random() < 0.85:
        params: dict[str, Any] = {"type": "object", "properties": props}
        if props and rng.random() < 0.5:
            params["required"] = list(props)[:1]
        fn["parameters"] = params
    if strict is not None:
        fn["strict"] = strict
        if strict and rng.random() < 0.5:
            fn["parameters"] = strict_schema(rng)
    return {"type": "function", "function": fn}


def _arguments(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.1:
        return "not json"
    if roll < 0.15:
        return "[1, 2]"
    if roll < 0.25:
        return "{}"
    obj = {f"a{i}": _value(rng) for i in range(rng.randint(1, 3))}
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5)


def _content(rng: random.Random, allow_images: bool) -> Any:
    if rng.random() < 0.6:
        return _text(rng)
    parts: list[Any] = []
    for _ in range(rng.randint(0, 3)):
        roll = rng.random()
        if roll < 0.6 or not allow_images:
            parts.append({"type": "text", "text": _text(rng)})
        elif roll < 0.8:
            url = PNG if rng.random() < 0.5 else "https://example.com/a.png"
            image: dict[str, Any] = {"url": url}
            if rng.random() < 0.3:
                image["detail"] = rng.choice(["low", "high", "auto"])
            parts.append({"type": "image_url", "image_url": image})
        else:
            parts.append({"type": "file", "file": {"file_id": "f1"}})
    return parts


def _messages(rng: random.Random, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        msgs.append(
            {"role": "system", "content": _content(rng, True) if rng.random() < 0.3 else _text(rng)}
        )
    call_no = 0
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.15:
            msgs.append({"role": "system", "content": _text(rng)})
        msgs.append({"role": "user", "content": _content(rng, True)})
        if rng.random() < 0.2:
            msgs.append({"role": "user", "content": _text(rng)})
        if rng.random() < 0.1:
            msgs.append({"role": "latest_reminder", "content": _text(rng)})
        if rng.random() < 0.35:
            break
        asst: dict[str, Any] = {"role": "assistant"}
        roll = rng.random()
        if roll < 0.65:
            asst["content"] = _text(rng)
        elif roll < 0.9:
            asst["content"] = ""
        elif roll < 0.95:
            asst["content"] = None
        # else: no content at all; valid only with tool calls
        if rng.random() < 0.5:
            asst["reasoning_content"] = _text(rng)
        names = [t["function"]["name"] for t in tools] or ["lookup"]
        ids = []
        if rng.random() < 0.4:
            calls = []
            for _ in range(rng.randint(1, 3)):
                cid = f"call_{call_no}"
                call_no += 1
                ids.append(cid)
                fn = {"name": rng.choice(names), "arguments": _arguments(rng)}
                calls.append({"id": cid, "type": "function", "function": fn})
            asst["tool_calls"] = calls
        msgs.append(asst)
        if ids:
            order = ids[:]
            rng.shuffle(order)
            for cid in order:
                msgs.append({"role": "tool", "tool_call_id": cid, "content": _content(rng, True)})
    if rng.random() < 0.12:
        final: dict[str, Any] = {"role": "assistant", "prefix": True}
        if rng.random() < 0.95:
            final["content"] = prefix_content(rng)
        if rng.random() < 0.5:
            final["reasoning_content"] = _text(rng)
        msgs.append(final)
    return msgs


def prefix_content(rng: random.Random) -> str:
    """The content of a prefix message, often with leading, trailing or repeated newlines."""
    roll = rng.random()
    if roll < 0.3:
        return _text(rng)
    if roll < 0.45:
        return ""
    lead = "\n" * rng.choice([0, 0, 1, 2])
    tail = "\n" * rng.choice([0, 1, 1, 2, 3])
    middle = rng.choice(["", _text(rng), _text(rng) + "\n\n" + _text(rng), "a\nb"])
    return lead + middle + tail


def random_body(rng: random.Random) -> dict[str, Any]:
    """A mostly valid request; about a third of them trip one validation rule."""
    strict = rng.choice([None, None, True])
    tools = [_tool(rng, f"fn_{i}", strict) for i in range(rng.choice([0, 0, 1, 2, 3]))]
    body: dict[str, Any] = {"model": rng.choice(MODELS), "messages": _messages(rng, tools)}
    if not tools and rng.random() < 0.15:
        # Forcing or naming a call with nothing to call means `auto`, even in thinking mode.
        if rng.random() < 0.3:
            body["tools"] = []
        named = {"type": "function", "function": {"name": "f"}}
        body["tool_choice"] = rng.choice(["required", "required", "none", "auto", named])
    if tools:
        body["tools"] = tools
        roll = rng.random()
        if roll < 0.2:
            body["tool_choice"] = "none"
        elif roll < 0.35:
            body["tool_choice"] = "required"
        elif roll < 0.45:
            body["tool_choice"] = {
                "type": "function",
                "function": {"name": tools[-1]["function"]["name"]},
            }
        elif roll < 0.55:
            body["tool_choice"] = "auto"
    roll = rng.random()
    if roll < 0.35:
        body["thinking"] = {"type": "disabled"}
    elif roll < 0.45:
        body["thinking"] = {"type": rng.choice(["enabled", "adaptive"])}
    effort = rng.choice(EFFORTS)
    if effort is not None:
        body["reasoning_effort"] = effort
    roll = rng.random()
    if roll < 0.1:
        body["response_format"] = {"type": "json_object"}
    elif roll < 0.18:
        schema = {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        }
        js: dict[str, Any] = {"name": "out", "schema": schema}
        if rng.random() < 0.5:
            js["strict"] = True
            if rng.random() < 0.5:
                js["schema"] = strict_schema(rng)
        body["response_format"] = {"type": "json_schema", "json_schema": js}
    elif roll < 0.22:
        body["response_format"] = {"type": "regex", "regex": "[a-z]+"}
    elif roll < 0.25:
        body["response_format"] = {"type": "text"}
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0.0, 0.3, 0.7, 1.3, 2.0])
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.1, 0.5, 0.9, 0.97, 1.0])
    if rng.random() < 0.3:
        body["max_tokens"] = rng.choice([1, 100, 4096, 393216])
    if rng.random() < 0.2:
        body["stop"] = rng.choice(["END", ["a", "STOP"], []])
    if rng.random() < 0.1:
        body["seed"] = rng.randint(0, 2**40)
    if rng.random() < 0.1:
        body["stream"] = True
    return body


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


PROBLEMS = _problems()


def broken_body(rng: random.Random) -> dict[str, Any]:
    """A request with one known problem, sometimes two (then the official order decides)."""
    body = {"model": rng.choice(MODELS), "messages": [{"role": "user", "content": "hi json"}]}
    body.update(copy.deepcopy(rng.choice(PROBLEMS)))
    if rng.random() < 0.3:
        _add_problem(body, copy.deepcopy(rng.choice(PROBLEMS)))
    return body


def _add_problem(body: dict[str, Any], problem: dict[str, Any]) -> None:
    """Merge a second problem: message lists and tool lists are joined, other keys replaced."""
    for key, value in problem.items():
        old = body.get(key)
        if key in ("messages", "tools") and isinstance(old, list) and isinstance(value, list):
            body[key] = old + value
        else:
            body[key] = value


def _dsml_block(rng: random.Random, v41: bool, names: list[str]) -> str:
    block, invoke, param = (
        ("calls", " invoke", " parameter") if v41 else ("tool_calls", "invoke", "parameter")
    )
    if v41:
        block = " calls"
    parts = []
    for _ in range(rng.randint(1, 2)):
        params = []
        for i in range(rng.randint(0, 3)):
            value = _value(rng)
            if isinstance(value, str) or rng.random() < 0.1:
                flag = (
                    rng.choice(["true", "true", "true", "maybe"])
                    if rng.random() < 0.95
                    else "false"
                )
                text = value if isinstance(value, str) else str(value)
            else:
                flag, text = "false", json.dumps(value, ensure_ascii=False)
            pname = rng.choice([f"p{i}", "city", "two words", ""])
            params.append(
                f'<｜DSML｜{param} name="{pname}" string="{flag}">{text}</｜DSML｜{param}>'
            )
        inner = "\n".join(params)
        parts.append(f'<｜DSML｜{invoke} name="{rng.choice(names)}">\n{inner}\n</｜DSML｜{invoke}>')
    return f"<｜DSML｜{block}>\n" + "\n".join(parts) + f"\n</｜DSML｜{block}>"


def random_output(
    rng: random.Random, thinking: bool, v41: bool, names: list[str], stops: list[str]
) -> str:
    pieces: list[str] = []
    if rng.random() < 0.3:
        pieces.append("\n" * rng.randint(1, 3))
    if thinking and rng.random() < 0.9:
        pieces.append(_text(rng, 6))
        if rng.random() < 0.85:
            pieces.append("\n" * rng.randint(0, 2) + "</think>")
    if rng.random() < 0.2:
        pieces.append("\n" * rng.randint(1, 2))
    if rng.random() < 0.8:
        pieces.append(_text(rng, 6))
    if rng.random() < 0.15:
        pieces.append(
            rng.choice(["</think>", "<think>", '```json\n{"a": 1}\n```', '{"k": [1]}', "\n```\n"])
        )
    if stops and rng.random() < 0.5:
        pieces.append(rng.choice(stops))
        pieces.append(_text(rng, 2))
    if rng.random() < 0.5:
        pieces.append(
            "\n\n" + _dsml_block(rng, v41 if rng.random() < 0.8 else not v41, names or ["lookup"])
        )
        if rng.random() < 0.2:
            pieces.append(
                rng.choice(
                    ["trailing", "<｜end▁of▁sentence｜>", "\n\n" + _dsml_block(rng, v41, ["x"])]
                )
            )
    text = "".join(pieces)
    if rng.random() < 0.15:
        text = text[: rng.randint(0, len(text))]
    return text


def split_text(rng: random.Random, text: str) -> list[str]:
    mode = rng.random()
    if mode < 0.15:
        return list(text)
    if mode < 0.3:
        return [text] if text else []
    out, i = [], 0
    while i < len(text):
        step = rng.randint(1, 12)
        out.append(text[i : i + step])
        i += step
    return out


def render_cases(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        body = broken_body(rng) if i % 4 == 3 else random_body(rng)
        case: dict[str, Any] = {
            "kind": "render",
            "body": body,
            "resolve": [[100, 200000], [5000, 6000], [7000, 7000]],
        }
        if rng.random() < 0.1:
            case["options"] = {"reject_missing_reasoning": True}
        elif rng.random() < 0.05:
            case["options"] = {"default_thinking_mode": False}
        cases.append(case)
    return cases


def stream_cases(seed: int, count: int, encode: Any) -> list[dict[str, Any]]:
    """`encode(text) -> ids` turns some outputs into token units (the real V4 tokenizer)."""
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        body = random_body(rng)
        body["messages"] = [{"role": "user", "content": "Give json please"}]
        body.pop("response_format", None) if rng.random() < 0.7 else None
        if rng.random() < 0.2:
            _continue_prefix(rng, body)
        thinking = (
            body.get("thinking", {}).get("type") != "disabled"
            and body.get("reasoning_effort") != "none"
        )
        forced = body.get("tool_choice") not in (None, "auto", "none")
        if thinking and forced and body.get("tools"):
            body["tool_choice"] = "auto"
        if thinking and rng.random() < 0.5:
            body["stop"] = ["END"]
        names = [t["function"]["name"] for t in body.get("tools", [])]
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        text = random_output(rng, thinking, body["model"].endswith("4.1-Flash"), names, stops)
        if rng.random() < 0.3:
            units = [{"tokens": [t]} for t in encode(text)]
            if rng.random() < 0.3 and units:
                units = [{"tokens": [u["tokens"][0] for u in units]}]
        else:
            units = [{"text": t, "count": rng.randint(0, 3)} for t in split_text(rng, text)]
        case = {
            "kind": "stream",
            "body": body,
            "units": units,
            "finish": rng.choice(["Stop", "Stop", "Length", "ContentFilter", None]),
            "ready": [rng.randint(0, 50), rng.randint(0, 10), rng.choice([None, "fp_1"])]
            if rng.random() < 0.8
            else None,
        }
        cases.append(case)
    return cases


def _continue_prefix(rng: random.Random, body: dict[str, Any]) -> None:
    """Make the request continue a prefix answer (no tools or JSON mode, which prefix forbids)."""
    final: dict[str, Any] = {"role": "assistant", "content": prefix_content(rng), "prefix": True}
    if rng.random() < 0.4:
        final["reasoning_content"] = rng.choice(["r", "r\n", _text(rng)])
    body["messages"].append(final)
    for key in ("tools", "tool_choice"):
        body.pop(key, None)
    if body.get("response_format", {}).get("type") == "json_object":
        del body["response_format"]


def direct_cases(seed: int, count: int) -> list[dict[str, Any]]:
    """Conversations built directly (no request validation): free role order and fields.

    Every call is answered right after it, as in any valid request; V4 renders partial or
    displaced tool results in a way this package does not reproduce.
    """
    rng = random.Random(seed)
    cases = []
    roles = ["system", "user", "user", "assistant", "assistant", "latest_reminder"]
    for _ in range(count):
        messages: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 7)):
            role = rng.choice(roles)
            spec: dict[str, Any] = {
                "role": role,
                "content": _text(rng) if rng.random() < 0.8 else "",
            }
            if role in ("system", "user") and rng.random() < 0.2:
                spec["content"] += " <｜image｜>"
                spec["images"] = ["http://x/a.png"]
            ids: list[str] = []
            if role == "assistant":
                if rng.random() < 0.5:
                    spec["reasoning_content"] = _text(rng)
                if rng.random() < 0.4:
                    ids = [f"c{len(messages)}_{k}" for k in range(rng.randint(1, 3))]
                    spec["tool_calls"] = [
                        {"id": i, "name": "f", "arguments": _arguments(rng)} for i in ids
                    ]
                elif rng.random() < 0.15:
                    spec["tool_calls"] = []  # neither calls nor (often) content
            messages.append(spec)
            rng.shuffle(ids)
            for call_id in ids:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(rng)})
        if rng.random() < 0.15:
            final: dict[str, Any] = {
                "role": "assistant",
                "content": prefix_content(rng),
                "prefix": True,
            }
            if rng.random() < 0.5:
                final["reasoning_content"] = "r"
            messages.append(final)
        conversation: dict[str, Any] = {"thinking_mode": rng.random() < 0.6}
        if rng.random() < 0.5:
            conversation["tools"] = [
                {"name": "f", "description": "d", "parameters": {"type": "object"}}
            ]
            conversation["tool_choice"] = rng.choice(["auto", "none", "required"])
        if rng.random() < 0.5:
            conversation["reasoning_effort"] = rng.choice(["low", "high", "xhigh", "max"])
        fmt = rng.random()
        if fmt < 0.1:
            conversation["response_format"] = "json_object"
        elif fmt < 0.2:
            conversation["response_schema"] = {"type": "object"}
        cases.append({"kind": "direct", "messages": messages, "conversation": conversation})
    return cases
