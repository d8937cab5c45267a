"""One request never breaks the engine: a failure inside a step aborts the request that caused
it, and only that one; the others' tokens equal the token-by-token reference; the engine keeps
serving and holds nothing afterwards.

Requests are validated when added, so every failure here is injected (a model, sampler or
detokenizer that raises for one request): isolation is the last line of defence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from reference import greedy_reference, random_prompts

from deepinfer.cache.pools import StatePool
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
#: A token id that makes the injected model fault whenever it is fed.
POISON = 4242


def run(engine: LLMEngine, prompts: list[list[int]], params: Any) -> list[RequestOutput]:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    final = engine.run()
    assert not engine.has_unfinished_requests()
    assert engine.pool.used_bytes == 0 and not engine.groups
    return [final[i] for i in ids]


def poison_forwards(engine: LLMEngine) -> None:
    """Make every forward that feeds :data:`POISON` raise, as a model bug would."""
    model = engine.model

    def guard(fn: Callable[..., Any], ids_of: Callable[..., list[torch.Tensor]]) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if any(bool((t == POISON).any()) for t in ids_of(*args)):
                raise RuntimeError("poisoned token in the batch")
            return fn(*args, **kwargs)

        return wrapped

    # Every step goes through the model's one forward; an instance attribute shadows it.
    model.forward = guard(model.forward, lambda batch, *_: [batch.input_ids])  # type: ignore[method-assign]


@pytest.fixture
def fresh_model(model):  # type: ignore[no-untyped-def]
    """The session's model with the instance patches of a test removed afterwards."""
    yield model
    model.__dict__.pop("forward", None)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_failing_forward_aborts_only_its_request(
    fresh_model, tokenizer, async_scheduling: bool, where: str
) -> None:  # type: ignore[no-untyped-def]
    model = fresh_model
    prompts = random_prompts(5, 20, 40, seed=3)
    prompts = [[t if t != POISON else 5 for t in p] for p in prompts]
    expected = [greedy_reference(model, p, 6) for p in prompts]
    bad = 2
    if where == "prefill":
        prompts[bad] = [*prompts[bad][:10], POISON, *prompts[bad][10:]]
        params: Any = GREEDY
    else:  # the poisoned token is the request's first output: it fails when fed back
        params = [GREEDY] * 5
        params[bad] = SamplingParams(temperature=0.0, max_tokens=6, allowed_token_ids=[POISON])
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, async_scheduling=async_scheduling),
    )
    poison_forwards(engine)
    outs = run(engine, prompts, params)
    for i, out in enumerate(outs):
        c = out.outputs[0]
        if i == bad:
            assert c.finish_reason == "abort"
            assert c.error is not None and "poisoned token" in c.error
        else:
            assert c.error is None
            assert c.token_ids == expected[i], i
    # The engine keeps serving, as if nothing had happened.
    again = run(engine, prompts[:2], GREEDY)
    assert [o.outputs[0].token_ids for o in again] == expected[:2]


def test_a_failing_sampler_aborts_only_its_request(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts(4, 10, 30, seed=4)
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=8))
    build = engine.runner._sampling_tensors

    def sampling_tensors(reqs, device):  # type: ignore[no-untyped-def]
        if any(r.params.min_p == 0.125 for r in reqs):
            raise ValueError("sampler cannot take this request")
        return build(reqs, device)

    engine.runner._sampling_tensors = sampling_tensors  # type: ignore[method-assign]
    params = [GREEDY] * 4
    params[1] = SamplingParams(temperature=0.0, max_tokens=6, min_p=0.125)
    outs = run(engine, prompts, params)
    assert outs[1].outputs[0].finish_reason == "abort"
    assert "sampler cannot take this request" in (outs[1].outputs[0].error or "")
    for i in (0, 2, 3):
        assert outs[i].outputs[0].token_ids == greedy_reference(model, prompts[i], 6)


