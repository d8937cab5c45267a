"""Where an engine run's time goes, step by step, for the speculative benchmark's engines.

For each arm (no speculation, DSpark k = 5, DSpark on the adaptive schedule), one engine built
as ``speculative.py`` builds it and kept across the batches in turn (as there: what the
adaptive schedule learnt at one batch carries to the next), generates ``--output-len`` greedy
tokens for ``batch`` held-out windows, three runs; the last one's steps are each timed between
device syncs (so the GPU's time lands in the step that queued it): the number of steps, their
sum, median and slowest, and the first step (the prompts' prefill). Each step is also told by
its kind (``P``: a plain decode step; ``D``: a step after which the drafter ran, its drafts
not verified yet; ``V``: a step that verified drafts), with the milliseconds of each kind, so
a schedule that drafts where it should not shows. Steps hand out final outputs only, as
``LLM.generate`` steps do. With ``--count-ops``, the torch ops of one more run's prefill step
and of a decode step are counted (a step's host work follows them, on any device). With
``--profile``, one more run's first step is profiled (torch.profiler, CPU and CUDA): its CPU
and GPU time and the CPU ops that took the most, which tells a host-bound step from a
GPU-bound one, and the Python functions that took the most (cProfile).

    python benchmarks/engine_steps.py --device cuda [--batches 1 8 64] [--arms none]
        [--profile] [--count-ops]

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


def submit(engine: Any, prompts: list[list[int]], output_len: int) -> None:
    """Queue a run: ``output_len`` greedy tokens for each prompt."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)


def _sync(engine: Any) -> None:
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()


def _kind(spec: Any, before: tuple[int, int, int]) -> str:
    """What a step was, from the speculative runner's counters before and after it."""
    if spec is None:
        return "P"
    plain, drafts, passes = before
    if spec.num_drafts != drafts:
        return "V"
    if spec.draft_passes != passes:
        return "D"
    return "P" if spec.plain_steps != plain else "?"


def timed_steps(engine: Any, prompts: list[list[int]], output_len: int) -> tuple[list[float], str]:
    """Milliseconds of each step of one run of ``prompts``, synced before and after, and
    each step's kind (see the module)."""
    submit(engine, prompts, output_len)
    times, kinds, spec = [], [], engine.spec
    while engine.groups:
        before = (spec.plain_steps, spec.num_drafts, spec.draft_passes) if spec else (0, 0, 0)
        _sync(engine)
        start = time.perf_counter()
        engine.step(final_only=True)
        _sync(engine)
        times.append((time.perf_counter() - start) * 1e3)
        kinds.append(_kind(spec, before))
    return times, "".join(kinds)


def _row(steps: list[float], kinds: str) -> dict[str, Any]:
    """One run's figures: steps, their sum, first, median and slowest, and by kind."""
    by_kind = {
        k: {
            "steps": len(ms),
            "sum_ms": round(sum(ms), 2),
            "median_ms": round(statistics.median(ms), 3),
        }
        for k in sorted(set(kinds))
        if (ms := [t for t, c in zip(steps, kinds, strict=True) if c == k])
    }
    return {
        "steps": len(steps),
        "sum_ms": round(sum(steps), 2),
        "first_ms": round(steps[0], 2),
        "median_ms": round(statistics.median(steps[1:] or steps), 3),
        "slowest_ms": [round(x, 2) for x in sorted(steps)[-3:]],
        "kinds": kinds,
        "by_kind": by_kind,
    }


def profiled_first_step(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """The first step of a run profiled: CPU and GPU milliseconds, the top CPU ops."""
    from torch.profiler import ProfilerActivity, profile

    submit(engine, prompts, output_len)
    activities = [ProfilerActivity.CPU]
    if engine.model.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        engine.step()
        _sync(engine)
    engine.run()  # the rest of the run, untimed
    events = prof.key_averages()
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    return {
        "self_cpu_ms": round(sum(e.self_cpu_time_total for e in events) / 1e3, 2),
        "self_device_ms": round(
            sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3, 2
        ),
        "top_self_cpu_ms": {e.key: round(e.self_cpu_time_total / 1e3, 2) for e in top},
        "top_calls": {e.key: e.count for e in top},
        "python": python_profile(engine, prompts, output_len),
    }


#: Small ops whose counts a step's host work follows (allocations, fills, copies, index
#: tensors made on the host).
COUNTED_OPS = (
    "aten::zeros", "aten::full", "aten::empty", "aten::fill_", "aten::copy_",
    "aten::index_copy_", "aten::index_put_", "aten::arange", "aten::lift_fresh",
)  # fmt: skip


def op_counts(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """How many torch ops (all, and of :data:`COUNTED_OPS`) the first step of a run (the
    prompts' prefill) and its fourth (a decode step) call, from one more run."""
    from torch.profiler import ProfilerActivity, profile

    submit(engine, prompts, output_len)
    found: dict[str, Any] = {}
    step = 0
    while engine.groups:
        if step not in (0, 3):
            engine.step(final_only=True)
        else:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                engine.step(final_only=True)
            counts = {e.key: e.count for e in prof.key_averages()}
            found["prefill" if step == 0 else "decode"] = {
                "aten_ops": sum(n for k, n in counts.items() if k.startswith("aten::")),
                **{k: counts.get(k, 0) for k in COUNTED_OPS},
            }
        step += 1
    return found


def python_profile(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """One more run's first step under cProfile: the engine's and model's Python functions
    that took the most time, inner calls included (which of them drive the host time)."""
    import cProfile
    import pstats

    submit(engine, prompts, output_len)
    profiler = cProfile.Profile()
    profiler.enable()
    engine.step()
    _sync(engine)
    profiler.disable()
    engine.run()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        (f"{Path(file).parent.name}/{Path(file).name}:{line}({name})", calls, own, cumulative)
        for (file, line, name), (_, calls, own, cumulative, _) in stats.items()
        if "deepinfer" in file
    ]
    rows.sort(key=lambda r: r[3], reverse=True)
    return {
        name: {"calls": calls, "self_ms": round(own * 1e3, 2), "cum_ms": round(cum * 1e3, 2)}
        for name, calls, own, cum in rows[:40]
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="profile one run's first step")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument(
        "--count-ops", action="store_true", help="torch ops of a prefill and a decode step"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {"benchmark": "engine_steps", "device": args.device,
                              "torch": torch.__version__, "args": vars(args) | {"out": None},
                              "batches": {}}  # fmt: skip
    engines = {name: build_engine(args, ARMS[name]) for name in args.arms}
    for batch in args.batches:
        prompts = held_out_prompts(batch, args.prompt_len)
        rows: dict[str, Any] = {}
        for name, engine in engines.items():
            engine.scheduler.max_num_seqs = batch
            for _ in range(2):  # graphs captured and kernels compiled on first use
                timed_steps(engine, prompts, args.output_len)
            row = _row(*timed_steps(engine, prompts, args.output_len))
            if args.count_ops:
                row["op_counts"] = op_counts(engine, prompts, args.output_len)
            if args.profile:
                row["first_step_profile"] = profiled_first_step(engine, prompts, args.output_len)
            rows[name] = row
            print(
                batch, name, {k: v for k, v in row.items() if k != "first_step_profile"}, flush=True
            )
        result["batches"][str(batch)] = rows
    write_result(result, args.out, f"engine_steps_{args.device.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
