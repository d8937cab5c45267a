"""The engine on an NVIDIA GPU runs on the sm100 kernels and decodes as the CPU reference does."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.models import causal_lm
from deepinfer_kernels_sm100.backend import Sm100Backend

pytestmark = pytest.mark.gpu

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "First Citizen:\nBefore we proceed", "KING HENRY"]


def test_auto_device_uses_the_kernels_and_matches_the_cpu() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    gpu = LLM("tiny", device="auto", dtype="float32")
    assert isinstance(gpu.backend, Sm100Backend)
    assert gpu.engine.model.ops is gpu.backend
    cpu = LLM("tiny", device="cpu", dtype="float32")
    got = [o.outputs[0].token_ids for o in gpu.generate(PROMPTS, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in cpu.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want


def test_cuda_graphs_change_no_token() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = PROMPTS * 5  # 20 rows: padded to the 24-row bucket
    eager = LLM("tiny", device="cuda", dtype="float32", enforce_eager=True)
    graphed = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=64)
    assert eager.engine.runner.graphs is None
    graphs = graphed.engine.runner.graphs
    assert graphs is not None
    # Every batch bucket at every entry bucket of up to 2048 tokens (1, 4, 16 pages), at startup.
    assert graphed.engine.max_model_len >= 2048
    assert graphs.num_captured == 3 * len(graphs.buckets)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in graphed.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert graphs.num_captured == 3 * len(graphs.buckets)  # none captured during the run


def _greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_speculative_plain_steps_replay_the_decode_graphs() -> None:
    """With speculation on, the decode graphs are captured at start-up; the steps the
    adaptive schedule runs plain replay them between verification steps, which capture and
    replay the verification pass's graphs (the drafter's features returned from them); the
    greedy tokens are the engine's without speculation. The made-up costs give both kinds: a
    plain step of any rows takes 1 s, drafting a round 0.3 s, a verification step 1 s up to 4
    tokens and 3 s at 16. Four rows verifying 3 drafts each would need to keep more than 2.3
    tokens a row for their 3.3 s, which the drafter's measured acceptance (1.33 kept a round)
    does not promise: plain steps. Once the three short requests end, the last one's round of
    4 tokens in 1.3 s pays for 1.3 tokens: it drafts."""
    spec = {
        "method": "dspark",
        "num_speculative_tokens": 3,
        "scheduling": "adaptive",
        "plain_cost": {1: 1.0, 16: 1.0},
        "verify_cost": {1: 1.0, 4: 1.0, 16: 3.0},
        "draft_cost": {1: 0.3, 16: 0.3},
    }
    plain = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=16)
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=16, speculative_config=spec)
    graphs = llm.engine.runner.graphs
    # decode steps at 3 entry buckets and the drafter's rounds, each batch bucket
    assert graphs is not None and graphs.num_captured == 4 * len(graphs.buckets)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (32, 8, 8, 8)]
    got, want = (llm_.generate(PROMPTS, params, use_tqdm=False) for llm_ in (llm, plain))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    runner = llm.engine.spec
    assert runner is not None and runner.plain_steps > 0 and runner.num_drafts > 0
    assert graphs.num_captured > 4 * len(graphs.buckets)  # the verification pass's


def test_dspark_rounds_replay_graphs_and_keep_greedy_outputs() -> None:
    """DSpark's drafting rounds replay CUDA graphs over a context ring per slot; over prompts
    past the drafter's 256-position window (the tiny model's own text, so no argmax rests on
    a near tie), at 1 to 24 requests a step, the greedy tokens are the engine's without
    speculation."""
    plain = LLM("tiny", device="cuda", dtype="float32")
    lengths = [SamplingParams(temperature=0.0, max_tokens=16 + 24 * i, ignore_eos=True)
               for i in range(24)]  # fmt: skip
    written = plain.generate(PROMPTS * 6, lengths, use_tqdm=False)
    prompts = [o.prompt_token_ids + o.outputs[0].token_ids for o in written]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    spec = {"method": "dspark", "num_speculative_tokens": 5}
    llm = LLM("tiny", device="cuda", dtype="float32", speculative_config=spec)
    assert llm.engine.spec is not None and llm.engine.spec.drafter.graphed is not None  # type: ignore[attr-defined]
    for batch in (1, 24):
        want = plain.generate(prompts[-batch:], params, use_tqdm=False)
        got = llm.generate(prompts[-batch:], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert llm.engine.spec.num_accepted > 0


def test_mtp_chained_passes_replay_graphs_and_keep_greedy_outputs() -> None:
    """MTP's drafting rounds replay one graph per batch bucket (captured at start-up with the
    decode steps, none during the run) and draft what the eager passes draft: the same
    drafts kept; the greedy tokens are the engine's without speculation, at 1 and 24
    requests a step."""
    plain = LLM("tiny", device="cuda", dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    llm = LLM("tiny", device="cuda", dtype="float32", speculative_config=spec)
    eager = LLM("tiny", device="cuda", dtype="float32",
                speculative_config={**spec, "enforce_eager": True})  # fmt: skip
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.num_captured == 4 * len(graphs.buckets)
    assert eager.engine.spec is not None and eager.engine.spec.drafter.graphed is None  # type: ignore[attr-defined]
    for batch in (1, 24):
        prompts = (PROMPTS * 6)[:batch]
        want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == want
    for batch in (1, 24):
        eager.generate((PROMPTS * 6)[:batch], params, use_tqdm=False)
    runner, reference = llm.engine.spec, eager.engine.spec
    assert runner is not None and runner.num_accepted > 0
    assert (runner.num_drafts, runner.num_accepted) == (
        reference.num_drafts,
        reference.num_accepted,
    )


def test_adaptive_profile_prices_graphed_plain_steps() -> None:
    """The schedule's start-up profile times plain and verification steps from CUDA graphs of
    its own slots (kept apart from the engine's, which hold just their start-up captures)
    when the engine has graphs (the engine's hold their start-up captures: its decode steps
    and the drafter's rounds); the engine then decodes as without speculation."""
    spec = {"method": "dspark", "num_speculative_tokens": 3, "scheduling": "adaptive"}
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=8, speculative_config=spec)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.num_captured == 4 * len(graphs.buckets)
    want = _greedy(LLM("tiny", device="cuda", dtype="float32", max_num_seqs=8), PROMPTS)
    assert _greedy(llm, PROMPTS) == want


def test_the_profile_pads_verification_rows_as_the_rounds_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verification rows the start-up profile times and those the engine's rounds run
    are padded to one width, k + 1 (a graph bakes it in, and one row more can switch a
    library GEMM to a kernel several times slower), though the profile's states keep one
    token more of slack."""
    monkeypatch.setenv("DEEPINFER_CACHE", str(tmp_path))  # profiled now, not read back
    widths: dict[str, set[int | None]] = {"profile": set(), "engine": set()}
    phase = ["profile"]
    real = causal_lm.run_verify

    def recording(  # noqa: PLR0917
        model: Any,
        chunks: Any,
        states: Any,
        graphs: Any,
        width: Any = None,
        capture: Any = (),
        drafts: Any = None,
    ) -> Any:
        widths[phase[0]].add(width)
        return real(model, chunks, states, graphs, width, capture, drafts)

    monkeypatch.setattr(causal_lm, "run_verify", recording)
    spec = {"method": "dspark", "num_speculative_tokens": 3}
    adaptive = {**spec, "scheduling": "adaptive"}
    LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, speculative_config=adaptive)
    phase[0] = "engine"
    llm = LLM("tiny", device="cuda", dtype="float32", max_num_seqs=4, speculative_config=spec)
    _greedy(llm, PROMPTS)
    assert widths["profile"] - {1} == widths["engine"] - {1} == {4}


def test_async_scheduling_changes_no_token() -> None:
    """On a GPU the engine queues step n+1 before reading step n's tokens (the default); the
    outputs are the synchronous engine's, greedy, seeded and with stops seen a step late."""
    prompts = PROMPTS * 6
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[30, 31, 32, 33]),
    ] * 8
    sync = LLM("tiny", device="cuda", dtype="float32", async_scheduling=False)
    overlapped = LLM("tiny", device="cuda", dtype="float32")
    assert overlapped.engine.async_scheduling and not sync.engine.async_scheduling
    want = sync.generate(prompts, params, use_tqdm=False)
    got = overlapped.generate(prompts, params, use_tqdm=False)
    assert [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in got] == [
        (o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in want
    ]
    assert (
        overlapped.engine.pool.used_bytes == 0 and not overlapped.engine.has_unfinished_requests()
    )


def _gpu_and_cpu(**gpu_options: bool) -> tuple[LLM, LLM, int]:
    """The tiny model on the GPU and on the CPU (no prefix cache), and the ids below the image
    placeholder (random prompts must not contain it)."""
    gpu = LLM("tiny", device="cuda", dtype="float32", **gpu_options)
    cpu = LLM("tiny", device="cpu", dtype="float32", enable_prefix_caching=False)
    cfg = gpu.engine.model.cfg
    return gpu, cpu, min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size)


