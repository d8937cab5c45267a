"""LLM.chat through deepseek_recipe: prompts from the recipe, replies parsed by it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from deepinfer.errors import InvalidRequestError
from deepinfer.llm import LLM
from deepinfer.sampling_params import SamplingParams
from deepseek_recipe import (
    ChatCompletionRequest,
    ConversionOptions,
    DeepseekV41Encoding,
    Tokenizer,
)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu")


def test_prompt_is_the_recipe_encoding(llm: LLM) -> None:
    messages = [
        {"role": "system", "content": "Thou art a player."},
        {"role": "user", "content": "Who goes there?"},
    ]
    (out,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    body = {"model": "DeepSeek-V4.1-Flash", "messages": messages, "thinking": {"type": "disabled"}}
    request = ChatCompletionRequest(body).convert(ConversionOptions())
    tokenizer = Tokenizer.from_file(str(llm.tokenizer_path))
    want = DeepseekV41Encoding().with_tokenizer(tokenizer).encode(request.conversation)
    assert out.prompt_token_ids == want
    assert llm.tokenizer.decode(want, skip_special_tokens=False).endswith(
        "Who goes there?<｜Assistant｜></think>"
    )
    assert out.reasoning_content == [None] and out.tool_calls == [None]


def test_reply_is_parsed_by_the_recipe(llm: LLM) -> None:
    """With thinking on, text before </think> is reasoning and the rest is the answer."""
    from deepinfer.chat import ChatFormatter

    chat = ChatFormatter(llm.tokenizer_path)
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "Hi"}]}
    prompt = chat.prompt(body)
    ids = [
        *llm.tokenizer.encode("I muse upon it.").ids,
        llm.tokenizer.token_to_id("</think>"),
        *llm.tokenizer.encode("Good morrow.").ids,
    ]
    msg = chat.parse(prompt, ids, "stop")
    assert (msg.reasoning_content, msg.content, msg.finish_reason) == (
        "I muse upon it.",
        "Good morrow.",
        "stop",
    )


def test_response_format_becomes_a_constraint(llm: LLM) -> None:
    schema = {
        "type": "object",
        "properties": {"mood": {"enum": ["merry", "sad"]}, "n": {"type": "integer"}},
        "required": ["mood", "n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "m", "schema": schema}}
    outs = llm.chat(
        [[{"role": "user", "content": f"Mood {i}?"}] for i in range(4)],
        SamplingParams(temperature=1.0, seed=3, max_tokens=60),
        response_format=fmt,
        use_tqdm=False,
    )
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)


def test_bad_chat_requests_fail_clearly(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="messages"):
        llm.chat([{"role": "wizard", "content": "hi"}], use_tqdm=False)
    with pytest.raises(NotImplementedError, match="prefix assistant message"):
        llm.chat(
            [
                {"role": "user", "content": "Answer."},
                {"role": "assistant", "content": "a", "prefix": True},
            ],
            response_format={"type": "regex", "regex": "a+"},
            use_tqdm=False,
        )


def test_chat_cli_streams_turns_and_reasoning() -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "deepinfer", "chat", "--max-tokens", "6", "--device", "cpu"]
    res = subprocess.run(
        cmd, input="Who art thou?\nAnd whence?\n\n", capture_output=True, text=True, check=True
    )
    assert res.stdout.count("model> ") == 2
    res = subprocess.run(
        [*cmd, "--thinking"], input="Hi\n", capture_output=True, text=True, check=True
    )
    assert "(thinking) " in res.stdout
    # /reset forgets the turns so far (the next reply is the first one's, greedy); /exit ends.
    greedy = [*cmd, "--temperature", "0"]
    alone = subprocess.run(greedy, input="Hi\n", capture_output=True, text=True, check=True)
    res = subprocess.run(
        greedy,
        input="Who art thou?\n/reset\nHi\n/exit\nnever sent\n",
        capture_output=True,
        text=True,
        check=True,
    )
    replies = res.stdout.split("model> ")
    assert len(replies) == 3 and "(conversation reset)" in res.stderr
    assert replies[2].splitlines()[0] == alone.stdout.split("model> ")[1].splitlines()[0]
