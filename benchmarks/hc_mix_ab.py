"""A/B of the sm100 backend's ``hc_mix``: the working tree's kernel (bf16 parts of fn on tensor
cores for bf16 streams) against an earlier one (``--old``; the IEEE fp32 dots on CUDA cores
that 6c4b2ff had), on bf16 streams.

For each hidden size (n = 4 streams, 24 outputs) and row count: the median time of each over
``--runs`` timings after a warm-up (``--graph-calls`` back-to-back calls captured in one CUDA
graph, as the engine replays decode steps, timed with CUDA events around a replay and divided
by their count; single eager calls where capture fails, and wall clock on the CPU), the bytes
of x read per second, each one's max abs error and max relative error against a float64
recomputation (relative to the largest logit, and to the magnitude ``scale * sum_k |x_k|
|fn_jk|`` that bounds an fp32 dot's error), and whether the new one's first and last rows
come out bitwise the same computed alone.

``--sweep`` also times the new kernel over tiling constants (HC_MIX_SPLIT, HC_MIX_BLOCK_R,
HC_MIX_BLOCK_K, HC_MIX_WARPS) to compare them.

The new kernel is imported from the working tree's source (packages/deepinfer-kernels-sm100/
src, put first on sys.path), the old one from ``--old``, a copy of an earlier ``mhc.py``, under
its own module name:

    git show 6c4b2ff:packages/deepinfer-kernels-sm100/src/deepinfer_kernels_sm100/mhc.py \
        > /tmp/mhc_old.py
    OUT=dir python benchmarks/hc_mix_ab.py --old /tmp/mhc_old.py [--sweep]
    TRITON_INTERPRET=1 python benchmarks/hc_mix_ab.py --old /tmp/mhc_old.py --device cpu \
        --hidden 32 --rows 1 17 --runs 2          (a CPU check of the code paths)
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# The working tree's kernels, ahead of any installed copy of the package.
sys.path.insert(0, str(REPO / "packages" / "deepinfer-kernels-sm100" / "src"))

import torch  # noqa: E402

from deepinfer_kernels_sm100 import mhc as new_mhc  # noqa: E402

HC = 4
WIDTH = (2 + HC) * HC
EPS = 1e-6
TUNABLES = ("HC_MIX_SPLIT", "HC_MIX_BLOCK_R", "HC_MIX_BLOCK_K", "HC_MIX_WARPS")


def load_old(path: Path) -> ModuleType:
    """The old mhc.py under its own module name, so it cannot clash with the package."""
    spec = importlib.util.spec_from_file_location("hcmix_ab_mhc_old", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(x: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, magnitude) in float64, in row chunks to bound the memory."""
    flat = x.reshape(x.shape[0], -1)
    f64 = fn.double()
    logits, magnitude = [], []
    for chunk in flat.split(2048):
        c = chunk.double()
        scale = torch.rsqrt(c.square().mean(-1, keepdim=True) + EPS)
        logits.append((c @ f64.T) * scale)
        magnitude.append((c.abs() @ f64.abs().T) * scale)
    return torch.cat(logits), torch.cat(magnitude)


def errors(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor) -> dict[str, float]:
    err = (got.double() - want).abs()
    return {
        "max_abs": err.max().item(),
        "max_rel": (err.max() / want.abs().max()).item(),
        "max_rel_magnitude": (err / magnitude.clamp_min(1e-300)).max().item(),
    }


def median_us(
    call: Callable[[], Any], device: torch.device, runs: int, warmup: int, graph_calls: int = 10
) -> float:
    """Median microseconds of ``call``: on a GPU, replays of a CUDA graph of ``graph_calls``
    calls timed by events, per call (single eager calls if capture fails); on the CPU, wall
    clock."""
    for _ in range(warmup):
        call()
    if device.type != "cuda":
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize(device)
    run: Callable[[], Any] = call
    per_run = 1
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            call()  # allocations outside the capture
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(graph_calls):
                    call()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph.replay()
        run, per_run = graph.replay, graph_calls
    except Exception as e:
        print(f"  (no CUDA graph: {type(e).__name__}: {e}; timing eager calls)")
    torch.cuda.synchronize(device)
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / per_run)
    return statistics.median(times)


def inputs(rows: int, hidden: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 7919 + hidden)
    x = torch.randn(rows, HC, hidden, generator=g).to(torch.bfloat16).to(device)
    fn = (torch.randn(WIDTH, HC * hidden, generator=g) * 0.02).to(device)
    return x, fn


def ab_case(
    old: ModuleType,
    *,
    rows: int,
    hidden: int,
    device: torch.device,
    runs: int,
    warmup: int,
    graph_calls: int,
) -> dict[str, Any]:
    x, fn = inputs(rows, hidden, device)
    want, magnitude = reference(x, fn)
    result: dict[str, Any] = {"hidden": hidden, "rows": rows, "x_bytes": x.numel() * 2}
    for name, module in (("old", old), ("new", new_mhc)):
        got = module.hc_mix(x, fn, EPS)
        us = median_us(lambda m=module: m.hc_mix(x, fn, EPS), device, runs, warmup, graph_calls)
        result[name] = {
            "median_us": us,
            "x_gb_per_s": result["x_bytes"] / us / 1e3,
            **errors(got, want, magnitude),
        }
    new_all = new_mhc.hc_mix(x, fn, EPS)
    result["new_rows_batch_invariant"] = all(
        torch.equal(new_mhc.hc_mix(x[r : r + 1], fn, EPS)[0], new_all[r]) for r in {0, rows - 1}
    )
    result["speedup"] = result["old"]["median_us"] / result["new"]["median_us"]
    return result


