"""The Jinja2 chat template must render exactly the prompt the encoder renders.

The encoder (`render_conversation` over `ChatCompletionRequest(...).convert`) is
checked against the official package elsewhere, so it is the reference here.
Templates are rendered the way Hugging Face renders them (an immutable sandbox
with trim_blocks/lstrip_blocks and its own `tojson`), over golden cases and over
seeded conversations with text, multi-turn history, reasoning, tools, tool
results, response formats and prefix completion for both models.  Where the
template cannot express an input it must refuse with `raise_exception`; where
the encoder rejects a request the template must reject it too.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import deepseek_recipe as dr
from deepseek_recipe import template as tpl

jinja2 = pytest.importorskip("jinja2", minversion="3.1")
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

V4 = "DeepSeek-V4-Pro"
V41 = "DeepSeek-V4.1-Flash"
TEMPLATE_MODEL = {V4: "DeepSeek-V4-Flash", V41: "DeepSeek-V4.1-Flash"}
#: Request fields the template takes as keyword arguments.
KWARGS = ("tools", "thinking", "reasoning_effort", "tool_choice", "response_format")
GOLDEN = json.loads(
    (Path(__file__).parent / "data" / "recipe_golden.json").read_text(encoding="utf-8")
)
ARGUMENTS_REFUSAL = "Tool-call arguments must be passed as an object"


# ----------------------------------------------------------------------------- rendering


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _hf_tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def hf_environment(*, trim: bool = True) -> ImmutableSandboxedEnvironment:
    """An environment set up like transformers' chat-template renderer."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=trim, lstrip_blocks=trim, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _hf_tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_ENV = hf_environment()
_TEMPLATES = {
    model: _ENV.from_string(tpl.chat_template(name)) for model, name in TEMPLATE_MODEL.items()
}


def render_template(model: str, messages: Any, generation: bool = True, **kwargs: Any) -> str:
    return _TEMPLATES[model].render(messages=messages, add_generation_prompt=generation, **kwargs)


def render_encoder(body: dict[str, Any]) -> str:
    request = dr.ChatCompletionRequest(copy.deepcopy(body)).convert(dr.ConversionOptions())
    encoding = (
        dr.DeepseekV41Encoding()
        if request.model_version is dr.ModelVersion.DeepseekV41Flash
        else dr.DeepseekV4Encoding()
    )
    return encoding.render_conversation(request.conversation).prompt


def _no_constants(_: str) -> Any:
    raise ValueError("non-standard JSON constant")


def hf_messages(messages: list[Any], keep_text: Callable[[int], bool] = lambda _: False) -> Any:
    """Chat Completions messages as a chat template receives them: arguments as objects.

    `keep_text(n)` leaves the n-th call's arguments as JSON text.
    """
    out = copy.deepcopy(messages)
    n = 0
    for message in out:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
                continue
            try:
                value = json.loads(fn["arguments"], parse_constant=_no_constants)
            except ValueError:
                value = None
            if isinstance(value, dict) and not keep_text(n):
                fn["arguments"] = value
            n += 1
    return out


def _text_arguments_may_be_object(messages: Any) -> bool:
    for message in messages:
        for call in message.get("tool_calls") or []:
            args = call["function"]["arguments"]
            if isinstance(args, str) and args.lstrip(" \t\n\r").startswith("{"):
                return True
    return False


def check_case(
    body: dict[str, Any], keep_text: Callable[[int], bool] = lambda _: False
) -> tuple[str, str]:
    """Compare template and encoder on one request; return the outcome and the prompt."""
    messages = hf_messages(body["messages"], keep_text)
    kwargs = {k: copy.deepcopy(body[k]) for k in KWARGS if k in body}
    try:
        expected = render_encoder(body)
    except (dr.ConversionError, ValueError):
        with pytest.raises(jinja2.exceptions.TemplateError):
            render_template(body["model"], messages, **kwargs)
        return "rejected", ""
    if _text_arguments_may_be_object(messages):
        with pytest.raises(jinja2.exceptions.TemplateError, match=ARGUMENTS_REFUSAL):
            render_template(body["model"], messages, **kwargs)
        return "refused", ""
    got = render_template(body["model"], messages, **kwargs)
    assert got == expected, json.dumps(body, ensure_ascii=False)
    last = body["messages"][-1]
    if not (last.get("role") == "assistant" and last.get("prefix")):
        # Without the generation prompt only the assistant opener (and a required block) go.
        without = render_template(body["model"], messages, generation=False, **kwargs)
        assert got.startswith(without)
        assert got[len(without) :] in GENERATION_SUFFIXES[body["model"]]
    return "rendered", got


