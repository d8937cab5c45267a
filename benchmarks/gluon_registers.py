"""What the Gluon decode kernels keep in flight, from their sm_90a builds (no GPU needed).

A decode kernel streams its weights: each warp holds ``stages`` K steps of weight loads in
flight, and the warps an SM holds at once are capped by the registers a thread takes (65,536
an SM, 64 warps at most). The bytes of weights in flight per SM, against the memory's latency,
bound the bandwidth (Little's law). This script compiles :mod:`deepinfer_kernels_sm100.
fp8_gluon`'s decode GEMM at V4-Flash's projections (one row, the launch shapes
:func:`.fp8_gluon.pick_tiles` takes, and each of ``--caps`` on the registers) and the FP4
experts' Gluon kernels at batch 1 (as ``fp4_issue_bound.py`` does), and reports for each its
registers and stack (cuobjdump's resource usage), K-loop instructions, warps an SM by
registers (programs of ``num_warps`` whole), and weight bytes in flight an SM when every warp's
stages are loading.

    python benchmarks/gluon_registers.py [--caps 168 192]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _results import write_result
from fp4_issue_bound import _compile, _gluon_launches, _k_loop, _sass, resource
from low_precision import FLASH_SHAPES

#: an sm_90 SM's registers and most resident warps; registers are given out 8 a thread a warp
REGISTERS_PER_SM, MAX_WARPS_PER_SM, REGISTER_UNIT = 65536, 64, 8


def _fp8_launches(caps: list[int]) -> list[dict[str, Any]]:
    """The FP8 decode GEMM at each V4-Flash projection, one row, picked and capped."""
    from deepinfer_kernels_sm100 import fp8_gluon

    out = []
    for name, n, k in FLASH_SHAPES:
        picked = fp8_gluon.pick_tiles(n, k, 132)
        for cap in [None, *caps]:
            t = picked._replace(maxnreg=cap)
            out.append({
                "launch": f"fp8-{name}", "kernel": "_fp8_decode_gluon", "module": "fp8_gluon",
                "num_warps": t.warps_n * t.split_k, "maxnreg": cap, "tiles": t._asdict(),
                "step_bytes": 16 * 128,  # a warp's K step: 16 rows of 128 e4m3 bytes
                "args": {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "w_ptr": "*fp8e4nv",
                         "ws_ptr": "*u8", "out_ptr": "*bf16", "part_ptr": "*bf16",
                         "count_ptr": "*i32", "m": 1, "n": n, "k_dim": k, "lda": k, "group_n": n},
                "constexprs": {"SCALE_UE8M0": True, "W_BN": 128, "W_BK": 128,
                               "WARPS_N": t.warps_n, "SPLIT_K": t.split_k, "SPLITS": t.splits,
                               "N_TILES": 1, "STAGES": t.stages,
                               "PDL": fp8_gluon.PDL and n * k <= fp8_gluon.PDL_MAX_BYTES},
            })  # fmt: skip
    return out


def _fp4_launches() -> list[dict[str, Any]]:
    """The FP4 experts' Gluon kernels at batch 1, as ``fp4_issue_bound.py`` compiles them."""
    out = []
    for spec in _gluon_launches():
        if spec["launch"] == "gluon-decode1":
            sets = 2 if "gate_up" in spec["kernel"] else 1
            out.append({**spec, "step_bytes": sets * 16 * 64})  # 16 rows (a set) of 64 bytes
    return out


def analyse(spec: dict[str, Any]) -> dict[str, Any]:
    kernel = _compile(spec)
    cubin = kernel.asm["cubin"]
    regs, stack = resource(cubin) or 0, resource(cubin, "STACK")
    warps = spec["num_warps"]
    per_warp = -(-regs // REGISTER_UNIT) * REGISTER_UNIT * 32
    programs = min(REGISTERS_PER_SM // (per_warp * warps), MAX_WARPS_PER_SM // warps)
    stages = spec["tiles"]["stages"]
    return {
        "launch": spec["launch"],
        "kernel": spec["kernel"],
        "tiles": spec["tiles"],
        "registers": regs,
        "stack_bytes": stack,
        "k_loop_instructions": len(_k_loop(_sass(cubin))),
        "warps_per_sm": programs * warps,
        "weight_kib_in_flight_per_sm": round(programs * warps * stages * spec["step_bytes"] / 1024),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--caps", type=int, nargs="*", default=[168, 192])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = [analyse(s) for s in [*_fp8_launches(args.caps), *_fp4_launches()]]
    for r in rows:
        keys = ("registers", "stack_bytes", "warps_per_sm", "weight_kib_in_flight_per_sm")
        print(r["launch"], r["kernel"], r["tiles"], *(f"{k} {r[k]}" for k in keys))
    result = {"benchmark": "gluon_registers", "target": "sm_90a", "kernels": rows}
    write_result(result, args.out, "gluon_registers_sm90")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
