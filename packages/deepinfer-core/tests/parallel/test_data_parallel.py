"""Attention data parallelism + MoE expert parallelism through ``LLM``: 2 ranks on the CPU (gloo).

One two-rank ``LLM`` (rank 0 in the test process, rank 1 spawned) serves most parity tests and
is compared with the single-process engine: greedy and seeded outputs token for token, with
chunked prefill, prefix-cache hits and requests arriving while others decode, and the per-expert
load the ranks count against a recount of the single process's router outputs. The fault,
preemption and V4 tests start their own runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import Tensor

from deepinfer import LLM, SamplingParams
from deepinfer.assets import TINY_TOKENIZER, random_tiny_model, tiny_config
from deepinfer.cache.prefix import BLOCK_SIZE
from deepinfer.dp.frontend import DataParallelEngine, DataParallelError
from deepinfer.models.layers.moe import MoE
from deepinfer.sampling_params import StructuredOutputsParams

#: Small enough that prompts above it are prefilled in several chunks.
CHUNK = 64
OPTIONS = {"max_num_batched_tokens": CHUNK, "seed": 3}
SHARED = [5 + (i * 37) % 900 for i in range(2 * BLOCK_SIZE)]
PROMPTS = [
    [11, 12, 13],
    [20 + i for i in range(40)],
    [*SHARED, 7, 8],
    [300 + (i * 13) % 500 for i in range(150)],
    [*SHARED, 9],
    [42] * 9,
    [*SHARED, 10, 11, 12],
]
GREEDY = SamplingParams(max_tokens=10, temperature=0)


# One worker runs the module: its process groups start one at a time, and the module fixture
# (two rank processes) is built once.
pytestmark = pytest.mark.xdist_group("data_parallel")

#: The fault tests bound steps by a few seconds, not the start-up of the ranks' processes.
STARTUP = {"dp_startup_timeout_s": 120.0}


def _tokens(outs: list) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


@pytest.fixture(scope="module")
def dp_llm() -> Iterator[LLM]:
    llm = LLM("tiny", data_parallel_size=2, enable_expert_parallel=True, dp_timeout_s=60, **OPTIONS)
    yield llm
    assert isinstance(llm.engine, DataParallelEngine)
    llm.engine.shutdown()
    assert not dist.is_initialized()


@pytest.fixture(scope="module")
def single() -> LLM:
    """The single-process engine the ranks are compared with: without the tiny model's default
    speculation, which ranks do not run (its verification rows route drafts too)."""
    return LLM("tiny", speculative_config=None, **OPTIONS)


def test_ranks_hold_half_the_routed_experts(dp_llm: LLM, single: LLM) -> None:
    held = dp_llm.engine.model.layers[0].ffn.experts.w13.shape[0]
    assert 2 * held == single.engine.model.layers[0].ffn.experts.w13.shape[0]


def test_greedy_outputs_equal_one_process(dp_llm: LLM, single: LLM) -> None:
    want = _tokens(single.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert _tokens(dp_llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
    metrics = dp_llm.engine.metrics()
    assert [m.rank for m in metrics] == [0, 1]
    assert max(m.prefix_cache_hit_rate for m in metrics) > 0  # the shared prefix was restored
    assert all(m.running == 0 and m.waiting == 0 and m.outstanding_tokens == 0 for m in metrics)


def test_requests_arriving_while_others_decode(dp_llm: LLM, single: LLM) -> None:
    want = _tokens(single.generate(PROMPTS, GREEDY, use_tqdm=False))
    stream = dp_llm.stream(PROMPTS[3], GREEDY)
    for _ in range(4):  # the stream's request prefills, then decodes a few tokens
        first = next(stream)
    assert not first.finished
    late = dp_llm.generate(PROMPTS[:3] + PROMPTS[4:], GREEDY, use_tqdm=False)
    last = list(stream)[-1] if not first.finished else first
    got = _tokens(late)
    assert [*got[:3], last.outputs[0].token_ids, *got[3:]] == want


def test_seeded_sampling_matches_one_process(dp_llm: LLM, single: LLM) -> None:
    params = [
        SamplingParams(max_tokens=8, temperature=0.9, seed=7),
        SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9),  # seeded by the engine
        SamplingParams(max_tokens=8, temperature=0.7, n=2, seed=11),
    ]
    prompts = PROMPTS[:3]
    want = _tokens(single.generate(prompts, params, use_tqdm=False))
    assert _tokens(dp_llm.generate(prompts, params, use_tqdm=False)) == want


def test_structured_outputs_equal_one_process(dp_llm: LLM, single: LLM) -> None:
    """Each rank's engine masks its requests' draws by their grammars: the constrained
    outputs are the single process's, and they satisfy their constraints."""
    kinds = [
        StructuredOutputsParams(
            json={"type": "array", "items": {"type": "boolean"}, "maxItems": 3}
        ),
        StructuredOutputsParams(regex=r"[a-z]{3}-[0-9]{2}"),
        StructuredOutputsParams(choice=["yes", "no", "maybe"]),
    ]
    params = [SamplingParams(max_tokens=24, temperature=0, structured_outputs=k) for k in kinds]
    want = [o.outputs[0] for o in single.generate(PROMPTS[:3], params, use_tqdm=False)]
    got = [o.outputs[0] for o in dp_llm.generate(PROMPTS[:3], params, use_tqdm=False)]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    array, code, choice = (c.text for c in got)
    assert got[0].finish_reason == "stop" and isinstance(json.loads(array), list)
    assert re.fullmatch(r"[a-z]{3}-[0-9]{2}", code) and choice in ("yes", "no", "maybe")


