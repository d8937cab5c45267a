"""Batch-invariant mode: a request's logits are bitwise the same alone or in any batch."""

from __future__ import annotations

import random

import torch
from reference import random_prompts

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.sampling_params import SamplingParams


def run_with_noise(model, tokenizer, target, params, *, n_others, budget, seed):  # type: ignore[no-untyped-def]
    """Run ``target`` among ``n_others`` random requests; return its logits rows and output."""
    rnd = random.Random(seed)
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(
            batch_invariant=True, max_num_batched_tokens=budget, max_num_seqs=rnd.randint(1, 33)
        ),
    )
    others = random_prompts(n_others, 2, 10, seed=seed)
    noise = SamplingParams(temperature=1.0, max_tokens=2)
    split = rnd.randint(0, n_others)
    ids = [engine.add_request(p, noise) for p in others[:split]]
    target_id = engine.add_request(target, params)
    ids += [engine.add_request(p, noise) for p in others[split:]]
    rows: list[torch.Tensor] = []
    launch = engine.runner.launch_sample

    def capture(due):  # type: ignore[no-untyped-def]
        rows.extend(
            logits[i].clone()
            for batch, logits in due
            for i, req in enumerate(batch)
            if req.group_id == target_id
        )
        return launch(due)

    engine.runner.launch_sample = capture  # type: ignore[method-assign]
    final = engine.run([target_id, *ids])
    return rows, final[target_id].outputs[0].token_ids


def test_logits_bitwise_equal_alone_and_in_random_batches(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (target,) = random_prompts(1, 30, 30, seed=20)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    alone, tokens = run_with_noise(
        model, tokenizer, target, params, n_others=0, budget=4096, seed=0
    )
    assert len(alone) == 4
    for n_others, budget, seed in ((1, 3, 1), (7, 17, 2), (32, 64, 3)):
        rows, got = run_with_noise(
            model, tokenizer, target, params, n_others=n_others, budget=budget, seed=seed
        )
        assert got == tokens
        assert all(torch.equal(a, b) for a, b in zip(alone, rows, strict=True))


def test_seeded_sampling_100_times_in_varied_batches_is_one_completion(model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (target,) = random_prompts(1, 8, 8, seed=21)
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=6)
    rnd = random.Random(0)
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(batch_invariant=True, max_num_seqs=16, max_num_batched_tokens=24),
    )
    noise = SamplingParams(temperature=1.0, max_tokens=2)
    targets = []
    for i in range(100):
        for p in random_prompts(rnd.randint(0, 1), 2, 6, seed=100 + i):
            engine.add_request(p, noise)
        targets.append(engine.add_request(target, params))
    final = engine.run()
    completions = {tuple(final[t].outputs[0].token_ids) for t in targets}
    assert len(completions) == 1
