"""Prefix cache, seeded sampling, n > 1, stops, logprobs, bad input and abort."""

from __future__ import annotations

import pytest
import torch
from reference import greedy_reference, random_prompts

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling.rng import sample_seed
from deepinfer.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=5)


def engine_for(model, tokenizer, **options) -> LLMEngine:  # type: ignore[no-untyped-def]
    return LLMEngine(model, tokenizer, EngineConfig(**options))


def generate(engine: LLMEngine, prompts, params) -> list:  # type: ignore[no-untyped-def]
    ids = [engine.add_request(p, params) for p in prompts]
    final = engine.run(ids)
    return [final[i] for i in ids]


# 100: the blocks end inside and at the ends of chunks; 8192: a prompt runs as one chunk and
# both of its blocks are recorded from states handed back by that one forward.
@pytest.mark.parametrize("budget", [100, 8192])
def test_prefix_cache_hit_equals_cold_run_and_skips_prefill(model, tokenizer, budget) -> None:  # type: ignore[no-untyped-def]
    shared = random_prompts(1, 300, 300, seed=5)[0]
    a = [*shared, 11, 12, 13]
    b = [*shared, 21, 22]
    engine = engine_for(model, tokenizer, max_num_batched_tokens=budget)
    (out_a,) = generate(engine, [a], GREEDY)
    assert out_a.metrics.num_cached_tokens == 0
    computed: list[int] = []
    # Every forward path (chunk, packed, decode batch) embeds exactly the tokens it runs.
    handle = model.embed.register_forward_hook(
        lambda m, args, out: computed.append(args[0].numel())
    )
    try:
        out_b, out_a2 = generate(engine, [b, a], GREEDY)
    finally:
        handle.remove()
    assert out_b.outputs[0].token_ids == greedy_reference(model, b, 5, eos=1)
    assert out_a2.outputs[0].token_ids == out_a.outputs[0].token_ids
    # Two full 128-token blocks of the shared prefix were restored, not recomputed.
    assert out_b.metrics.num_cached_tokens == 256
    assert out_a2.metrics.num_cached_tokens == 256
    assert sum(computed) == (len(b) - 256) + (len(a) - 256) + 2 * 4  # prefill rest + 4 decodes
    stats = engine.prefix_cache.stats
    assert stats.hits == 512 and stats.queries == len(a) + len(b) + len(a)