def test_balancer_keeps_shared_prefixes_together(dp_llm: LLM) -> None:
    engine = dp_llm.engine
    assert isinstance(engine, DataParallelEngine)
    assert dp_llm.reset_prefix_cache()
    shared = [engine.add_request([*SHARED, 900 + i], GREEDY) for i in range(3)]
    unrelated = [engine.add_request([700 + i] * (5 + i), GREEDY) for i in range(2)]
    ranks = dict(engine.groups)
    assert len({ranks[r] for r in shared}) == 1
    assert {ranks[r] for r in unrelated} == {1 - ranks[shared[0]]}
    while engine.has_unfinished_requests():
        engine.step(final_only=True)


def _summed_load(llm: LLM) -> dict[str, Tensor]:
    """Every rank's expert load, summed over the ranks."""
    metrics = llm.engine.metrics()
    return {
        name: sum(torch.tensor(m.expert_load[name]) for m in metrics)  # type: ignore[misc]
        for name in metrics[0].expert_load
    }


def _counting(inner: Callable[..., Tensor], seen: Tensor) -> Callable[..., Tensor]:
    """``MoE.combine`` that first adds its router indices to ``seen``."""

    def combine(ops: object, flat: Tensor, weights: Tensor, indices: Tensor, *rest: Any) -> Tensor:
        seen.add_(torch.bincount(indices[indices >= 0], minlength=seen.numel()))
        return inner(ops, flat, weights, indices, *rest)

    return combine


def _recount(model: torch.nn.Module) -> dict[str, Tensor]:
    """Count the router's (token, slot) pairs per global expert in every MoE layer of a
    single-process model, from the indices its ``combine`` receives (patched per instance)."""
    counts: dict[str, Tensor] = {}
    for name, layer in model.named_modules():
        if isinstance(layer, MoE):
            seen = counts[name] = torch.zeros(layer.cfg.n_routed_experts, dtype=torch.long)
            layer.combine = _counting(layer.combine, seen)  # type: ignore[method-assign]
    return counts


