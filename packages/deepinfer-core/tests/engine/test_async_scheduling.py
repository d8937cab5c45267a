"""Asynchronous scheduling: step n+1 is queued before the host reads step n's tokens.

On the CPU nothing overlaps (every op runs in the calling thread), but the bookkeeping is the
same as on a GPU: decode rows feed tokens the host has not read, stops are seen a step late,
preemption and the prefix cache meet tokens in flight. Outputs must equal the token-by-token
reference and the synchronous engine, field by field. (Preemption and abort with tokens in
flight are the synchronous tests', run both ways.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reference import SCHEDULES, greedy_reference, random_prompts

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams


def engine_for(model, tokenizer, **options: Any) -> LLMEngine:  # type: ignore[no-untyped-def]
    return LLMEngine(model, tokenizer, EngineConfig(async_scheduling=True, **options))


def run(engine: LLMEngine, prompts: list[list[int]], params: Any) -> list[RequestOutput]:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    final = engine.run()
    assert not engine.has_unfinished_requests() and engine.pool.used_bytes == 0
    return [final[i] for i in ids]


def fields(out: RequestOutput) -> list[tuple[Any, ...]]:
    """What must match exactly. Logprobs match to float rounding: the extra step a late stop
    costs changes the batch size of a decode step, and a batched step sums in a
    batch-dependent order (batch_invariant exists for bitwise equality)."""
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]


def assert_same_outputs(got: list[RequestOutput], want: list[RequestOutput]) -> None:
    assert [fields(o) for o in got] == [fields(o) for o in want]
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert (x.logprobs is None) == (y.logprobs is None)
            for ex, ey in zip(x.logprobs or [], y.logprobs or [], strict=True):
                assert ex.keys() == ey.keys()
                assert all(ex[t] == pytest.approx(ey[t], abs=1e-4) for t in ex)


def count_inflight_decodes(engine: LLMEngine) -> list[int]:
    """Per decode step, how many rows fed a token the host had not read yet."""
    counts: list[int] = []
    decode = engine.runner._decode_ids

    def spy(reqs):  # type: ignore[no-untyped-def]
        counts.append(sum(1 for r in reqs if r.num_inflight))
        return decode(reqs)

    engine.runner._decode_ids = spy  # type: ignore[method-assign]
    return counts


@pytest.mark.parametrize("options", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_greedy_matches_reference(model, tokenizer, options) -> None:  # type: ignore[no-untyped-def]
    # Prompts of 118-126 tokens decode across the 128-token block boundary, whose block ends
    # with a token in flight.
    prompts = random_prompts(3, 5, 60, seed=30) + random_prompts(3, 118, 126, seed=31)
    expected = [greedy_reference(model, p, 12, eos=1) for p in prompts]
    engine = engine_for(model, tokenizer, **options)
    inflight = count_inflight_decodes(engine)
    outs = run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert sum(inflight) > 0  # the decode steps really ran ahead of the host


def test_prefix_cache_hit_and_block_recorded_during_decode(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A block that ends with a token in flight is snapshotted at the boundary and recorded
    when the token is read, without making the step wait for it."""
    (prompt,) = random_prompts(1, 120, 120, seed=32)
    engine = engine_for(model, tokenizer)
    waits: list[bool] = []
    needs_tokens = engine._needs_tokens
    engine._needs_tokens = lambda p: waits.append(needs_tokens(p)) or waits[-1]  # type: ignore[method-assign]
    (first,) = run(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=20))
    assert waits and not any(waits)
    assert engine.prefix_cache.stats.inserted_blocks == 1
    # The first 128 tokens (prompt + 8 generated) were recorded while decoding.
    again = [*prompt, *first.outputs[0].token_ids[:10]]
    (second,) = run(engine, [again], SamplingParams(temperature=0.0, max_tokens=5))
    assert second.metrics.num_cached_tokens == 128
    assert second.outputs[0].token_ids == greedy_reference(model, again, 5, eos=1)