GENERATION_SUFFIXES = {
    model: {
        "<｜Assistant｜><think>",
        "<｜Assistant｜></think>",
        f"<｜Assistant｜></think>\n\n<｜DSML｜{block}>\n",
    }
    for model, block in ((V4, "tool_calls"), (V41, " calls"))
}


# ------------------------------------------------------------------------ golden vectors

GOLDEN_CASES = [(c["name"], key, c) for c in GOLDEN["render_cases"] for key in c["by_model"]]


@pytest.mark.parametrize(
    ("name", "key", "case"), GOLDEN_CASES, ids=[f"{n}-{k}" for n, k, _ in GOLDEN_CASES]
)
def test_golden_prompts(name: str, key: str, case: dict[str, Any]) -> None:
    """Prompts of the official package (golden file) come out of the template unchanged."""
    model = V4 if key == "v4" else V41
    expected = case["by_model"][key]
    request = case["request"]
    messages = hf_messages(request["messages"])
    kwargs = {k: request[k] for k in KWARGS if k in request}
    if "error" in expected:
        with pytest.raises(jinja2.exceptions.TemplateError):
            render_template(model, messages, **kwargs)
        return
    assert render_template(model, messages, **kwargs) == expected["prompt"]


# ------------------------------------------------------------------- seeded conversations

WORDS = [
    "hello",
    "json",
    "Paris",
    "日本語",
    "naïve",
    "😀",
    'say "hi"',
    "back\\slash",
    "two\nlines",
    "tab\there",
    "{braces}",
    "<think>",
    "｜DSML｜",
    "<｜User｜>",
    "\u2028",
]
FLOATS = [0.5, -2.25, 1e-05, 1.5e-05, 1e-07, -3e-06, 0.0001, 3.0, 1e16, 1e21, 123.456, -0.0]
EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"]
DATA_URL = "data:image/png;base64,iVBORw0KGgo="
STRICT_PARAMETERS: list[Any] = [
    {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}},
    {
        "type": "object",
        "properties": {
            "n": {"type": "number", "minimum": 0.5, "maximum": 1e-05, "title": "dropped"},
            "tags": {"type": "array", "items": {"type": "string", "format": "email"}},
            "mode": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "m"},
            "ref": {"$ref": "#/$defs/R"},
            "either": {"type": ["string", "null"], "enum": ["a", None]},
        },
        "required": ["tags", "n", "mode", "ref", "either"],
        "description": "top",
    },
    {"type": "object"},
    None,
    {"type": "object", "properties": {"o": {"type": "object"}}},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},
    {"type": "object", "properties": {"s": {"type": "string", "format": "date"}}},
    {"type": "object", "properties": {"a": {"type": "array"}}},
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    {"type": "object", "properties": {"c": {"const": 1}}},
]


