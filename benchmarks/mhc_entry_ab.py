"""Launch shapes of the sm100 mHC entry's second kernel (``mhc_fused._mhc_finish_kernel``).

A decode step runs the entry twice a layer; at batch 1 the second kernel is one program per
row, a latency-bound chain: the splits' sums, the gates, 20 Sinkhorn iterations of row and
column sums over a 4 x 4 mix, then the streams' collapse and its RMSNorm, either over the whole
row loaded at the program's start or in column blocks read twice (once for the norm).

For each hidden size, row count, warps of a whole row (``FINISH_CELLS_PER_WARP``), column block
(``FINISH_BLOCK_D``) and whole-row limit (``FINISH_ROW_CELLS``; 0: never whole), the median
time of ``mhc_entry`` as a decoder layer calls it (collapse and RMSNorm; ``--quant`` adds the
FP8 codes) less the mixer's first kernel alone, timed the same way (``hc_mix_ab.median_us``:
CUDA graphs of back-to-back calls); ``sinkhorn_1`` is the same with one Sinkhorn iteration, to
show the iterations' share. Each variant's outputs are compared with the shipped launch
shape's (max abs difference; 0 where the bits agree).

    OUT=dir python benchmarks/mhc_entry_ab.py [--hidden 2048 4096] [--rows 1 32 256 4096]
    TRITON_INTERPRET=1 python benchmarks/mhc_entry_ab.py --device cpu --hidden 256 --rows 1 3 \
        --cells-per-warp 4096 --blocks 128 --row-cells 0 16384 --runs 1 --quant    (a CPU check)
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "packages" / "deepinfer-kernels-sm100" / "src"))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import triton  # noqa: E402
from _results import write_result  # noqa: E402
from hc_mix_ab import HC, WIDTH, inputs, median_us  # noqa: E402

from deepinfer_kernels_sm100 import mhc_fused  # noqa: E402
from deepinfer_kernels_sm100.mhc import hc_mix_parts  # noqa: E402

EPS = 1e-6
ITERS = 20
KNOBS = ("FINISH_CELLS_PER_WARP", "FINISH_BLOCK_D", "FINISH_ROW_CELLS")


def entry(x: torch.Tensor, fn: torch.Tensor, quant: bool, iters: int) -> tuple[Any, ...]:
    """One sublayer entry as the decoder layer calls it."""
    weight = torch.ones(x.shape[-1], device=x.device)
    norm = mhc_fused.Normed(weight, EPS, quant)
    base = torch.zeros(WIDTH, device=x.device)
    scale = torch.ones(3, device=x.device)
    return mhc_fused.mhc_entry(x, fn, base, scale, EPS, EPS, iters, True, norm)


def max_diff(got: tuple[Any, ...], want: tuple[Any, ...]) -> float:
    """Largest abs difference over every output tensor (codes compared as floats)."""
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        pairs = zip(*((t,) if not isinstance(t, tuple) else t for t in (a, b)), strict=True)
        for u, v in pairs:
            if u is not None:
                diff = (u.float() - v.float()).abs().max().item() if u.numel() else 0.0
                worst = max(worst, diff)
    return worst


def case(x: torch.Tensor, fn: torch.Tensor, run: argparse.Namespace) -> dict[str, Any]:
    """Every launch shape on one input."""
    dev = x.device
    mix_us = median_us(lambda: hc_mix_parts(x, fn, EPS), dev, run.runs, 2, run.graph_calls)
    shipped = tuple(getattr(mhc_fused, k) for k in KNOBS)
    want = entry(x, fn, run.quant, ITERS)
    out: dict[str, Any] = {"mix_us": mix_us, "shipped": list(shipped), "variants": []}
    cells = HC * triton.next_power_of_2(x.shape[-1])
    seen = set()
    for knobs in itertools.product(run.cells_per_warp, run.blocks, run.row_cells):
        per_warp, block, row_cells = knobs
        whole = cells <= row_cells
        launch = (whole, max(2, cells // per_warp) if whole else block)  # what the launch uses
        if launch in seen:
            continue
        seen.add(launch)
        for name, value in zip(KNOBS, knobs, strict=True):
            setattr(mhc_fused, name, value)
        try:
            got = entry(x, fn, run.quant, ITERS)
            row: dict[str, Any] = dict(zip(KNOBS, knobs, strict=True))
            row["whole"], row["warps" if whole else "block"] = launch
            row["max_diff_vs_shipped"] = max_diff(got, want)
            for name, iters in (("finish", ITERS), ("sinkhorn_1", 1)):
                total = median_us(
                    lambda it=iters: entry(x, fn, run.quant, it), dev, run.runs, 2, run.graph_calls
                )
                row[f"{name}_us"] = round(total - mix_us, 2)
            out["variants"].append(row)
            print(f"  {row}", flush=True)
        finally:
            for name, value in zip(KNOBS, shipped, strict=True):
                setattr(mhc_fused, name, value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256, 4096])
    parser.add_argument("--cells-per-warp", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--blocks", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument(
        "--row-cells", type=int, nargs="+", default=[0, 16384, 32768], help="0: never whole"
    )
    parser.add_argument("--quant", action="store_true", help="also the FP8 codes (V4-Flash)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--graph-calls", type=int, default=20)
    run = parser.parse_args()
    device = torch.device(run.device)
    result: dict[str, Any] = {"device": str(device), "hc": HC, "quant": run.quant, "cases": []}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    for hidden in run.hidden:
        for rows in run.rows:
            print(f"hidden {hidden} rows {rows}", flush=True)
            x, fn = inputs(rows, hidden, device)
            result["cases"].append({"hidden": hidden, "rows": rows, **case(x, fn, run)})
    out = os.environ.get("OUT")
    write_result(result, Path(out) / "mhc_entry_ab.json" if out else None, "mhc_entry_ab")


if __name__ == "__main__":
    main()