def test_a_failing_detokenizer_aborts_only_its_request(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Host-side work on one request's token (detokenizing, stop checks, a grammar) fails
    that request alone, without rerunning anything."""
    prompts = random_prompts(3, 10, 30, seed=5)
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=8))
    update = engine.detokenizer.update

    def flaky(req):  # type: ignore[no-untyped-def]
        if req.params.seed == 99 and len(req.output_token_ids) == 3:
            raise UnicodeError("cannot decode")
        return update(req)

    engine.detokenizer.update = flaky  # type: ignore[method-assign]
    params = [GREEDY, SamplingParams(temperature=0.0, max_tokens=6, seed=99), GREEDY]
    outs = run(engine, prompts, params)
    bad = outs[1].outputs[0]
    assert bad.finish_reason == "abort" and "cannot decode" in (bad.error or "")
    assert bad.token_ids == greedy_reference(model, prompts[1], 3)  # work up to the error kept
    for i in (0, 2):
        assert outs[i].outputs[0].token_ids == greedy_reference(model, prompts[i], 6)


def test_integer_logit_bias_and_zero_logprobs(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """OpenAI clients send integer biases ({"50256": -100}) and ``logprobs=0`` (the sampled
    token's logprob only); both once failed inside the step and broke the engine."""
    prompts = random_prompts(2, 10, 20, seed=6)
    first = greedy_reference(model, prompts[0], 1)[0]
    engine = LLMEngine(model, tokenizer, EngineConfig())
    banned = SamplingParams(temperature=0.0, max_tokens=4, logit_bias={str(first): -100})
    zero = SamplingParams(temperature=0.0, max_tokens=4, logprobs=0)
    outs = run(engine, prompts, [banned, zero])

    def minus_first(logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        out[first] -= 100
        return out

    assert outs[0].outputs[0].token_ids == greedy_reference(
        model, prompts[0], 4, adjust=minus_first
    )
    got = outs[1].outputs[0]
    assert got.token_ids == greedy_reference(model, prompts[1], 4)
    assert got.logprobs is not None and [list(e) for e in got.logprobs] == [
        [t] for t in got.token_ids
    ]
    # The first logprob against a float64 recomputation from the model's logits.
    logits = model.forward_logits(torch.tensor([prompts[1]]))[0, -1].double()
    want = torch.log_softmax(logits, -1)[got.token_ids[0]].item()
    assert got.logprobs[0][got.token_ids[0]] == pytest.approx(want, abs=1e-4)


# -- the state budget ------------------------------------------------------------------------


def test_budget_below_one_request_is_refused_at_start(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    fixed = StatePool(model.cfg, model.dtype, 1).bytes_for(2)
    with pytest.raises(InvalidRequestError) as err:
        LLMEngine(model, tokenizer, EngineConfig(state_memory_bytes=fixed - 1))
    assert err.value.field == "state_memory_bytes"


def test_max_model_len_must_fit_the_budget_and_the_model(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    pool = StatePool(model.cfg, model.dtype, 1)
    budget = pool.bytes_for(256)  # one sequence of at most 256 tokens
    with pytest.raises(InvalidRequestError, match="bytes of state") as err:
        LLMEngine(model, tokenizer, EngineConfig(state_memory_bytes=budget, max_model_len=1024))
    assert err.value.field == "max_model_len"
    with pytest.raises(InvalidRequestError, match="max_position_embeddings"):
        LLMEngine(model, tokenizer, EngineConfig(max_model_len=10**7))
    # By default the length follows the budget instead, and says so in every refusal.
    engine = LLMEngine(model, tokenizer, EngineConfig(state_memory_bytes=budget))
    n = engine.max_model_len
    assert pool.bytes_for(n) <= budget < pool.bytes_for(n + 1)
    with pytest.raises(InvalidRequestError, match=f"max_model_len is {n}"):
        engine.add_request(list(range(3, n + 3)), GREEDY)
    assert not engine.has_unfinished_requests()


def test_requests_that_fit_always_finish_whole(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Each request alone needs most of the budget: they take turns by preemption, and each
    gets every token it asked for (never a silent "length")."""
    pool = StatePool(model.cfg, model.dtype, 1)
    # Two requests fit while they hold one entry page each, not once they need two.
    budget = 2 * pool.bytes_for(128)
    assert 2 * pool.bytes_for(160) > budget
    engine = LLMEngine(model, tokenizer, EngineConfig(state_memory_bytes=budget, max_num_seqs=4))
    prompts = random_prompts(3, 100, 120, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs = run(engine, prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].finish_reason == "length" and out.outputs[0].error is None
        assert out.outputs[0].token_ids == greedy_reference(model, prompt, 40)
    assert sum(o.metrics.num_preemptions for o in outs if o.metrics) > 0
