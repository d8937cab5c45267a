"""What attention DP + MoE EP costs and gives: ``data_parallel_size=D`` against D = 1.

The same random prompts (``--num-seqs`` of ``--prompt-len`` tokens, ``--output-len`` greedy
tokens each, ``ignore_eos``, prefix cache off so every run computes everything) run through
``LLM(model, data_parallel_size=D, enable_expert_parallel=True)`` for each D of ``--dp-sizes``,
each in its own run, one after the other. D = 1 with ``enable_expert_parallel`` is the plain
engine, so the first row is the baseline EP must not slow down.

Per D: prefill tok/s (a run with ``max_tokens=1``: prompt tokens over its wall time), decode
tok/s (the extra output tokens of the full run over its extra time), steps, and rank 0's
``all_to_all_single`` calls, bytes sent and seconds per step. ``dist.all_to_all_single`` is
wrapped with a timer in this script only (rank 0's process; the other ranks are not timed), so
the time includes waiting for the slowest rank, and on CUDA each call is synchronised around,
which removes any overlap the engine might have had. CPU runs use gloo, CUDA runs NCCL.

    python benchmarks/expert_parallel.py [--model tiny] [--device cpu] [--dp-sizes 1,2]
        [--num-seqs 16] [--prompt-len 64] [--output-len 16] [--out path.json]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _results import write_result

from deepinfer import LLM, SamplingParams


class AllToAllTimer:
    """Counts rank 0's ``all_to_all_single`` calls, bytes sent and seconds spent in them."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0
        self.inner: Callable[..., Any] = dist.all_to_all_single

    def __call__(self, output: torch.Tensor, input: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = self.inner(output, input, *args, **kw)
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.bytes += input.numel() * input.element_size()
        return result

    def reset(self) -> None:
        self.calls, self.bytes, self.seconds = 0, 0, 0.0


def timed_run(
    llm: LLM, prompts: list[list[int]], params: SamplingParams, timer: AllToAllTimer
) -> dict[str, float]:
    """One generate: wall seconds, engine steps and rank 0's all-to-all totals."""
    engine = llm.engine
    inner = engine.step
    steps = [0]

    def step(*args: Any, **kwargs: Any) -> Any:
        steps[0] += 1
        return inner(*args, **kwargs)

    engine.step = step  # type: ignore[method-assign]
    timer.reset()
    try:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        del engine.step
    return {
        "seconds": seconds,
        "steps": steps[0],
        "all_to_all_calls": timer.calls,
        "all_to_all_bytes": timer.bytes,
        "all_to_all_seconds": timer.seconds,
    }


def measure(dp: int, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, prefill-only and full runs at world size ``dp``."""
    timer = AllToAllTimer(args.device.startswith("cuda"))
    dist.all_to_all_single = timer  # type: ignore[assignment]
    llm = LLM(
        args.model,
        device=args.device,
        load_format=args.load_format,
        data_parallel_size=dp,
        enable_expert_parallel=True,
        enable_prefix_caching=False,
        seed=0,
    )
    try:
        first = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        full = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
        # Warm-up over the same prompts and lengths, so that no timed run compiles a kernel
        # or captures a graph for a shape it meets first (and every rank has started).
        timed_run(llm, prompts, full, timer)
        prefill = timed_run(llm, prompts, first, timer)
        whole = timed_run(llm, prompts, full, timer)
    finally:
        if hasattr(llm.engine, "shutdown"):
            llm.engine.shutdown()
        dist.all_to_all_single = timer.inner  # type: ignore[assignment]
    prompt_tokens = sum(map(len, prompts))
    decode_tokens = len(prompts) * (args.output_len - 1)
    decode_s = whole["seconds"] - prefill["seconds"]
    steps = max(whole["steps"], 1)
    return {
        "data_parallel_size": dp,
        "prefill_tok_s": prompt_tokens / prefill["seconds"],
        # None where the decode steps took no measurable time over the prefill run's
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else None,
        "prefill": prefill,
        "full": whole,
        "all_to_all_bytes_per_step": whole["all_to_all_bytes"] / steps,
        "all_to_all_seconds_per_step": whole["all_to_all_seconds"] / steps,
        "all_to_all_share": whole["all_to_all_seconds"] / whole["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dp-sizes", default="1,2", help="comma-separated world sizes")
    parser.add_argument("--num-seqs", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rnd = random.Random(0)
    prompts = [
        [rnd.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(args.num_seqs)
    ]
    rows = [measure(int(d), prompts, args) for d in args.dp_sizes.split(",")]
    for row in rows:
        print(
            f"D={row['data_parallel_size']}: prefill {row['prefill_tok_s']:.0f} tok/s, "
            f"decode {row['decode_tok_s'] or float('nan'):.0f} tok/s, all-to-all "
            f"{row['all_to_all_bytes_per_step']:.0f} B and "
            f"{1e3 * row['all_to_all_seconds_per_step']:.2f} ms per step (rank 0)"
        )
    result = {"workload": {k: v for k, v in vars(args).items() if k != "out"}, "runs": rows}
    device = args.device.split(":")[0]
    write_result(result, args.out, f"expert_parallel_{device}")


if __name__ == "__main__":
    main()