def test_stops_are_seen_late_but_outputs_do_not_change(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts(4, 20, 40, seed=33)
    refs = [greedy_reference(model, p, 10) for p in prompts]
    text = tokenizer.decode(refs[1], skip_special_tokens=True)
    params = [
        SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[refs[0][3]]),
        SamplingParams(temperature=0, max_tokens=10, stop=[text[len(text) // 2 :][:2]]),
        SamplingParams(temperature=0, max_tokens=3),
        SamplingParams(temperature=0, max_tokens=6, min_tokens=4, stop_token_ids=[refs[3][1]]),
    ]
    sync = run(LLMEngine(model, tokenizer, EngineConfig()), prompts, params)
    engine = engine_for(model, tokenizer)
    inflight = count_inflight_decodes(engine)
    outs = run(engine, prompts, params)
    assert_same_outputs(outs, sync)
    assert outs[0].outputs[0].finish_reason == "stop"
    assert outs[1].outputs[0].stop_reason is not None
    assert sum(inflight) > 0


def test_seeded_sampling_logprobs_and_n_equal_the_synchronous_engine(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts(5, 3, 90, seed=34)
    params = [
        SamplingParams(temperature=1.0, seed=7, max_tokens=9, top_p=0.9, logprobs=2),
        SamplingParams(temperature=0.7, seed=8, max_tokens=7, top_k=5, min_p=0.05),
        SamplingParams(temperature=1.0, seed=9, max_tokens=6, n=3),
        SamplingParams(temperature=0.0, max_tokens=8, logprobs=1),
        SamplingParams(temperature=1.0, seed=10, max_tokens=8, presence_penalty=0.5),
    ]
    for options in ({}, {"max_num_batched_tokens": 11, "max_num_seqs": 3}):
        sync = run(LLMEngine(model, tokenizer, EngineConfig(**options)), prompts, params)
        outs = run(engine_for(model, tokenizer, **options), prompts, params)
        assert_same_outputs(outs, sync)


def test_penalties_see_the_token_in_flight(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A penalty depends on every generated token, so the step reads the last one first."""
    prompts = random_prompts(3, 10, 30, seed=36)
    expected = []
    for prompt in prompts:  # greedy under frequency_penalty=-2, as a plain loop
        out: list[int] = []
        for _ in range(10):
            logits = model.forward_logits(torch.tensor([prompt + out]))[0, -1].double()
            for t in out:
                logits[t] += 2.0
            out.append(int(torch.argmax(logits)))
        expected.append(out)
    assert expected != [greedy_reference(model, p, 10) for p in prompts]  # the penalty bites
    params = SamplingParams(temperature=0, max_tokens=10, frequency_penalty=-2.0, ignore_eos=True)
    outs = run(engine_for(model, tokenizer), prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_length_limits_with_a_token_in_flight(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A request whose in-flight token reaches max_tokens or max_model_len is not scheduled
    again (a step past max_model_len would outgrow its state)."""
    prompts = random_prompts(3, 30, 30, seed=35)
    engine = engine_for(model, tokenizer, max_model_len=40)
    calls: list[int] = []
    decode = engine.runner._decode_ids
    engine.runner._decode_ids = lambda reqs: calls.append(len(reqs)) or decode(reqs)  # type: ignore[method-assign]
    params = [
        SamplingParams(temperature=0, ignore_eos=True),
        SamplingParams(temperature=0, ignore_eos=True, max_tokens=4),
        SamplingParams(temperature=0, ignore_eos=True, max_tokens=7),
    ]
    outs = run(engine, prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [10, 4, 7]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    # The first token comes from the prefill; each further one costs one decode row, no more.
    assert sum(calls) == 9 + 3 + 6


def test_defaults_and_bad_combination(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert not LLMEngine(model, tokenizer).async_scheduling  # a CPU has nothing to overlap
    with pytest.raises(InvalidRequestError, match="async_scheduling"):
        LLMEngine(model, tokenizer, EngineConfig(async_scheduling=True, batch_invariant=True))


def test_a_step_with_nothing_to_run_fails_nothing(model, tokenizer, caplog) -> None:  # type: ignore[no-untyped-def]
    """When every running request waits only for its last token to reach the host (it
    finishes by length), the scheduler schedules nothing; that step reads the tokens and
    runs no model at all, rather than failing on an empty batch and logging an error."""
    engine = engine_for(model, tokenizer)
    prompts = random_prompts(2, 5, 9, seed=40)
    with caplog.at_level("ERROR", logger="deepinfer.engine.engine"):
        outs = run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=3))
    assert [o.outputs[0].token_ids for o in outs] == [
        greedy_reference(model, p, 3, eos=1) for p in prompts
    ]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
