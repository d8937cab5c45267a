"""fp32 products of few rows: cuBLAS's kernel choice by row count, and the backend's padding.

The embedded tiny model runs in fp32, so its projections are cuBLAS fp32 GEMMs of a step's rows
(a decode batch, or verification rows of k + 1 tokens) by weights of 128 columns. For some row
counts and shapes cuBLAS picks a kernel far slower than for a few rows fewer or more; the
``sm100`` backend's ``linear`` pads those products' rows (``pads_fp32_rows``). For
each of the tiny model's weight shapes and each row count this times, side by side, the plain
``F.linear`` and the backend's ``linear``: products captured in one CUDA graph and replayed, so
the figure is GPU time per product, not launch overhead (median of ``--repeats`` replays).

    python benchmarks/fp32_linear_rows.py

Results go to ``benchmarks/results/fp32_linear_rows_<gpu>.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import write_result
from attention_kernels import graph_us

#: (out, in) of the tiny model's fp32 projections (its config: hidden 128, q rank 64).
SHAPES = ((128, 128), (256, 64), (384, 128), (640, 128), (8192, 128))
ROWS = (*range(1, 25), 32, 48, 64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from deepinfer_kernels_sm100.backend import Sm100Backend, pads_fp32_rows

    ops = Sm100Backend(torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    cases: dict[str, dict[str, float]] = {}
    for n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", generator=g)
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", generator=g)
            plain = graph_us(lambda x=x, w=w: F.linear(x, w), args.repeats)
            padded = graph_us(lambda x=x, w=w: ops.linear(x, w), args.repeats)
            cases[f"{rows}x{k}->{n}"] = {
                "F.linear_us": plain,
                "backend_linear_us": padded,
                "padded": pads_fp32_rows(rows, w),
            }
            print(f"rows {rows:3d} {k:4d} -> {n:5d}: F.linear {plain:7.2f} us, "
                  f"backend {padded:7.2f} us", flush=True)  # fmt: skip
    name = torch.cuda.get_device_name().split()[1].lower()
    result = {
        "benchmark": "fp32_linear_rows",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "args": vars(args) | {"out": None},
        "cases": cases,
    }
    write_result(result, args.out, f"fp32_linear_rows_{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
