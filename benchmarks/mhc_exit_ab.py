"""The mHC exit with the next mixer's products in one kernel, against the exit then the mixer.

``mhc_exit.mhc_post_mix`` writes a sublayer's new streams and the next sublayer's mixer split
products in one launch where ``mhc_exit.mhc_post`` and ``mhc.hc_mix_parts`` take two. Its
programs each write one stream of a split's columns and so read every input stream there
(n times the exit's reads), so it pays at a decode step's few rows and may not at a long
prefill chunk's; ``mhc_exit.POST_MIX_MAX_ROWS`` is where the engine stops fusing. For each
hidden size and row count: the median microseconds of both (``hc_mix_ab.median_us``: CUDA
graphs of back-to-back calls), their ratio, and whether the outputs are the same bits.

    OUT=dir python benchmarks/mhc_exit_ab.py [--hidden 2048 4096] [--rows 1 64 256 1024 4096]
    TRITON_INTERPRET=1 python benchmarks/mhc_exit_ab.py --device cpu --hidden 256 --rows 1 3 \
        --runs 1                                                                (a CPU check)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "packages" / "deepinfer-kernels-sm100" / "src"))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _results import write_result  # noqa: E402
from hc_mix_ab import HC, inputs, median_us  # noqa: E402

from deepinfer_kernels_sm100 import mhc_exit  # noqa: E402
from deepinfer_kernels_sm100.mhc import hc_mix_parts  # noqa: E402

EPS = 1e-6


def case(rows: int, hidden: int, device: torch.device, run: argparse.Namespace) -> dict[str, Any]:
    """Both paths on one input: the streams, the next mixer and the exit's weights."""
    x, fn = inputs(rows, hidden, device)
    g = torch.Generator().manual_seed(rows + hidden)
    y = torch.randn(rows, hidden, generator=g).to(x.dtype).to(device)
    post = (torch.rand(rows, HC, generator=g) * 2).to(device)
    comb = torch.rand(rows, HC, HC, generator=g).softmax(-1).to(device)
    mhc_exit.POST_MIX_MAX_ROWS = rows  # this script decides nothing by the row count

    def apart() -> tuple[Any, ...]:
        out = mhc_exit.mhc_post(y, x, post, comb)
        return out, hc_mix_parts(out, fn, EPS)

    def fused() -> tuple[Any, ...]:
        return mhc_exit.mhc_post_mix(y, x, post, comb, fn)

    (out_a, parts_a), (out_f, parts_f) = apart(), fused()
    same = torch.equal(out_a, out_f) and parts_f is not None
    same = same and all(torch.equal(a, b) for a, b in zip(parts_a, parts_f, strict=True))
    times = {}
    for name, call in (("apart", apart), ("fused", fused), ("apart_2", apart), ("fused_2", fused)):
        times[name] = median_us(call, device, run.runs, 2, run.graph_calls)
    apart_us = min(times["apart"], times["apart_2"])
    fused_us = min(times["fused"], times["fused_2"])
    row = {"hidden": hidden, "rows": rows, "same_bits": same, **{k: round(v, 2) for k, v in
           times.items()}, "fused_over_apart": round(fused_us / apart_us, 3)}  # fmt: skip
    print(f"  {row}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 4096])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--graph-calls", type=int, default=20)
    run = parser.parse_args()
    device = torch.device(run.device)
    result: dict[str, Any] = {"device": str(device), "hc": HC, "cases": []}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    for hidden in run.hidden:
        for rows in run.rows:
            result["cases"].append(case(rows, hidden, device, run))
    out = os.environ.get("OUT")
    write_result(result, Path(out) / "mhc_exit_ab.json" if out else None, "mhc_exit_ab")


if __name__ == "__main__":
    main()
