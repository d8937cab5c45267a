"""The projections computed in fp32 (head, router gate, compressors): precision against time.

The model reference computes them as ``x.float() @ w.float().T`` from bf16 checkpoint weights.
Each way of doing that on the GPU, at V4-Flash's shapes (and the head at config A's width):

* ``fp32_weight``: the weight widened to fp32 at load, an fp32 GEMM (CUDA cores);
* ``bf16_split3``: the weight held in bf16 and an fp32 input split into three bf16 parts in
  one GEMM of three times the rows (``deepinfer_kernels_sm100.split_linear``, the sm100
  backend's choice for inputs narrower than 253): the fp32 product up to summation order;
* ``bf16_split2`` / ``bf16_split1``: two parts (the backend's choice from 253 on: the 8 bits
  dropped are within the fp32 dot-product bound there), or the input rounded to bf16 once:
  cheaper at large batch, with the input's last 8 or 16 significand bits dropped;
* a bf16 input (router gate, compressors: their input is the bf16 hidden state) needs no split,
  so ``bf16_split1`` is exact there.

Per shape and row count: the median GPU time of one call (CUDA graphs of several calls, each
on its own weight copy so the weights come from HBM), and the accuracy against a float64
recomputation: the largest error over the fp32 error bound ``(K + 4) 2**-24 sum |x||w|`` (at
most 1 for fp32-equivalent), the largest absolute error, and for the head the rows whose
argmax differs from float64's.

    python benchmarks/fp32_projections.py [--device cuda] [--rows 1 8 64 256 1024] [--out p]
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _results import write_result
from low_precision import copies_for, graph_s

from deepinfer_kernels_sm100.split_linear import linear_fp32

#: (name, output features N, input features K, input dtype): V4-Flash's head, router gate and
#: compressor projections (CSA's overlapping pair, HCA's single window), config A's head.
SHAPES: tuple[tuple[str, int, int, torch.dtype], ...] = (
    ("head_v4_flash", 129280, 4096, torch.float32),
    ("head_config_a", 129280, 2048, torch.float32),
    ("router_gate", 256, 4096, torch.bfloat16),
    ("compressor_csa", 1024, 4096, torch.bfloat16),
    ("compressor_hca", 512, 4096, torch.bfloat16),
)


def variants(x_dtype: torch.dtype) -> dict[str, Any]:
    """name -> (weight dtype, fn(x, w)); splits only where the input is fp32."""
    out: dict[str, Any] = {"fp32_weight": (torch.float32, lambda x, w: F.linear(x.float(), w))}
    for parts in (3, 2, 1) if x_dtype == torch.float32 else (1,):
        fn = functools.partial(linear_fp32, parts=parts) if parts > 1 else _one_part
        out[f"bf16_split{parts}"] = (torch.bfloat16, fn)
    return out


def _one_part(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The input rounded to bf16 once (exact for a bf16 input)."""
    return linear_fp32(x.to(torch.bfloat16), w)


def reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 product of the exact operands and the fp32 error bound on it."""
    xd, wd = x.double(), w.double()
    bound = (x.shape[-1] + 4) * 2.0**-24 * (xd.abs() @ wd.abs().T)
    return xd @ wd.T, bound


def accuracy(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, head: bool) -> dict:
    """Errors of ``got`` against the float64 product ``want``."""
    err = (got.double() - want).abs()
    out: dict[str, Any] = {
        "max_err_over_fp32_bound": float((err / bound.clamp_min(1e-300)).max()),
        "max_abs_err": float(err.max()),
        "max_abs_value": float(want.abs().max()),
    }
    if head:
        out["argmax_differs"] = int((got.argmax(-1) != want.argmax(-1)).sum())
    return out


def run_shape(name: str, n: int, k: int, x_dtype: torch.dtype, rows: list[int]) -> dict:
    """Every variant at every row count for one projection shape."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w_bf16 = (torch.randn(n, k, generator=g, device="cuda") / k**0.5).to(torch.bfloat16)
    result: dict[str, Any] = {"n": n, "k": k, "input": str(x_dtype), "rows": {}}
    for m in rows:
        x = torch.randn(m, k, generator=g, device="cuda").to(x_dtype)
        want, bound = reference(x, w_bf16)
        per: dict[str, Any] = {}
        for vname, (w_dtype, fn) in variants(x_dtype).items():
            weights = [w_bf16.to(w_dtype) for _ in range(copies_for(n * k * w_dtype.itemsize))]
            got = fn(x, weights[0])
            per[vname] = accuracy(got, want, bound, name.startswith("head"))
            per[vname]["us"] = 1e6 * graph_s([functools.partial(fn, x, wc) for wc in weights], 20)
            del weights
        base = per["fp32_weight"]["us"]
        for body in per.values():
            body["speedup_vs_fp32_weight"] = base / body["us"]
        result["rows"][str(m)] = per
        print(name, m, {v: round(b["us"], 1) for v, b in per.items()}, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fp32_projections.py times GPU kernels: it needs CUDA")
    shapes = {s[0]: run_shape(*s, rows=args.rows) for s in SHAPES}
    result = {
        "benchmark": "fp32_projections",
        "device_name": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shapes": shapes,
        "notes": __doc__,
    }
    write_result(result, args.out, "fp32_projections_h200")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
