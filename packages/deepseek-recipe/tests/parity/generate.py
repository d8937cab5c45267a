"""Seeded generators of parity cases: requests (valid and broken) and model outputs.

The cases aim at the places where a re-implementation drifts: message merging
and ordering, system placement, effort and sampling rules, tool markup, JSON
modes, images, validation messages and which of several problems is reported,
tool choices with no tools to choose, assistant messages without content,
string formats in strict schemas, continuations of prefix answers, and markers
split across chunks.
"""

from __future__ import annotations

import json
import random
import runpy
from pathlib import Path
from typing import Any

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
SCHEMAS = load("schemas")
BROKEN = load("problems")

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
            fn["parameters"] = SCHEMAS.strict_schema(rng)
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
                js["schema"] = SCHEMAS.strict_schema(rng)
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


def broken_body(rng: random.Random) -> dict[str, Any]:
    """A request with one known problem, sometimes two (then the official order decides).

    A second problem adds its messages and tools to the first one's.
    """
    body = {"model": rng.choice(MODELS), "messages": [{"role": "user", "content": "hi json"}]}
    body = BROKEN.merge(body, rng.choice(BROKEN.PROBLEMS))
    if rng.random() < 0.3:
        body = BROKEN.merge(body, rng.choice(BROKEN.PROBLEMS), joined=("messages", "tools"))
    return body


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
