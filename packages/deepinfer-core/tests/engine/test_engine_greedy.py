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
    from deepinfer.paging import PAGE_TOKENS

    prompts = random_prompts(5, 100, 120, seed=1)
    expected = [greedy_reference(model, p, 40, eos=1) for p in prompts]
    # Three sequences of up to 128 tokens (one entry page each) fit; past 128 tokens a
    # sequence needs a second page, so the pool runs out and preempts.
    budget = 3 * state_bytes(model.cfg, model.dtype, PAGE_TOKENS)
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
    table = engine.slots.page_table
    assert table is not None
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        assert engine.pool.used_bytes <= budget
        # Each running request is charged its state at its length rounded up to whole pages,
        # and holds no more pages than that.
        running = engine.scheduler.running
        pages = [-(-r.num_computed_tokens // PAGE_TOKENS) for r in running]
        assert engine.pool.used_bytes == sum(
            state_bytes(model.cfg, model.dtype, n * PAGE_TOKENS) for n in pages
        )
        for r, n in zip(running, pages, strict=True):
            assert r.state is not None
            assert len(table.pages_of(r.state.layers[0].swa.slot)) <= n
    assert [outputs[i].outputs[0].token_ids for i in ids] == expected
    assert sum(o.metrics.num_preemptions for o in outputs.values()) > 0
    # Every page is back, but those the prefix cache keeps for its blocks (a block recorded
    # while its last token was in flight keeps a copy instead).
    held = [b.page for b in engine.prefix_cache.blocks.values() if b.page is not None]
    assert table.num_free == table.max_pages - len(held)
