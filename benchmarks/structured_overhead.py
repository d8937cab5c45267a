#!/usr/bin/env python3
"""Cost of structured outputs: per-step mask time and end-to-end tokens/s with and without.

The same prompts run free and under a JSON schema, at batch 1 and batch 32, side by side in one
process on the tiny model (ignore_eos, fixed output length, so both do the same number of
steps). The per-step mask time is measured on the matcher alone. Writes JSON.

Usage: python benchmarks/structured_overhead.py [--device cpu] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from deepinfer.llm import LLM
from deepinfer.sampling_params import SamplingParams, StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "speaker": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "string"}},
        "act": {"type": "integer"},
    },
    "required": ["speaker", "lines", "act"],
}


def tok_per_s(llm: LLM, batch: int, tokens: int, constrained: bool) -> float:
    prompts = [[3 + (i * 7919 + j) % 8000 for j in range(32)] for i in range(batch)]
    so = {"json": SCHEMA} if constrained else None
    params = SamplingParams(
        temperature=1.0,
        seed=0,
        max_tokens=tokens,
        min_tokens=tokens,
        ignore_eos=True,
        structured_outputs=so,
    )
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def mask_ms(llm: LLM, steps: int) -> float:
    matcher = llm.engine.grammar_backend().matcher(StructuredOutputsParams(json=SCHEMA))
    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        allowed = matcher.allowed()
        times.append(time.perf_counter() - start)
        choices = allowed.nonzero()[:, 0]
        token = int(choices[torch.randint(len(choices), (1,), generator=g)])
        if not matcher.accept(token) or matcher.is_terminated():
            break
    return 1000 * statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--out", default="benchmarks/results/structured_overhead.json")
    args = p.parse_args()
    llm = LLM("tiny", device=args.device, dtype="float32", enable_prefix_caching=False)
    tok_per_s(llm, 2, 4, True)  # warm-up: compile the schema, first matcher
    result: dict[str, object] = {
        "device": args.device,
        "tokens_per_request": args.tokens,
        "mask_ms_per_step_median": round(mask_ms(llm, 64), 3),
    }
    for batch in (1, 32):
        free = tok_per_s(llm, batch, args.tokens, False)
        con = tok_per_s(llm, batch, args.tokens, True)
        result[f"batch_{batch}"] = {
            "free_tok_per_s": round(free, 1),
            "constrained_tok_per_s": round(con, 1),
            "slowdown": round(free / con - 1, 3),
        }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
