"""The FP8 decode GEMM on Hopper (:mod:`.fp8_gluon`) with its registers capped, side by side in
one process (CUDA graphs, variants alternated over ``--rounds`` rounds).

With four K steps of weights in registers the compiler gives each thread all 255 registers,
so an SM holds eight warps: two programs of four. Capped at 168 (``maxnreg``), three programs
fit, with the bytes they keep in flight, at the price of some spilled values
(``cuobjdump -res-usage``: 144 bytes of stack, two more instructions in the K loop). Each
projection of V4-Flash at ``--decode-m`` rows, the launch shape :func:`.fp8_gluon.pick_tiles`
takes with each cap of ``--caps`` (0: none), over weight copies larger than L2, as
``gluon_decode_ab.py --parts fp8`` times it, with the engine's programmatic dependent launch
rule.

    python benchmarks/fp8_regs_ab.py --device cuda [--caps 0 168 192] [--shapes wq_b wo_b]
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

import torch
from _results import write_result
from gluon_decode_ab import _alternate, ab_header, ab_parser, medians
from low_precision import FLASH_SHAPES, copies_for, graph_s


def run(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    from deepinfer.models.quant import quant_fp8_block
    from deepinfer_kernels_sm100 import fp8_gluon, fp8_linear
    from deepinfer_kernels_sm100.devices import sm_count
    from deepinfer_kernels_sm100.fp8_linear import fp8_block_linear, quantize_act_fp8

    sms = sm_count(torch.device(args.device))
    kernel, fp8_linear.DECODE_KERNEL = fp8_linear.DECODE_KERNEL, "gluon"
    rows = []
    try:
        for name, n, k in FLASH_SHAPES:
            if args.shapes and name not in args.shapes:
                continue
            w = (torch.randn(n, k) / k**0.5).to(torch.bfloat16)
            wq, ws = quant_fp8_block(w, (128, 128), "ue8m0")
            fp8 = [tuple(t.to(args.device) for t in (wq, ws)) for _ in range(copies_for(n * k))]
            picked = fp8_gluon.pick_tiles(n, k, sms)

            def timed(cap: int, fns: list[Any]) -> float:
                fp8_gluon.OVERRIDE[(n, k)] = picked._replace(maxnreg=cap or None)  # noqa: B023
                return graph_s(fns, args.repeats)

            for m in args.decode_m:
                x = torch.randn(m, k, device=args.device).to(torch.bfloat16)
                pre = quantize_act_fp8(x)
                fns = [partial(fp8_block_linear, x, q, s, quantized=pre) for q, s in fp8]
                seconds = _alternate({f"r{c}": partial(timed, c, fns) for c in args.caps},
                                     args.rounds)  # fmt: skip
                row: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k,
                                       "tiles": list(picked)}  # fmt: skip
                row.update(medians(seconds, n * k, bandwidth, "weight_bw_fraction"))
                rows.append(row)
                print(row, file=sys.stderr)
    finally:
        fp8_gluon.OVERRIDE.clear()
        fp8_linear.DECODE_KERNEL = kernel
    return rows


def main() -> int:
    ap = ab_parser(__doc__, rounds=3)
    ap.add_argument("--caps", type=int, nargs="+", default=[0, 168, 192])
    ap.add_argument("--shapes", nargs="*", default=[])
    ap.add_argument("--decode-m", type=int, nargs="+", default=[1])
    args = ap.parse_args()
    result, bandwidth = ab_header("fp8_regs_ab", args)
    result["rows"] = run(args, bandwidth)
    write_result(result, args.out, "fp8_regs_ab")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
