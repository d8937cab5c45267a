"""Where a speculative round's time goes, against what the adaptive schedule's profile prices.

The adaptive schedule (``scheduling: "adaptive"``) drafts only when a round pays for itself at
the step costs profiled at engine start (:mod:`deepinfer.engine.verify_profile`). This script
puts, side by side in one process for the embedded tiny model with a DSpark drafter (fixed
``k``, greedy, the prompts of ``speculative.py``):

* ``profile``: the profile's own dummy steps (``_DummySteps.run``), timed as the profile times
  them, for a plain step and verification steps of 1, 2 and ``k`` drafts a row, and the same
  step cut into its parts with a device sync around each (batch build, the pass, the logits
  to fp32, the greedy draws read back, the rollback of every row);
* ``engine``: the engine's rounds at the same batch, each part timed the same way (the
  verification pass, the draws, the drafting pass, the rollbacks, the whole step), and the
  plain engine's step;
* ``kernels``: CUDA kernels launched by one profiled verification step and by one engine
  round (torch profiler), with their GPU time against the round's wall time;
* ``--cprofile``: the engine's whole generation of the prompts, unsynced as it runs in
  service, under cProfile (the host functions taking the most time, by own and cumulative
  time) with its wall time per output position.

    python benchmarks/round_parts.py --device cuda [--batch 1] [--k 5] [--cprofile]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from speculative import build_engine, held_out_prompts

from deepinfer.engine import speculative as speculative_module
from deepinfer.engine import verify_profile
from deepinfer.engine.verify_cost import spread
from deepinfer.engine.verify_profile import _DummySteps, _inputs
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.sampling.sampler import sample


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 3)


def profile_parts(
    engine: Any, rows: int, k: int, repeats: int, context: int | None = None
) -> dict[str, Any]:
    """The profile's dummy steps (over ``context`` tokens; default: the profile's own):
    whole, as timed at start-up, and cut into synced parts."""
    if context is not None:
        verify_profile.PROFILE_CONTEXT = context
    model, drafter = engine.model, engine.spec.drafter
    layers = tuple(getattr(drafter, "feature_layers", None) or ())
    graphs = DecodeGraphs(rows) if model.device.type == "cuda" else None
    steps = _DummySteps(model, rows, k, layers, graphs)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    whole: dict[int, list[float]] = collections.defaultdict(list)
    parts: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for _ in range(repeats):
            steps.run(rows, 0)
            for drafts in (0, rows, 2 * rows, k * rows):
                whole[drafts].append(steps.run(rows, drafts))
            _timed_run(steps, rows, k * rows, parts, sync)
        kernels = _kernels(lambda: steps.run(rows, k * rows))
        captured = None if graphs is None else graphs.num_captured
    finally:
        steps.close()
    return {
        "context": steps.context,
        "whole_ms": {f"drafts_{d}": ms(v) for d, v in whole.items()},
        "parts_ms": {name: ms(v) for name, v in parts.items()},
        "kernels_verify_step": kernels,
        "graphs_captured": captured,
    }


def _timed_run(
    steps: _DummySteps,
    rows: int,
    drafts: int,
    parts: dict[str, list[float]],
    sync: Callable[[], None],
) -> None:
    """``steps.run(rows, drafts)``, each part between device syncs."""

    def part(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        sync()
        begin = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        parts[name].append(time.perf_counter() - begin)
        return out

    used, lengths = steps.states[:rows], spread(rows, drafts)
    chunks, start = [], steps.context
    for n in lengths:
        chunks.append(steps.ids[start : start + n])
        start += n
    build = ForwardBatch.build
    batch = part("batch_build", build, chunks, used, lengths, return_streams=not steps.layers)
    out = part("forward", steps.model, batch, steps.graphs, capture=steps.layers)
    logits = part("logits_fp32", out.logits.float)
    greedy = _inputs(logits.shape[0], logits.device, 0.0)

    def draws() -> list[int]:
        return sample(logits, greedy, ops=steps.model.ops).token_ids.tolist()

    part("draws", draws)
    part("rollback", steps._rollback, used)


def engine_parts(
    engine: Any, plain: Any, prompts: list[list[int]], output_len: int
) -> dict[str, Any]:
    """The engine's rounds (and the plain engine's steps) on ``prompts``, parts synced."""
    from deepinfer.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    sync = torch.cuda.synchronize if engine.model.device.type == "cuda" else (lambda: None)
    for eng in (engine, plain):  # warm-up: graphs, kernels
        for p in prompts:
            eng.add_request(p, params)
        eng.run()
    spent: dict[str, list[float]] = collections.defaultdict(list)
    spec = engine.spec
    hooks = [
        (spec, "_forward", "forward"),
        (speculative_module, "step_targets", "draws"),
        (spec.drafter, "draft_batch", "drafter"),
        (engine.model, "rollback", "rollback"),
        (engine, "step", "engine_step"),
    ]
    for obj, name, label in hooks:
        setattr(obj, name, _listed(getattr(obj, name), label, spent, sync))
    try:
        for p in prompts:
            engine.add_request(p, params)
        engine.run()
    finally:
        for obj, name, _ in hooks:
            if obj is speculative_module:
                setattr(obj, name, getattr(obj, name).__wrapped__)
            else:
                delattr(obj, name)
    plain_steps: list[float] = []
    plain.step = _listed(plain.step, "step", {"step": plain_steps}, sync)
    try:
        for p in prompts:
            plain.add_request(p, params)
        plain.run()
    finally:
        del plain.step
    for p in prompts:
        engine.add_request(p, params)
    engine.step()  # the prefill
    kernels = _kernels(engine.step)
    engine.run()
    graphs = engine.spec.graphs
    # the first engine step is the prompts' prefill: left out of every part
    return {
        "rounds": len(spent["engine_step"]) - 1,
        "parts_ms": {
            name: ms(v[1:] if name in {"forward", "engine_step"} else v)
            for name, v in spent.items()
        },
        "calls": {name: len(v) for name, v in spent.items()},
        "plain_engine_step_ms": ms(plain_steps[1:]),
        "kernels_engine_round": kernels,
        "engine_graphs_captured": None if graphs is None else graphs.num_captured,
    }


def _listed(
    fn: Callable[..., Any],
    label: str,
    spent: dict[str, list[float]],
    sync: Callable[[], None],
) -> Callable[..., Any]:
    """``fn`` timed between device syncs, each call's seconds appended to ``spent[label]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync()
        begin = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        spent.setdefault(label, []).append(time.perf_counter() - begin)
        return out

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _kernels(fn: Callable[[], Any]) -> dict[str, int] | None:
    """CUDA kernels one call of ``fn`` runs, and the host's kernel and graph launches for
    them (torch profiler; None on a CPU)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - begin
    events = prof.key_averages()
    cuda = sorted(
        (e for e in events if e.device_type.name == "CUDA"),
        key=lambda e: -e.self_device_time_total,
    )
    return {
        "top_kernels_us": {e.key[:60]: round(e.self_device_time_total, 1) for e in cuda[:8]},
        "kernels": sum(e.count for e in events if e.device_type.name == "CUDA"),
        "kernel_launches": sum(e.count for e in events if e.key == "cudaLaunchKernel"),
        "graph_launches": sum(e.count for e in events if e.key == "cudaGraphLaunch"),
        "kernel_us": round(sum(e.self_device_time_total for e in cuda), 1),
        "wall_us_profiled": round(wall * 1e6, 1),
    }


def host_profile(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """The engine's generation of ``prompts`` as it runs in service (no syncs added): its
    wall time, then the top host functions of a second run under cProfile."""
    from host_time import profiled

    from deepinfer.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)

    def generate() -> None:
        for p in prompts:
            engine.add_request(p, params)
        engine.run()

    device = str(engine.model.device)
    begin = time.perf_counter()
    generate()
    wall = time.perf_counter() - begin
    return {
        "wall_ms_per_output_position": round(wall * 1e3 / output_len, 3),
        "cprofile": profiled(generate, device, lines=40, warm=False),  # warm: the timed run
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        default=[verify_profile.PROFILE_CONTEXT],
        help="context tokens of the profile's dummy steps (one profile each)",
    )
    ap.add_argument("--cprofile", action="store_true", help="also profile the host (see above)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    spec = {"method": "dspark", "num_speculative_tokens": args.k}
    engine, plain = build_engine(args, spec), build_engine(args, None)
    prompts = held_out_prompts(args.batch, args.prompt_len)
    result: dict[str, Any] = {
        "benchmark": "round_parts",
        "device": args.device,
        "torch": torch.__version__,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "engine": engine_parts(engine, plain, prompts, args.output_len),
        "profile": {
            str(c): profile_parts(engine, args.batch, args.k, args.repeats, c)
            for c in args.contexts
        },
    }
    if args.cprofile:
        result["host"] = {
            "dspark": host_profile(engine, prompts, args.output_len),
            "none": host_profile(plain, prompts, args.output_len),
        }
    print({k: v for k, v in result.items() if k != "host"}, flush=True)
    write_result(result, args.out, f"round_parts_{args.device.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