class Generator:
    """Random Chat Completions requests that exercise every rendering rule."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.call_no = 0

    def text(self, n: int = 3) -> str:
        rng = self.rng
        if rng.random() < 0.08:
            return ""
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, n)))

    def value(self, depth: int = 0) -> Any:
        kind = self.rng.randrange(8 if depth < 2 else 5)
        if kind == 0:
            return self.rng.choice([0, -7, 42, 10**20])
        if kind == 1:
            return self.rng.choice(FLOATS)
        if kind == 2:
            return self.rng.choice([True, False, None])
        if kind in (3, 4):
            return self.text(2)
        if kind == 5:
            return [self.value(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {f"k{i}": self.value(depth + 1) for i in range(self.rng.randint(0, 3))}

    def content(self, images: bool = True) -> Any:
        rng = self.rng
        if rng.random() < 0.65:
            return self.text()
        parts: list[dict[str, Any]] = []
        for _ in range(rng.randint(0, 3)):
            roll = rng.random()
            if roll < 0.7 or not images:
                parts.append({"type": "text", "text": self.text()})
            elif roll < 0.97:
                image: dict[str, Any] = {"url": DATA_URL if roll < 0.85 else "https://x/a.png"}
                if rng.random() < 0.3:
                    image["detail"] = rng.choice(["low", "high", "auto", "original"])
                parts.append({"type": "image_url", "image_url": image})
            else:
                parts.append({"type": "file", "file": {"file_id": "f"}})
        return parts

    def tool(self, name: str, strict: bool | None) -> dict[str, Any]:
        rng = self.rng
        fn: dict[str, Any] = {"name": name}
        roll = rng.random()
        if roll < 0.6:
            fn["description"] = self.text(4)
        elif roll < 0.7:
            fn["description"] = None
        roll = rng.random()
        if roll < 0.7:
            props = {
                f"p{i}": {"type": rng.choice(["string", "integer", "number", "boolean"])}
                for i in range(rng.randint(0, 3))
            }
            params: dict[str, Any] = {"type": "object", "properties": props}
            if props and rng.random() < 0.5:
                params["required"] = list(props)[:1]
            if rng.random() < 0.3:
                params["x-default"] = self.value()
            fn["parameters"] = params
        elif roll < 0.8:
            fn["parameters"] = rng.choice([None, {}, True])
        if strict is not None:
            fn["strict"] = strict
            if strict and rng.random() < 0.6:
                fn["parameters"] = copy.deepcopy(rng.choice(STRICT_PARAMETERS))
        return {"type": "function", "function": fn}

    def arguments(self) -> str:
        roll = self.rng.random()
        if roll < 0.05:
            return "not json"
        if roll < 0.08:
            return "[1, 2]"
        if roll < 0.1:
            return ""
        if roll < 0.12:
            return '"just a string"'
        if roll < 0.14:
            return '{"broken": '
        if roll < 0.16:
            return '{"x": NaN}'
        if roll < 0.25:
            return "{}"
        obj = {f"a{i}": self.value() for i in range(self.rng.randint(1, 3))}
        return json.dumps(obj, ensure_ascii=self.rng.random() < 0.5)

    def assistant(self, names: list[str]) -> dict[str, Any]:
        """An assistant turn; tool calls only when `names` offers tools to call."""
        rng = self.rng
        message: dict[str, Any] = {"role": "assistant"}
        calling = bool(names) and rng.random() < 0.45
        roll = rng.random()
        if roll < 0.7:
            message["content"] = self.text()
        elif roll < 0.8:
            message["content"] = [{"type": "text", "text": self.text()}]
        elif roll < 0.9 and (calling or rng.random() < 0.2):
            # Without tool calls a message needs content; now and then one lacks both.
            message["content"] = None
        elif not calling and rng.random() < 0.8:
            message["content"] = ""
        if rng.random() < 0.6:
            message["reasoning_content"] = self.text()
        if calling:
            calls = []
            for _ in range(rng.randint(1, 3)):
                self.call_no += 1
                fn = {"name": rng.choice(names), "arguments": self.arguments()}
                calls.append({"id": f"call_{self.call_no}", "type": "function", "function": fn})
            message["tool_calls"] = calls
        return message

    def messages(self, names: list[str]) -> list[dict[str, Any]]:
        rng = self.rng
        out: list[dict[str, Any]] = []
        if rng.random() < 0.55:
            out.append({"role": "system", "content": self.content()})
        if rng.random() < 0.05:
            out.append(self.assistant([]))
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.15:
                out.append({"role": "system", "content": self.text()})
            out.append({"role": "user", "content": self.content()})
            if rng.random() < 0.2:
                out.append({"role": "user", "content": self.content()})
            for _ in range(rng.choice([0, 0, 0, 0, 1, 2])):
                out.append({"role": "latest_reminder", "content": self.text()})
            if rng.random() < 0.3:
                break
            assistant = self.assistant(names)
            out.append(assistant)
            ids = [c["id"] for c in assistant.get("tool_calls") or []]
            rng.shuffle(ids)
            for call_id in ids:
                out.append({"role": "tool", "tool_call_id": call_id, "content": self.content()})
            if ids and rng.random() < 0.3:
                out.append({"role": "user", "content": self.content()})
        roll = rng.random()
        if roll < 0.12:
            final: dict[str, Any] = {"role": "assistant", "content": self.text(), "prefix": True}
            if rng.random() < 0.5:
                final["reasoning_content"] = self.text()
            out.append(final)
        elif roll < 0.2:
            out.append({"role": "assistant", "content": self.text()})
        return out

    def body(self, model: str) -> dict[str, Any]:
        rng = self.rng
        strict = rng.choice([None, None, None, False, True])
        tools = [self.tool(f"fn_{i}", strict) for i in range(rng.choice([0, 0, 1, 2, 3]))]
        names = [t["function"]["name"] for t in tools] or ["lookup"]
        body: dict[str, Any] = {"model": model, "messages": self.messages(names)}
        if tools or rng.random() < 0.05:
            body["tools"] = tools
        roll = rng.random()
        if roll < 0.12:
            body["tool_choice"] = "none"
        elif roll < 0.22:
            body["tool_choice"] = "required"
        elif roll < 0.3:
            name = rng.choice([*names, "missing"])
            body["tool_choice"] = {"type": "function", "function": {"name": name}}
        elif roll < 0.4:
            body["tool_choice"] = "auto"
        roll = rng.random()
        # Mostly consistent requests: forced tool calls need thinking off (else rejected).
        if roll < 0.4 or ("tool_choice" in body and body["tool_choice"] not in ("none", "auto")):
            if roll < 0.9:
                body["thinking"] = {"type": "disabled"}
        elif roll < 0.5:
            body["thinking"] = {"type": rng.choice(["enabled", "adaptive"])}
        if rng.random() < 0.5:
            body["reasoning_effort"] = rng.choice(EFFORTS)
        last = body["messages"][-1]
        calls = any("tool_calls" in m for m in body["messages"])
        # Prefix completion excludes tools (rejected); keep a few to check that.
        if last.get("prefix") and (tools or calls) and rng.random() < 0.8:
            del last["prefix"]
        roll = rng.random()
        if roll < 0.1:
            body["response_format"] = {"type": "json_object"}
            if rng.random() < 0.8:
                body["messages"].insert(0, {"role": "user", "content": "Reply in JSON."})
        elif roll < 0.2:
            schema = {"type": "object", "properties": {"a": {"type": "number", "minimum": 1e-05}}}
            js: dict[str, Any] = {"name": "out", "schema": schema}
            if rng.random() < 0.4:
                js["strict"] = True
                if rng.random() < 0.5:
                    js["schema"] = copy.deepcopy(rng.choice(STRICT_PARAMETERS))
            body["response_format"] = {"type": "json_schema", "json_schema": js}
        elif roll < 0.24:
            body["response_format"] = {"type": "regex", "regex": "[a-z]+"}
        elif roll < 0.28:
            body["response_format"] = {"type": "text"}
        return body


SEEDS = range(12)
CASES_PER_SEED = 40


@functools.cache
def run_seed(model: str, seed: int) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """Check one seed's requests; return (outcome, prompt, request) for each."""
    gen = Generator(seed * 2 + (model == V41))
    results = []
    for _ in range(CASES_PER_SEED):
        body = gen.body(model)
        keep = gen.rng.random() < 0.15
        kind, prompt = check_case(body, keep_text=lambda i, keep=keep: keep and i == 0)
        results.append((kind, prompt, body))
    return tuple(results)


