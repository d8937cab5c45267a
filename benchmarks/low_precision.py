"""Weights in their stored formats against the vendor's FP8 GEMM and bf16, side by side.

Its parts, written together to ``benchmarks/results/low_precision_<device>.json``:

* ``gemm``: the FP8 block-scaled linear (``Sm100Backend.fp8_linear``: activations quantised
  per token and 128 columns inside the kernel) at V4-Flash projection shapes and M = 1 ..
  4096, against ``torch._scaled_mm`` with row-wise scales on pre-quantised operands (the
  vendor's FP8 GEMM, given its quantisation for free) and a bf16 ``torch.matmul``: TFLOP/s,
  and for small M the weight bytes read per second as a fraction of the measured copy
  bandwidth. Past 64 rows also the GEMM alone on activations quantised ahead, as
  ``_scaled_mm`` is timed: the kernel the launch picks (Hopper: the Gluon wgmma kernel) and
  the Triton TMA kernel (:func:`gemm_only`).
* ``experts``: the FP4 routed experts at decode (256 experts, top-6, batch 1 .. 256): bytes of
  the experts a step touches per second, as a fraction of the copy bandwidth, with the scales
  known to fit (``scales_fit``, as the loader finds them) for the kernels the launch picks
  and, side by side, the Triton kernels and on Hopper the Gluon ones (:mod:`fp4_gluon`), and
  the Triton kernels with the scales unchecked.
* ``experts_sweep`` (only when named): the Gluon kernels under each launch shape of
  ``GLUON_SWEEP``, one kernel at a time, at each ``--experts-batches``.
* ``gemm_tiles``: the FP8 linear at the prefill sizes of ``--m`` (above 64 rows) under each
  tile shape of ``TILE_CANDIDATES``, beside the activation quantisation alone and
  ``torch._scaled_mm``.
* ``gemm_gluon`` (only when named): the decode GEMM alone on activations quantised ahead, the
  Triton kernel and on Hopper the Gluon one (:mod:`fp8_gluon`) side by side at ``--decode-m``
  rows; with ``--gluon-sweep`` also the Gluon kernel's launch shapes at one row.
* ``floor``: what one kernel can do at the ``gemm`` part's weight sizes: an empty launch, and
  a bare kernel that reads every weight byte once; the weight-bandwidth fraction of that read
  bounds any one-kernel linear at decode (ours is two or three dependent kernels).
* ``model``: a V4-Flash-width model (the published config cut to ``--layers`` layers, dummy
  weights): prefill of one ``--prefill-len`` prompt and decode steps at each batch, held as
  stored (``quantization="auto"``) and dequantised to bf16; on a GPU also the deepest prefix of
  the full config whose stored-format weights fit it (``deepinfer info``'s arithmetic), timed
  the same way, with its memory: weights held, peak, and the predicted bytes by tensor kind.

    python benchmarks/low_precision.py --device cuda [--parts gemm experts floor model]
    python benchmarks/low_precision.py --device cpu --small   # a check of the code paths
    python benchmarks/low_precision.py --parts experts experts_sweep --experts-batches 1 8 64 256

On the GPU the kernels are timed in CUDA graphs (:func:`graph_s`: no host launch overhead, as
in a decode step's graph, and weights read from HBM, not L2), medians over ``--repeats``
replays. On the CPU (Triton's interpreter) the figures mean nothing and only ``--small``
shapes are practical.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from torch import Tensor

ROOT = Path(__file__).resolve().parent.parent
FLASH_CONFIG = ROOT / "examples" / "configs" / "deepseek-v4-flash" / "config.json"
#: (name, N, K) of V4-Flash's FP8 projections (hidden 4096).
FLASH_SHAPES = [
    ("wq_a", 1024, 4096),
    ("wq_b", 32768, 1024),
    ("wkv", 512, 4096),
    ("wo_b", 4096, 8192),
    ("shared_w13", 4096, 4096),
    ("shared_w2", 4096, 2048),
]
SMALL_SHAPES = [("small", 256, 256)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_s(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up (host timing)."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def graph_timer(fns: list[Callable[[], object]], calls: int = 16) -> Callable[[], float]:
    """A timer of ``calls`` calls cycling ``fns``, captured once in a CUDA graph: each call of
    the timer replays the graph and returns the GPU seconds of one call (timers of several
    variants can so be interleaved, as side-by-side figures want).

    A graph replays the calls without host launch overhead, as a decode step's graph does;
    each of ``fns`` reads its own copy of the weights, together larger than the L2 cache, so
    the weights come from HBM as they do in a model, where the other layers' weights pass
    through the cache in between.
    """
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fns[0]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    count = max(calls, len(fns))
    with torch.cuda.graph(graph):
        for i in range(count):
            fns[i % len(fns)]()

    def seconds() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / count

    return seconds


def graph_s(fns: list[Callable[[], object]], repeats: int, calls: int = 16) -> float:
    """Median GPU seconds of one call over ``repeats`` replays of :func:`graph_timer`'s graph."""
    timer = graph_timer(fns, calls)
    return statistics.median(timer() for _ in range(repeats))


