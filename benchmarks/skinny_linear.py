"""Decode-size bf16 linears: ``skinny_linear`` (K split over the SMs) against torch's GEMM.

For each projection of config A's decode step (and the router and compressor gates, which
take bf16 inputs to fp32 outputs), at each of ``--rows``, the GPU time of one call, each call
timed inside a CUDA graph over weight copies that together pass the L2 cache
(``low_precision.graph_timer``), variants interleaved over ``--repeats`` replays, medians
reported:

* ``torch``: what the backend ran before (``F.linear``; ``torch.mm(..., out_dtype=fp32)`` for
  the fp32 outputs; the grouped ``wo_a`` as ``grouped_ref.grouped_linear``'s bmm);
* ``skinny`` with each launch shape of ``--tiles`` (``block_n,block_k,dot,warps,stages``),
  the first being the module's default.

Each variant's output is checked against torch's (max relative difference, reported). The
``step_us`` rows sum every shape's per-call time times its calls a decode step (config A: 16
layers, 7 of them CSA with an indexer), the part of a decode step these projections take.

With ``--model-batches``, also config A's captured decode step (``step_ab.time_decode``,
512-token prompts, bf16 projections held as a checkpoint holds them) at those batches, with
``skinny_linear.ENABLED`` off and on alternately (``--model-rounds`` rounds) in one process,
the default launch shape (or ``--pick``: the sweep's fastest over all of ``--rows``).

    python benchmarks/skinny_linear.py [--rows 1 8] [--tiles 64,128,1,4,4 32,64,0,4,4]
        [--model-batches 1 8 64] [--pick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _results import write_result
from low_precision import copies_for, graph_timer

#: (name, N, K, groups, out dtype, calls a config A decode step)
SHAPES: tuple[tuple[str, int, int, int, str, int], ...] = (
    ("wq_a+wkv", 1024, 2048, 1, "bf16", 16),
    ("wq_b", 8192, 512, 1, "bf16", 16),
    ("wo_a (4 groups)", 2048, 2048, 4, "bf16", 16),
    ("wo_b", 2048, 2048, 1, "bf16", 16),
    ("shared_w13", 1536, 2048, 1, "bf16", 16),
    ("shared_w2", 2048, 768, 1, "bf16", 16),
    ("indexer_wq_b", 4096, 512, 1, "bf16", 7),
    ("router gate", 16, 2048, 1, "fp32", 16),
    ("indexer weights_proj", 32, 2048, 1, "fp32", 7),
    ("csa compressor", 2048, 2048, 1, "fp32", 14),
    ("hca compressor", 1024, 2048, 1, "fp32", 7),
)


def parse_tiles(spec: str) -> Any:
    from deepinfer_kernels_sm100.skinny_linear import Tiles

    bn, bk, dot, warps, stages = (int(v) for v in spec.split(","))
    return Tiles(block_n=bn, block_k=bk, dot=bool(dot), num_warps=warps, num_stages=stages)


def tile_label(t: Any) -> str:
    return f"{t.block_n},{t.block_k},{int(t.dot)},{t.num_warps},{t.num_stages}"


def torch_call(x: torch.Tensor, w: torch.Tensor, groups: int, fp32: bool) -> torch.Tensor:
    from deepinfer.backends.grouped_ref import grouped_linear

    if groups > 1:
        return grouped_linear(x.view(x.shape[0], groups, -1), w).flatten(-2)
    if fp32:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return F.linear(x, w)


def skinny_call(
    x: torch.Tensor, w: torch.Tensor, groups: int, fp32: bool, tiles: Any
) -> torch.Tensor:
    from deepinfer_kernels_sm100 import skinny_linear

    skinny_linear.TILES = tiles
    out_dtype = torch.float32 if fp32 else None
    return skinny_linear.skinny_linear(x, w, out_dtype=out_dtype, groups=groups)


def shape_row(
    shape: tuple[str, int, int, int, str, int], rows: int, tiles: list[Any], repeats: int
) -> dict[str, Any]:
    """One shape at ``rows`` rows: per-call us of torch and each launch shape, interleaved."""
    from deepinfer_kernels_sm100 import skinny_linear

    name, n, k, groups, out, per_step = shape
    fp32 = out == "fp32"
    g = torch.Generator(device="cuda").manual_seed(n * k + rows)
    copies = copies_for(n * k * 2)
    ws = [torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(rows, groups * k, device="cuda", generator=g).to(torch.bfloat16)
    want = torch_call(x, ws[0], groups, fp32).float()
    row: dict[str, Any] = {
        "shape": name, "rows": rows, "n": n, "k": k, "groups": groups, "out": out,
        "per_step": per_step, "weight_mb": round(n * k * 2 / 2**20, 2),
    }  # fmt: skip
    variants: dict[str, Callable[[], float]] = {
        "torch": graph_timer([lambda w=w: torch_call(x, w, groups, fp32) for w in ws])
    }
    diffs = {}
    for t in tiles:
        label = tile_label(t)
        skinny_linear.TILES = t
        if not skinny_linear.fits(x, ws[0], groups):
            continue
        got = skinny_call(x, ws[0], groups, fp32, t).float()
        diffs[label] = float(((got - want).abs().max() / want.abs().max()).item())
        variants[label] = graph_timer(
            [lambda w=w, t=t: skinny_call(x, w, groups, fp32, t) for w in ws]
        )
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(repeats):
        for v, timer in variants.items():
            times[v].append(timer())
    row["us"] = {v: round(statistics.median(ts) * 1e6, 2) for v, ts in times.items()}
    row["max_rel_diff_vs_torch"] = diffs
    skinny_linear.TILES = tiles[0]
    return row


def model_ab(batches: list[int], rounds: int) -> dict[str, Any]:
    """Config A decode steps (ms, median over steps) with skinny linears off and on, alternated."""
    from model_speed import hold_as_checkpoint
    from step_ab import midsize_config, pick_api, time_decode

    from deepinfer import plugins
    from deepinfer.assets import init_random_weights
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
    from deepinfer_kernels_sm100 import skinny_linear

    cfg = midsize_config()
    model = DeepseekV4ForCausalLM(
        cfg, dtype=torch.bfloat16, device="cuda", backend=plugins.backends.load("sm100")("cuda")
    )
    init_random_weights(model, seed=0)
    hold_as_checkpoint(model)
    model.eval()
    api = pick_api(model, "auto")
    run = argparse.Namespace(device="cuda", decode_prompt_len=512, warmup_steps=3,
                             decode_steps=20, max_len=540, prefill_group=16, seed=0)  # fmt: skip
    ms: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    with torch.inference_mode():
        for _ in range(rounds):
            for arm in ("off", "on"):
                skinny_linear.ENABLED = arm == "on"
                for b in batches:
                    step = time_decode(
                        model,
                        api,
                        b,
                        run,
                        min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size),
                    )
                    ms[arm].setdefault(str(b), []).append(step["ms"])
                    print(arm, b, step["ms"], flush=True)
    skinny_linear.ENABLED = True
    return {"tiles": str(skinny_linear.TILES), "ms": ms}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, nargs="*", default=[1, 8], help="none: no sweep")
    p.add_argument("--tiles", nargs="+", default=None, help="block_n,block_k,dot,warps,stages")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--model-batches", type=int, nargs="*", default=[])
    p.add_argument("--model-rounds", type=int, default=2)
    p.add_argument("--pick", action="store_true", help="the model A/B with the sweep's fastest")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from deepinfer_kernels_sm100 import skinny_linear

    default = skinny_linear.TILES
    tiles = [default] + [parse_tiles(s) for s in args.tiles or []]
    rows = []
    for m in args.rows:
        for shape in SHAPES:
            rows.append(shape_row(shape, m, tiles, args.repeats))
            print(rows[-1]["shape"], m, rows[-1]["us"], flush=True)
    step: dict[str, dict[str, float]] = {}
    for m in args.rows:
        mine = [r for r in rows if r["rows"] == m]
        labels = set.intersection(*(set(r["us"]) for r in mine))
        step[str(m)] = {v: round(sum(r["us"][v] * r["per_step"] for r in mine), 1) for v in labels}
    result = {
        "benchmark": "skinny_linear",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python benchmarks/skinny_linear.py " + " ".join(sys.argv[1:]),
        "note": "us per call (median of interleaved CUDA-graph replays over weight copies past "
        "the L2 cache); step_us: each variant's per-call time times the calls of a config A "
        "decode step, summed over the shapes every variant ran",
        "rows": rows,
        "step_us": step,
    }
    if args.model_batches:
        if args.pick and args.rows:
            labels = [v for v in step[str(args.rows[0])] if v != "torch"]
            label = min(labels, key=lambda v: sum(step[str(m)][v] for m in args.rows))
            skinny_linear.TILES = next(t for t in tiles if tile_label(t) == label)
        result["model_ab"] = model_ab(args.model_batches, args.model_rounds)
    name = "skinny_linear_" + torch.cuda.get_device_name().split()[1].lower()
    write_result(result, args.out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
