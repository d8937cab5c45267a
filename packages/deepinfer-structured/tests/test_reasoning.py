"""Thinking on: the reasoning is free and the constraint governs the answer after ``</think>``.

Independent checks: replies go through ``deepseek_recipe``'s parser, the answer must satisfy
the schema under ``jsonschema`` (or the regex under ``re.fullmatch``), and a matcher rolled back
to any point must allow exactly what a fresh matcher replaying the same tokens allows.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from matcher_walks import rollback_walk

from deepinfer.chat import ChatFormatter
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured import ReplyConstraint

SCHEMA = {
    "type": "object",
    "properties": {
        "speaker": {"type": "string", "maxLength": 12},
        "act": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["speaker", "act"],
    "additionalProperties": False,
}
REGEX = r"(ACT|SCENE) [IVX]{1,4}\. [A-Z][a-z]{2,9}"


def chat_body(question: str, budget: int | None, response_format: dict) -> dict:
    thinking: dict = {"type": "enabled"}
    if budget is not None:
        thinking["budget_tokens"] = budget
    return {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [{"role": "user", "content": question}],
        "thinking": thinking,
        "response_format": response_format,
    }


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "line", "schema": SCHEMA}},
        {"type": "regex", "regex": REGEX},
    ],
)
def test_reasoning_is_free_and_the_answer_is_constrained(trained, response_format: dict) -> None:  # type: ignore[no-untyped-def]
    formatter = ChatFormatter(trained.tokenizer_path)
    questions = ["Who speaks first?", "Name a king.", "Which act?", "Who dies?"]
    prompts = [
        formatter.prompt(chat_body(q, 6 + 5 * i, response_format)) for i, q in enumerate(questions)
    ]
    params = []
    for seed, prompt in enumerate(prompts):
        sp = SamplingParams(temperature=1.0, max_tokens=120, seed=seed)
        sp.structured_outputs = prompt.constraint
        params.append(sp)
    outs = trained.generate([p.token_ids for p in prompts], params, use_tqdm=False)
    end = trained.tokenizer.token_to_id("</think>")
    for prompt, out in zip(prompts, outs, strict=True):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", completion
        assert end in completion.token_ids
        ids = completion.token_ids[:-1]  # the stop token
        message = formatter.parse(prompt, ids, "stop")
        assert message.reasoning_content  # free text (Shakespeare), not the schema's
        if response_format["type"] == "regex":
            assert re.fullmatch(REGEX, message.content), message.content
        else:
            jsonschema.validate(json.loads(message.content), SCHEMA)


def test_llm_chat_with_thinking_constrains_only_the_answer(trained) -> None:  # type: ignore[no-untyped-def]
    rf = {"type": "json_schema", "json_schema": {"name": "line", "schema": SCHEMA}}
    outs = trained.chat(
        [[{"role": "user", "content": q}] for q in ("Who?", "Where?")],
        SamplingParams(max_tokens=24, seed=0),
        thinking=True,
        response_format=rf,
        use_tqdm=False,
    )
    for out in outs:
        # Without a budget the tiny model never closes its reasoning: it is cut, never invalid.
        completion = out.outputs[0]
        if completion.finish_reason == "length" and not completion.text:
            assert out.reasoning_content[0]
        else:
            jsonschema.validate(json.loads(completion.text), SCHEMA)


def test_rollback_across_the_end_of_reasoning_matches_a_replay(trained) -> None:  # type: ignore[no-untyped-def]
    backend = trained.engine.grammar_backend()
    tok = trained.tokenizer
    end = tok.token_to_id("</think>")
    constraint = ReplyConstraint(json=SCHEMA, reasoning_end="</think>")
    answer = tok.encode('{"speaker": "Lear", "act": 4}', add_special_tokens=False).ids
    tokens = [*tok.encode("Hmm, the king.", add_special_tokens=False).ids, end, *answer, 1]
    matcher = backend.matcher(constraint)
    for t in tokens:
        assert matcher.accept(t)
    assert matcher.is_terminated()
    position = rollback_walk(backend, constraint, matcher, tokens)
    # Drafts that cross the end of the reasoning verify like single steps, and leave no trace.
    matcher.rollback(position)
    before = matcher.allowed()
    masks, accepted = matcher.draft_masks(tokens[:8])
    assert accepted == 8 and torch.equal(masks[0], before)
    assert torch.equal(matcher.allowed(), before)


def test_budget_forces_the_end_and_stops_wait_for_the_answer(trained) -> None:  # type: ignore[no-untyped-def]
    backend = trained.engine.grammar_backend()
    tok = trained.tokenizer
    end = tok.token_to_id("</think>")
    matcher = backend.matcher(
        ReplyConstraint(regex="ok", reasoning_end="</think>", reasoning_budget=3)
    )
    free = matcher.allowed()
    assert not free[1] and free[end] and free.sum() == free.numel() - 1  # all but the stop
    for t in tok.encode("a b c", add_special_tokens=False).ids[:3]:
        assert matcher.accept(t)
    assert matcher.allowed().nonzero()[:, 0].tolist() == [end]
    assert not matcher.accept(5)
    assert matcher.accept(end)
    assert not matcher.allowed()[end]  # the answer is text: control tokens are never allowed


def test_budget_alone_and_bad_budgets(trained) -> None:  # type: ignore[no-untyped-def]
    formatter = ChatFormatter(trained.tokenizer_path)
    body = chat_body("Speak.", 5, {"type": "text"})
    prompt = formatter.prompt(body)
    assert isinstance(prompt.constraint, ReplyConstraint) and prompt.constraint.kind == "reasoning"
    sp = SamplingParams(max_tokens=20, seed=0)
    sp.structured_outputs = prompt.constraint
    out = trained.generate([prompt.token_ids], sp, use_tqdm=False)[0].outputs[0]
    end = trained.tokenizer.token_to_id("</think>")
    assert out.token_ids.index(end) <= 5  # forced at the budget; the answer after it is free
    with pytest.raises(InvalidRequestError, match="budget_tokens"):
        formatter.prompt(chat_body("Speak.", "many", {"type": "text"}))  # type: ignore[arg-type]