def test_padded_score_groups_change_no_token() -> None:
    """On a GPU the indexers score prompts of different lengths as padded groups of one ragged
    pass (the CPU groups equal lengths only); greedy outputs agree."""
    gpu, cpu, top = _gpu_and_cpu(enable_prefix_caching=False)
    rnd = random.Random(0)
    prompts = [[rnd.randrange(3, top) for _ in range(rnd.randint(20, 200))] for _ in range(24)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in gpu.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in cpu.generate(prompts, params, use_tqdm=False)]
    assert got == want


def test_prefix_hits_on_blocks_recorded_inside_chunks_change_no_token() -> None:
    """Prompts prefill in one ragged pass and the prefix cache keeps the states the pass
    handed back at the 128-token boundaries inside them; prompts that share those prefixes
    restore them and decode as a CPU engine without a cache does."""
    gpu, cpu, top = _gpu_and_cpu()
    rnd = random.Random(1)
    first = [[rnd.randrange(3, top) for _ in range(rnd.randint(260, 520))] for _ in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    gpu.generate(first, params, use_tqdm=False)
    second = [[*p[: rnd.randint(130, len(p))], rnd.randrange(3, top)] for p in first]
    got = gpu.generate(second, params, use_tqdm=False)
    want = cpu.generate(second, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    cached = [o.metrics.num_cached_tokens for o in got]
    assert all(c >= 128 for c in cached), cached  # every one hit at least one block


def test_a_failing_step_aborts_only_its_request_with_graphs_and_async() -> None:
    """Isolation on the GPU path: captured decode steps and asynchronous scheduling. A forward
    that raises whenever one token is fed aborts the request that fed it; the others' tokens
    equal a clean run's, and the engine serves afterwards."""
    llm = LLM("tiny", device="cuda", dtype="float32")
    assert llm.engine.async_scheduling and llm.engine.runner.graphs is not None
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    poison = 4242
    model = llm.engine.model
    forward = model.forward

    def guarded(batch, *args, **kwargs):  # type: ignore[no-untyped-def]
        if bool((batch.input_ids == poison).any()):
            raise RuntimeError("poisoned token in the step")
        return forward(batch, *args, **kwargs)

    model.forward = guarded  # every step goes through the model's one forward
    try:
        forced = SamplingParams(
            temperature=0.0, max_tokens=16, ignore_eos=True, allowed_token_ids=[poison]
        )
        outs = llm.generate([*PROMPTS, "ROMEO:"], [params] * 4 + [forced], use_tqdm=False)
    finally:
        del model.forward
    assert [o.outputs[0].token_ids for o in outs[:4]] == want
    bad = outs[4].outputs[0]
    assert bad.finish_reason == "abort" and "poisoned" in (bad.error or "")
    again = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == want
    assert llm.engine.pool.used_bytes == 0 and not llm.engine.has_unfinished_requests()


def test_gpu_memory_utilization_sizes_the_state_budget() -> None:
    """vLLM's option: weights plus state stay within the share of the GPU's memory."""
    import torch

    llm = LLM("tiny", device="cuda", gpu_memory_utilization=0.25)
    total = torch.cuda.get_device_properties(0).total_memory
    budget = llm.engine.pool.budget_bytes
    assert 0 < budget <= 0.25 * total
    params = SamplingParams(temperature=0.0, max_tokens=8)
    (out,) = llm.generate("ROMEO:", params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 8
