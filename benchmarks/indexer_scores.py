"""Lightning-indexer scores on a GPU: the fused sm100 kernel vs the torch reference.

The reference materialises [B, S, heads, T] per-head dots (in query blocks bounded by
``MAX_SCORE_ELEMENTS``), the kernel only the [B, S, T] scores. Shapes: the tiny model's index
heads, and V4-Flash-like ones (64 heads of 128, fp32 and bf16) for a prefill chunk against a
long context and for a decode batch. Median of CUDA-event timings, both ops in one run, with
the largest difference between them. Results: ``benchmarks/results/indexer_scores_<gpu>.json``.

    python benchmarks/indexer_scores.py [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from _results import write_result

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100.indexer import indexer_scores

SHAPES = [  # name, B, S, heads, dim, T, dtype
    ("tiny prefill 2048 x 2048", 1, 2048, 16, 16, 2048, torch.float32),
    ("flash prefill 2048 x 8192", 1, 2048, 64, 128, 8192, torch.float32),
    ("flash prefill 2048 x 8192 bf16", 1, 2048, 64, 128, 8192, torch.bfloat16),
    ("flash prefill 4096 x 32768 bf16", 1, 4096, 64, 128, 32768, torch.bfloat16),
    ("flash decode 128 rows x 16384 bf16", 128, 1, 64, 128, 16384, torch.bfloat16),
]


def median_ms(fn, repeats: int = 10) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_shape(ref: TorchBackend, g: torch.Generator, shape: tuple) -> dict[str, object]:  # type: ignore[type-arg]
    name, b, s, h, c, t, dtype = shape
    q = torch.randn(b, s, h, c, generator=g, device="cuda").to(dtype)
    keys = torch.randn(b, t, c, generator=g, device="cuda").to(dtype)
    w = torch.randn(b, s, h, generator=g, device="cuda")
    diff = (indexer_scores(q, keys, w) - ref.indexer_scores(q, keys, w)).abs().max().item()
    reference = median_ms(lambda: ref.indexer_scores(q, keys, w))
    kernel = median_ms(lambda: indexer_scores(q, keys, w))
    return {
        "shape": name,
        "reference_ms": round(reference, 3),
        "kernel_ms": round(kernel, 3),
        "speedup": round(reference / kernel, 2),
        "max_abs_diff": diff,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ref = TorchBackend("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for shape in SHAPES:
        rows.append(time_shape(ref, g, shape))
        print(rows[-1])
        torch.cuda.empty_cache()
    result = {
        "benchmark": "indexer_scores",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
    }
    write_result(result, args.out, "indexer_scores_h200")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