def test_reset_prefix_cache_forgets_every_block(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = random_prompts(1, 260, 260, seed=8)[0]
    engine = engine_for(model, tokenizer)
    (first,) = generate(engine, [prompt], GREEDY)
    (hit,) = generate(engine, [prompt], GREEDY)
    assert hit.metrics.num_cached_tokens == 256
    assert engine.reset_prefix_cache()
    assert engine.prefix_cache.used_bytes == 0 and not engine.prefix_cache.blocks
    (cold,) = generate(engine, [prompt], GREEDY)
    assert cold.metrics.num_cached_tokens == 0
    assert first.outputs[0].token_ids == hit.outputs[0].token_ids == cold.outputs[0].token_ids
    assert not engine_for(model, tokenizer, enable_prefix_caching=False).reset_prefix_cache()


def test_prefix_cache_eviction_keeps_outputs_exact(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts(4, 260, 300, seed=6)
    prompts += [[*p[:200], 5, 6, 7] for p in prompts]
    expected = [greedy_reference(model, p, 5, eos=1) for p in prompts]
    engine = engine_for(model, tokenizer, prefix_cache_bytes=300_000, max_num_seqs=2)
    outs = generate(engine, prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert engine.prefix_cache.stats.evicted_blocks > 0
    assert engine.prefix_cache.used_bytes <= 300_000


def test_prefix_hits_share_the_cached_entry_pages(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A cached block holds its entry page, and a request restored from it maps its first
    blocks to those very pages instead of copies; outputs stay a cold run's."""
    shared = random_prompts(1, 300, 300, seed=5)[0]
    engine = engine_for(model, tokenizer)
    table = engine.slots.page_table
    generate(engine, [[*shared, 11]], GREEDY)
    cached = [b.page for b in engine.prefix_cache.blocks.values()]
    assert len(cached) == 2 and None not in cached
    assert table.num_free == table.max_pages - 2  # the finished request's other page is back
    prompt = [*shared, 21, 22]
    rid = engine.add_request(prompt, GREEDY)
    engine.step()  # admitted from the cache, the rest prefilled
    (req,) = engine.scheduler.running
    assert req.metrics.num_cached_tokens == 256
    assert table.pages_of(req.state.layers[0].swa.slot)[:2] == cached
    final = engine.run([rid])
    assert final[rid].outputs[0].token_ids == greedy_reference(model, prompt, 5, eos=1)


def test_cached_pages_are_reclaimed_when_the_pool_runs_short(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Cached blocks' pages live in the state pool's memory: when a running request needs a
    page and none is free, the least recently used blocks give theirs back."""
    from deepinfer.cache.pools import state_bytes

    prompts = random_prompts(12, 260, 300, seed=11)
    budget = 2 * state_bytes(model.cfg, model.dtype, 384)  # two 3-page sequences, ~17 pages
    engine = engine_for(model, tokenizer, state_memory_bytes=budget, max_num_seqs=2)
    table = engine.slots.page_table
    assert table.max_pages < 2 * len(prompts)  # every prompt leaves two cached pages behind
    outs = generate(engine, prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [
        greedy_reference(model, p, 5, eos=1) for p in prompts
    ]
    assert engine.prefix_cache.stats.evicted_blocks > 0
    held = [b.page for b in engine.prefix_cache.blocks.values() if b.page is not None]
    assert len(held) == len(engine.prefix_cache.blocks)  # every block was recorded in pages
    assert table.num_free == table.max_pages - len(held)  # the rest are free again


SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=12, top_p=0.95)


def test_seeded_sampling_ignores_batch_and_chunking(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (prompt,) = random_prompts(1, 140, 140, seed=8)
    alone = generate(engine_for(model, tokenizer), [prompt], SEEDED)[0].outputs[0].token_ids
    others = random_prompts(5, 3, 90, seed=9)
    for options in (
        {"max_num_batched_tokens": 5},
        {"max_num_batched_tokens": 37, "max_num_seqs": 3},
    ):
        engine = engine_for(model, tokenizer, **options)
        noisy = SamplingParams(temperature=1.0, max_tokens=12)
        ids = [engine.add_request(p, noisy) for p in others[:2]]
        target = engine.add_request(prompt, SEEDED)
        ids += [engine.add_request(p, noisy) for p in others[2:]]
        final = engine.run([target, *ids])
        assert final[target].outputs[0].token_ids == alone


def test_n_samples_share_the_prefill(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (prompt,) = random_prompts(1, 60, 60, seed=10)
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6)
    engine = engine_for(model, tokenizer)
    seen: list[int] = []
    handle = model.embed.register_forward_hook(lambda m, args, out: seen.append(args[0].numel()))
    try:
        (out,) = generate(engine, [prompt], params)
    finally:
        handle.remove()
    assert sum(seen) == len(prompt) + 3 * 5  # one prefill, then five decodes per sample
    for i, sample in enumerate(out.outputs):
        single = SamplingParams(temperature=1.0, seed=sample_seed(11, i), max_tokens=6)
        (alone,) = generate(engine_for(model, tokenizer), [prompt], single)
        assert sample.token_ids == alone.outputs[0].token_ids
    assert len({tuple(s.token_ids) for s in out.outputs}) == 3


def test_n_samples_share_the_prompts_full_entry_pages(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Past 256 tokens the prompt's first two entry pages are full: the samples map them
    instead of copying, and each still decodes as it would alone."""
    (prompt,) = random_prompts(1, 300, 300, seed=12)
    params = SamplingParams(n=3, temperature=1.0, seed=13, max_tokens=6)
    engine = engine_for(model, tokenizer, enable_prefix_caching=False)
    table = engine.slots.page_table
    rid = engine.add_request(prompt, params)
    while len(engine.scheduler.running) < 3:
        engine.step()
    pages = [table.pages_of(r.state.layers[0].swa.slot) for r in engine.scheduler.running]
    assert pages[0][:2] == pages[1][:2] == pages[2][:2]
    assert len({p[2] for p in pages}) == 3  # the partial third page is each one's own
    out = engine.run([rid])[rid]
    for i, sample in enumerate(out.outputs):
        single = SamplingParams(temperature=1.0, seed=sample_seed(13, i), max_tokens=6)
        (alone,) = generate(engine_for(model, tokenizer), [prompt], single)
        assert sample.token_ids == alone.outputs[0].token_ids
    assert table.num_free == table.max_pages


def test_n_samples_extend_the_prompts_prefix_cache_chain(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Samples forked after a prompt of more than one block record the next block each
    completes on the prompt's chain, and decode as they would alone."""
    (prompt,) = random_prompts(1, 250, 250, seed=14)
    params = SamplingParams(n=2, temperature=1.0, seed=15, max_tokens=10)
    engine = engine_for(model, tokenizer)
    (out,) = generate(engine, [prompt], params)
    for i, sample in enumerate(out.outputs):
        assert sample.finish_reason == "length"
        single = SamplingParams(temperature=1.0, seed=sample_seed(15, i), max_tokens=10)
        (alone,) = generate(engine_for(model, tokenizer), [prompt], single)
        assert sample.token_ids == alone.outputs[0].token_ids
    assert engine.prefix_cache.stats.inserted_blocks == 3  # the prompt's first, each one's second


def test_stop_conditions(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (prompt,) = random_prompts(1, 30, 30, seed=12)
    ref = greedy_reference(model, prompt, 10)
    engine = engine_for(model, tokenizer)

    (out,) = generate(engine, [prompt], SamplingParams(temperature=0, stop_token_ids=[ref[3]]))
    c = out.outputs[0]
    assert c.token_ids == ref[: ref.index(ref[3]) + 1]
    assert (c.finish_reason, c.stop_reason) == ("stop", ref[3])

    full_text = tokenizer.decode(ref, skip_special_tokens=True)
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 2]
    (out,) = generate(engine, [prompt], SamplingParams(temperature=0, max_tokens=10, stop=[stop]))
    c = out.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)
    assert c.text == full_text[: full_text.index(stop)]

    (out,) = generate(engine, [prompt], SamplingParams(temperature=0, max_tokens=4))
    assert out.outputs[0].token_ids == ref[:4] and out.outputs[0].finish_reason == "length"


def test_min_tokens_bans_stop_tokens(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (prompt,) = random_prompts(1, 30, 30, seed=13)
    ref = greedy_reference(model, prompt, 2)
    engine = engine_for(model, tokenizer)
    params = SamplingParams(temperature=0, max_tokens=3, min_tokens=3, stop_token_ids=[ref[1]])
    (out,) = generate(engine, [prompt], params)
    logits = model.forward_logits(torch.tensor([prompt + ref[:1]]))[0, -1]
    logits[ref[1]] = float("-inf")
    logits[1] = float("-inf")  # EOS is banned as well
    assert out.outputs[0].token_ids[:2] == [ref[0], int(torch.argmax(logits))]


def test_logprobs_match_the_full_forward(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (prompt,) = random_prompts(1, 40, 40, seed=14)
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=3, prompt_logprobs=2)
    (out,) = generate(engine_for(model, tokenizer, max_num_batched_tokens=16), [prompt], params)
    c = out.outputs[0]
    ids = prompt + c.token_ids
    ref = torch.log_softmax(model.forward_logits(torch.tensor([ids]))[0].double(), dim=-1)
    for step, entry in enumerate(c.logprobs):
        row = ref[len(prompt) - 1 + step]
        top = torch.argsort(-row, stable=True)[:3].tolist()
        assert set(entry) == {c.token_ids[step], *top}
        for token, lp in entry.items():
            assert lp == pytest.approx(float(row[token]), abs=1e-4)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        entry = out.prompt_logprobs[pos]
        assert entry[prompt[pos]] == pytest.approx(float(ref[pos - 1, prompt[pos]]), abs=1e-4)


@pytest.mark.parametrize(
    ("prompt", "field"),
    [([], "prompt"), ([5, 99_999], "prompt"), ([-1], "prompt"), (list(range(3, 5000)), "prompt")],
)
def test_bad_requests_fail_alone(model, tokenizer, prompt, field) -> None:  # type: ignore[no-untyped-def]
    engine = engine_for(model, tokenizer)
    good = random_prompts(2, 10, 20, seed=15)
    ids = [engine.add_request(good[0], GREEDY)]
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(prompt, GREEDY)
    assert err.value.field == field
    ids.append(engine.add_request(good[1], GREEDY))
    final = engine.run(ids)
    for p, i in zip(good, ids, strict=True):
        assert final[i].outputs[0].token_ids == greedy_reference(model, p, 5, eos=1)


def test_logit_bias_and_allowed_token_ids_steer_greedy(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Against the plain loop with the parameters' effect written out on the logits."""
    prompts = random_prompts(3, 10, 30, seed=21)
    bias = {123: 4.0, 789: 4.5, 2000: 3.0}
    allowed = [7, 70, 700, 4000, 5555]
    steps = 6

    def biased(logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        for token, value in bias.items():
            out[token] += value
        return out

    def only_allowed(logits: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(logits, float("-inf"))
        out[allowed] = logits[allowed]
        return out

    base = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    params = [
        SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logit_bias=bias),
        SamplingParams(
            temperature=0.0, max_tokens=steps, ignore_eos=True, allowed_token_ids=allowed
        ),
        base,
    ]
    engine = engine_for(model, tokenizer)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    final = engine.run(ids)
    got = [final[i].outputs[0].token_ids for i in ids]
    assert got[0] == greedy_reference(model, prompts[0], steps, adjust=biased)
    assert got[0] != greedy_reference(model, prompts[0], steps), "the bias changed nothing"
    assert got[1] == greedy_reference(model, prompts[1], steps, adjust=only_allowed)
    assert set(got[1]) <= set(allowed)
    assert got[2] == greedy_reference(model, prompts[2], steps)
    # A stop token that is all allowed_token_ids permits is not banned by min_tokens.
    params = SamplingParams(temperature=0.0, max_tokens=3, min_tokens=2, allowed_token_ids=[1])
    (out,) = generate(engine, prompts[:1], params)
    assert out.outputs[0].token_ids == [1] and out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("span", [(1, 2), (4, 6)], ids=["one-token", "two-token"])
def test_bad_words_are_never_completed(model, tokenizer, async_scheduling, span) -> None:  # type: ignore[no-untyped-def]
    """vLLM's rule against the plain loop: each word is tokenized as is and after a space, and
    a sequence's last token is banned where the output so far ends with the rest of it."""
    (prompt,) = random_prompts(1, 10, 20, seed=24)
    steps = 10
    free = greedy_reference(model, prompt, steps)
    # A word the unconstrained output would produce (a two-token one is banned only once the
    # output has reached its first token).
    words = [tokenizer.decode(free[span[0] : span[1]])]
    sequences = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if ids and ids not in sequences:
                sequences.append(ids)
    out: list[int] = []

    def ban(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        for seq in sequences:
            head = seq[:-1]
            if not head or out[len(out) - len(head) :] == head:
                logits[seq[-1]] = float("-inf")
        return logits

    def adjust(logits: torch.Tensor) -> torch.Tensor:  # the loop appends after each call
        result = ban(logits)
        out.append(int(torch.argmax(result)))
        return result

    want = greedy_reference(model, prompt, steps, adjust=adjust)
    engine = engine_for(model, tokenizer, async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, bad_words=words)
    (got,) = generate(engine, [prompt], params)
    assert got.outputs[0].token_ids == want
    assert want != free


def test_truncate_prompt_tokens_keeps_the_last_tokens(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A prompt past max_model_len runs once truncated, as the plain loop over its tail."""
    engine = engine_for(model, tokenizer, max_model_len=256)
    (long,) = random_prompts(1, 400, 400, seed=23)
    params = SamplingParams(temperature=0.0, max_tokens=5, truncate_prompt_tokens=100)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        engine.add_request(long, GREEDY)
    (out,) = generate(engine, [long], params)
    assert out.prompt_token_ids == long[-100:]
    assert out.outputs[0].token_ids == greedy_reference(model, long[-100:], 5, eos=1)


@pytest.mark.parametrize("field", ["stop_token_ids", "logit_bias", "allowed_token_ids"])
def test_token_ids_past_the_vocabulary_fail_alone(model, tokenizer, field) -> None:  # type: ignore[no-untyped-def]
    engine = engine_for(model, tokenizer)
    good = random_prompts(1, 10, 20, seed=22)[0]
    first = engine.add_request(good, GREEDY)
    value = {10**6: 1.0} if field == "logit_bias" else [10**6]
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request([5, 6], SamplingParams(**{field: value}))
    assert err.value.field == field
    assert engine.run([first])[first].outputs[0].token_ids == greedy_reference(
        model, good, 5, eos=1
    )


def test_duplicate_request_id_and_bad_stop_id(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = engine_for(model, tokenizer)
    engine.add_request([5, 6], GREEDY, request_id="x")
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request([5, 6], GREEDY, request_id="x")
    with pytest.raises(InvalidRequestError):
        engine.add_request([5, 6], SamplingParams(stop_token_ids=[10**6]))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_abort_keeps_other_requests(model, tokenizer, async_scheduling) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts(2, 20, 30, seed=16)
    engine = engine_for(model, tokenizer, async_scheduling=async_scheduling)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    a = engine.add_request(prompts[0], long)
    b = engine.add_request(prompts[1], GREEDY)
    for _ in range(3):
        engine.step()
    assert any(r.num_inflight for r in engine.groups[a]) == async_scheduling
    aborted = engine.abort_request(a)
    assert aborted is not None and aborted.finished
    assert aborted.outputs[0].finish_reason == "abort"
    final = engine.run([b])
    assert final[b].outputs[0].token_ids == greedy_reference(model, prompts[1], 5, eos=1)
    assert not engine.has_unfinished_requests() and engine.pool.used_bytes == 0
    assert engine.slots.num_used == 0


def test_abort_after_the_slot_tensors_grew(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Slot and page tensors that grow inside a step are made in inference mode; aborting
    their requests from outside a step must still release them (it once raised)."""
    prompts = random_prompts(12, 5, 20, seed=17)
    engine = engine_for(model, tokenizer)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    ids = [engine.add_request(p, long) for p in prompts[:-1]]
    kept = engine.add_request(prompts[-1], GREEDY)
    for _ in range(3):
        engine.step()
    assert engine.slots.page_table is not None and engine.slots.page_table.table.is_inference()
    for i in ids:
        assert engine.abort_request(i) is not None
    final = engine.run([kept])
    assert final[kept].outputs[0].token_ids == greedy_reference(model, prompts[-1], 5, eos=1)
    assert engine.slots.num_used == 0
