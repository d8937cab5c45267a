#!/usr/bin/env python3
"""Cost of structured outputs: per-step mask time and end-to-end tokens/s with and without.

The same prompts run free and under a JSON schema, at batch 1 and batch 32, interleaved in one
process on the tiny model (``ignore_eos``, fixed output length, so both do the same steps; a
constrained request whose grammar completes early stops early, so rates are tokens/second).
Each pair is repeated; the slowdown is reported from the best runs and as the median over
pairs of wall time and of this process's CPU time (on a shared CPU, CPU time is the least
disturbed by other jobs). The per-step mask time is measured on the matcher alone, as the
bool mask the engine takes now (``allowed``) and as the packed bitmask row a batched sampler
would take (``fill_bitmask``). Writes JSON, with the machine's load for context.

Usage: python benchmarks/structured_overhead.py [--device cpu] [--repeats 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
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


def tok_per_s(llm: LLM, batch: int, tokens: int, constrained: bool) -> tuple[float, float]:
    """Output tokens per second of wall time and per second of this process's CPU time."""
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
    start, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    done = sum(len(o.outputs[0].token_ids) for o in outs)
    return done / elapsed, done / cpu


def step_times(llm: LLM, steps: int, measure: Callable[..., object]) -> list[float]:
    """Seconds of ``measure(matcher)`` at each step of a random walk through the schema."""
    matcher = llm.engine.grammar_backend().matcher(StructuredOutputsParams(json=SCHEMA))
    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        measure(matcher)
        times.append(time.perf_counter() - start)
        choices = matcher.allowed().nonzero()[:, 0]
        token = int(choices[torch.randint(len(choices), (1,), generator=g)])
        if not matcher.accept(token) or matcher.is_terminated():
            break
    return times


def attributed(llm: LLM, batch: int, tokens: int) -> dict[str, float]:
    """Time spent in the constraint's own code path, measured inside one run of each kind: the
    runner's sampling-tensor build (where masks are made), and the matchers' ``accept``. The
    share of the free run's step time is the slowdown the mask path accounts for, without the
    run-to-run noise of a shared CPU."""
    from deepinfer_structured.matcher import XGrammarMatcher

    runner = llm.engine.runner
    spent: dict[str, float] = {}

    def timed(owner: object, name: str, key: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def wrapper(*a: object, **k: object) -> object:
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

        setattr(owner, name, wrapper)
        return lambda: setattr(owner, name, original)

    out: dict[str, float] = {}
    for constrained in (False, True):
        spent.clear()
        undo = [
            timed(runner, "_sampling_tensors", "tensors"),
            timed(XGrammarMatcher, "accept", "accept"),
        ]
        steps = llm.engine.num_steps
        start = time.perf_counter()
        tok_per_s(llm, batch, tokens, constrained)
        elapsed = time.perf_counter() - start
        steps = llm.engine.num_steps - steps
        for restore in undo:
            restore()
        kind = "constrained" if constrained else "free"
        out[f"{kind}_step_ms"] = 1000 * elapsed / steps
        out[f"{kind}_sampling_tensors_ms_per_step"] = 1000 * spent.get("tensors", 0.0) / steps
        out[f"{kind}_accept_ms_per_step"] = 1000 * spent.get("accept", 0.0) / steps
    extra = (
        out["constrained_sampling_tensors_ms_per_step"]
        - out["free_sampling_tensors_ms_per_step"]
        + out["constrained_accept_ms_per_step"]
    )
    out["mask_path_ms_per_step"] = extra
    out["mask_path_share_of_free_step"] = extra / out["free_step_ms"]
    return {k: round(v, 4) for k, v in out.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/structured_overhead.json")
    args = p.parse_args()
    llm = LLM("tiny", device=args.device, dtype="float32", enable_prefix_caching=False)
    tok_per_s(llm, 2, 4, True)  # warm-up: compile the schema, first matcher
    load_before = os.getloadavg()
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(32, llm.engine.model.cfg.vocab_size)
    allowed = step_times(llm, 64, lambda m: m.allowed())
    packed = step_times(llm, 64, lambda m: m.fill_bitmask(bitmask, 5))
    result: dict[str, object] = {
        "device": args.device,
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared "
        "with other jobs (load average below); torch threads "
        f"{torch.get_num_threads()}",
        "load_average_1m_before_after": None,
        "tokens_per_request": args.tokens,
        "repeats": args.repeats,
        "mask_ms_per_step_median": round(1000 * statistics.median(allowed), 4),
        "fill_bitmask_ms_per_step_median": round(1000 * statistics.median(packed), 4),
    }
    for batch in (1, 32):
        free, con = [], []
        for _ in range(args.repeats):
            free.append(tok_per_s(llm, batch, args.tokens, False))
            con.append(tok_per_s(llm, batch, args.tokens, True))
        wall = [f[0] / c[0] - 1 for f, c in zip(free, con, strict=True)]
        cpu = [f[1] / c[1] - 1 for f, c in zip(free, con, strict=True)]
        result[f"batch_{batch}"] = {
            "free_tok_per_s": round(max(f[0] for f in free), 1),
            "constrained_tok_per_s": round(max(c[0] for c in con), 1),
            "slowdown_best_wall": round(max(f[0] for f in free) / max(c[0] for c in con) - 1, 3),
            "slowdown_median_pair_wall": round(statistics.median(wall), 3),
            "slowdown_median_pair_cpu_time": round(statistics.median(cpu), 3),
            "runs_free_wall_cpu": [[round(x, 1) for x in f] for f in free],
            "runs_constrained_wall_cpu": [[round(x, 1) for x in c] for c in con],
        }
    if hasattr(llm.engine.runner, "_sampling_tensors"):
        result["batch_32_attributed"] = attributed(llm, 32, args.tokens)
    result["load_average_1m_before_after"] = [
        round(load_before[0], 2),
        round(os.getloadavg()[0], 2),
    ]
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
