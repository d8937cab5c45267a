"""Run parity cases through whichever `deepseek_recipe` is importable and dump results as JSON.

Run by the official package's interpreter, it produces the reference results;
imported in-process by the parity test, it runs the same cases through this
package.  Keeping one harness for both sides means any difference is in the
package, never in the harness.

Usage: python oracle_dump.py CASES.json OUT.json
"""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path
from typing import Any

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
common = load("_dump")

_RANDOM_ID = re.compile(r"(call_\d\d_)[A-Za-z0-9_]+")
_CREATED = re.compile(r'"created":\d+')


def _norm(text: str) -> Any:
    return json.loads(_CREATED.sub('"created":0', _RANDOM_ID.sub(r"\1<random>", text)))


def _convert(dr: Any, case: dict[str, Any]) -> Any:
    options = common.conversion_options(dr, case.get("options", {}))
    return dr.ChatCompletionRequest(case["body"]).convert(options)


def run_render(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    try:
        req = _convert(dr, case)
    except Exception as exc:
        return {"convert_error": common.error_json(exc)}
    conv = req.conversation
    io = req.inference_options
    oc = io.output_constraint
    po = req.parsing_options
    out: dict[str, Any] = {
        "model_version": str(req.model_version),
        "stream": req.stream,
        "messages": [repr(m) for m in conv.messages],
        "message_fields": [
            [m.role, m.content, m.reasoning_content, m.tool_call_id, m.prefix, len(m.image_sources)]
            for m in conv.messages
        ],
        "conversation": repr(conv),
        "tools": [[t.name, t.description, t.parameters, t.strict] for t in conv.tools],
        "inference": common.inference_fields(io),
        "constraint": None if oc is None else [oc.kind, oc.schema],
        "parsing": common.parsing_fields(po),
    }
    resolved = []
    for prompt_tokens, limit in case.get("resolve", []):
        try:
            resolved.append(req.resolve_max_tokens(prompt_tokens, limit))
        except Exception as exc:
            resolved.append(common.error_json(exc))
    out["resolved"] = resolved
    encodings = {"v4": dr.DeepseekV4Encoding(), "v41": dr.DeepseekV41Encoding()}
    for name, encoding in encodings.items():
        rendered = encoding.render_conversation(conv)
        out[name] = {
            "prompt": rendered.prompt,
            "ranges": [list(r) for r in rendered.special_ranges],
            "images": [
                [s.kind, s.detail, s.url, s.data_url, s.path] for s in rendered.image_sources
            ],
        }
        try:
            out[name]["ids"] = encoding.with_tokenizer(tok).encode(conv)
        except Exception as exc:
            out[name]["ids"] = common.error_json(exc)
    return out


def run_stream(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    try:
        req = _convert(dr, case)
    except Exception as exc:
        return {"convert_error": common.error_json(exc)}
    gen = dr.ChatCompletionRequest.chunk_generator(req, "chatcmpl-x", "model-x")
    proc = dr.StreamProcessor(gen, req.parsing_options, tok)
    response = dr.ChatCompletionResponse("chatcmpl-x", "model-x", 0, 0, 0)
    events: list[Any] = []

    def take(chunks: list[Any], step: Any) -> None:
        for chunk in chunks:
            events.append([step, _norm(chunk.to_json())])
            response.accumulate(chunk)

    common.feed_stream(dr, proc, case, take=take, events=events, error=common.error_json)
    return {"events": events, "response": _norm(response.to_json())}


def run_probe(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    probe = load("probes").PROBES[case["name"]]
    return common.run_probe(probe, dr, tok, _chunk_json, common.error_json)


def _chunk_json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return _norm(value.to_json())
    return repr(value)


def _message(dr: Any, spec: dict[str, Any]) -> Any:
    role, content = spec["role"], spec.get("content", "")
    images = [dr.UrlImageSource(u) for u in spec.get("images", [])]
    if role == "system":
        return dr.SystemMessage(content, images)
    if role == "user":
        return dr.UserMessage(content, images)
    if role == "tool":
        return dr.ToolMessage(content, spec.get("tool_call_id"), images)
    if role == "latest_reminder":
        return dr.LatestReminderMessage(content)
    calls = None
    if "tool_calls" in spec:
        calls = [dr.ToolCall(c["id"], c["name"], c["arguments"]) for c in spec["tool_calls"]]
    return dr.AssistantMessage(
        content, spec.get("reasoning_content"), calls, spec.get("prefix", False)
    )


def run_direct(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    """Render a conversation built with the public constructors (no request validation)."""
    try:
        kwargs = dict(case["conversation"])
        kwargs["tools"] = [dr.ToolDefinition(**t) for t in kwargs.get("tools", [])]
        conversation = dr.Conversation([_message(dr, m) for m in case["messages"]], **kwargs)
    except Exception as exc:
        return {"build_error": common.error_json(exc)}
    out: dict[str, Any] = {}
    for name, encoding in {"v4": dr.DeepseekV4Encoding(), "v41": dr.DeepseekV41Encoding()}.items():
        rendered = encoding.render_conversation(conversation)
        out[name] = [
            rendered.prompt,
            [list(r) for r in rendered.special_ranges],
            len(rendered.image_sources),
        ]
    return out


def run_all(dr: Any, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tok = common.tokenizer(dr)
    runners = {"render": run_render, "stream": run_stream, "probe": run_probe, "direct": run_direct}
    return [runners[case["kind"]](dr, tok, case) for case in cases]


if __name__ == "__main__":
    common.main(run_all)
