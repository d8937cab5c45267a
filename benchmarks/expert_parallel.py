"""What attention DP + MoE EP costs and gives: ``data_parallel_size=D`` against D = 1.

The same random prompts (``--num-seqs`` of ``--prompt-len`` tokens, ``--output-len`` greedy
tokens each, ``ignore_eos``, prefix cache off so every run computes everything) run through
``LLM(model, data_parallel_size=D, enable_expert_parallel=True)`` for each D of ``--dp-sizes``,
each in its own run, one after the other. D = 1 with ``enable_expert_parallel`` is the plain
engine, so the first row is the baseline EP must not slow down.

Per D: prefill tok/s (a run with ``max_tokens=1``: prompt tokens over its wall time), decode
tok/s (the extra output tokens of the full run over its extra time), steps, and rank 0's
exchange collectives (the all-to-all's ``all_to_all_single``, the fixed-shape exchange's
all-gather and reduce-scatter): calls, bytes sent and seconds per step. They are wrapped with a
timer in this script only (rank 0's process; the other ranks are not timed), so the time
includes waiting for the slowest rank, and on CUDA each call is synchronised around, which
removes any overlap the engine might have had. Decode steps replayed from CUDA graphs run their
collectives inside the graphs, unseen by the timer: ``--enforce-eager`` times them (at eager
speed). CPU runs use gloo, CUDA runs NCCL.

    python benchmarks/expert_parallel.py [--model tiny] [--device cpu] [--dp-sizes 1,2]
        [--num-seqs 16] [--prompt-len 64] [--output-len 16] [--enforce-eager] [--out path.json]
    python benchmarks/expert_parallel.py --compare-no-ep [...]   # EP at world size 1
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _results import write_result

from deepinfer import LLM, SamplingParams
from deepinfer.parallel import expert_dispatch


class ExchangeTimer:
    """Counts rank 0's calls of the MoE exchange's collectives (``all_to_all_single``, and the
    fixed-shape exchange's all-gather and reduce-scatter), their bytes sent and the seconds
    spent in them. Installed over ``torch.distributed`` and ``expert_dispatch``'s bound names."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0
        self.saved: list[tuple[Any, str, Callable[..., Any]]] = []

    def install(self) -> None:
        """Wrap each collective where the exchange looks it up."""
        for owner, name in (
            (dist, "all_to_all_single"),
            (expert_dispatch, "_all_gather"),
            (expert_dispatch, "_reduce_scatter"),
        ):
            inner = getattr(owner, name)
            self.saved.append((owner, name, inner))
            setattr(owner, name, functools.partial(self._timed, inner))

    def uninstall(self) -> None:
        for owner, name, inner in self.saved:
            setattr(owner, name, inner)
        self.saved.clear()

    def _timed(
        self,
        inner: Callable[..., Any],
        output: torch.Tensor,
        input: torch.Tensor,
        *a: Any,
        **kw: Any,
    ) -> Any:
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = inner(output, input, *a, **kw)
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.bytes += input.numel() * input.element_size()
        return result

    def reset(self) -> None:
        self.calls, self.bytes, self.seconds = 0, 0, 0.0


def timed_run(
    llm: LLM, prompts: list[list[int]], params: SamplingParams, timer: ExchangeTimer
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
        "exchange_calls": timer.calls,
        "exchange_bytes": timer.bytes,
        "exchange_seconds": timer.seconds,
    }


def measure(
    dp: int, prompts: list[list[int]], args: argparse.Namespace, ep: bool = True
) -> dict[str, Any]:
    """Warm-up, prefill-only and full runs at world size ``dp`` (``ep`` False: an engine
    given no parallel options at all)."""
    timer = ExchangeTimer(args.device.startswith("cuda"))
    timer.install()
    parallel = {"data_parallel_size": dp, "enable_expert_parallel": True} if ep else {}
    llm = LLM(
        args.model,
        device=args.device,
        load_format=args.load_format,
        enable_prefix_caching=False,
        enforce_eager=args.enforce_eager,
        seed=0,
        **parallel,
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
        timer.uninstall()
    prompt_tokens = sum(map(len, prompts))
    decode_tokens = len(prompts) * (args.output_len - 1)
    decode_s = whole["seconds"] - prefill["seconds"]
    steps = max(whole["steps"], 1)
    return {
        "data_parallel_size": dp,
        "enable_expert_parallel": ep,
        "prefill_tok_s": prompt_tokens / prefill["seconds"],
        # None where the decode steps took no measurable time over the prefill run's
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else None,
        "prefill": prefill,
        "full": whole,
        "exchange_bytes_per_step": whole["exchange_bytes"] / steps,
        "exchange_seconds_per_step": whole["exchange_seconds"] / steps,
        "exchange_share": whole["exchange_seconds"] / whole["seconds"],
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
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs: the decode steps' exchanges are then timed too",
    )
    parser.add_argument(
        "--compare-no-ep",
        action="store_true",
        help="instead: D = 1 with enable_expert_parallel against no parallel options, twice each,"
        " alternated (what EP costs at world size 1)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rnd = random.Random(0)
    prompts = [
        [rnd.randrange(3, 4000) for _ in range(args.prompt_len)] for _ in range(args.num_seqs)
    ]
    if args.compare_no_ep:
        rows = [measure(1, prompts, args, ep) for ep in (False, True, False, True)]
    else:
        rows = [measure(int(d), prompts, args) for d in args.dp_sizes.split(",")]
    for row in rows:
        print(
            f"D={row['data_parallel_size']} EP={row['enable_expert_parallel']}: "
            f"prefill {row['prefill_tok_s']:.0f} tok/s, "
            f"decode {row['decode_tok_s'] or float('nan'):.0f} tok/s, exchange "
            f"{row['exchange_bytes_per_step']:.0f} B and "
            f"{1e3 * row['exchange_seconds_per_step']:.2f} ms per step (rank 0)"
        )
    result = {"workload": {k: v for k, v in vars(args).items() if k != "out"}, "runs": rows}
    device = args.device.split(":")[0]
    write_result(result, args.out, f"expert_parallel_{device}")


if __name__ == "__main__":
    main()
