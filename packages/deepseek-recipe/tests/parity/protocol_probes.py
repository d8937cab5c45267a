"""API probes of the Responses and Messages classes, run on both packages by protocol_dump.py.

Each probe takes the imported `deepseek_recipe` module and returns JSON-able
values; exceptions are recorded by type and message by the caller.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

R_BODY = {"model": "DeepSeek-V4-Pro", "input": "q"}
M_BODY = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "q"}]}


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]


def consumed_requests(dr: Any, tok: Any) -> Any:
    out = []
    for cls, body in ((dr.ResponsesRequest, R_BODY), (dr.MessagesRequest, M_BODY)):
        request = cls(dict(body))
        out.append(request.model)
        request.convert(dr.ConversionOptions())
        out.append(_try(lambda request=request: request.model))
        out.append(_try(lambda request=request: request.convert(dr.ConversionOptions())))
    request = dr.ResponsesRequest(dict(R_BODY))
    request.convert(dr.ConversionOptions())
    out.append(_try(request.echo))
    out.append(_try(lambda: request.namespace_tool_map(dr.ConversionOptions())))
    failed = dr.ResponsesRequest({"model": "nope", "input": "q"})
    out.append(_try(lambda: failed.convert(dr.ConversionOptions())))
    out.append(_try(lambda: failed.model))
    return out


def body_forms(dr: Any, tok: Any) -> Any:
    out = []
    for cls, body in ((dr.ResponsesRequest, R_BODY), (dr.MessagesRequest, M_BODY)):
        for form in (json.dumps(body), json.dumps(body).encode(), "{bad", b"\xff", "[]", "5"):
            out.append(_try(lambda cls=cls, form=form: cls(form).model))
    out.append(_try(lambda: dr.ResponsesRequest(["DeepSeek-V4-Pro", "q"]).model))
    out.append(_try(lambda: dr.MessagesRequest(["DeepSeek-V4-Pro", []]).model))
    return out


def echo_defaults(dr: Any, tok: Any) -> Any:
    echo = dr.ResponsesEcho()
    request = dr.ResponsesRequest(
        {
            **R_BODY,
            "temperature": 0.3,
            "top_p": 0.7,
            "top_logprobs": 4,
            "user": "u",
            "instructions": "i",
        }
    )
    e = request.echo()
    return [
        [echo.instructions, echo.max_output_tokens, echo.temperature, echo.top_p],
        [echo.top_logprobs, echo.user],
        [e.instructions, e.max_output_tokens, e.temperature, e.top_p, e.top_logprobs, e.user],
    ]


def fresh_responses(dr: Any, tok: Any) -> Any:
    return [
        json.loads(dr.ResponsesResponse("id", "m", 5, 10, 4).to_json()),
        json.loads(dr.MessagesResponse("id", "m", 5, 10, 4).to_json()),
        json.loads(dr.MessagesResponse("id", "m", 5, 3, 9).to_json()),
        dr.ResponsesResponse.sse_done_data(),
        dr.MessagesResponse.sse_done_data(),
    ]


def generator_consumed(dr: Any, tok: Any) -> Any:
    out = []
    gen = dr.MessagesChunkGenerator("id", "m", True)
    gen.with_signature("a")
    out.append(_try(lambda: gen.with_signature("b")))
    request = dr.ResponsesRequest(dict(R_BODY)).convert(dr.ConversionOptions())
    rgen = dr.ResponsesRequest.chunk_generator(request, "id", "m")
    rgen.with_echo(dr.ResponsesEcho())
    out.append(_try(lambda: rgen.with_namespace_tool_map({})))
    return out


def event_consumed(dr: Any, tok: Any) -> Any:
    out = []
    for cls, body, resp in (
        (dr.ResponsesRequest, R_BODY, dr.ResponsesResponse),
        (dr.MessagesRequest, M_BODY, dr.MessagesResponse),
    ):
        request = cls(dict(body)).convert(dr.ConversionOptions())
        processor = dr.StreamProcessor(
            cls.chunk_generator(request, "id", "m"), request.parsing_options
        )
        events = processor.push(dr.InferenceChunk.ready())
        response = resp("id", "m", 0, 0, 0)
        response.accumulate(events[0])
        out.append(_try(lambda events=events: events[0].to_json()))
        out.append(_try(lambda events=events, response=response: response.accumulate(events[0])))
        out.append(_try(lambda events=events, resp=resp: resp.sse_event_name(events[0])))
    return out


def partial_accumulation(dr: Any, tok: Any) -> Any:
    """A response serializes its partial state after each event."""
    out = []
    body = {**R_BODY, "tools": [{"type": "function", "name": "f"}]}
    text = (
        '<think>r</think>ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜invoke>\n'
    )
    for cls, resp, b in (
        (dr.ResponsesRequest, dr.ResponsesResponse, body),
        (
            dr.MessagesRequest,
            dr.MessagesResponse,
            {**M_BODY, "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
        ),
    ):
        request = cls(dict(b)).convert(dr.ConversionOptions())
        processor = dr.StreamProcessor(
            cls.chunk_generator(request, "id", "m"), request.parsing_options
        )
        response = resp("id", "m", 3, 9, 2)
        for chunk in processor.push(dr.InferenceChunk.text(text[8:], 4)):
            response.accumulate(chunk)
            state = re.sub(r"(call_\d\d_(?:ET_)?)[A-Za-z0-9]+", r"\1<id>", response.to_json())
            snapshot = json.loads(state)
            snapshot.pop("created_at", None)
            out.append(json.dumps(snapshot, sort_keys=True))
    return out


PROBES: dict[str, Callable[[Any, Any], Any]] = {
    name: fn
    for name, fn in globals().items()
    if callable(fn) and not name.startswith("_") and fn.__module__ == __name__
}
