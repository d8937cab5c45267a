"""Attention DP + MoE EP on two NVIDIA GPUs (NCCL), decode steps in CUDA graphs: the ranks'
greedy tokens are the single-GPU engine's. Skipped with fewer than two GPUs."""

from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two NVIDIA GPUs"),
]

PROMPTS = [
    "ROMEO:",
    "JULIET:\nO Romeo, Romeo",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "KING HENRY",
    "Enter HAMLET",
    "To be, or not to be",
] * 3


def test_graphed_ranks_decode_as_one_gpu() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    one = LLM("tiny", device="cuda", dtype="float32", enforce_eager=True)
    want = [o.outputs[0].token_ids for o in one.generate(PROMPTS, params, use_tqdm=False)]
    del one
    dp = LLM(
        "tiny",
        device="cuda",
        dtype="float32",
        max_num_seqs=16,
        data_parallel_size=2,
        enable_expert_parallel=True,
        dp_timeout_s=120,
    )
    try:
        graphs = dp.engine.local.runner.graphs
        assert graphs is not None and not graphs.capture_on_use
        captured = graphs.num_captured
        assert captured
        got = [o.outputs[0].token_ids for o in dp.generate(PROMPTS, params, use_tqdm=False)]
        assert got == want
        assert graphs.num_captured == captured  # captured at startup only, on every rank
    finally:
        dp.engine.shutdown()
