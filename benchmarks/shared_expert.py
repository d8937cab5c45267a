"""The shared expert inside the grouped MoE kernels against beside them, side by side by rows.

``Sm100Backend.moe_experts_shared`` runs a layer's shared expert as one more expert of the
routed experts' grouped kernels (the grids' last slot), where the composed path
(``TokenOps.moe_experts_shared``) runs it as dense GEMMs (``swiglu_mlp``) and hands its output to
the routed experts' slot sum. The grouped kernels' tiles are sized for a routed expert's rows;
past some row count a dense GEMM's tiles run the shared expert faster than they do, and the
backend hands larger steps to the composed path (``moe_ops.FUSED_SHARED_ROWS``). This finds
that count: each path of each case is captured ``--replays`` times in one CUDA graph
(``low_precision.graph_timer``: GPU time, no host launches) and replayed ``--repeats`` times,
the two interleaved; the median of each and their ratio.

    python benchmarks/shared_expert.py [--tokens 1 64 256 ...] [--widths config_a flash]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from low_precision import graph_timer

from deepinfer.backends.token_ops import TokenOps
from deepinfer_kernels_sm100.moe import moe_experts

#: (hidden, expert width, routed experts, top-k) of config A and of a V4-Flash layer.
WIDTHS: dict[str, tuple[int, int, int, int]] = {
    "config_a": (2048, 768, 16, 4),
    "flash": (4096, 2048, 256, 6),
}
TOKENS = (1, 8, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)


def run_case(ops: Any, width: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both paths on ``n`` tokens of ``width``'s layer: GPU ms of each and fused / composed."""
    d, inter, experts, k = WIDTHS[width]
    g = torch.Generator(device="cuda").manual_seed(n)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(n, d, generator=g, **bf16)
    w13 = torch.randn(experts, 2 * inter, d, generator=g, **bf16) / d**0.5
    w2 = torch.randn(experts, d, inter, generator=g, **bf16) / inter**0.5
    s13 = torch.randn(2 * inter, d, generator=g, **bf16) / d**0.5
    s2 = torch.randn(d, inter, generator=g, **bf16) / inter**0.5
    weights, indices = torch.rand(n, experts, device="cuda", generator=g).topk(k, dim=-1)
    kw = {"w13": w13, "w2": w2, "shared_w13": s13, "shared_w2": s2, "swiglu_limit": 0.0}
    kw["out_dtype"] = torch.bfloat16
    routed = {"w13": w13, "w2": w2, "swiglu_limit": 0.0, "out_dtype": torch.bfloat16}
    paths = {
        "fused": lambda: moe_experts(x, weights, indices, **routed, shared=(s13, s2)),
        "composed": lambda: TokenOps.moe_experts_shared(ops, x, weights, indices, **kw),
    }
    timers = {label: graph_timer([call], args.replays) for label, call in paths.items()}
    samples: dict[str, list[float]] = {label: [] for label in timers}
    for _ in range(args.repeats):
        for label, timer in timers.items():
            samples[label].append(timer())
    ms = {label: round(statistics.median(t) * 1e3, 4) for label, t in samples.items()}
    row = {"tokens": n, **{f"{label}_ms": v for label, v in ms.items()}}
    row["fused_over_composed"] = round(ms["fused"] / ms["composed"], 3)
    print(f"{width} {n}: {row}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", nargs="+", choices=list(WIDTHS), default=list(WIDTHS))
    ap.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("shared_expert.py needs an NVIDIA GPU")
    from deepinfer import plugins

    ops = plugins.backends.load("sm100")("cuda")
    name = torch.cuda.get_device_name().split()[1].lower()  # e.g. "h200"
    result = {
        "benchmark": "shared_expert",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "widths": {
            width: {
                "shape": dict(
                    zip(("hidden", "expert_width", "experts", "top_k"), shape, strict=True)
                )
            }
            | {"rows": [run_case(ops, width, n, args) for n in args.tokens]}
            for width, shape in WIDTHS.items()
            if width in args.widths
        },
    }
    write_result(result, args.out, f"shared_expert_{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