def copies_for(nbytes: int) -> int:
    """Copies of ``nbytes`` of weights that together pass any GPU's L2 cache (256 MB)."""
    return max(2, min(64, -(-(256 << 20) // max(nbytes, 1))))


def copy_bandwidth(device: str, repeats: int, nbytes: int) -> float:
    """Bytes per second a device-to-device copy moves (read plus write)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_s(lambda: dst.copy_(src), device, repeats)


def kernel_ops(device: str) -> Any:
    """The sm100 op table (bound directly off the GPU, where the kernels run interpreted)."""
    from deepinfer_kernels_sm100.backend import Sm100Backend

    if device.startswith("cuda"):
        return Sm100Backend(torch.device(device))
    ops = object.__new__(Sm100Backend)
    ops.device = torch.device(device)
    return ops


def gemm(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    from deepinfer.models.quant import quant_fp8_block

    ops, device = kernel_ops(args.device), args.device
    cuda = device.startswith("cuda")
    rows = []
    for name, n, k in SMALL_SHAPES if args.small else FLASH_SHAPES:
        w = (torch.randn(n, k) / k**0.5).to(torch.bfloat16)
        wq, ws = quant_fp8_block(w, (128, 128), "ue8m0")
        copies = copies_for(n * k) if cuda else 1
        fp8 = [tuple(t.to(device) for t in (wq, ws)) for _ in range(copies)]
        bf16 = [w.to(device) for _ in range(copies)]
        for m in [1, 8] if args.small else args.m:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            flops = 2 * m * n * k
            ours_fns = [partial(ops.fp8_linear, x, q, s, (128, 128)) for q, s in fp8]
            bf16_fns = [partial(torch.matmul, x, b.T) for b in bf16]
            if cuda:
                ours, plain = graph_s(ours_fns, args.repeats), graph_s(bf16_fns, args.repeats)
            else:
                ours = median_s(ours_fns[0], device, args.repeats)
                plain = median_s(bf16_fns[0], device, args.repeats)
            row = {
                "shape": name,
                "m": m,
                "n": n,
                "k": k,
                "fp8_us": round(ours * 1e6, 2),
                "fp8_tflops": round(flops / ours / 1e12, 2),
                "bf16_tflops": round(flops / plain / 1e12, 2),
                "fp8_weight_bw_fraction": round(n * k / ours / bandwidth, 3),
            }
            if cuda:
                xq = (x.float() / 448).to(torch.float8_e4m3fn)
                sa = torch.ones(m, 1, device=device)
                sb = torch.ones(1, n, device=device)
                vendor_fns = [
                    partial(
                        torch._scaled_mm, xq, q.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
                    )
                    for q, _ in fp8
                ]
                vendor = graph_s(vendor_fns, args.repeats)
                row["scaled_mm_tflops"] = round(flops / vendor / 1e12, 2)
                row["fp8_over_scaled_mm"] = round(vendor / ours, 3)
                if m > 64:  # prefill tiles: the GEMM alone, as scaled_mm is timed
                    row.update(gemm_only(x, fp8, vendor, args.repeats))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def gemm_only(
    x: Tensor, fp8: list[tuple[Tensor, Tensor]], vendor: float, repeats: int
) -> dict[str, float]:
    """The prefill GEMM alone on activations quantised ahead, as ``torch._scaled_mm`` is
    given them: the kernel the launch picks (on Hopper the Gluon wgmma kernel) and the Triton
    TMA kernel, each over ``fp8``'s weight copies; their times and ratios to ``vendor``."""
    from deepinfer_kernels_sm100 import fp8_wgmma
    from deepinfer_kernels_sm100.fp8_linear import quantize_act_fp8
    from deepinfer_kernels_sm100.fp8_prefill import fp8_prefill_gemm

    a, sa = quantize_act_fp8(x)
    m, n = x.shape[0], fp8[0][0].shape[0]
    tile = (64, 128 if m >= 1024 else 64, 128)  # the Triton kernel's, as fp8_linear picks
    outs = [torch.empty(m, n, dtype=torch.bfloat16, device=x.device) for _ in fp8]
    fns = [
        partial(fp8_prefill_gemm, a, sa, q, s, o, (128, 128), tile, 1, ue8m0=True,
                num_warps=4, num_stages=4)
        for (q, s), o in zip(fp8, outs, strict=True)
    ]  # fmt: skip
    picked = graph_s(fns, repeats)
    usable = fp8_wgmma.usable
    fp8_wgmma.usable = lambda *_: False  # type: ignore[assignment]
    try:
        triton_kernel = graph_s(fns, repeats)
    finally:
        fp8_wgmma.usable = usable
    return {
        "gemm_only_us": round(picked * 1e6, 2),
        "gemm_only_over_scaled_mm": round(vendor / picked, 3),
        "triton_gemm_only_us": round(triton_kernel * 1e6, 2),
        "triton_gemm_only_over_scaled_mm": round(vendor / triton_kernel, 3),
    }


def gluon_candidates(n: int, k: int, sms: int) -> list[Any]:
    """Launch shapes of the Gluon decode kernel tried by ``gemm_gluon`` at one row: the picked
    one, K split half and twice as far, within a program only, and four steps in flight."""
    from deepinfer_kernels_sm100 import fp8_gluon

    pick = fp8_gluon.pick_tiles(n, k, sms)
    split = pick.split_k * pick.splits
    found = [pick]
    for s in (split // 2, split, split * 2, split * 4):
        if s < 1:
            continue
        for sk, stages in ((min(s, 4), 2), (min(s, 8), 2), (min(s, 16), 2), (min(s, 8), 4)):
            wn = max(1, 4 // sk) if n % (16 * max(1, 4 // sk)) == 0 else 1
            tiles = fp8_gluon.Tiles(wn, sk, max(1, s // sk), stages)
            try:
                fp8_gluon._checked(tiles, n, k, n)
            except ValueError:
                continue
            if tiles not in found:
                found.append(tiles)
    return found[:8]


def gemm_gluon(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    """The decode GEMM alone (activations quantised ahead, as the fused RMSNorm / SwiGLU hand
    them over) on the Triton and the Gluon kernels side by side at ``--decode-m`` rows, and
    with ``--gluon-sweep`` the Gluon kernel at one row under each of
    :func:`gluon_candidates`."""
    from deepinfer.models.quant import quant_fp8_block
    from deepinfer_kernels_sm100 import fp8_gluon, fp8_linear
    from deepinfer_kernels_sm100.devices import sm_count
    from deepinfer_kernels_sm100.fp8_linear import fp8_block_linear, quantize_act_fp8

    if not args.device.startswith("cuda"):
        raise SystemExit("the gemm_gluon part times CUDA graphs: it needs a GPU")
    default = fp8_linear.DECODE_KERNEL
    rows = []
    for name, n, k in FLASH_SHAPES:
        w = (torch.randn(n, k) / k**0.5).to(torch.bfloat16)
        wq, ws = quant_fp8_block(w, (128, 128), "ue8m0")
        fp8 = [tuple(t.to(args.device) for t in (wq, ws)) for _ in range(copies_for(n * k))]
        for m in args.decode_m:
            x = torch.randn(m, k, device=args.device).to(torch.bfloat16)
            pre = quantize_act_fp8(x)
            fns = [partial(fp8_block_linear, x, q, s, quantized=pre) for q, s in fp8]
            row: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k}
            outs = {}
            for kernel in ("triton", "gluon"):
                fp8_linear.DECODE_KERNEL = kernel
                outs[kernel] = fns[0]().float()
                seconds = graph_s(fns, args.repeats)
                row[f"{kernel}_us"] = round(seconds * 1e6, 2)
                row[f"{kernel}_weight_bw_fraction"] = round(n * k / seconds / bandwidth, 3)
            fp8_linear.DECODE_KERNEL = default
            diff = (outs["gluon"] - outs["triton"]).abs().max().item()
            row["max_rel_diff"] = round(diff / max(outs["triton"].abs().max().item(), 1e-30), 5)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        if not args.gluon_sweep:
            continue
        fp8_linear.DECODE_KERNEL = "gluon"
        x = torch.randn(1, k, device=args.device).to(torch.bfloat16)
        pre = quantize_act_fp8(x)
        fns = [partial(fp8_block_linear, x, q, s, quantized=pre) for q, s in fp8]
        for tiles in gluon_candidates(n, k, sm_count(torch.device(args.device))):
            fp8_gluon.OVERRIDE[(n, k)] = tiles
            seconds = graph_s(fns, args.repeats)
            row = {"shape": name, "m": 1, "tiles": list(tiles), "gluon_us": round(seconds * 1e6, 2),
                   "gluon_weight_bw_fraction": round(n * k / seconds / bandwidth, 3)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        fp8_gluon.OVERRIDE.clear()
        fp8_linear.DECODE_KERNEL = default
    return rows


#: prefill tiles tried by ``gemm_tiles``: (BLOCK_M, BLOCK_N, warps, stages); BLOCK_K is the
#: 128-column scale block
TILE_CANDIDATES = [
    (64, 64, 4, 4),
    (64, 128, 4, 4),
    (64, 128, 4, 3),
    (64, 256, 4, 3),
    (128, 128, 4, 3),
    (128, 128, 8, 3),
    (128, 128, 8, 4),
    (128, 256, 8, 3),
    (256, 128, 8, 3),
]


def gemm_tiles(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The FP8 linear at prefill sizes under each of ``TILE_CANDIDATES`` (the launch's tile
    choice replaced), beside the activation quantisation alone and ``torch._scaled_mm``."""
    from deepinfer.models.quant import quant_fp8_block
    from deepinfer_kernels_sm100 import fp8_linear
    from deepinfer_kernels_sm100.fp8_quant import quantize_act_fp8

    if not args.device.startswith("cuda"):
        raise SystemExit("the gemm_tiles part times CUDA graphs: it needs a GPU")
    ops, device = kernel_ops(args.device), args.device
    chosen = fp8_linear._tiles
    rows = []
    for name, n, k in FLASH_SHAPES:
        w = (torch.randn(n, k) / k**0.5).to(torch.bfloat16)
        wq, ws = quant_fp8_block(w, (128, 128), "ue8m0")
        fp8 = [tuple(t.to(device) for t in (wq, ws)) for _ in range(copies_for(n * k))]
        for m in [m for m in args.m if m > fp8_linear.SMALL_M]:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            flops = 2 * m * n * k
            xq = (x.float() / 448).to(torch.float8_e4m3fn)
            sa, sb = torch.ones(m, 1, device=device), torch.ones(1, n, device=device)
            vendor = graph_s(
                [partial(torch._scaled_mm, xq, q.T, scale_a=sa, scale_b=sb,
                         out_dtype=torch.bfloat16) for q, _ in fp8],
                args.repeats,
            )  # fmt: skip
            quant = graph_s([partial(quantize_act_fp8, x)], args.repeats)
            row: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k,
                                   "scaled_mm_us": round(vendor * 1e6, 2),
                                   "act_quant_us": round(quant * 1e6, 2), "tiles": {}}  # fmt: skip
            for bm, bn, warps, stages in TILE_CANDIDATES:
                if n % bn:
                    continue
                tile = fp8_linear._Tiles(bm, bn, 128, warps, stages, fused=False, k_split=k)
                fp8_linear._tiles = lambda *a, tile=tile, **kw: tile
                try:
                    ours = graph_s(
                        [partial(ops.fp8_linear, x, q, s, (128, 128)) for q, s in fp8],
                        args.repeats,
                    )
                except Exception as e:  # a tile that does not compile or does not fit
                    row["tiles"][f"m{bm}n{bn}w{warps}s{stages}"] = f"failed: {type(e).__name__}"
                    continue
                finally:
                    fp8_linear._tiles = chosen
                row["tiles"][f"m{bm}n{bn}w{warps}s{stages}"] = {
                    "us": round(ours * 1e6, 2),
                    "tflops": round(flops / ours / 1e12, 1),
                    "over_scaled_mm": round(vendor / ours, 3),
                    "gemm_only_over_scaled_mm": round(vendor / max(ours - quant, 1e-9), 3),
                }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def floor(args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    """The one-kernel floor at each FP8 weight size (module doc)."""
    import triton
    import triton.language as tl

    @triton.jit
    def empty(p):  # type: ignore[no-untyped-def]
        pass

    @triton.jit
    def read(p, out, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + tl.program_id(0), tl.sum(tl.load(p + offs, mask=offs < n, other=0), 0))

    device, cuda = args.device, args.device.startswith("cuda")
    timed = partial(graph_s, repeats=args.repeats) if cuda else None
    buf = torch.zeros(1, device=device)
    result: dict[str, Any] = {}
    for programs in (1, 1024):
        fn = partial(empty[(programs,)], buf)
        seconds = timed([fn]) if timed else median_s(fn, device, args.repeats)
        result[f"empty_kernel_{programs}_programs_us"] = round(seconds * 1e6, 2)
    block = 4096
    for name, n, k in SMALL_SHAPES if args.small else FLASH_SHAPES:
        words = n * k // 4
        copies = [
            torch.randint(0, 100, (words,), dtype=torch.int32, device=device)
            for _ in range(copies_for(n * k) if cuda else 1)
        ]
        out = torch.empty(-(-words // block), dtype=torch.int32, device=device)
        fns = [partial(read[(out.numel(),)], c, out, words, BLOCK=block) for c in copies]
        seconds = timed(fns) if timed else median_s(fns[0], device, args.repeats)
        result[name] = {
            "read_us": round(seconds * 1e6, 2),
            "bytes_at_copy_bandwidth_us": round(n * k / bandwidth * 1e6, 2),
            "best_weight_bw_fraction": round(n * k / bandwidth / seconds, 3),
        }
        print(name, json.dumps(result[name]), file=sys.stderr)
    return result


def expert_weights(device: str, small: bool) -> tuple[dict[str, Tensor], tuple[int, ...]]:
    """Random FP4 experts (every scale byte at most 128, as ``scales_fit`` promises) of
    V4-Flash's shapes, or tiny ones (``small``), and (experts, d, I, top-k)."""
    e, d, inter, top = (16, 256, 128, 2) if small else (256, 4096, 2048, 6)
    g = torch.Generator().manual_seed(0)

    def codes(*shape: int) -> Tensor:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(device)

    def scales(*shape: int) -> Tensor:
        return torch.randint(112, 120, shape, dtype=torch.uint8, generator=g).to(device)

    w = {
        "w13_packed": codes(e, 2 * inter, d // 2),
        "w13_scale": scales(e, 2 * inter, d // 32),
        "w2_packed": codes(e, d, inter // 2),
        "w2_scale": scales(e, d, inter // 32),
    }
    return w, (e, d, inter, top)


def expert_routing(b: int, shape: tuple[int, ...], device: str) -> tuple[Tensor, Tensor, Tensor]:
    """(x, router weights, indices) of a batch of ``b`` tokens, top-k distinct experts each,
    for ``shape`` = (experts, d, I, top-k) (seeded by ``b``)."""
    e, d, _, top = shape
    g = torch.Generator().manual_seed(b)
    x = torch.randn(b, d, generator=g).to(torch.bfloat16).to(device)
    indices = torch.stack([torch.randperm(e, generator=g)[:top] for _ in range(b)]).to(device)
    weights = torch.softmax(torch.randn(b, top, generator=g), dim=-1).to(device)
    return x, weights, indices


def experts(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    """FP4 routed experts at decode: the bytes of the experts a step touches per second, for
    the kernels the launch picks (``us``) and, side by side in one process, the Triton and the
    Gluon (Hopper) kernels with ``scales_fit``, and the Triton kernels without."""
    from deepinfer_kernels_sm100 import fp4_gluon
    from deepinfer_kernels_sm100.fp4_moe import moe_experts_fp4

    device, cuda = args.device, args.device.startswith("cuda")
    w, shape = expert_weights(device, args.small)
    per_expert = sum(t[0].numel() for t in w.values())
    rows = []
    for b in [1, 4] if args.small else args.experts_batches:
        x, weights, indices = expert_routing(b, shape, device)
        touched = int(torch.unique(indices).numel()) * per_expert
        gluon = fp4_gluon.usable(x, w["w13_packed"], w["w2_packed"], scales_fit=True,
                                 decode=True)  # fmt: skip
        timed: dict[str, float] = {}
        for name, fit, kernel in (("auto", True, "auto"), ("triton", True, "triton"),
                                  ("triton_scales_unchecked", False, "triton"),
                                  ("gluon", True, "gluon")):  # fmt: skip
            if kernel == "gluon" and not gluon:
                continue
            run = partial(moe_experts_fp4, x, weights, indices, swiglu_limit=10.0,
                          scales_fit=fit, kernel=kernel, **w)  # fmt: skip
            timed[name] = graph_s([run], args.repeats) if cuda else median_s(run, device, 3)
        row: dict[str, Any] = {"batch": b, "experts_touched": touched // per_expert}
        for name, seconds in timed.items():
            suffix = "" if name == "auto" else f"_{name}"
            row[f"us{suffix}"] = round(seconds * 1e6, 1)
            row[f"bw_fraction{suffix}"] = round(touched / seconds / bandwidth, 3)
        if "gluon" in timed:
            row["gluon_speedup"] = round(timed["triton"] / timed["gluon"], 3)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


#: launch shapes tried by ``experts_sweep`` for one Gluon kernel while the other keeps its
#: pick: (warps_n, split_k, n_tiles, stages, maxnreg)
GLUON_SWEEP = [
    (4, 1, 1, 1, None),
    (4, 1, 1, 2, None),
    (4, 1, 1, 4, None),
    (4, 1, 1, 2, 168),
    (4, 1, 2, 2, None),
    (2, 1, 1, 2, None),
    (1, 1, 1, 2, None),
    (8, 1, 1, 2, None),
    (2, 2, 1, 2, 168),
    (2, 2, 1, 1, 128),
    (1, 4, 1, 1, 168),
    (4, 2, 1, 2, 128),
    (2, 2, 1, 4, None),
    (2, 2, 1, 4, 208),
    (1, 4, 1, 4, None),
    (4, 1, 1, 4, 208),
]


def experts_sweep(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    """The Gluon kernels' constexpr knobs (:data:`GLUON_SWEEP`), one kernel at a time with the
    other at its pick, at each batch: us and fraction of the copy bandwidth, best first."""
    from deepinfer_kernels_sm100 import fp4_gluon
    from deepinfer_kernels_sm100.fp4_moe import moe_experts_fp4

    device = args.device
    if not device.startswith("cuda"):
        raise SystemExit("the experts_sweep part times the Gluon kernels: it needs a Hopper GPU")
    w, shape = expert_weights(device, args.small)
    _, d, inter, _ = shape
    per_expert = sum(t[0].numel() for t in w.values())
    rows = []
    for b in args.experts_batches:
        x, weights, indices = expert_routing(b, shape, device)
        touched = int(torch.unique(indices).numel()) * per_expert
        run = partial(moe_experts_fp4, x, weights, indices, swiglu_limit=10.0, scales_fit=True,
                      kernel="gluon", **w)  # fmt: skip
        picked = graph_s([run], args.repeats)
        row: dict[str, Any] = {
            "batch": b,
            "picked_us": round(picked * 1e6, 1),
            "picked_bw_fraction": round(touched / picked / bandwidth, 3),
        }
        for kernel, k_dim, n_rows in (("gate_up", d, inter), ("down", inter, d)):
            tried = {}
            for knobs in GLUON_SWEEP:
                tiles = fp4_gluon.Tiles(*knobs)
                steps = k_dim // fp4_gluon.STEP_K
                if n_rows % (16 * tiles.warps_n) or steps % (tiles.split_k * tiles.stages):
                    continue
                fp4_gluon.OVERRIDE = {kernel: tiles}
                try:
                    seconds = graph_s([run], args.repeats)
                except Exception as err:  # a shape that does not compile or launch
                    tried["w{}k{}n{}s{}r{}".format(*knobs)] = f"failed: {type(err).__name__}"
                    continue
                finally:
                    fp4_gluon.OVERRIDE = {}
                tried["w{}k{}n{}s{}r{}".format(*knobs)] = {
                    "us": round(seconds * 1e6, 1),
                    "bw_fraction": round(touched / seconds / bandwidth, 3),
                }
            ok = {k: v for k, v in tried.items() if isinstance(v, dict)}
            row[kernel] = dict(sorted(ok.items(), key=lambda kv: kv[1]["us"])) | {
                k: v for k, v in tried.items() if k not in ok
            }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def cut(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """The config's first ``layers`` layers (and its MTP layer)."""
    short = dict(cfg, num_hidden_layers=layers)
    ratios = cfg.get("compress_ratios")
    if ratios:
        mtp = ratios[cfg["num_hidden_layers"] :]
        short["compress_ratios"] = ratios[:layers] + mtp
    return short


def fitting_layers(cfg: dict[str, Any], budget_bytes: float) -> int:
    """The deepest prefix of the config whose weights, held as stored, fit ``budget_bytes``
    (deepinfer info's arithmetic, per layer from two depths' totals)."""
    from deepinfer.model_info import model_report

    def held(layers: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(cut(cfg, layers)))
            return model_report(tmp).held_bytes

    one, two = held(1), held(2)
    per_layer = two - one
    return max(1, min(cfg["num_hidden_layers"], int((budget_bytes - one) // per_layer) + 1))


def time_model(args: argparse.Namespace, cfg: dict[str, Any], quantization: str | None) -> dict:
    """Prefill and decode figures of ``cfg`` with dummy weights, and its memory split."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_ab import pick_api, time_decode, time_prefill

    from deepinfer import plugins
    from deepinfer.device import select_backend
    from deepinfer.loading import load
    from deepinfer.model_info import model_report

    cuda = args.device.startswith("cuda")
    choice = select_backend(args.device)  # as LLM picks it: sm100 on an NVIDIA GPU
    backend = plugins.backends.load(choice.backend)(choice.device)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        kinds = {name: k.held_bytes for name, k in model_report(tmp).kinds.items()}
        if cuda:
            torch.cuda.reset_peak_memory_stats(args.device)
        net, _ = load(
            tmp, "bfloat16", choice.device, backend, load_format="dummy", quantization=quantization
        )
    run: dict[str, Any] = {"layers": cfg["num_hidden_layers"], "backend": choice.backend}
    net.eval()
    if cuda:
        run["weights_gib"] = round(torch.cuda.memory_allocated(args.device) / 2**30, 2)
    if quantization == "auto":  # deepinfer info's arithmetic is that of the stored formats
        run["predicted_weights_gib_by_kind"] = {k: round(v / 2**30, 2) for k, v in kinds.items()}
    api = pick_api(net, "new")
    top = net.cfg.vocab_size
    with torch.inference_mode():
        ids = torch.randint(3, top, (args.prefill_len,)).to(args.device)
        prefill = statistics.median(time_prefill(net, api, ids, 2, args.device))
        run["prefill_tok_per_s"] = round(args.prefill_len / prefill, 1)
        for batch in args.batches:
            step = time_decode(net, api, batch, args, top)
            run[f"decode_B{batch}_ms"] = step["ms"]
            run[f"decode_B{batch}_tok_per_s"] = round(batch / step["ms"] * 1e3, 1)
    if cuda:
        run["peak_gib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**30, 2)
    del net, api
    if cuda:
        torch.cuda.empty_cache()
    return run


def model(args: argparse.Namespace) -> dict[str, Any]:
    """The V4-Flash-width model cut to ``--layers``, stored vs bf16; on a GPU also the deepest
    prefix of the full config that fits it, in the stored formats."""
    cfg = json.loads(args.config.read_text())
    out: dict[str, Any] = {"layers": args.layers}
    for name, quantization in {"stored": "auto", "bf16": None}.items():
        out[name] = time_model(args, cut(cfg, args.layers), quantization)
        print(json.dumps({name: out[name]}), file=sys.stderr)
    if args.device.startswith("cuda") and args.deepest:
        total = torch.cuda.get_device_properties(args.device).total_memory
        layers = fitting_layers(cfg, 0.85 * total)
        out["deepest_prefix"] = time_model(args, cut(cfg, layers), "auto")
        print(json.dumps({"deepest_prefix": out["deepest_prefix"]}), file=sys.stderr)
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--parts", nargs="+", default=["gemm", "experts", "floor", "model"])
    ap.add_argument("--small", action="store_true", help="tiny shapes: a CPU check")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 64, 256, 4096])
    ap.add_argument("--decode-m", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--gluon-sweep", action="store_true", help="gemm_gluon: launch shapes too")
    ap.add_argument("--experts-batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--config", type=Path, default=FLASH_CONFIG, help="model part's config.json")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=4096)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument(
        "--no-deepest", dest="deepest", action="store_false", help="skip the deepest prefix"
    )
    # What step_ab's decode timing reads.
    ap.add_argument("--decode-prompt-len", type=int, default=512)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=10)
    ap.add_argument("--max-len", type=int, default=640)
    ap.add_argument("--prefill-group", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    if not args.device.startswith("cuda"):  # the kernels run in Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    bandwidth = copy_bandwidth(args.device, args.repeats, (1 << 22) if args.small else (1 << 30))
    result: dict[str, Any] = {
        "benchmark": "low_precision",
        "device": args.device,
        "torch": torch.__version__,
        "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1),
    }
    if "gemm" in args.parts:
        result["gemm"] = gemm(args, bandwidth)
    if "experts" in args.parts:
        result["experts"] = experts(args, bandwidth)
    if "experts_sweep" in args.parts:
        result["experts_sweep"] = experts_sweep(args, bandwidth)
    if "gemm_tiles" in args.parts:
        result["gemm_tiles"] = gemm_tiles(args)
    if "gemm_gluon" in args.parts:
        result["gemm_gluon"] = gemm_gluon(args, bandwidth)
    if "floor" in args.parts:
        result["floor"] = floor(args, bandwidth)
    if "model" in args.parts:
        result["model"] = model(args)
    name = f"low_precision_{args.device.split(':')[0]}" + ("_small" if args.small else "")
    write_result(result, args.out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
