"""Launch shapes of the bf16 grouped-expert kernels (``deepinfer_kernels_sm100.moe``), side by
side at the shapes of real steps.

For each case (config A's prefill of 4k and 16k tokens and decode batches, a V4-Flash-width
layer's prefill and decode), each launch shape in :data:`SHAPES` of its regime (``small``:
decode batches, ``moe.TIERS``; ``large``: longer chunks, ``moe.LARGE``) is set as the
module's shape and ``moe_experts`` (grouping, both grouped matmuls, the slot sum) is captured
``--replays`` times in one CUDA graph (``low_precision.graph_timer``) and replayed: the median
of ``--repeats`` replays, shapes interleaved replay by replay. Each figure also as TFLOP/s of
the two matmuls and against a dense ``torch.matmul`` of the same FLOPs (the pairs as one
[P, d] matrix through one expert's weights: no grouping, cuBLAS's tiles), timed the same way.
``serial`` is the shape before the row split (one program walks all of an expert's row tiles);
``*_h<k>`` (:data:`HEADROOMS`) take a shape with ``moe.SPLIT_HEADROOM`` set to k: the splits
sized for an expert k standard deviations busier than the mean.

    python benchmarks/moe_tiles.py [--cases config_a_prefill_4k ...] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from low_precision import graph_timer

from deepinfer_kernels_sm100 import moe
from deepinfer_kernels_sm100.moe import ExpertLaunch

#: (tokens, hidden, expert width, experts, top-k) of each case.
CASES: dict[str, tuple[int, int, int, int, int]] = {
    "config_a_prefill_4k": (4096, 2048, 768, 16, 4),
    "config_a_prefill_16k": (16384, 2048, 768, 16, 4),
    "config_a_decode_256": (256, 2048, 768, 16, 4),
    "config_a_decode_64": (64, 2048, 768, 16, 4),
    "config_a_decode_8": (8, 2048, 768, 16, 4),
    "config_a_decode_1": (1, 2048, 768, 16, 4),
    "flash_prefill_4k": (4096, 4096, 2048, 256, 6),
    "flash_decode_256": (256, 4096, 2048, 256, 6),
}

_NO_SPLIT = 10**6  # tiles a program: one program walks every tile of its expert

#: Launch shapes tried in each regime: (block_m, block_n, block_k, warps, stages, tiles);
#: ``shipped`` is the one ``moe.launch_for`` picks for the case.
SHAPES: dict[str, dict[str, ExpertLaunch | None]] = {
    "small": {
        "shipped": None,
        "before": ExpertLaunch(16, 64, 64, 4, 3, 4),
        "split": ExpertLaunch(16, 64, 64, 4, 3, 1),
        "n128": ExpertLaunch(16, 128, 64, 4, 3, 4),
        "n128_split2": ExpertLaunch(16, 128, 64, 4, 3, 2),
        "m32": ExpertLaunch(32, 64, 64, 4, 3, 2),
        "m64_n128_w8": ExpertLaunch(64, 128, 64, 8, 3, 1),
        "k128": ExpertLaunch(16, 64, 128, 4, 3, 4),
        "n32_k128_s4": ExpertLaunch(16, 32, 128, 4, 4, 4),
        "m64_n64_w4": ExpertLaunch(64, 64, 64, 4, 3, 1),
        "m64_n64_w4_s4": ExpertLaunch(64, 64, 64, 4, 4, 1),
        "m64_n128_w4": ExpertLaunch(64, 128, 64, 4, 3, 1),
        "m64_n128_w8_s4": ExpertLaunch(64, 128, 64, 8, 4, 1),
        "m64_n128_k128_w8": ExpertLaunch(64, 128, 128, 8, 3, 1),
        "m128_n64_w8": ExpertLaunch(128, 64, 64, 8, 3, 1),
        "m128_n128_w8": ExpertLaunch(128, 128, 64, 8, 3, 1),
        "m32_n128_w4": ExpertLaunch(32, 128, 64, 4, 3, 2),
    },
    "large": {
        "shipped": None,
        "serial": ExpertLaunch(64, 64, 64, 4, 3, _NO_SPLIT),
        "split": ExpertLaunch(64, 64, 64, 4, 3, 1),
        "m64_n128": ExpertLaunch(64, 128, 64, 4, 3, 1),
        "m64_n128_w8": ExpertLaunch(64, 128, 64, 8, 3, 1),
        "m128_n64": ExpertLaunch(128, 64, 64, 4, 3, 1),
        "m128_n128_w8": ExpertLaunch(128, 128, 64, 8, 3, 1),
        "m128_n128_w8_s4": ExpertLaunch(128, 128, 64, 8, 4, 1),
        "m128_n128_k32_w8_s4": ExpertLaunch(128, 128, 32, 8, 4, 1),
        "m64_n256_w8": ExpertLaunch(64, 256, 64, 8, 3, 1),
        "m128_n128_w8_t2": ExpertLaunch(128, 128, 64, 8, 3, 2),
    },
}


#: Extra variants: (the shape of ``SHAPES`` they take, ``moe.SPLIT_HEADROOM``).
HEADROOMS: dict[str, tuple[str, float]] = {
    "shipped_h2": ("shipped", 2.0),
    "shipped_h4": ("shipped", 4.0),
    "m32_h4": ("m32", 4.0),
}


def use_shape(regime: str, shape: ExpertLaunch) -> None:
    """Make ``moe.launch_for`` pick ``shape`` for every case of ``regime``."""
    if regime == "small":
        moe.TIERS = ((moe.TIERS[-1][0], shape),)
    else:
        moe.LARGE = shape


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    n, d, inter, experts, k = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, d, device="cuda", generator=g, dtype=torch.bfloat16)
    w13 = torch.randn(experts, 2 * inter, d, device="cuda", generator=g, dtype=torch.bfloat16)
    w2 = torch.randn(experts, d, inter, device="cuda", generator=g, dtype=torch.bfloat16)
    w13 /= d**0.5
    w2 /= inter**0.5
    scores = torch.rand(n, experts, device="cuda", generator=g)
    weights, indices = scores.topk(k, dim=-1)
    pairs = n * k
    slots = min(experts, pairs)
    shipped = moe.launch_for(pairs, slots)[0]
    regime = "large" if shipped == moe.LARGE else "small"
    shapes = {label: shape or shipped for label, shape in SHAPES[regime].items()}
    flops = 2 * pairs * d * 3 * inter
    timers: dict[str, Callable[[], float]] = {}
    results: dict[str, Any] = {}
    saved = moe.TIERS, moe.LARGE, moe.SPLIT_HEADROOM
    variants = {label: (shape, saved[2]) for label, shape in shapes.items()}
    variants |= {
        label: (shapes[base], h) for label, (base, h) in HEADROOMS.items() if base in shapes
    }
    try:
        for label, (shape, headroom) in variants.items():
            use_shape(regime, shape)
            moe.SPLIT_HEADROOM = headroom
            call = lambda: moe.moe_experts(  # noqa: E731
                x, weights, indices, w13=w13, w2=w2, swiglu_limit=0.0
            )
            try:
                timers[label] = graph_timer([call], args.replays)
                results[label] = {"splits": moe.launch_for(pairs, slots)[1]}
            except Exception as exc:  # a shape past the device's shared memory
                results[label] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        moe.TIERS, moe.LARGE, moe.SPLIT_HEADROOM = saved
    a13, a2 = x.new_empty(pairs, d).normal_(), x.new_empty(pairs, inter).normal_()
    timers["dense_matmul"] = graph_timer([lambda: (a13 @ w13[0].T, a2 @ w2[0].T)], args.replays)
    results["dense_matmul"] = {}
    samples: dict[str, list[float]] = {label: [] for label in timers}
    for _ in range(args.repeats):
        for label, timer in timers.items():
            samples[label].append(timer())
    for label, times in samples.items():
        ms = statistics.median(times) * 1e3
        results[label] |= {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)}
    timed = [(r["ms"], label) for label, r in results.items() if "ms" in r]
    best = min(entry for entry in timed if entry[1] != "dense_matmul")
    print(f"{name} ({regime}): " + ", ".join(f"{k} {v.get('ms')}" for k, v in results.items()))
    return {
        "tokens": n,
        "hidden": d,
        "expert_width": inter,
        "experts": experts,
        "top_k": k,
        "regime": regime,
        "gflop": round(flops / 1e9, 2),
        "shapes": {label: shape._asdict() for label, shape in shapes.items()},
        "headrooms": {label: HEADROOMS[label][1] for label in variants if label in HEADROOMS},
        "results": results,
        "fastest": best[1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("moe_tiles.py needs an NVIDIA GPU")
    name = torch.cuda.get_device_name().split()[1].lower()  # e.g. "h200"
    result = {
        "benchmark": "moe_tiles",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "cases": {case: run_case(case, args) for case in args.cases},
    }
    write_result(result, args.out, f"moe_tiles_{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
