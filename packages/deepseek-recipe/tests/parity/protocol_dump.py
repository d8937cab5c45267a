"""Run Responses/Messages parity cases through whichever `deepseek_recipe` is importable.

Run by the official package's interpreter it produces the reference results;
imported by the parity test it runs the same cases through this package.  One
harness for both sides means any difference is in the package, not the harness.

Usage: python protocol_dump.py CASES.json OUT.json
"""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path
from typing import Any

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
common = load("_dump")

#: Random tool-call ids; the `ET_` marker (a call made before any reasoning) is kept.
_RANDOM_ID = re.compile(r"(call_\d\d_(?:ET_)?)[A-Za-z0-9]+")
_TIMES = re.compile(r'"(created_at|completed_at)":\d+')
#: When several calls lack their output, the official converter names one of them in hash-set
#: order, which changes from process to process; only the message shape is compared then.
_MISSING_OUTPUT = re.compile(r"No tool output found for tool call .*\.$")


def norm(text: str) -> Any:
    """Event JSON with random call ids and wall-clock times replaced."""
    return json.loads(_TIMES.sub(r'"\1":0', _RANDOM_ID.sub(r"\1<random>", text)))


def error(exc: BaseException) -> dict[str, Any]:
    """The exception's JSON form, with the run-dependent missing-output call id hidden."""
    return common.error_json(
        exc, _MISSING_OUTPUT.sub("No tool output found for tool call <id>.", str(exc))
    )


def _request_class(dr: Any, protocol: str) -> Any:
    return dr.ResponsesRequest if protocol == "responses" else dr.MessagesRequest


def _source(s: Any) -> list[Any]:
    return [s.kind, s.detail, s.url, s.data_url, s.path]


def _tool(t: Any) -> list[Any]:
    return [t.name, t.description, t.parameters, t.strict, t.defer_loading]


def describe(dr: Any, req: Any) -> dict[str, Any]:
    """Everything observable about a converted request, rendered with both encodings."""
    conv = req.conversation
    io = req.inference_options
    oc = io.output_constraint
    po = req.parsing_options
    messages = []
    for m in conv.messages:
        calls = (
            None if m.tool_calls is None else [[c.id, c.name, c.arguments] for c in m.tool_calls]
        )
        row = [m.role, m.content, m.reasoning_content, calls, m.tool_call_id, m.prefix]
        row.append([_source(s) for s in m.image_sources])
        if m.role == "system":
            row.append(None if m.tools is None else [_tool(t) for t in m.tools])
        messages.append(row)
    out: dict[str, Any] = {
        "model_version": str(req.model_version),
        "stream": req.stream,
        "messages": messages,
        "reprs": [repr(m) for m in conv.messages],
        "conversation": repr(conv),
        "format": [conv.response_format, conv.response_schema, conv.response_regex],
        "tools": [_tool(t) for t in conv.tools],
        "inference": common.inference_fields(io),
        "constraint": None if oc is None else [oc.kind, oc.schema],
        "parsing": common.parsing_fields(po),
    }
    for name, encoding in {"v4": dr.DeepseekV4Encoding(), "v41": dr.DeepseekV41Encoding()}.items():
        rendered = encoding.render_conversation(conv)
        out[name] = [
            rendered.prompt,
            [list(r) for r in rendered.special_ranges],
            [_source(s) for s in rendered.image_sources],
        ]
    resolved = []
    for prompt_tokens, limit in ((100, 200000), (5000, 6000)):
        try:
            resolved.append(req.resolve_max_tokens(prompt_tokens, limit))
        except Exception as exc:
            resolved.append(error(exc))
    out["resolved"] = resolved
    return out


def run_convert(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    protocol = case["protocol"]
    opts = common.conversion_options(dr, case.get("options", {}))
    try:
        request = _request_class(dr, protocol)(case["body"])
    except Exception as exc:
        return {"decode_error": error(exc)}
    out: dict[str, Any] = {}
    try:
        out["model"] = request.model
    except Exception as exc:
        out["model"] = error(exc)
    if protocol == "responses":
        try:
            out["namespace_map"] = sorted(
                [k, list(v)] for k, v in request.namespace_tool_map(opts).items()
            )
        except Exception as exc:
            out["namespace_map"] = error(exc)
        echo = request.echo()
        out["echo"] = [
            echo.instructions,
            echo.max_output_tokens,
            echo.temperature,
            echo.top_p,
            echo.top_logprobs,
            echo.user,
        ]
    try:
        req = request.convert(opts)
    except Exception as exc:
        out["convert_error"] = error(exc)
        return out
    out.update(describe(dr, req))
    try:
        request.convert(opts)
    except Exception as exc:
        out["second_convert"] = error(exc)
    return out


def run_stream(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    protocol = case["protocol"]
    opts = common.conversion_options(dr, case.get("options", {}))
    request_class = _request_class(dr, protocol)
    try:
        request = request_class(case["body"])
        extras: dict[str, Any] = {}
        if protocol == "responses":
            extras["namespace_map"] = request.namespace_tool_map(opts)
            extras["echo"] = request.echo()
        req = request.convert(opts)
    except Exception as exc:
        return {"convert_error": error(exc)}
    if case.get("direct"):
        gen = dr.MessagesChunkGenerator("resp-x", "model-x", case["direct"] == "thinking")
    else:
        gen = request_class.chunk_generator(req, "resp-x", "model-x")
    for modifier in case.get("modifiers", []):
        if modifier == "echo_default":
            gen = gen.with_echo(dr.ResponsesEcho())
        elif modifier == "echo_request":
            gen = gen.with_echo(extras["echo"])
        elif modifier == "namespace_map":
            gen = gen.with_namespace_tool_map(extras["namespace_map"])
        elif modifier == "namespace_map_empty":
            gen = gen.with_namespace_tool_map({})
        elif modifier.startswith("signature:"):
            gen = gen.with_signature(modifier.split(":", 1)[1])
    response_class = dr.ResponsesResponse if protocol == "responses" else dr.MessagesResponse
    processor = dr.StreamProcessor(gen, req.parsing_options, tok if case.get("tokens") else None)
    response = response_class("resp-x", "model-x", 7, 20, 5)
    events: list[Any] = []

    def take(chunks: list[Any], step: Any) -> None:
        for chunk in chunks:
            events.append([step, response_class.sse_event_name(chunk), norm(chunk.to_json())])
            response.accumulate(chunk)

    common.feed_stream(dr, processor, case, take=take, events=events, error=error)
    return {
        "events": events,
        "response": norm(response.to_json()),
        "done_data": response_class.sse_done_data(),
    }


def run_probe(dr: Any, tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    probe = load("protocol_probes").PROBES[case["name"]]
    return common.run_probe(probe, dr, tok, repr, error)


def run_all(dr: Any, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tok = common.tokenizer(dr)
    runners = {"convert": run_convert, "stream": run_stream, "probe": run_probe}
    return [runners[case["kind"]](dr, tok, case) for case in cases]


if __name__ == "__main__":
    common.main(run_all)