@pytest.mark.parametrize("model", [V4, V41])
@pytest.mark.parametrize("seed", SEEDS)
def test_generated_conversations(model: str, seed: int) -> None:
    """Seeded requests: the template renders the encoder's prompt, or both reject it."""
    kinds = [kind for kind, _, _ in run_seed(model, seed)]
    # The generator must keep producing mostly renderable conversations.
    assert kinds.count("rendered") >= CASES_PER_SEED // 2, kinds


def test_generated_conversations_cover_every_feature() -> None:
    """The seeded cases reach each rendering rule (and each refusal) several times."""
    features = dict.fromkeys(
        [
            "tool results",
            "kept reasoning",
            "dropped reasoning",
            "v41 mid system",
            "v4 hoisted system",
            "image placeholder",
            "prefix",
            "required block",
            "json_schema",
            "json_object",
            "strict tool",
            "reminder",
            "refused",
            "rejected",
        ],
        0,
    )
    for model in (V4, V41):
        for seed in SEEDS:
            for kind, out, body in run_seed(model, seed):
                if kind != "rendered":
                    features[kind] += 1
                    continue
                roles = [m["role"] for m in body["messages"]]
                history = out[: out.rfind("<｜Assistant｜>")]
                prefix = bool(body["messages"][-1].get("prefix"))
                features["tool results"] += "<tool_result>" in out
                features["kept reasoning"] += not prefix and "<｜Assistant｜><think>" in history
                features["dropped reasoning"] += (
                    out.endswith("<think>") and "<｜Assistant｜></think>" in history
                )
                features["v41 mid system"] += model == V41 and out.count("<｜System｜>") > 1
                features["v4 hoisted system"] += model == V4 and "system" in roles[1:]
                image = "<｜image｜>" if model == V41 else "[Unsupported Image]"
                features["image placeholder"] += image in out
                features["prefix"] += prefix
                features["required block"] += out.endswith(">\n")
                features["json_schema"] += "schema to reply:\n{" in out
                features["json_object"] += "json_object" in out or "JSON object ONLY" in out
                features["strict tool"] += '"additionalProperties": false' in out
                features["reminder"] += "<｜latest_reminder｜>" in out
    assert min(features.values()) >= 5, features


