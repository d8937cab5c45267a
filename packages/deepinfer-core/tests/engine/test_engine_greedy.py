"""Engine outputs against a token-by-token loop over forward_logits."""

from __future__ import annotations

import pytest
from reference import SCHEDULES, greedy_reference, random_prompts

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.sampling_params import SamplingParams

MAX_TOKENS = 6
PROMPTS = random_prompts(6, 5, 150, seed=0)


@pytest.fixture(scope="module")
def expected(model) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [greedy_reference(model, p, MAX_TOKENS, eos=1) for p in PROMPTS]


def run(model, tokenizer, prompts, **options) -> list[list[int]]:  # type: ignore[no-untyped-def]
    engine = LLMEngine(model, tokenizer, EngineConfig(**options))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    ids = [engine.add_request(p, params) for p in prompts]
    final = engine.run()
    assert not engine.has_unfinished_requests()
    assert engine.pool.used_bytes == 0
    return [final[i].outputs[0].token_ids for i in ids]


@pytest.mark.parametrize("options", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_greedy_matches_reference(model, tokenizer, expected, options) -> None:  # type: ignore[no-untyped-def]
    assert run(model, tokenizer, PROMPTS, **options) == expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_by_a_small_pool_keeps_outputs(model, tokenizer, async_scheduling) -> None:  # type: ignore[no-untyped-def]
    from deepinfer.cache.pools import state_bytes

    prompts = random_prompts(5, 18, 22, seed=1)
    expected = [greedy_reference(model, p, 40, eos=1) for p in prompts]
    # Three 30-token sequences fit; three requests admitted at ~20 tokens outgrow the pool.
    budget = 3 * state_bytes(model.cfg, model.dtype, 30)
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(
            max_num_seqs=8,
            max_num_batched_tokens=64,
            state_memory_bytes=budget,
            async_scheduling=async_scheduling,  # preempted with a token in flight
        ),
    )
    params = SamplingParams(temperature=0.0, max_tokens=40)
    ids = [engine.add_request(p, params) for p in prompts]
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        assert engine.pool.used_bytes <= budget
        # The running total is the sum of what each running request is charged for its length.
        assert engine.pool.used_bytes == sum(
            state_bytes(model.cfg, model.dtype, r.num_computed_tokens)
            for r in engine.scheduler.running
        )
    assert [outputs[i].outputs[0].token_ids for i in ids] == expected
    assert sum(o.metrics.num_preemptions for o in outputs.values()) > 0
