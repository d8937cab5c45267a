"""API probes run on both packages by oracle_dump.py: direct construction, options and errors.

Each probe takes the imported `deepseek_recipe` module and returns JSON-able
values; exceptions are recorded by type and message by the caller.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

BODY = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "q"}]}


def _processor(dr: Any, tokenizer: Any = None, body: dict[str, Any] | None = None) -> Any:
    request = dr.ChatCompletionRequest(dict(body or BODY)).convert(dr.ConversionOptions())
    generator = dr.ChatCompletionRequest.chunk_generator(request, "id", "m")
    return dr.StreamProcessor(generator, request.parsing_options, tokenizer)


def _render(dr: Any, conversation: Any, tokens: Any = None) -> list[Any]:
    out = []
    for base in (dr.DeepseekV4Encoding(), dr.DeepseekV41Encoding()):
        encoding = base if tokens is None else base.with_special_tokens(tokens)
        rendered = encoding.render_conversation(conversation)
        out.append(
            [
                rendered.prompt,
                [list(r) for r in rendered.special_ranges],
                len(rendered.image_sources),
            ]
        )
    return out


def tokens_without_tokenizer(dr: Any, tok: Any) -> Any:
    return _processor(dr).push(dr.InferenceChunk.tokens([1]))


def push_after_tokens_error(dr: Any, tok: Any) -> Any:
    processor = _processor(dr)
    with contextlib.suppress(RuntimeError):
        processor.push(dr.InferenceChunk.tokens([1]))
    return processor.push(dr.InferenceChunk.text("x"))


def push_after_close(dr: Any, tok: Any) -> Any:
    processor = _processor(dr)
    processor.close()
    return [processor.finished, processor.push(dr.InferenceChunk.text("x"))]


def finish_twice(dr: Any, tok: Any) -> Any:
    processor = _processor(dr)
    first = len(processor.finish())
    return [first, len(processor.finish()), processor.finished]


def push_after_finish(dr: Any, tok: Any) -> Any:
    processor = _processor(dr)
    processor.finish()
    return processor.push(dr.InferenceChunk.text("x"))


def convert_twice(dr: Any, tok: Any) -> Any:
    request = dr.ChatCompletionRequest(dict(BODY))
    model = request.model
    request.convert(dr.ConversionOptions())
    return [model, request.convert(dr.ConversionOptions())]


def model_after_convert(dr: Any, tok: Any) -> Any:
    request = dr.ChatCompletionRequest(dict(BODY))
    request.convert(dr.ConversionOptions())
    return request.model


def encode_without_tokenizer(dr: Any, tok: Any) -> Any:
    return dr.DeepseekV4Encoding().encode(dr.Conversation([dr.UserMessage("x")]))


def v41_encode_with_v4_tokenizer(dr: Any, tok: Any) -> Any:
    conversation = dr.Conversation([dr.SystemMessage("s"), dr.UserMessage("x")])
    return dr.DeepseekV41Encoding().with_tokenizer(tok).encode(conversation)


def direct_formats(dr: Any, tok: Any) -> Any:
    user = [dr.UserMessage("give json")]
    schema = {"type": "object", "properties": {"x": {"type": "number", "minimum": 1.5}}}
    return [
        _render(dr, dr.Conversation(user, response_regex="[0-9]+", thinking_mode=False)),
        _render(dr, dr.Conversation(user, response_schema=schema, reasoning_effort="max")),
        _render(dr, dr.Conversation(user, response_format="json_object", reasoning_effort="low")),
    ]


def direct_images(dr: Any, tok: Any) -> Any:
    sources = [
        dr.UrlImageSource("http://x/a.png"),
        dr.DataUrlImageSource("data:image/png;base64,AA"),
    ]
    messages = [
        dr.SystemMessage("sys <｜image｜>", [dr.UrlImageSource("http://s")]),
        dr.UserMessage("a <｜image｜> b <｜image｜> c <｜image｜>", sources),
        dr.ToolMessage(
            "t [img]", "call", [dr.BytesImageSource(b"abc", "low")], image_token="[img]"
        ),
    ]
    return _render(dr, dr.Conversation(messages, thinking_mode=False))


def direct_special_tokens(dr: Any, tok: Any) -> Any:
    tokens = dr.SpecialTokens(image="<IMG>", user="<U>", thinking_end="</T>")
    message = dr.UserMessage("x <IMG>", [dr.UrlImageSource("u")], image_token="<IMG>")
    return [
        tokens.token(dr.SpecialToken.User),
        dr.SpecialToken.Dsml.default_str(),
        _render(dr, dr.Conversation([message], thinking_mode=False), tokens),
    ]


def direct_tools(dr: Any, tok: Any) -> Any:
    tools = [dr.ToolDefinition("f"), dr.ToolDefinition("g", "desc", {"type": "object"}, True)]
    calls = [
        dr.ToolCall("a", "f", '{"x": [1, 2.5, null], "y": "s"}'),
        dr.ToolCall("b", "g", "not json"),
        dr.ToolCall("c", "g", "{}"),
    ]
    messages = [
        dr.UserMessage("q"),
        dr.AssistantMessage("", "why", calls),
        dr.ToolMessage("rc", "c"),
        dr.ToolMessage("ra", "a"),
        dr.ToolMessage("rb", "b"),
        dr.LatestReminderMessage("be brief"),
    ]
    return [
        _render(dr, dr.Conversation(messages, tools=tools)),
        _render(
            dr, dr.Conversation(messages, tools=tools, tool_choice="required", thinking_mode=False)
        ),
        _render(dr, dr.Conversation(messages, tools=tools, tool_choice="none")),
    ]


def direct_deferred_tools(dr: Any, tok: Any) -> Any:
    """Deferred tools stay out of the tools block; system messages announce loaded tools."""
    shown = dr.ToolDefinition(
        "f", "desc", {"type": "object", "properties": {"n": {"default": 1.5}}}
    )
    late = dr.ToolDefinition("late", "<｜DSML｜ x <think>", {"type": "object"}, None, True)
    other = dr.ToolDefinition("other", None, None, False, True)
    messages = [
        dr.SystemMessage("sys", tools=[late]),
        dr.UserMessage("q"),
        dr.AssistantMessage("", "why", [dr.ToolCall("a", "tool_search", '{"q": "x"}')]),
        dr.ToolMessage("found", "a"),
        dr.SystemMessage("", tools=[late, other]),
        dr.SystemMessage("see <｜image｜>", [dr.UrlImageSource("http://s")], [other]),
        dr.SystemMessage("plain", tools=[]),
        dr.UserMessage("go"),
    ]
    out = []
    for tools in ([shown, late], [late, other], []):
        for choice in ("auto", "required", "none"):
            conversation = dr.Conversation(
                messages, tools=tools, tool_choice=choice, thinking_mode=choice != "required"
            )
            out.append(_render(dr, conversation))
    out.append(_render(dr, dr.Conversation([], tools=[late])))
    out.append(_render(dr, dr.Conversation([dr.SystemMessage("", tools=[late])])))
    out.append(_render(dr, dr.Conversation(messages[:2], response_format="json_object")))
    out.append([[t.name, t.defer_loading] for t in messages[4].tools])
    return out


def direct_prefix(dr: Any, tok: Any) -> Any:
    out = []
    for thinking in (True, False):
        for content, reasoning in (("", None), ("", "r"), ("c", None), ("c", "r")):
            messages = [dr.UserMessage("q"), dr.AssistantMessage(content, reasoning, None, True)]
            out.append(_render(dr, dr.Conversation(messages, thinking_mode=thinking)))
    return out


def assistant_arguments(dr: Any, tok: Any) -> Any:
    """An assistant message without content is built with empty text, never `None`."""
    call = dr.ToolCall("a", "f", "{}")
    attempts: list[tuple[Any, ...]] = [
        (None,),
        (None, None, [call]),
        (5,),
        ("x", 5),
        ("x", None, ["call"]),
        ("x", None, None, None),
        ("", None, []),
    ]
    out: list[Any] = []
    for args in attempts:
        try:
            out.append(repr(dr.AssistantMessage(*args)))
        except TypeError as exc:
            out.append(["TypeError", str(exc)])
    for make in (dr.UserMessage, dr.SystemMessage, dr.LatestReminderMessage):
        try:
            out.append(repr(make(None)))
        except TypeError as exc:
            out.append(["TypeError", str(exc)])
    return out


def content_continuation_stream(dr: Any, tok: Any) -> Any:
    """A thinking-mode reply continuing a prefix answer opens with content, not reasoning."""
    out = []
    for content, reasoning in (("a\n", None), ("\n\n", "r"), ("", "r")):
        body = {
            "model": "DeepSeek-V4-Pro",
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": content,
                    "reasoning_content": reasoning,
                    "prefix": True,
                },
            ],
        }
        processor = _processor(dr, None, body)
        chunks = processor.push(dr.InferenceChunk.text("\nx\n</think>\ny", 3))
        chunks += processor.finish()
        out.append([json.loads(c.to_json())["choices"][0]["delta"] for c in chunks])
    return out


def conversation_errors(dr: Any, tok: Any) -> Any:
    results = []
    for kwargs in (
        {"response_schema": {}, "response_regex": "x"},
        {"response_format": "json_object", "response_schema": {}},
        {"response_format": "json_object", "response_regex": "x"},
    ):
        try:
            dr.Conversation([], **kwargs)
            results.append("ok")
        except ValueError:
            results.append("ValueError")
    return results


def options(dr: Any, tok: Any) -> Any:
    base = dr.ConversionOptions()
    aliased = base.with_model_alias("deepseek-flash", dr.ModelVersion.DeepseekV41Flash)
    replaced = base.with_model_versions_by_name({"m": dr.ModelVersion.DeepseekV4Pro})
    bounded = base.with_thinking_max_tokens_upper_bound(
        100
    ).with_non_thinking_max_tokens_upper_bound(50)
    out: list[Any] = [
        base.default_thinking_mode,
        base.thinking_max_tokens_upper_bound,
        sorted(str(v) for v in aliased.model_versions_by_name.values()),
        str(
            dr.ChatCompletionRequest({**BODY, "model": "deepseek-flash"})
            .convert(aliased)
            .model_version
        ),
    ]
    for opts, body in (
        (replaced, BODY),
        (bounded, {**BODY, "max_tokens": 101}),
        (bounded, {**BODY, "max_tokens": 51, "thinking": {"type": "disabled"}}),
        (base.with_default_thinking_mode(False), BODY),
    ):
        try:
            req = dr.ChatCompletionRequest(dict(body)).convert(opts)
            out.append([req.conversation.thinking_mode, req.inference_options.max_tokens])
        except Exception as exc:
            out.append([type(exc).__name__, str(exc)])
    return out


def chunk_properties(dr: Any, tok: Any) -> Any:
    ready = dr.InferenceChunk.ready(
        prompt_usage=dr.PromptUsage(prompt_tokens=3), system_fingerprint="fp"
    )
    text = dr.InferenceChunk.text("a", 2)
    tokens = dr.InferenceChunk.tokens([1, 2])
    finish = dr.InferenceChunk.finish(dr.InferenceFinishReason.Length)
    po = dr.ParsingOptions()
    return [
        [ready.kind, ready.system_fingerprint, ready.prompt_usage.prompt_tokens],
        [text.kind, text.content, text.token_count, text.token_ids],
        [tokens.kind, tokens.token_ids, tokens.content],
        [finish.kind, str(finish.finish_reason)],
        [
            po.parse_tool_calls,
            po.starts_in_tool_calls,
            po.parse_json_output,
            po.thinking_initial_stage,
        ],
        [
            dr.ThinkingInitialStage.ContentContinuation.starts_in_reasoning(),
            dr.IMAGE_SPECIAL_TOKEN_ID,
        ],
    ]


def reprs(dr: Any, tok: Any) -> Any:
    request = dr.ChatCompletionRequest(
        {**BODY, "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}]}
    ).convert(dr.ConversionOptions())
    return [
        repr(request.conversation),
        [repr(m) for m in request.conversation.messages],
        [repr(t) for t in request.conversation.tools],
        repr(dr.ToolCall("i", "n", '{"a": "\\n"}')),
        repr(dr.UrlImageSource("http://x", "low", path=".messages[0]")),
        repr(request.inference_options.output_constraint),
        str(request.model_version),
        str(request.parsing_options.thinking_initial_stage),
    ]


def json_syntax_errors(dr: Any, tok: Any) -> Any:
    bodies = [
        "{bad",
        "",
        "   ",
        '{"a":1',
        '{"a":1}}',
        '{"a" 1}',
        '{"a":1 "b":2}',
        "[1,2",
        '{"a":tru}',
        '{"a":"x\\q"}',
        '{"a":"x\x01"}',
        '{"a":"unterminated',
        '{"a":01}',
        '{"a":1,}',
        "nul",
        '"str"',
        "5",
        '{"model":"m","messages":[1,]}',
        '{\n"a":\n}',
        '{"a":-}',
        '{"a":1.}',
        '{"a":1e}',
        '{"a":"\\u12x4"}',
        '{"a":[1 2]}',
        '{"a":{}',
        "[]",
    ]
    out = []
    for body in bodies:
        try:
            dr.ChatCompletionRequest(body)
            out.append("ok")
        except ValueError as exc:
            out.append(str(exc))
    return out


def logprobs_mismatch(dr: Any, tok: Any) -> Any:
    return _processor(dr, tok).push(dr.InferenceChunk.tokens([1, 2], [(0.0, [])]))


PROBES: dict[str, Callable[[Any, Any], Any]] = {
    name: fn
    for name, fn in globals().items()
    if callable(fn) and not name.startswith("_") and fn.__module__ == __name__
}
