"""The block-of-queries sparse attention (``attention_blocks``) against the per-query kernel
(``attention.sparse_mqa_sink_attention``) at config A's prefill chunks.

Each case lists each query's keys as a 4096-token (or 16k) chunk of config A does
(``prefill_attention.chunk_index``: a 128-row window, then a ratio-4 layer's top-512 entries in
random order, a ratio-128 layer's every entry, or nothing). Both kernels run on the same inputs,
each call replayed from a CUDA graph; the block kernel's time includes the union kernel that
``block_keys`` launches, which is also timed alone. Both outputs are compared with a float64
recomputation (mean and max absolute error, and the float64 result's own error once rounded to
bf16). ``VARIANTS`` are launch shapes of the block kernel (the first is the shipped one).

    python benchmarks/block_attention.py [--variants NAME ...] [--out PATH]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton
from _results import write_result
from attention_kernels import graph_us
from prefill_attention import chunk_index, float64_attention

#: (name, queries, chunk keys, long-range entries, picks per query); 16 heads of 512
CASES = [
    ("a-window", 4096, 4096, 0, 0),
    ("a-ratio128", 4096, 4096, 32, 32),
    ("a-ratio4", 4096, 4096, 1024, 512),
    ("a-ratio4-16k", 16384, 16384, 4096, 512),
]
#: name: attention_blocks knobs (ROWS = queries x 16 heads a program; DV: output columns a
#: program, which ``attention.wide_block_dv`` otherwise picks).
VARIANTS: dict[str, dict[str, int]] = {
    f"r{r}_dv{dv}_w{w}_l{bl}": {"ROWS": r, "DV": dv, "NUM_WARPS": w, "BLOCK_L": bl}
    for r, dv, w, bl in ((64, 256, 4, 64), (64, 256, 4, 32), (64, 256, 8, 64), (32, 512, 4, 64),
                         (32, 512, 8, 64), (128, 128, 4, 64))
}  # fmt: skip


def errors(got: Any, exact: Any) -> dict[str, float]:
    diff = (got.double().view(exact.shape) - exact).abs()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}


def case_row(ab: Any, att: Any, case: tuple[Any, ...], variants: list[str], g: Any) -> dict:
    """One case: both kernels timed and checked against float64, the block kernel under every
    variant."""
    name, s, chunk, entries, picks = case
    q = torch.randn(1, s, 16, 512, device="cuda", generator=g).bfloat16()
    kv = torch.randn(1, chunk + entries, 512, device="cuda", generator=g).bfloat16()
    sinks = torch.randn(16, device="cuda", generator=g)
    index = chunk_index(s, chunk, entries, picks, g)[None]
    exact = float64_attention(q[0], kv[0][index[0].clamp(min=0)], index[0] >= 0, sinks)
    per_query = partial(att.sparse_mqa_sink_attention, q, kv, index, sinks, 512**-0.5)
    row: dict[str, Any] = {"case": name, "S": s, "keys_per_query": index.shape[-1]}
    row["bf16_floor_mean_abs"] = float((exact.bfloat16() - exact).abs().mean())
    row["per_query"] = {"us": graph_us(per_query), **errors(per_query()[0], exact)}
    knobs = {k for v in VARIANTS.values() for k in v} - {"DV"}
    shipped = {k: getattr(ab, k) for k in knobs} | {"wide_block_dv": ab.wide_block_dv}
    for variant in variants:
        for knob, value in VARIANTS[variant].items():
            if knob == "DV":
                ab.wide_block_dv = lambda *_, dv=value: dv  # every launch takes dv columns
            else:
                setattr(ab, knob, value)
        blocks = partial(ab.block_sparse_attention, q, kv, index, sinks, 512**-0.5)
        try:
            out = blocks()
        except triton.runtime.errors.OutOfResources as exc:
            row[variant] = {"error": str(exc).split(".")[0]}
            continue
        queries = ab.queries_per_block(16)
        _, _, count = ab.block_keys(index, queries)
        row[variant] = {
            "us": graph_us(blocks),
            **errors(out[0], exact),
            "union_us": graph_us(partial(ab.block_keys, index, queries)),
            "mean_union_rows": float(count.float().mean()),
            "mean_listed_per_query": float((index >= 0).sum(-1).float().mean()),
        }
    for knob, value in shipped.items():
        setattr(ab, knob, value)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--cases", nargs="+", default=[c[0] for c in CASES])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("block_attention.py times CUDA graphs: it needs an NVIDIA GPU")
    from deepinfer_kernels_sm100 import attention as att
    from deepinfer_kernels_sm100 import attention_blocks as ab

    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for case in CASES:
        if case[0] in args.cases:
            rows.append(case_row(ab, att, case, args.variants, g))
            print(rows[-1], flush=True)
    result = {
        "benchmark": "block_attention",
        "device": torch.cuda.get_device_name(0),
        "variants": {v: VARIANTS[v] for v in args.variants},
        "rows": rows,
    }
    write_result(result, args.out, "block_attention_" + result["device"].split()[1].lower())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