def sweep_case(
    *,
    rows: int,
    hidden: int,
    device: torch.device,
    runs: int,
    warmup: int,
    graph_calls: int,
    configs: list[tuple[int, ...]],
) -> list[dict[str, Any]]:
    x, fn = inputs(rows, hidden, device)
    saved = {k: getattr(new_mhc, k) for k in TUNABLES}
    out = []
    try:
        for config in configs:
            entry: dict[str, Any] = {
                "hidden": hidden,
                "rows": rows,
                **dict(zip(TUNABLES, config, strict=True)),
            }
            try:
                for k, v in zip(TUNABLES, config, strict=True):
                    setattr(new_mhc, k, v)
                entry["median_us"] = median_us(
                    lambda: new_mhc.hc_mix(x, fn, EPS), device, runs, warmup, graph_calls
                )
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {e}"[:300]
            out.append(entry)
    finally:
        for k, v in saved.items():
            setattr(new_mhc, k, v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device)
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 4096, 16384])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--graph-calls", type=int, default=10, help="calls per timed replay")
    parser.add_argument("--old", type=Path, required=True, help="a copy of an earlier mhc.py")
    parser.add_argument("--sweep", action="store_true", help="also time tiling constants")
    parser.add_argument("--sweep-split", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--sweep-block-r", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--sweep-block-k", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--sweep-warps", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()

    device = torch.device(args.device)
    old = load_old(args.old)
    print(f"new: {new_mhc.__file__}\nold: {old.__file__}\ndevice: {device}", end="")
    if device.type == "cuda":
        print(f" ({torch.cuda.get_device_name(device)})", end="")
    print("\nnew tiles: " + ", ".join(f"{k}={getattr(new_mhc, k)}" for k in TUNABLES))
    report: dict[str, Any] = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tiles": {k: getattr(new_mhc, k) for k in TUNABLES},
        "cases": [],
        "failures": [],
        "sweep": [],
    }
    header = (
        f"{'hidden':>6} {'rows':>6} | {'old us':>9} {'new us':>9} {'x':>6} | "
        f"{'old GB/s':>8} {'new GB/s':>8} | {'old abs':>8} {'new abs':>8} | "
        f"{'old rel':>8} {'new rel':>8} {'new rel|m|':>10} | inv"
    )
    print(header)
    print("-" * len(header))
    for hidden, rows in itertools.product(args.hidden, args.rows):
        try:
            r = ab_case(
                old,
                rows=rows,
                hidden=hidden,
                device=device,
                runs=args.runs,
                warmup=args.warmup,
                graph_calls=args.graph_calls,
            )
        except Exception as e:
            report["failures"].append(
                {"hidden": hidden, "rows": rows, "error": traceback.format_exc()[-2000:]}
            )
            print(f"{hidden:>6} {rows:>6} | FAILED: {type(e).__name__}: {e}"[:200])
            continue
        report["cases"].append(r)
        o, n = r["old"], r["new"]
        print(
            f"{hidden:>6} {rows:>6} | {o['median_us']:>9.1f} {n['median_us']:>9.1f} "
            f"{r['speedup']:>5.1f}x | {o['x_gb_per_s']:>8.0f} {n['x_gb_per_s']:>8.0f} | "
            f"{o['max_abs']:>8.1e} {n['max_abs']:>8.1e} | {o['max_rel']:>8.1e} "
            f"{n['max_rel']:>8.1e} {n['max_rel_magnitude']:>10.1e} | "
            f"{'yes' if r['new_rows_batch_invariant'] else 'NO'}",
            flush=True,
        )
    if args.sweep:
        configs = [
            c
            for c in itertools.product(
                args.sweep_split, args.sweep_block_r, args.sweep_block_k, args.sweep_warps
            )
            if c[2] <= c[0]
        ]
        print(f"\nsweep: {len(configs)} configs ({', '.join(TUNABLES)})")
        for hidden, rows in itertools.product(args.hidden, args.rows):
            try:
                entries = sweep_case(
                    rows=rows,
                    hidden=hidden,
                    device=device,
                    runs=args.runs,
                    warmup=args.warmup,
                    graph_calls=args.graph_calls,
                    configs=configs,
                )
            except Exception as e:
                print(f"{hidden:>6} {rows:>6} | sweep FAILED: {type(e).__name__}: {e}"[:200])
                continue
            report["sweep"].extend(entries)
            timed = sorted((e for e in entries if "median_us" in e), key=lambda e: e["median_us"])
            best = ", ".join(
                f"{tuple(e[k] for k in TUNABLES)}={e['median_us']:.1f}" for e in timed[:4]
            )
            print(f"{hidden:>6} {rows:>6} | best: {best}", flush=True)
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "hc_mix_ab.json").write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out_dir / 'hc_mix_ab.json'}; {len(report['failures'])} failure(s)")


if __name__ == "__main__":
    main()