# ------------------------------------------------------------------------- focused cases


def _body(model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **extra}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
TOOL_ROUND = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two calls.",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "b", "content": '{"temp": 25}'},
    {"role": "tool", "tool_call_id": "a", "content": '{"temp": 21}'},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("model", [V4, V41])
@pytest.mark.parametrize(
    ("label", "messages", "extra"),
    [
        ("text", [{"role": "user", "content": "Hello"}], {"thinking": {"type": "disabled"}}),
        (
            "multi-turn reasoning dropped",
            [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
                {"role": "user", "content": "Q2"},
            ],
            {"reasoning_effort": "low"},
        ),
        ("tools, reasoning kept, results reordered", TOOL_ROUND, {"tools": [WEATHER]}),
        (
            "tools declared but none: reasoning dropped",
            TOOL_ROUND,
            {"tools": [WEATHER], "tool_choice": "none"},
        ),
        ("no tools declared: reasoning dropped", TOOL_ROUND, {}),
        (
            "named tool choice",
            [{"role": "user", "content": "go"}],
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "thinking": {"type": "disabled"},
            },
        ),
        (
            "system placement",
            [
                {"role": "system", "content": "S1"},
                {"role": "user", "content": "U1"},
                {"role": "assistant", "content": "A1"},
                {"role": "system", "content": "S2"},
                {"role": "user", "content": "U2"},
                {"role": "system", "content": ""},
                {"role": "user", "content": "U3"},
            ],
            {"reasoning_effort": "max"},
        ),
        (
            "opening assistant with prefix",
            [{"role": "assistant", "content": "", "reasoning_content": "r", "prefix": True}],
            {},
        ),
        (
            "json_schema with small floats",
            [{"role": "user", "content": "numbers"}],
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "n",
                        "schema": {"type": "number", "enum": FLOATS, "multipleOf": 5e-324},
                    },
                }
            },
        ),
    ],
)
def test_focused_cases(model: str, label: str, messages: list[Any], extra: dict[str, Any]) -> None:
    assert check_case(_body(model, messages, **extra))[0] == "rendered", label


def test_tool_results_follow_call_order() -> None:
    out = render_template(V4, hf_messages(TOOL_ROUND), tools=[WEATHER])
    assert out.index('{"temp": 21}') < out.index('{"temp": 25}')
    assert "<think>Two calls.</think>" in out


def test_thinking_keyword_forms() -> None:
    """`thinking` accepts the request object, its type string, or a boolean."""
    messages = [{"role": "user", "content": "hi"}]
    for model in (V4, V41):
        off = render_encoder(_body(model, messages, thinking={"type": "disabled"}))
        on = render_encoder(_body(model, messages))
        for value in ({"type": "disabled"}, "disabled", False):
            assert render_template(model, messages, thinking=value) == off
        for value in ({"type": "enabled"}, "adaptive", True, None):
            assert render_template(model, messages, thinking=value) == on
        assert render_template(model, messages, reasoning_effort="none") == off
        assert render_template(model, messages, thinking=True, reasoning_effort="none") == on


