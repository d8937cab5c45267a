"""Priorities: lower values are admitted first and preempted last; ties go by arrival."""

from __future__ import annotations

import pytest
from reference import greedy_reference, random_prompts

from deepinfer import LLM
from deepinfer.cache.pools import state_bytes
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams


def test_waiting_requests_are_admitted_by_priority_then_arrival(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=1))
    params = SamplingParams(temperature=0.0, max_tokens=2)
    ranks = [1, 0, 0, -2]
    ids = [
        engine.add_request(p, params, priority=r)
        for p, r in zip(random_prompts(4, 5, 9, seed=2), ranks, strict=True)
    ]
    final = engine.run()
    started = [final[i].metrics.first_scheduled_time for i in ids]
    assert sorted(range(4), key=lambda i: started[i]) == [3, 1, 2, 0]


def test_preemption_takes_the_lowest_priority_request(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts(3, 100, 100, seed=3)
    cfg, dtype = model.cfg, model.dtype
    # All three fit at admission (one 128-token entry page each); past 128 tokens, two pages
    # each, only two do.
    budget = max(3 * state_bytes(cfg, dtype, 128), 2 * state_bytes(cfg, dtype, 256))
    assert 3 * state_bytes(cfg, dtype, 256) > budget
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(max_num_seqs=3, max_num_batched_tokens=64, state_memory_bytes=budget),
    )
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    # The worst priority arrives first, so arrival order alone would spare it.
    ranks = [5, 0, 0]
    ids = [engine.add_request(p, params, priority=r) for p, r in zip(prompts, ranks, strict=True)]
    final = engine.run()
    preemptions = [final[i].metrics.num_preemptions for i in ids]
    assert preemptions[0] > 0 and preemptions[1:] == [0, 0]
    want = [greedy_reference(model, p, 40, eos=None) for p in prompts]
    assert [final[i].outputs[0].token_ids for i in ids] == want


def test_a_victim_already_scheduled_this_step_leaves_the_step(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The worst-priority request can be scheduled before a better one that cannot grow; when
    it is then preempted its state is gone, so it must not run in that step."""
    prompts = random_prompts(2, 20, 20, seed=4)
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=2))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    a = engine.add_request(prompts[0], params, priority=5)
    engine.step()  # a runs first, so it comes first in the running list
    b = engine.add_request(prompts[1], params, priority=0)
    engine.step()
    (req_a,), (req_b,) = engine.groups[a], engine.groups[b]
    grow, schedule = engine.pool.try_reserve, engine.scheduler.schedule
    engine.pool.try_reserve = lambda rid, n: (  # type: ignore[method-assign]
        False if rid == req_b.request_id and req_a.state is not None else grow(rid, n)
    )
    seen = []
    engine.scheduler.schedule = lambda: seen.append(schedule()) or seen[-1]  # type: ignore[method-assign]
    engine.step()  # a would run without a state
    engine.pool.try_reserve, engine.scheduler.schedule = grow, schedule  # type: ignore[method-assign]
    (out,) = seen
    assert out.preempted == [req_a] and req_a not in out.scheduled and req_b in out.scheduled
    final = engine.run()
    want = [greedy_reference(model, p, 12, eos=None) for p in prompts]
    assert [final[i].outputs[0].token_ids for i in (a, b)] == want


def test_llm_generate_takes_one_priority_per_prompt() -> None:
    llm = LLM("tiny", device="cpu", max_num_seqs=1)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    outs = llm.generate(["ROMEO:", "JULIET:"], params, priority=[3, -1], use_tqdm=False)
    assert outs[1].metrics.first_scheduled_time < outs[0].metrics.first_scheduled_time
    for bad in ([0], [0, "1"], [0, True]):
        with pytest.raises(InvalidRequestError, match="priority"):
            llm.generate(["a", "b"], params, priority=bad, use_tqdm=False)  # type: ignore[arg-type]
