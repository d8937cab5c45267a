"""MTP drafting on the embedded model (V4.1, one MTP layer trained with it): lossless, and its
drafts are kept often enough to emit more than one token a round; its confidences drive the
static threshold and the adaptive schedule."""

from __future__ import annotations

from typing import Any

import pytest

from deepinfer import LLM, SamplingParams

PROMPTS = ["ROMEO:\nWhat light through yonder window breaks?", "First Citizen:\nBefore we"]


def test_mtp_speculation_on_the_tiny_model_keeps_greedy_outputs() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    outputs = []
    for config in (None, spec):
        llm = LLM("tiny", max_num_seqs=4, speculative_config=config)
        outputs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)])
    assert outputs[0] == outputs[1]
    runner = llm.engine.spec
    assert runner is not None and runner.num_drafts > 0
    assert runner.num_accepted / runner.num_drafts > 0.2  # a trained layer: about 0.4 here


SPEC: dict[str, Any] = {"method": "mtp", "num_speculative_tokens": 3}


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def references() -> tuple[list[list[int]], int]:
    """The greedy tokens without speculation, and the drafts MTP verifies when it verifies
    every one."""
    want = _greedy(LLM("tiny", max_num_seqs=4, speculative_config=None))
    every = LLM("tiny", max_num_seqs=4, speculative_config=SPEC)
    _greedy(every)
    assert every.engine.spec is not None
    return want, every.engine.spec.num_drafts


@pytest.mark.parametrize(
    "options",
    [
        {"confidence_threshold": 0.5},
        {"confidence_threshold": 1.0},
        {"scheduling": "adaptive", "verify_cost": {1: 1.0, 16: 1.2}, "draft_cost": {1: 0.1}},
    ],
)
def test_mtp_confidences_schedule_its_drafts(
    options: dict[str, Any], references: tuple[list[list[int]], int]
) -> None:
    """MTP drafts come with confidences (the MTP layer's probability of each draft), so the
    static threshold and the adaptive schedule apply to it, and the greedy outputs stay the
    engine's without speculation. A threshold of 1 verifies nothing (no probability reaches
    it), 0.5 fewer drafts than verifying every one; the adaptive schedule, on tables that make
    verifying cheap, verifies some."""
    want, every = references
    llm = LLM("tiny", max_num_seqs=4, speculative_config={**SPEC, **options})
    assert _greedy(llm) == want
    runner = llm.engine.spec
    assert runner is not None
    if options.get("confidence_threshold") == 1.0:
        assert runner.num_drafts == 0
    elif "confidence_threshold" in options:
        assert 0 < runner.num_drafts < every
    else:
        assert runner.num_drafts > 0