@pytest.mark.parametrize("model", [V4, V41])
def test_json_values_match_encoder(model: str) -> None:
    """Escapes, Unicode and each model's float style in schemas and call arguments."""
    controls = "".join(chr(c) for c in range(32)) + "\"\\\x7f\u2028é😀<>&'"
    numbers = [*FLOATS, 5e-324, 1.7976931348623157e308, 2.5e-05, 9.999e-06, 1e-4, 12345678.9]
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": controls,
            "parameters": {"type": "object", "default": numbers, controls: [controls, 10**30]},
        },
    }
    arguments = json.dumps({controls: numbers, "s": controls, "n": None, "o": {"x": [True]}})
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    assert check_case(_body(model, messages, tools=[tool]))[0] == "rendered"


def test_strict_tool_schema_is_normalized() -> None:
    tool = {
        "type": "function",
        "function": {"name": "f", "strict": True, "parameters": STRICT_PARAMETERS[1]},
    }
    body = _body(V4, [{"role": "user", "content": "q"}], tools=[tool])
    assert check_case(body)[0] == "rendered"
    out = render_template(V4, body["messages"], tools=[tool])
    assert '"additionalProperties": false' in out and "dropped" not in out


# ---------------------------------------------------------------------------- refusals


def test_refuses_arguments_given_as_json_object_text() -> None:
    """A template cannot parse JSON: object-like argument text is refused, not guessed."""
    messages = copy.deepcopy(TOOL_ROUND[:5])
    for model in (V4, V41):
        for text in ('{"city": "Paris"}', ' \n{"city": ', "{not json"):
            messages[2]["tool_calls"][0]["function"]["arguments"] = text
            body = _body(model, messages, tools=[WEATHER])
            assert check_case(body, keep_text=lambda i: i == 0)[0] == "refused"
        # Text that cannot be an object renders like the encoder (one raw `arguments` value).
        for text in ("not json", "[1, 2]", "", "42", '"s"', "null"):
            messages[2]["tool_calls"][0]["function"]["arguments"] = text
            assert check_case(_body(model, messages, tools=[WEATHER]))[0] == "rendered"


def test_refuses_non_finite_numbers() -> None:
    messages = [{"role": "user", "content": "q"}]
    parameters = {"type": "object", "default": math.nan}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(jinja2.exceptions.TemplateError, match="Non-finite"):
        render_template(V4, messages, tools=[tool])


REJECTED: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("empty messages", [], {}),
    ("developer role", [{"role": "developer", "content": "x"}], {}),
    ("missing content", [{"role": "user"}], {}),
    ("content type", [{"role": "user", "content": 5}], {}),
    ("part type", [{"role": "user", "content": [{"type": "audio"}]}], {}),
    ("text part", [{"role": "user", "content": [{"type": "text"}]}], {}),
    ("image part", [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}], {}),
    ("orphan tool", [{"role": "tool", "tool_call_id": "a", "content": "x"}], {}),
    (
        "reminder parts",
        [{"role": "latest_reminder", "content": [{"type": "text", "text": "a"}]}],
        {},
    ),
    (
        "unanswered call",
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}],
            },
            {"role": "user", "content": "q"},
        ],
        {},
    ),
    (
        "wrong call id",
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}],
            },
            {"role": "tool", "tool_call_id": "b", "content": "r"},
        ],
        {},
    ),
    (
        "duplicate call ids",
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "function": {"name": "f", "arguments": {}}},
                    {"id": "a", "function": {"name": "f", "arguments": {}}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "r"},
        ],
        {},
    ),
    (
        "empty tool_calls",
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": []}],
        {},
    ),
    (
        "prefix not last",
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "prefix": True},
            {"role": "user", "content": "b"},
        ],
        {},
    ),
    (
        "prefix with tools",
        [{"role": "assistant", "content": "a", "prefix": True}],
        {"tools": [WEATHER]},
    ),
    ("bad effort", [{"role": "user", "content": "q"}], {"reasoning_effort": "huge"}),
    ("bad thinking", [{"role": "user", "content": "q"}], {"thinking": {"type": "auto"}}),
    (
        "required while thinking",
        [{"role": "user", "content": "q"}],
        {"tools": [WEATHER], "tool_choice": "required"},
    ),
    (
        "unknown named tool",
        [{"role": "user", "content": "q"}],
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
            "thinking": {"type": "disabled"},
        },
    ),
    (
        "bad tool_choice",
        [{"role": "user", "content": "q"}],
        {"tools": [WEATHER], "tool_choice": "sometimes"},
    ),
    ("duplicate tools", [{"role": "user", "content": "q"}], {"tools": [WEATHER, WEATHER]}),
    (
        "tool name pattern",
        [{"role": "user", "content": "q"}],
        {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
    ),
    (
        "tool parameters type",
        [{"role": "user", "content": "q"}],
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
            ]
        },
    ),
    (
        "strict mixed with non-strict",
        [{"role": "user", "content": "q"}],
        {"tools": [{"type": "function", "function": {"name": "f", "strict": True}}, WEATHER]},
    ),
    (
        "strict tool with response_format",
        [{"role": "user", "content": "q json"}],
        {
            "tools": [{"type": "function", "function": {"name": "f", "strict": True}}],
            "response_format": {"type": "text"},
        },
    ),
    (
        "json_object without json",
        [{"role": "user", "content": "hi"}],
        {"response_format": {"type": "json_object"}},
    ),
    (
        "unknown response_format",
        [{"role": "user", "content": "q"}],
        {"response_format": {"type": "xml"}},
    ),
    (
        "strict schema without type",
        [{"role": "user", "content": "q"}],
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "strict": True, "schema": {"properties": {}}},
            }
        },
    ),
]


