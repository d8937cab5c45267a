#!/usr/bin/env python3
"""Speed of the torch reference backend: the baseline every kernel has to beat.

Runs the mid-size config A of the model reference (2.1 B parameters, random bf16 weights) on
one device: prefill of a 1024-token prompt in 256-token chunks, then token-by-token decode, each
timed as the median of a few repetitions after a warm-up, and the tiny model through the engine
(``deepinfer bench`` protocol). Writes JSON.

Usage: python benchmarks/reference_speed.py [--device cuda] [--out benchmarks/results/x.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/deepinfer-core/tests"))

from test_midsize import config_a

from deepinfer.assets import init_random_weights
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def midsize(device: str, prompt_len: int, decode_tokens: int) -> dict[str, float]:
    model = DeepseekV4ForCausalLM(config_a(), dtype=torch.bfloat16, device=device)
    init_random_weights(model, seed=0)
    ids = torch.randint(3, 129280, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)

    def prefill() -> None:
        state = model.new_state(1)
        for start in range(0, prompt_len, 256):
            model.step(ids[:, start : start + 256], state)

    prefill_s = timed(prefill, device, reps=3)
    state = model.new_state(1)
    for start in range(0, prompt_len, 256):
        model.step(ids[:, start : start + 256], state)
    step = ids[:, :1]

    def decode() -> None:
        for _ in range(decode_tokens):
            model.step(step, state)

    decode_s = timed(decode, device, reps=2)
    return {
        "prompt_tokens": prompt_len,
        "prefill_s": round(prefill_s, 4),
        "prefill_tok_per_s": round(prompt_len / prefill_s, 1),
        "decode_ms_per_token": round(1000 * decode_s / decode_tokens, 2),
    }


def tiny_engine(device: str) -> dict[str, float]:
    from deepinfer.llm import LLM
    from deepinfer.sampling_params import SamplingParams

    llm = LLM("tiny", device=device, dtype="float32", enable_prefix_caching=False)
    prompts = [[3 + (i * 7919 + j) % 8000 for j in range(64 + 8 * i)] for i in range(32)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm.generate(prompts[:2], params, use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync(device)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "requests": len(prompts),
        "output_tokens": tokens,
        "output_tok_per_s": round(tokens / elapsed, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/results/reference_speed.json")
    args = parser.parse_args()
    result = {
        "device": torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "midsize_a_bf16": midsize(args.device, args.prompt_len, args.decode_tokens),
        "tiny_engine_fp32": tiny_engine(args.device),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