def test_expert_load_equals_a_single_process_recount(dp_llm: LLM, single: LLM) -> None:
    prompts = [
        [101, 102, 103],
        [400 + i for i in range(70)],
        [60 + (i * 7) % 300 for i in range(33)],
    ]
    assert dp_llm.reset_prefix_cache() and single.reset_prefix_cache()  # every token computed
    before = _summed_load(dp_llm)
    model = single.engine.model
    counts = _recount(model)
    try:
        want = _tokens(single.generate(prompts, GREEDY, use_tqdm=False))
    finally:
        for layer in model.modules():
            layer.__dict__.pop("combine", None)
    assert _tokens(dp_llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    after = _summed_load(dp_llm)
    assert set(after) == set(counts) and len(counts) >= 2
    assert all(seen.sum() > 0 for name, seen in counts.items() if name.startswith("layers."))
    for name, seen in counts.items():  # the MTP layer's too (it never runs here)
        assert torch.equal(after[name] - before[name], seen), name
    ranks = dp_llm.engine.metrics()
    assert all(sum(sum(c) for c in m.expert_load.values()) > 0 for m in ranks)  # both routed


def _assert_gone(llm: LLM, started: float, limit_s: float) -> None:
    engine = llm.engine
    assert isinstance(engine, DataParallelEngine)
    assert time.monotonic() - started < limit_s
    workers = engine.group.workers
    assert workers is not None
    assert all(not p.is_alive() for p in workers.processes)
    assert not dist.is_initialized()
    with pytest.raises(DataParallelError):  # the run is over: later calls fail at once
        llm.generate([[1, 2, 3]], use_tqdm=False)


def test_an_idle_run_outlives_the_timeout(dp_llm: LLM, single: LLM) -> None:
    """No step for twice ``dp_timeout_s``: the keep-alive holds the waiting rank, and the run
    then serves requests as one process does. (The start-up has a bound of its own: a rank
    takes several seconds to start on a loaded two-core machine.)"""
    dp_llm.engine.shutdown()  # one process group at a time
    timeout_s = 5.0
    llm = LLM(
        "tiny", data_parallel_size=2, enable_expert_parallel=True, dp_timeout_s=timeout_s, **STARTUP
    )
    prompts = PROMPTS[:3]
    first = llm.generate(prompts, GREEDY, use_tqdm=False)
    time.sleep(2 * timeout_s + 1.0)
    second = llm.generate(prompts, GREEDY, use_tqdm=False)
    want = _tokens(single.generate(prompts, GREEDY, use_tqdm=False))
    assert _tokens(first) == want and _tokens(second) == want
    assert isinstance(llm.engine, DataParallelEngine) and llm.engine.failure is None
    llm.engine.shutdown()
    assert not dist.is_initialized()


@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_a_lost_rank_ends_the_run(dp_llm: LLM, how: str) -> None:
    dp_llm.engine.shutdown()  # one process group at a time
    timeout_s = 4.0
    llm = LLM(
        "tiny", data_parallel_size=2, enable_expert_parallel=True, dp_timeout_s=timeout_s, **STARTUP
    )
    engine = llm.engine
    assert isinstance(engine, DataParallelEngine) and engine.group.workers is not None
    for i in range(4):
        engine.add_request([30 + i] * 20, SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()
    worker = engine.group.workers.processes[0]
    os.kill(worker.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(DataParallelError, match="unfinished requests failed"):
        while engine.has_unfinished_requests():
            engine.step()
    _assert_gone(llm, started, limit_s=3 * timeout_s)


def test_four_ranks_equal_one_process(dp_llm: LLM, single: LLM) -> None:
    dp_llm.engine.shutdown()  # one process group at a time
    want = _tokens(single.generate(PROMPTS, GREEDY, use_tqdm=False))
    llm = LLM("tiny", data_parallel_size=4, enable_expert_parallel=True, **OPTIONS)
    try:
        assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
        assert sum(m.steps > 0 for m in llm.engine.metrics()) == 4
    finally:
        llm.engine.shutdown()
    assert not dist.is_initialized()


def test_async_scheduling_equals_one_process(dp_llm: LLM, single: LLM) -> None:
    """Each rank's engine reads a step's tokens during the next (one step of lag, still one
    forward a step): greedy and seeded outputs stay the single process's, with chunked
    prefill, prefix-cache hits and a request arriving while another decodes."""
    dp_llm.engine.shutdown()  # one process group at a time
    greedy = _tokens(single.generate(PROMPTS, GREEDY, use_tqdm=False))
    seeded = SamplingParams(max_tokens=8, temperature=0.9, seed=7)
    want_seeded = _tokens(single.generate(PROMPTS[:3], seeded, use_tqdm=False))
    llm = LLM(
        "tiny",
        data_parallel_size=2,
        enable_expert_parallel=True,
        async_scheduling=True,
        dp_timeout_s=60,
        **OPTIONS,
    )
    try:
        assert llm.engine.async_scheduling
        stream = llm.stream(PROMPTS[3], GREEDY)
        first = next(stream)
        late = _tokens(llm.generate(PROMPTS[:3] + PROMPTS[4:], GREEDY, use_tqdm=False))
        last = first if first.finished else list(stream)[-1]
        assert [*late[:3], last.outputs[0].token_ids, *late[3:]] == greedy
        assert _tokens(llm.generate(PROMPTS[:3], seeded, use_tqdm=False)) == want_seeded
        assert all(m.steps > 0 for m in llm.engine.metrics())
    finally:
        llm.engine.shutdown()
    assert not dist.is_initialized()


@pytest.mark.parametrize(("method", "k"), [("dspark", 3), ("mtp", 2)])
def test_speculation_equals_one_process(dp_llm: LLM, single: LLM, method: str, k: int) -> None:
    """One target forward a step on every rank: DSpark drafts with layers of its own (no
    collective); MTP through the MTP layer, whose MoE is a collective, so the ranks match their
    drafting passes (a rank drafting nothing runs dummy passes). Greedy outputs stay the single
    process's without speculation (lossless), seeded sampling the single process's with the
    same speculation; one request on two ranks leaves a rank idle while the other drafts."""
    dp_llm.engine.shutdown()  # one process group at a time
    spec = {"method": method, "num_speculative_tokens": k}
    greedy = _tokens(single.generate(PROMPTS, GREEDY, use_tqdm=False))
    seeded = SamplingParams(max_tokens=8, temperature=0.9, seed=7)
    want_seeded = _tokens(
        LLM("tiny", speculative_config=spec, **OPTIONS).generate(
            PROMPTS[:3], seeded, use_tqdm=False
        )
    )
    llm = LLM(
        "tiny",
        data_parallel_size=2,
        enable_expert_parallel=True,
        speculative_config=spec,
        dp_timeout_s=60,
        **OPTIONS,
    )
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert _tokens(outs) == greedy
        assert all(o.metrics.spec_rounds > 0 for o in outs)  # every request drafted
        assert _tokens(llm.generate(PROMPTS[:3], seeded, use_tqdm=False)) == want_seeded
        assert _tokens(llm.generate(PROMPTS[1:2], GREEDY, use_tqdm=False)) == greedy[1:2]
        assert any(m.dummy_steps > 0 for m in llm.engine.metrics())
    finally:
        llm.engine.shutdown()
    assert not dist.is_initialized()


def test_preemption_on_a_rank_keeps_outputs(dp_llm: LLM, single: LLM) -> None:
    """Each rank's pool holds three sequences of one page; four requests per rank growing
    past a page make its scheduler preempt and recompute (a step of only preemptions runs
    the dummy forward), and greedy outputs do not change."""
    from deepinfer.cache.pools import state_bytes
    from deepinfer.paging import PAGE_TOKENS

    dp_llm.engine.shutdown()  # one process group at a time
    model = single.engine.model
    budget = 3 * state_bytes(model.cfg, model.dtype, PAGE_TOKENS)
    prompts = [[200 + (i * 31 + j * 17) % 700 for j in range(112 + i)] for i in range(8)]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    want = _tokens(single.generate(prompts, params, use_tqdm=False))
    llm = LLM(
        "tiny",
        data_parallel_size=2,
        enable_expert_parallel=True,
        state_memory_bytes=budget,
        max_num_seqs=8,
        **OPTIONS,
    )
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert _tokens(outs) == want
        assert sum(o.metrics.num_preemptions for o in outs) > 0
        assert all(m.steps > 0 for m in llm.engine.metrics())
    finally:
        llm.engine.shutdown()
    assert not dist.is_initialized()


def test_v4_checkpoint_equals_one_process(dp_llm: LLM, tmp_path: Path) -> None:
    """A random tiny V4 (not V4.1) model written as a checkpoint: two ranks, each reading
    only its experts, generate what one process does."""
    dp_llm.engine.shutdown()  # one process group at a time
    model = random_tiny_model(torch.float32, seed=0)
    tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(tiny_config().to_dict()))
    shutil.copy(TINY_TOKENIZER, tmp_path / "tokenizer.json")
    options = {"dtype": "float32", **OPTIONS}
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[5]]
    params = SamplingParams(max_tokens=6, temperature=0)
    want = _tokens(LLM(str(tmp_path), **options).generate(prompts, params, use_tqdm=False))
    llm = LLM(str(tmp_path), data_parallel_size=2, enable_expert_parallel=True, **options)
    try:
        assert not llm.engine.model.cfg.is_v41
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == want
    finally:
        llm.engine.shutdown()
    assert not dist.is_initialized()