def test_only_empty_system_messages_render_like_the_encoder() -> None:
    """Nothing but empty system messages: the official package still renders a prompt (the
    V4.1 one is ``<BOS><Assistant><think>``, taken from the official wheel)."""
    for model in (V4, V41):
        for messages in (
            [{"role": "system", "content": ""}],
            [{"role": "system", "content": ""}] * 2,
        ):
            outcome, prompt = check_case({"model": model, "messages": messages})
            assert outcome == "rendered"
            if model == V41:
                assert prompt == "<｜begin▁of▁sentence｜><｜Assistant｜><think>"


@pytest.mark.parametrize("model", [V4, V41])
@pytest.mark.parametrize(("label", "messages", "extra"), REJECTED, ids=[r[0] for r in REJECTED])
def test_rejects_what_the_encoder_rejects(
    model: str, label: str, messages: list[Any], extra: dict[str, Any]
) -> None:
    body = _body(model, messages, **extra)
    encoder_body = copy.deepcopy(body)
    for message in encoder_body["messages"]:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls or []:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    with pytest.raises((dr.ConversionError, ValueError)):
        render_encoder(encoder_body)
    with pytest.raises(jinja2.exceptions.TemplateError):
        render_template(model, messages, **extra)


def test_v41_rejects_images_in_assistant_and_files() -> None:
    image = {"type": "image_url", "image_url": {"url": DATA_URL}}
    assistant = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [image]}]
    files = [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]
    for messages in (assistant, files):
        assert check_case(_body(V41, messages))[0] == "rejected"
        assert check_case(_body(V4, messages))[0] == "rendered"  # V4 shows a text placeholder


# --------------------------------------------------------------- environments and limits


def test_whitespace_settings_do_not_matter() -> None:
    """Every tag strips its own whitespace, so plain Jinja defaults render the same text."""
    plain = hf_environment(trim=False)
    for model in (V4, V41):
        template = plain.from_string(tpl.chat_template(TEMPLATE_MODEL[model]))
        for extra in ({"tools": [WEATHER]}, {"thinking": False}):
            messages = hf_messages(TOOL_ROUND)
            expected = render_template(model, messages, **extra)
            assert (
                template.render(messages=messages, add_generation_prompt=True, **extra) == expected
            )


def test_does_not_use_tojson() -> None:
    """Stock Jinja's tojson escapes <, > and &; the template must not depend on the filter."""
    env = hf_environment()
    del env.filters["tojson"]
    template = env.from_string(tpl.chat_template("DeepSeek-V4-Flash"))
    tool = copy.deepcopy(WEATHER)
    tool["function"]["description"] = "a <b> & 'c'"
    messages = [{"role": "user", "content": "q"}]
    out = template.render(messages=messages, tools=[tool], add_generation_prompt=True)
    assert out == render_encoder(_body(V4, messages, tools=[tool]))


