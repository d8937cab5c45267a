"""Where an engine run's time goes, step by step, for the speculative benchmark's engines.

For each arm (no speculation, DSpark k = 5, DSpark on the adaptive schedule) and batch, the
engine of ``speculative.py`` generates ``--output-len`` greedy tokens for ``batch`` held-out
windows, three runs; the last one's steps are each timed between device syncs (so the GPU's
time lands in the step that queued it): the number of steps, their sum, median and slowest,
and the first step (the prompts' prefill). With ``--profile``, one more run's first step is
profiled (torch.profiler, CPU and CUDA): its CPU and GPU time and the CPU ops that took the
most, which tells a host-bound step from a GPU-bound one.

    python benchmarks/engine_steps.py --device cuda [--batches 1 8 64] [--profile]

Results go to ``benchmarks/results/engine_steps_<device>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from speculative import build_engine, held_out_prompts

from deepinfer.sampling_params import SamplingParams

ARMS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "dspark_k5": {"method": "dspark", "num_speculative_tokens": 5},
    "dspark_scheduled": {"method": "dspark", "num_speculative_tokens": 5,
                         "scheduling": "adaptive"},
}  # fmt: skip


def _sync(engine: Any) -> None:
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(engine: Any, prompts: list[list[int]], output_len: int) -> list[float]:
    """Milliseconds of each step of one run of ``prompts``, synced before and after."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    times = []
    while engine.groups:
        _sync(engine)
        start = time.perf_counter()
        engine.step()
        _sync(engine)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def profiled_first_step(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """The first step of a run profiled: CPU and GPU milliseconds, the top CPU ops."""
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    activities = [ProfilerActivity.CPU]
    if engine.model.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        engine.step()
        _sync(engine)
    engine.run()  # the rest of the run, untimed
    events = prof.key_averages()
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return {
        "self_cpu_ms": round(sum(e.self_cpu_time_total for e in events) / 1e3, 2),
        "self_device_ms": round(
            sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3, 2
        ),
        "top_self_cpu_ms": {e.key: round(e.self_cpu_time_total / 1e3, 2) for e in top},
        "top_calls": {e.key: e.count for e in top},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="profile one run's first step")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {"benchmark": "engine_steps", "device": args.device,
                              "torch": torch.__version__, "args": vars(args) | {"out": None},
                              "batches": {}}  # fmt: skip
    for batch in args.batches:
        prompts = held_out_prompts(batch, args.prompt_len)
        rows: dict[str, Any] = {}
        for name, spec in ARMS.items():
            engine = build_engine(args, spec)
            engine.scheduler.max_num_seqs = batch
            for _ in range(2):  # graphs captured and kernels compiled on first use
                timed_steps(engine, prompts, args.output_len)
            steps = timed_steps(engine, prompts, args.output_len)
            row: dict[str, Any] = {
                "steps": len(steps),
                "sum_ms": round(sum(steps), 2),
                "first_ms": round(steps[0], 2),
                "median_ms": round(statistics.median(steps[1:] or steps), 3),
                "slowest_ms": [round(x, 2) for x in sorted(steps)[-3:]],
            }
            if args.profile:
                row["first_step_profile"] = profiled_first_step(engine, prompts, args.output_len)
            rows[name] = row
            print(batch, name, {k: v for k, v in row.items() if k != "first_step_profile"})
        result["batches"][str(batch)] = rows
    write_result(result, args.out, f"engine_steps_{args.device.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
