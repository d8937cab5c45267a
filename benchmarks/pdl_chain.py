"""What programmatic dependent launch (PDL) saves on a chain of small dependent kernels, as a
batch-1 decode step is (hundreds of kernels of a few microseconds, each waiting on the last).

A chain of ``--length`` Triton kernels, each reading the previous one's output and writing its
own, is captured in a CUDA graph and timed per kernel: without PDL, and with PDL (each kernel
launched with ``launch_pdl`` waits for its predecessor with ``griddepcontrol.wait`` before it
touches memory, and lets its successor launch with ``griddepcontrol.launch_dependents``, either
first thing or after its stores). Each chain is also timed with a cuBLAS GEMV (``F.linear``,
one row) between every two Triton kernels, as the model's projections sit between its Triton
kernels. The modes' outputs are checked equal (``same_result``).

    python benchmarks/pdl_chain.py [--length 256] [--sizes 16384 1048576] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from _results import write_result
from low_precision import graph_timer
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

BLOCK = 1024


@triton.jit
def _link_kernel(x_ptr, y_ptr, n, WAIT: tl.constexpr, RELEASE: tl.constexpr,  # noqa: PLR0917
                 BLOCK: tl.constexpr):  # fmt: skip
    """y = x * 0.5 + 1 over a block; WAIT: griddepcontrol.wait first; RELEASE 1: let the next
    kernel launch first thing, 2: after the stores."""
    if WAIT:
        gdc_wait()
    if RELEASE == 1:
        gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, x * 0.5 + 1.0, mask=offs < n)
    if RELEASE == 2:
        gdc_launch_dependents()


def _chain(n: int, length: int, mode: str, gemv: bool) -> tuple[Callable[[], float], torch.Tensor]:
    """(a timer of the chain in a CUDA graph: seconds per Triton kernel of one replay, the
    chain's output after its first replay)."""
    torch.manual_seed(0)
    bufs = [torch.randn(n, device="cuda"), torch.empty(n, device="cuda")]
    w = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    row = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    pdl = mode != "none"
    release = {"none": 0, "pdl-early": 1, "pdl-late": 2}[mode]

    def run() -> None:
        for i in range(length):
            _link_kernel[(triton.cdiv(n, BLOCK),)](
                bufs[i % 2], bufs[(i + 1) % 2], n, WAIT=pdl, RELEASE=release, BLOCK=BLOCK,
                launch_pdl=pdl,
            )  # fmt: skip
            if gemv and i % 2:
                F.linear(row, w)

    timer = graph_timer([run], calls=1)  # one replay: the whole chain
    timer()
    torch.cuda.synchronize()
    return (lambda: timer() / length), bufs[length % 2].clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384, 1 << 20])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    modes = ["none", "pdl-early", "pdl-late"]
    rows = []
    for gemv in (False, True):
        for n in args.sizes:
            chains = {m: _chain(n, args.length, m, gemv) for m in modes}
            timers = {m: c[0] for m, c in chains.items()}
            same = all(torch.equal(c[1], chains["none"][1]) for c in chains.values())
            times: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(args.repeats):
                for m, timer in timers.items():
                    times[m].append(timer() * 1e6)
            row: dict[str, Any] = {"elements": n, "gemv_between": gemv, "same_result": same}
            row.update({f"{m}_us": round(statistics.median(times[m]), 3) for m in modes})
            print(row)
            rows.append(row)
    write_result(
        {
            "benchmark": "pdl_chain",
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "length": args.length,
            "note": "us per Triton kernel of a dependent chain replayed in a CUDA graph, medians "
            "over repeats, modes interleaved (with gemv_between, a cuBLAS GEMV of one row "
            "after every second kernel is in each kernel's share)",
            "rows": rows,
        },
        args.out,
        "pdl_chain",
    )


if __name__ == "__main__":
    main()