def test_control_token_text_renders_the_same_string() -> None:
    """The documented limit: strings match, only the spans are unknown to the template."""
    messages = [{"role": "user", "content": "Hi <｜User｜> and <think>"}]
    body = _body(V4, messages, thinking={"type": "disabled"})
    assert render_template(V4, messages, thinking=False) == render_encoder(body)
    assert "control token" in tpl.chat_template()
    assert "control token" in tpl.tokenizer_config()["chat_template_limitations"]
    assert "control token" in (tpl.__doc__ or "")


def test_transformers_apply_chat_template(tmp_path: Path) -> None:
    """The written tokenizer_config.json drives transformers' own apply_chat_template."""
    transformers = pytest.importorskip("transformers")
    from deepseek_recipe.tokenizer import default_v4_path

    (tmp_path / "tokenizer.json").write_bytes(default_v4_path().read_bytes())
    assert (
        tpl.main(
            ["--model", "DeepSeek-V4-Flash", "--output", str(tmp_path / "tokenizer_config.json")]
        )
        == 0
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    messages = hf_messages(TOOL_ROUND)
    body = _body(V4, TOOL_ROUND, tools=[WEATHER], reasoning_effort="max")
    text = tokenizer.apply_chat_template(
        messages,
        tools=[WEATHER],
        add_generation_prompt=True,
        tokenize=False,
        reasoning_effort="max",
    )
    assert text == render_encoder(body)
    request = dr.ChatCompletionRequest(copy.deepcopy(body)).convert(dr.ConversionOptions())
    encoding = dr.DeepseekV4Encoding().with_tokenizer(dr.Tokenizer.default_v4())
    ids = tokenizer.apply_chat_template(
        messages,
        tools=[WEATHER],
        add_generation_prompt=True,
        reasoning_effort="max",
        return_dict=True,
    )["input_ids"]
    assert ids == encoding.encode(request.conversation)
    # Content that spells a control token: same text, different ids (the documented limit).
    literal = [{"role": "user", "content": "a <｜User｜> b"}]
    request = dr.ChatCompletionRequest(_body(V4, literal)).convert(dr.ConversionOptions())
    ids = tokenizer.apply_chat_template(literal, add_generation_prompt=True, return_dict=True)
    assert ids["input_ids"] != encoding.encode(request.conversation)
    assert tokenizer.decode(ids["input_ids"]) == render_encoder(_body(V4, literal))


# ------------------------------------------------------------------------------- the CLI


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert tpl.main([]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["chat_template"] == tpl.chat_template("DeepSeek-V4-Flash")
    assert config["bos_token"] == "<｜begin▁of▁sentence｜>"
    assert config["eos_token"] == "<｜end▁of▁sentence｜>"
    assert config["chat_template_model"] == "DeepSeek-V4-Flash"
    assert config["add_bos_token"] is False


def test_cli_writes_v41_file(tmp_path: Path) -> None:
    out = tmp_path / "tokenizer_config.json"
    assert tpl.main(["--model", "DeepSeek-V4.1-Flash", "--output", str(out)]) == 0
    config = json.loads(out.read_text(encoding="utf-8"))
    assert config["chat_template"] == tpl.chat_template("DeepSeek-V4.1-Flash")
    assert config["chat_template"] != tpl.chat_template("DeepSeek-V4-Pro")
    assert config["chat_template_model"] == "DeepSeek-V4.1-Flash"


def test_cli_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        tpl.main(["--model", "gpt-4o"])
    assert info.value.code == 2
    assert "invalid choice: 'gpt-4o'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        tpl.main(["--output"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        tpl.main(["--output", str(tmp_path / "missing" / "x.json")])
    assert info.value.code == 1
    assert "cannot write" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown model"):
        tpl.chat_template("DeepSeek-V3")


def test_module_entry_point() -> None:
    """`python -m deepseek_recipe.template` works and never imports Jinja2 (not a dependency)."""
    done = subprocess.run(
        [sys.executable, "-m", "deepseek_recipe.template", "--model", "DeepSeek-V4.1-Flash"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=True,
    )
    assert json.loads(done.stdout)["chat_template"] == tpl.chat_template("DeepSeek-V4.1-Flash")
    script = (
        "import sys, io, contextlib\n"
        "from deepseek_recipe import template\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    template.main([])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'jinja2'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
