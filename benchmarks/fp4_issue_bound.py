"""How fast the FP4 expert kernels can stream their weights, from their compiled instructions.

Hopper has no FP4 tensor cores, so the grouped expert kernels (:mod:`deepinfer_kernels_sm100.
fp4_moe`) decode every weight in registers before its bf16 dot. At decode sizes each decoded
weight meets a few rows, so the instructions a weight costs, not its half byte, can set the
speed: an SM issues at most four warp instructions a cycle. This script compiles the kernels
for ``sm_90a`` on the CPU, as they launch at DeepSeek-V4-Flash's shapes (Triton's compiler with
a ``GPUTarget`` and the ptxas and cuobjdump in its wheel: no GPU needed), finds each kernel's
K loop in the SASS and counts its instructions. From them:

    weights / s  <=  SMs * 4 issue slots * 32 lanes * clock / (instructions per weight)

and, at half a byte plus 1/32 of a scale byte per weight, the fraction of the copy bandwidth
that issue rate allows even if every cycle issued. ``low_precision.py --parts experts``
measures what the kernels reach; the ratio of the two is the issue efficiency they get.
The Triton kernels (``fp4_moe``) and Hopper's Gluon kernels (``fp4_gluon``, launch shapes as
``fp4_gluon.pick_tiles`` takes them) are both counted; a Gluon K loop holds ``stages`` K steps.

    python benchmarks/fp4_issue_bound.py [--copy-gb-s 4122] [--sms 132] [--clock-ghz 1.98]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from _results import write_result

RESULTS = Path(__file__).resolve().parent / "results"
#: bytes a routed-expert weight costs: half a byte of code, a scale byte per 32
BYTES_PER_WEIGHT = 0.5 + 1 / 32
#: warp instructions an SM issues per cycle (four schedulers) and lanes per warp
ISSUE_PER_CYCLE, LANES = 4, 32


def _launches() -> list[dict[str, Any]]:
    """The kernels' launch configurations at V4-Flash shapes (hidden 4096, experts of 2048),
    as ``moe_experts_fp4`` picks them: decode (16-row tiles; 32 columns for gate/up with at most
    8 pairs) and prefill (64-row tiles), with every scale byte known to be at most 128 (as the
    loader finds for the checkpoints' scales), and decode without that knowledge; then the
    Gluon kernels (Hopper's decode path) at batches 1, 8 and 512."""
    out = []
    for name, block_m, gate_up_n, down_n, stages, listed, fit in (
        ("decode", 16, 64, 64, 3, True, True),
        ("decode-scales-unchecked", 16, 64, 64, 3, True, False),
        ("decode-few-pairs", 16, 32, 64, 4, True, True),
        ("prefill", 64, 128, 128, 3, False, True),
    ):
        common = {"IEEE": False, "WIDEN": False, "EVEN": True, "CLAMP": True, "SCALES_FIT": fit}
        tiles = {"BLOCK_M": block_m, "BLOCK_K": 128, "LISTED": listed}
        out.append({
            "launch": name, "kernel": "_fp4_gate_up_kernel", "num_stages": stages,
            "weights": 2 * gate_up_n * 128 / (4 * LANES),
            "args": {"x_ptr": "*bf16", "token_ptr": "*i32", "w_ptr": "*u8", "ws_ptr": "*u8",
                     "scale_ptr": "*fp32", "ends_ptr": "*i32", "experts_ptr": "*i32",
                     "h_ptr": "*bf16", "inter": 2048, "k_dim": 4096, "limit": 10.0},
            "constexprs": {**common, **tiles, "BLOCK_N": gate_up_n},
        })  # fmt: skip
        out.append({
            "launch": name, "kernel": "_fp4_down_kernel", "num_stages": 3,
            "weights": down_n * 128 / (4 * LANES),
            "args": {"h_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*u8", "ends_ptr": "*i32",
                     "experts_ptr": "*i32", "order_ptr": "*i32", "y_ptr": "*fp32",
                     "d_out": 4096, "inter": 2048},
            "constexprs": {k: v for k, v in {**common, **tiles, "BLOCK_N": down_n}.items()
                           if k != "CLAMP"},
        })  # fmt: skip
    return out + _gluon_launches()


def _gluon_launches() -> list[dict[str, Any]]:
    """Hopper's Gluon kernels as ``fp4_gluon.launch`` picks their shapes. A thread's K step
    covers 32 elements of rows g and g + 8 of each row set (gate and up: two)."""
    from deepinfer_kernels_sm100 import fp4_gluon

    out = []
    for batch in (1, 2, 8, 256, 512):
        pairs, slots = 6 * batch, min(256, 6 * batch)
        ungrouped = batch <= fp4_gluon.BY_PAIR_TOKENS
        mode = fp4_gluon.BY_PAIR if ungrouped else fp4_gluon.LISTED if slots < 256 else 0
        for kernel, k_dim, rows, sets in (("gate_up", 4096, 2048, 2), ("down", 2048, 4096, 1)):
            if kernel == "down" and ungrouped and fp4_gluon.SUM_IN_DOWN:
                out.append(_sum_launch(batch))
                continue
            t = fp4_gluon.pick_tiles(k_dim, rows, pairs, slots, sets, 132)
            by_pair = "*i32"  # (None at batch 1: a constexpr)
            args = {"x_ptr": "*bf16", "token_ptr": by_pair, "w_ptr": "*u8", "ws_ptr": "*u8",
                    "scale_ptr": "*fp32", "ends_ptr": "*i32", "experts_ptr": "*i32",
                    "h_ptr": "*bf16", "inter": 2048, "k_dim": 4096, "limit": 10.0}  # fmt: skip
            if kernel == "down":
                args = {"h_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*u8", "ends_ptr": "*i32",
                        "experts_ptr": "*i32", "order_ptr": by_pair, "y_ptr": "*fp32",
                        "d_out": 4096, "inter": 2048}  # fmt: skip
            # WIDE 0: the K loop of one token tile a pass (slots of 9-16 pairs take another)
            constexprs = {"SLOTS": mode, "PAIRED": True, "WARPS_N": t.warps_n,
                          "SPLIT_K": t.split_k, "N_TILES": t.n_tiles, "STAGES": t.stages,
                          "WIDE": 0}  # fmt: skip
            if ungrouped:  # pairs in routing order
                constexprs["token_ptr" if kernel == "gate_up" else "order_ptr"] = None
            if kernel == "gate_up":
                constexprs.update(CLAMP=True, PER_ROW=6)
            else:
                constexprs["PDL"] = fp4_gluon.PDL_DOWN and ungrouped
            out.append({
                "launch": f"gluon-decode{batch}", "kernel": f"_fp4_{kernel}_gluon",
                "module": "fp4_gluon", "num_warps": t.warps_n * t.split_k,
                "maxnreg": t.maxnreg, "weights": t.stages * sets * 2 * 32,
                "tiles": t._asdict(), "args": args, "constexprs": constexprs,
            })  # fmt: skip
    return out


def _sum_launch(batch: int) -> dict[str, Any]:
    """The down kernel that adds each token's 6 pairs (``fp4_gluon_sum``), as it launches for
    ``batch`` tokens."""
    from deepinfer_kernels_sm100 import fp4_gluon, fp4_gluon_sum

    t = fp4_gluon_sum.pick_tiles(2048, 4096, 6, batch, 132)
    per = 2048 // (fp4_gluon_sum.STEP_K * t.split_k)
    return {
        "launch": f"gluon-decode{batch}", "kernel": "_fp4_down_sum_gluon",
        "module": "fp4_gluon_sum", "num_warps": t.warps_n * t.split_k,
        "weights": t.stages * 2 * 32, "tiles": t._asdict(),
        "args": {"h_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*u8", "idx_ptr": "*i64",
                 "res_ptr": "*bf16", "out_ptr": "*bf16", "d_out": 4096, "inter": 2048},
        "constexprs": {"TOPK": 6, "PER": per, "PAIRED": True, "WARPS_N": t.warps_n,
                       "SPLIT_K": t.split_k, "STAGES": t.stages, "PDL": fp4_gluon.PDL_DOWN},
    }  # fmt: skip


def _compile(spec: dict[str, Any]) -> Any:
    """The kernel compiled for sm_90a with the launch's argument types and constexprs."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    module = importlib.import_module(f"deepinfer_kernels_sm100.{spec.get('module', 'fp4_moe')}")
    fn = getattr(module, spec["kernel"])
    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, p in enumerate(fn.params):
        if p.name in spec["constexprs"]:
            signature[p.name] = "constexpr"
            continue
        value = spec["args"][p.name]
        if isinstance(value, str):
            signature[p.name] = value
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch's allocations are 16-byte aligned
        elif isinstance(value, int):
            signature[p.name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[p.name] = "fp32"
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source(fn=fn, signature=signature, constexprs=spec["constexprs"], attrs=attrs)
    options: dict[str, Any] = {"num_warps": spec.get("num_warps", 4)}
    if "num_stages" in spec:
        options["num_stages"] = spec["num_stages"]
    if spec.get("maxnreg"):
        options["maxnreg"] = spec["maxnreg"]
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    """The output of the cuobjdump in Triton's wheel run with ``flag`` on ``cubin``."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [str(tool), flag, f.name], capture_output=True, text=True, check=True
        ).stdout


def _sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of the cubin's SASS."""
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", _cuobjdump(cubin, "-sass"))
    return [(int(a, 16), ins.strip()) for a, ins in found]


def _k_loop(sass: list[tuple[int, str]]) -> list[str]:
    """The instructions of the smallest loop (a backward branch's range) holding a tensor-core
    MMA: the K loop."""
    best: list[str] = []
    for addr, ins in sass:
        target = re.search(r"\bBRA (0x[0-9a-f]+)", ins)
        if target is None or int(target.group(1), 16) >= addr:
            continue
        body = [i for a, i in sass if int(target.group(1), 16) <= a <= addr]
        if any("MMA" in i for i in body) and (not best or len(body) < len(best)):
            best = body
    return best


def _opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def analyse(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    kernel = _compile(spec)
    loop = _k_loop(_sass(kernel.asm["cubin"]))
    c = spec["constexprs"]
    weights = spec["weights"]  # per thread, per pass of the K loop
    per_weight = len(loop) / weights
    weights_per_s = args.sms * ISSUE_PER_CYCLE * LANES * args.clock_ghz * 1e9 / per_weight
    ops = collections.Counter(_opcode(i) for i in loop)
    bound = weights_per_s * BYTES_PER_WEIGHT / (args.copy_gb_s * 1e9)
    tiles = spec.get("tiles") or {k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    return {
        "launch": spec["launch"],
        "kernel": spec["kernel"],
        "tiles": tiles,
        "registers": resource(kernel.asm["cubin"]),
        "k_loop_instructions": len(loop),
        "weights_per_thread_per_loop": weights,
        "instructions_per_weight": round(per_weight, 2),
        "issue_bound_bw_fraction": round(bound, 3),
        "top_opcodes": dict(ops.most_common(16)),
        "shuffles_or_shared_in_loop": sum(n for op, n in ops.items() if op.split(".")[0]
                                          in {"SHFL", "LDS", "STS", "LDSM", "BAR"}),
    }  # fmt: skip


def resource(cubin: bytes, key: str = "REG") -> int | None:
    """A resource of the cubin's kernel in cuobjdump's usage: ``REG`` (registers a thread),
    ``STACK`` (bytes a thread), ..."""
    found = re.search(rf"{key}:(\d+)", _cuobjdump(cubin, "-res-usage"))
    return int(found.group(1)) if found else None


def _measured_copy_gb_s() -> float:
    """The copy bandwidth low_precision.py measured on the H200, else the H200's usual 4122."""
    path = RESULTS / "low_precision_h200.json"
    if path.exists():
        return float(json.loads(path.read_text()).get("copy_bandwidth_gb_s", 4122.0))
    return 4122.0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sms", type=int, default=132, help="H200: 132")
    ap.add_argument("--clock-ghz", type=float, default=1.98, help="H200 boost clock")
    ap.add_argument("--copy-gb-s", type=float, default=None, help="default: the measured H200 copy")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    args.copy_gb_s = args.copy_gb_s or _measured_copy_gb_s()
    rows = [analyse(spec, args) for spec in _launches()]
    for r in rows:
        print(
            f"{r['launch']:24s} {r['kernel']:20s} {r['k_loop_instructions']:5d} instr/loop "
            f"{r['instructions_per_weight']:5.2f}/weight -> at most "
            f"{r['issue_bound_bw_fraction']:.2f} of the copy bandwidth "
            f"({r['registers']} registers)"
        )
    result = {
        "benchmark": "fp4_issue_bound",
        "target": "sm_90a",
        "sms": args.sms,
        "clock_ghz": args.clock_ghz,
        "copy_gb_s": args.copy_gb_s,
        "bytes_per_weight": BYTES_PER_WEIGHT,
        "kernels": rows,
    }
    write_result(result, args.out, "fp4_issue_bound_sm90")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
