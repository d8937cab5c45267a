"""Every golden vector produced by the official deepseek-recipe 0.2.0 must match exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import deepseek_recipe as dr

GOLDEN = json.loads(
    (Path(__file__).parent / "data" / "recipe_golden.json").read_text(encoding="utf-8")
)
MODELS = {"v4": "DeepSeek-V4-Pro", "v41": "DeepSeek-V4.1-Flash"}
RENDER_CASES = [(c["name"], key, c) for c in GOLDEN["render_cases"] for key in c["by_model"]]
PARSE_CASES = [(c["name"], c) for c in GOLDEN["parse_cases"]]
_RANDOM_ID = re.compile(r"(call_\d\d_)[A-Za-z0-9_]+")


def _parsing_options(po: dr.ParsingOptions) -> dict[str, Any]:
    stage = po.thinking_initial_stage
    return {
        "parse_tool_calls": po.parse_tool_calls,
        "starts_in_tool_calls": po.starts_in_tool_calls,
        "parse_json_output": po.parse_json_output,
        "thinking_initial_stage": None if stage is None else str(stage),
        "stop_sequences": po.stop_sequences,
    }


@pytest.mark.parametrize(
    ("name", "model", "case"), RENDER_CASES, ids=[f"{n}-{m}" for n, m, _ in RENDER_CASES]
)
def test_render(name: str, model: str, case: dict[str, Any], v4_tokenizer: dr.Tokenizer) -> None:
    expected = case["by_model"][model]
    body = dict(case["request"], model=MODELS[model])
    if "error" in expected:
        with pytest.raises((dr.ConversionError, ValueError)) as info:
            dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
        assert str(info.value) == expected["error"]
        return
    request = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
    encoding = dr.DeepseekV4Encoding() if model == "v4" else dr.DeepseekV41Encoding()
    rendered = encoding.render_conversation(request.conversation)
    assert rendered.prompt == expected["prompt"]
    assert [rendered.prompt[a:b] for a, b in rendered.special_ranges] == expected["special_spans"]
    assert len(rendered.image_sources) == expected["n_image_sources"]
    assert _parsing_options(request.parsing_options) == expected["parsing_options"]
    if "token_ids" in expected:
        assert (
            encoding.with_tokenizer(v4_tokenizer).encode(request.conversation)
            == expected["token_ids"]
        )


def _normalize(text: str) -> Any:
    return json.loads(_RANDOM_ID.sub(r"\1<random>", text))


@pytest.mark.parametrize(("name", "case"), PARSE_CASES, ids=[n for n, _ in PARSE_CASES])
def test_parse(name: str, case: dict[str, Any]) -> None:
    request = dr.ChatCompletionRequest(dict(case["request"])).convert(dr.ConversionOptions())
    generator = dr.ChatCompletionRequest.chunk_generator(request, "id", "model")
    processor = dr.StreamProcessor(generator, request.parsing_options)
    chunks = processor.push(dr.InferenceChunk.ready())
    for text in case["output_chunks"]:
        if processor.finished:
            break
        chunks += processor.push(dr.InferenceChunk.text(text))
    if not processor.finished:
        reason = getattr(dr.InferenceFinishReason, case["backend_finish"])
        chunks += processor.push(dr.InferenceChunk.finish(reason))
    chunks += processor.finish()
    response = dr.ChatCompletionResponse("id", "model", 0, 0, 0)
    deltas = []
    for chunk in chunks:
        choice = _normalize(chunk.to_json())["choices"][0]
        deltas.append({"delta": choice["delta"], "finish_reason": choice["finish_reason"]})
        response.accumulate(chunk)
    choice = _normalize(response.to_json())["choices"][0]
    message = choice["message"]
    result = {
        "content": message.get("content"),
        "reasoning_content": message.get("reasoning_content"),
        "tool_calls": message.get("tool_calls"),
        "finish_reason": choice["finish_reason"],
    }
    assert deltas == case["stream_deltas"]
    assert result == case["result"]
