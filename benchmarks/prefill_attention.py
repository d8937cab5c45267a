"""Launch shapes of the sm100 sparse attention at config A's prefill: 16 heads of 512.

A 4096-token chunk of config A lists each query's keys (its 128-row window, then its long-range
entries: none, 32 of a ratio-128 layer, up to 512 of a ratio-4 layer's 1,024) and runs
``sparse_mqa_sink_attention`` once per layer. With 16 heads a program's tensor-core work per
key row is a quarter of V4's 64-head programs', so what the kernel reads per key (a 1 KiB row,
re-read by every program that takes some of the output columns) sets its time. This script
times each case under each of ``VARIANTS`` (knobs of ``attention``), each call replayed from a
CUDA graph, and reports every variant's largest difference from the first (the shipped launch
shapes), so a variant that changes no bit shows 0.0. V4's 64-head prefill and config A's
decode rows (dense masks at B = 32 / 256) show what the same knobs do elsewhere. Config A's
decode rows as the model runs them (a ring and entry pages read in place, output rope channels
rotated back) are timed under ``PAGED_VARIANTS``.

    python benchmarks/prefill_attention.py [--variants NAME ...] [--paged-only] [--out PATH]
    python benchmarks/prefill_attention.py --decode-kernels   # the two paged decode kernels
    python benchmarks/prefill_attention.py --pv-parts   # bf16 parts of the probabilities
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

#: name: the ``attention`` knobs it sets (the first is the comparison for the others).
VARIANTS: dict[str, dict[str, int]] = {
    f"dv{dv}_w{w}_l{bl}": {"WIDE_CELLS": 16 * dv, "SMALL_WARPS": w, "BLOCK_L": bl}
    for dv, w, bl in ((256, 4, 64), (256, 8, 64), (512, 8, 64), (512, 4, 64), (512, 8, 32),
                      (512, 4, 32), (256, 4, 32))
}  # fmt: skip
#: name: the ``attention`` knobs of a paged decode launch (the first is the comparison).
PAGED_VARIANTS: dict[str, dict[str, int]] = {
    f"paged_dv{dv}_w{w}": {"WIDE_CELLS": 16 * dv, "PAGED_WARPS": w, "WIDE_ROWS": 32}
    for dv, w in ((512, 8), (256, 4), (512, 4), (256, 8))
} | {  # never wide: 128 columns, so 32 rows make 128 programs without splitting their keys
    f"paged_dv128_w{w}": {"WIDE_CELLS": 16 * 512, "PAGED_WARPS": w, "WIDE_ROWS": 1 << 30}
    for w in (4, 8)
}
#: name: the knobs of ``attention_decode``'s transposed paged decode kernel ("decode." ones,
#: at every batch) against ``attention``'s own program (the first).
DECODE_VARIANTS: dict[str, dict[str, Any]] = {"heads_as_rows": {"decode.ENABLED": False}} | {
    f"keys_as_rows_w{w}_s{s}_l{bl}_r{r}": {
        "decode.ENABLED": True, "decode.MIN_ROWS": 0, "decode.NUM_WARPS": w,
        "decode.NUM_STAGES": s, "decode.BLOCK_L": bl, "decode.MAXNREG": r,
        "decode.TARGET_PROGRAMS": None,
    }
    for w, s, bl, r in ((8, 2, 32, 128), (8, 2, 32, None), (8, 2, 64, None))
} | {  # the same, a row's keys split in ranges up to that many programs (then merged)
    f"keys_as_rows_w8_s2_l32_r128_split{t}": {
        "decode.ENABLED": True, "decode.MIN_ROWS": 0, "decode.NUM_WARPS": 8,
        "decode.NUM_STAGES": 2, "decode.BLOCK_L": 32, "decode.MAXNREG": 128,
        "decode.TARGET_PROGRAMS": t,
    }
    for t in (256, 512)
}  # fmt: skip
#: (name, batch, queries, heads, chunk keys, long-range entries, picks per query)
CASES = [
    ("a-window", 1, 4096, 16, 4096, 0, 0),
    ("a-ratio128", 1, 4096, 16, 4096, 32, 32),
    ("a-ratio4", 1, 4096, 16, 4096, 1024, 512),
    ("v4-prefill-512", 1, 512, 64, 4096, 0, 640),
]
#: (name, batch, heads, keys): config A decode rows over a dense mask
DECODE_CASES = [("a-decode-640", b, 16, 640) for b in (1, 32, 256)]
#: (name, batch, heads, entries a row sees): config A's decode rows after a 512-token prompt,
#: each over its 128-slot ring and the entries of a ratio-4 (128) or ratio-128 (4) layer
PAGED_CASES = [(f"a-paged-{n}", b, 16, n) for n in (128, 4) for b in (1, 32, 64, 256)]
#: Entries a page holds in the paged cases.
PER_PAGE = 64
#: ``attention.PV_PARTS`` values ``--pv-parts`` compares (bf16 parts of the probabilities).
PV_CHOICES = (3, 2, 1)
#: (batch, entries a row sees) of the paged decode cases ``--pv-parts`` times
PV_PAGED = ((256, 128), (256, 4), (64, 128), (1, 128))


def chunk_index(queries: int, chunk: int, entries: int, picks: int, g: torch.Generator) -> Any:
    """Each query's key rows as a chunk lists them: its window of up to 128 rows of the chunk
    (-1 before the first), then ``picks`` of the entries it may see (one per 4 positions, in
    random order as the indexer's top-k gives them; -1 where it sees fewer)."""
    t = torch.arange(queries, device="cuda")
    window = t[:, None] - 127 + torch.arange(128, device="cuda")
    window = torch.where(window >= 0, window, -1)
    if not picks:
        return window
    if picks == entries:  # a ratio-128 layer: every entry it may see
        seen = torch.arange(entries, device="cuda").expand(queries, -1)
    else:
        score = torch.rand(queries, entries, device="cuda", generator=g)
        seen = score.topk(picks, dim=-1).indices
    visible = seen < ((t[:, None] + 1) * entries // queries)
    rows = torch.where(visible, chunk + seen, -1)
    return torch.cat((window, rows), dim=-1)


def paged_inputs(b: int, h: int, entries: int, g: torch.Generator) -> tuple[Any, ...]:
    """(q, sources, sinks, derotate angles, keys) of ``b`` rows of one query each: a full
    128-slot bf16 ring a row (one page, the row's slot) and ``entries`` bf16 entries on pages
    of the rows' own, in a shuffled page order; ``keys`` [b, 128 + entries, D]: each row's keys
    in order, for a reference."""
    from deepinfer.paging import KeyPages

    dev, dim = "cuda", 512
    q = torch.randn(b, 1, h, dim, device=dev, generator=g).bfloat16()
    ring = torch.randn(b, 128, dim, device=dev, generator=g).bfloat16()
    slots = torch.randperm(b, device=dev, generator=g)[:, None]
    seen = torch.arange(128, device=dev).expand(b, 1, 128)
    n = -(-entries // PER_PAGE)
    pool = torch.randn(b * n, PER_PAGE, dim, device=dev, generator=g).bfloat16()
    pages = torch.randperm(b * n, device=dev, generator=g).view(b, n)
    listed = torch.arange(entries, device=dev).expand(b, 1, entries)
    sources = [KeyPages(ring, slots, seen), KeyPages(pool, pages, listed)]
    angle = torch.rand(b, 1, 32, device=dev, generator=g) * 6.28
    sinks = torch.randn(h, device=dev, generator=g)
    keys = torch.cat((ring[slots[:, 0]], pool[pages].flatten(1, 2)[:, :entries]), dim=1)
    return q, sources, sinks, (angle.cos(), angle.sin()), keys


def paged_call(att: Any, b: int, h: int, entries: int, g: torch.Generator) -> Any:
    """``paged_mqa_sink_attention`` over :func:`paged_inputs`, the output's 64 rope channels
    rotated back."""
    q, sources, sinks, derotate, _ = paged_inputs(b, h, entries, g)
    return partial(att.paged_mqa_sink_attention, q, sources, sinks, 512**-0.5, derotate)


def time_variants(
    att: Any, fn: Any, variants: list[str], table: dict[str, dict[str, Any]] = VARIANTS
) -> dict[str, Any]:
    """``fn()`` timed and compared under each variant of ``table`` (a "decode." knob is one of
    ``attention_decode``'s)."""
    from deepinfer_kernels_sm100 import attention_decode

    row: dict[str, Any] = {}
    first = None
    for name in variants:
        for knob, value in table[name].items():
            module, _, attr = knob.rpartition(".")
            setattr(attention_decode if module == "decode" else att, attr, value)
        try:
            out = fn().float()
        except triton.runtime.errors.OutOfResources as exc:  # a launch shape that cannot run
            row[name] = None
            row["error_" + name] = str(exc).split(".")[0]
            continue
        first = out if first is None else first
        row[name] = graph_us(fn)
        row["diff_" + name] = float((out - first).abs().max())
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--paged-only", action="store_true", help="only the paged decode cases")
    ap.add_argument(
        "--decode-kernels", action="store_true",
        help="only the paged decode cases, under DECODE_VARIANTS (the two decode kernels)",
    )  # fmt: skip
    ap.add_argument(
        "--pv-parts", action="store_true",
        help=f"config A's cases under each of PV_CHOICES {PV_CHOICES}, against float64",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prefill_attention.py times CUDA graphs: it needs an NVIDIA GPU")
    from deepinfer_kernels_sm100 import attention as att
    from deepinfer_kernels_sm100 import attention_decode

    if args.decode_kernels:
        return decode_kernels(att, attention_decode, args.out)
    if args.pv_parts:
        return pv_parts(att, args.out)
    tables = (*VARIANTS.values(), *PAGED_VARIANTS.values())
    shipped = {knob: getattr(att, knob) for v in tables for knob in v}
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    cases, decode_cases = ([], []) if args.paged_only else (CASES, DECODE_CASES)
    for name, b, s, h, chunk, entries, picks in cases:
        q = torch.randn(b, s, h, 512, device="cuda", generator=g).bfloat16()
        kv = torch.randn(b, chunk + entries, 512, device="cuda", generator=g).bfloat16()
        sinks = torch.randn(h, device="cuda", generator=g)
        if name.startswith("v4"):
            index = torch.stack([torch.randperm(chunk, device="cuda", generator=g)[:picks]
                                 for _ in range(s)])[None]  # fmt: skip
        else:
            index = chunk_index(s, chunk, entries, picks, g)[None]
        fn = partial(att.sparse_mqa_sink_attention, q, kv, index, sinks, 512**-0.5)
        rows.append({"case": name, "S": s, "heads": h, **time_variants(att, fn, args.variants)})
        print(rows[-1], flush=True)
    for name, b, h, keys in decode_cases:
        q = torch.randn(b, 1, h, 512, device="cuda", generator=g).bfloat16()
        kv = torch.randn(b, keys, 512, device="cuda", generator=g).bfloat16()
        sinks = torch.randn(h, device="cuda", generator=g)
        mask = torch.rand(b, 1, keys, device="cuda", generator=g) > 0.1
        fn = partial(att.mqa_sink_attention, q, kv, mask, sinks, 512**-0.5)
        rows.append({"case": name, "B": b, "heads": h, **time_variants(att, fn, args.variants)})
        print(rows[-1], flush=True)
    for knob, value in shipped.items():
        setattr(att, knob, value)
    rows += paged_rows(att, PAGED_CASES, PAGED_VARIANTS, g)
    for knob, value in shipped.items():
        setattr(att, knob, value)
    result = {
        "benchmark": "prefill_attention",
        "device": torch.cuda.get_device_name(0),
        "shipped": shipped,
        "variants": {v: VARIANTS[v] for v in args.variants},
        "paged_variants": PAGED_VARIANTS,
        "rows": rows,
    }
    name = "prefill_attention_" + result["device"].split()[1].lower()
    write_result(result, args.out, name)
    return 0


def paged_rows(
    att: Any,
    cases: list[tuple[str, int, int, int]],
    table: dict[str, dict[str, Any]],
    g: torch.Generator,
) -> list[dict[str, Any]]:
    """Each paged decode case (name, batch, heads, entries) timed under every variant of
    ``table``."""
    rows = []
    for name, b, h, entries in cases:
        timed = time_variants(att, paged_call(att, b, h, entries, g), list(table), table)
        rows.append({"case": name, "B": b, "heads": h, **timed})
        print(rows[-1], flush=True)
    return rows


def decode_kernels(att: Any, decode: Any, out: Path | None) -> int:
    """The paged decode cases (and 128 rows) under each of ``DECODE_VARIANTS``."""
    shipped = {k: getattr(decode, k.split(".")[1]) for v in DECODE_VARIANTS.values() for k in v}
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = PAGED_CASES + [(f"a-paged-{n}", 128, 16, n) for n in (128, 4)]
    rows = paged_rows(att, cases, DECODE_VARIANTS, g)
    for knob, value in shipped.items():
        setattr(decode, knob.split(".")[1], value)
    result = {
        "benchmark": "decode_attention_kernels",
        "device": torch.cuda.get_device_name(0),
        "shipped": shipped,
        "variants": DECODE_VARIANTS,
        "rows": rows,
    }
    write_result(result, out, "decode_attention_" + result["device"].split()[1].lower())
    return 0


def float64_attention(q: Any, keys: Any, visible: Any, sinks: Any) -> Any:
    """[R, H, D] float64 attention of query rows ``q`` [R, H, D] over their own ``keys``
    [R, K, D] (``visible`` [R, K]) with the sink logit, computed in blocks of rows."""
    outs = []
    for a in range(0, q.shape[0], 128):
        k = keys[a : a + 128].double()
        logits = torch.einsum("rhd,rkd->rhk", q[a : a + 128].double(), k) * q.shape[-1] ** -0.5
        logits = logits.masked_fill(~visible[a : a + 128, None, :], float("-inf"))
        sink = sinks.double().view(1, -1, 1).expand(k.shape[0], -1, 1)
        probs = torch.cat((logits, sink), -1).softmax(-1)[..., :-1]
        outs.append(torch.einsum("rhk,rkd->rhd", probs, k))
    return torch.cat(outs)


def pv_row(att: Any, fn: Any, exact: Any) -> dict[str, Any]:
    """``fn()`` [R, H, D] timed and compared with float64 under each of :data:`PV_CHOICES`;
    ``bf16_floor_mean_abs``: the float64 result's own error once rounded to bf16."""
    row: dict[str, Any] = {"bf16_floor_mean_abs": float((exact.bfloat16() - exact).abs().mean())}
    for parts in PV_CHOICES:
        att.PV_PARTS = parts
        diff = (fn().double().view(exact.shape) - exact).abs()
        row[f"pv{parts}"] = {"us": graph_us(fn), "max_abs": float(diff.max()),
                             "mean_abs": float(diff.mean())}  # fmt: skip
    return row


def pv_parts(att: Any, out: Path | None) -> int:
    """Config A's prefill cases and paged decode rows under each of :data:`PV_CHOICES`:
    time, and error against float64."""
    shipped, rows = att.PV_PARTS, []
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, b, s, h, chunk, entries, picks in CASES[:3]:
        q = torch.randn(b, s, h, 512, device="cuda", generator=g).bfloat16()
        kv = torch.randn(b, chunk + entries, 512, device="cuda", generator=g).bfloat16()
        sinks = torch.randn(h, device="cuda", generator=g)
        index = chunk_index(s, chunk, entries, picks, g)[None]
        exact = float64_attention(q[0], kv[0][index[0].clamp(min=0)], index[0] >= 0, sinks)
        fn = partial(att.sparse_mqa_sink_attention, q, kv, index, sinks, 512**-0.5)
        rows.append({"case": name, "S": s, "heads": h, **pv_row(att, fn, exact)})
        print(rows[-1], flush=True)
    for b, entries in PV_PAGED:
        q, sources, sinks, _, keys = paged_inputs(b, 16, entries, g)
        visible = torch.ones(keys.shape[:2], dtype=torch.bool, device="cuda")
        exact = float64_attention(q[:, 0], keys, visible, sinks)
        fn = partial(att.paged_mqa_sink_attention, q, sources, sinks, 512**-0.5)
        rows.append({"case": f"a-paged-{entries}", "B": b, "heads": 16, **pv_row(att, fn, exact)})
        print(rows[-1], flush=True)
    att.PV_PARTS = shipped
    result = {"benchmark": "attention_pv_parts", "device": torch.cuda.get_device_name(0),
              "shipped": shipped, "rows": rows}  # fmt: skip
    write_result(result, out, "attention_pv_parts_" + result["device"].split()[1].lower())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
