"""The Gluon decode kernels' launch choices against those they replaced, side by side in one
process (CUDA graphs, variants alternated over ``--rounds`` rounds).

* ``fp4``: the routed experts at V4-Flash's shapes (256 experts of 2048, top-6, hidden 4096,
  random FP4 weights whose scale bytes fit), the whole ``moe_experts_fp4`` call: ``before``,
  grouped slots and one token tile a pass, against ``now``, :mod:`.fp4_gluon`'s settings (a
  slot per pair for one token with the down kernel a programmatic dependent launch, slots of
  9 to 16 pairs in one pass of two tiles where slots average ``WIDE_MIN_PAIRS``). Bandwidth
  fractions count the bytes of the experts the batch touches, as ``low_precision.py --parts
  experts`` does; each variant's kernels at batches 1 and 256 come from the torch profiler.
* ``fp8``: the decode GEMM alone (activations quantised ahead) at V4-Flash's projections, over
  weight copies larger than L2, as ``low_precision.py --parts gemm_gluon`` times it: the launch
  shapes of ``before_tiles`` (81518bd's rule) against :func:`.fp8_gluon.pick_tiles`, each with
  and without programmatic dependent launch at every size (``PDL``; in a graph of calls each
  call's weights are then asked of L2 while the call before drains; the engine takes it up to
  ``PDL_MAX_BYTES``).

* ``model`` (only when named): the 4-layer V4-Flash model in its stored formats, prefill and
  decode at ``--batches`` as ``low_precision.py --parts model`` times them, every
  choice above as before against as now, one after the other in one process.

    python benchmarks/gluon_decode_ab.py --device cuda [--parts fp4 fp8 model] [--rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from low_precision import (
    FLASH_SHAPES,
    copies_for,
    copy_bandwidth,
    expert_routing,
    expert_weights,
    graph_s,
)

#: fp4_gluon's settings as 81518bd had them: grouped slots, one token tile a pass, no PDL,
#: the pairs added by a launch of their own
FP4_BEFORE = {"BY_PAIR_TOKENS": 0, "WIDE_MIN_PAIRS": 0, "WIDE_STAGES": 0, "PDL_DOWN": False,
              "SUM_IN_DOWN": False}  # fmt: skip
VARIANTS = ("before", "now")


def before_tiles(n: int, k: int, sms: int) -> Any:
    """81518bd's launch shape: K halved while the 16-row warps number under 8 an SM (up to 8
    warps of a program, past that across programs), two K steps in registers."""
    from deepinfer_kernels_sm100.fp8_gluon import STEP_K, WARP_ROWS, Tiles

    steps, rows = k // STEP_K, n // WARP_ROWS
    split = 1
    while rows * split < 8 * sms and steps % (4 * split) == 0:
        split *= 2
    split_k = min(split, 8)
    warps_n = 1
    while warps_n * split_k < 4 and rows % (2 * warps_n) == 0:
        warps_n *= 2
    return Tiles(warps_n, split_k, split // split_k, 2 if steps % (2 * split) == 0 else 1)


#: the modules' own choices, kept while ``_settings`` swaps in 81518bd's
_NOW: dict[str, Any] = {}


def _settings(before: bool) -> None:
    """Every Gluon decode choice as 81518bd had it (``before``), or as the modules have it."""
    from deepinfer_kernels_sm100 import fp4_gluon, fp8_gluon

    if not _NOW:
        _NOW.update(pick=fp8_gluon.pick_tiles, pdl=fp8_gluon.PDL)
        _NOW["fp4"] = {k: getattr(fp4_gluon, k) for k in FP4_BEFORE}
    fp8_gluon.pick_tiles = before_tiles if before else _NOW["pick"]
    fp8_gluon.PDL = False if before else _NOW["pdl"]
    for knob, value in (FP4_BEFORE if before else _NOW["fp4"]).items():
        setattr(fp4_gluon, knob, value)


def _alternate(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each run's seconds over ``rounds`` rounds, the runs alternated within each."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for name, run in runs.items():
            out[name].append(run())
    return out


def medians(
    seconds: dict[str, list[float]], nbytes: int, bandwidth: float, key: str = "bw_fraction"
) -> dict[str, dict[str, Any]]:
    """Per variant its median microseconds, its rounds', and ``nbytes`` read in the median as a
    fraction of ``bandwidth`` (under ``key``)."""
    out = {}
    for variant, got in seconds.items():
        us = statistics.median(got) * 1e6
        out[variant] = {"us": round(us, 2), "us_rounds": [round(s * 1e6, 2) for s in got],
                        key: round(nbytes / (us * 1e-6) / bandwidth, 3)}  # fmt: skip
    return out


def _kernels(run: Callable[[], object], calls: int) -> dict[str, float]:
    """Device microseconds per call of each kernel ``run`` launches (the torch profiler over
    ``calls`` eager calls, as ``model_speed.py`` profiles its steps)."""
    from model_speed import profile_calls

    run()
    table = profile_calls(run, calls, "cuda")
    return {k["name"][:60]: round(k["total_us"] / calls, 2) for k in table["top"]}


def fp4(args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    from deepinfer_kernels_sm100 import fp4_gluon
    from deepinfer_kernels_sm100.fp4_moe import moe_experts_fp4

    def timed(variant: str, call: Callable[[], object]) -> float:
        _settings(variant == "before")
        return graph_s([call], args.repeats)

    w, shape = expert_weights(args.device, False)
    per_expert = sum(t[0].numel() for t in w.values())
    rows, kernels = [], {}
    for b in args.batches:
        x, weights, indices = expert_routing(b, shape, args.device)
        call = partial(moe_experts_fp4, x, weights, indices, swiglu_limit=10.0, scales_fit=True,
                       kernel="gluon", **w)  # fmt: skip
        seconds = _alternate({v: partial(timed, v, call) for v in VARIANTS}, args.rounds)
        touched = int(torch.unique(indices).numel()) * per_expert
        row: dict[str, Any] = {"batch": b, "experts_touched": touched // per_expert}
        row.update(medians(seconds, touched, bandwidth))
        row["now_over_before"] = round(row["before"]["us"] / row["now"]["us"], 3)
        rows.append(row)
        print(row, file=sys.stderr)
        if b in (1, 256):
            for variant in VARIANTS:
                _settings(variant == "before")
                kernels[f"{variant}_b{b}"] = _kernels(call, 10)
        _settings(False)
    knobs = {"before": FP4_BEFORE, "now": {k: getattr(fp4_gluon, k) for k in FP4_BEFORE}}
    return {"variants": knobs, "rows": rows, "kernels_us_per_call": kernels}


def fp8(args: argparse.Namespace, bandwidth: float) -> list[dict[str, Any]]:
    from deepinfer.models.quant import quant_fp8_block
    from deepinfer_kernels_sm100 import fp8_gluon, fp8_linear
    from deepinfer_kernels_sm100.devices import sm_count
    from deepinfer_kernels_sm100.fp8_linear import fp8_block_linear, quantize_act_fp8

    sms = sm_count(torch.device(args.device))
    pdl, kernel, most = fp8_gluon.PDL, fp8_linear.DECODE_KERNEL, fp8_gluon.PDL_MAX_BYTES
    fp8_linear.DECODE_KERNEL = "gluon"
    rows = []
    try:
        for name, n, k in FLASH_SHAPES:
            w = (torch.randn(n, k) / k**0.5).to(torch.bfloat16)
            wq, ws = quant_fp8_block(w, (128, 128), "ue8m0")
            fp8 = [tuple(t.to(args.device) for t in (wq, ws)) for _ in range(copies_for(n * k))]
            shapes = {"before": before_tiles(n, k, sms), "now": fp8_gluon.pick_tiles(n, k, sms)}

            def timed(tiles: Any, with_pdl: bool, fns: list[Callable[[], object]]) -> float:
                fp8_gluon.OVERRIDE[(n, k)], fp8_gluon.PDL = tiles, with_pdl  # noqa: B023
                return graph_s(fns, args.repeats)

            fp8_gluon.PDL_MAX_BYTES = n * k  # (the _pdl variants at every size)

            for m in args.decode_m:
                x = torch.randn(m, k, device=args.device).to(torch.bfloat16)
                pre = quantize_act_fp8(x)
                fns = [partial(fp8_block_linear, x, q, s, quantized=pre) for q, s in fp8]
                runs = {f"{t}{'_pdl' if p else ''}": partial(timed, shapes[t], p, fns)
                        for t in shapes for p in (False, True)}  # fmt: skip
                seconds = _alternate(runs, args.rounds)
                row: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k}
                row.update({f"{t}_tiles": list(v) for t, v in shapes.items()})
                row.update(medians(seconds, n * k, bandwidth, "weight_bw_fraction"))
                rows.append(row)
                print(row, file=sys.stderr)
    finally:
        fp8_gluon.OVERRIDE.clear()
        fp8_gluon.PDL, fp8_linear.DECODE_KERNEL, fp8_gluon.PDL_MAX_BYTES = pdl, kernel, most
    return rows


def model(args: argparse.Namespace) -> dict[str, Any]:
    """The V4-Flash-width model cut to ``--layers`` in its stored formats (dummy weights), as
    ``low_precision.py --parts model`` times it, under the choices before and now."""
    import json

    from low_precision import FLASH_CONFIG, cut, time_model

    cfg = cut(json.loads(FLASH_CONFIG.read_text()), args.layers)
    lp = argparse.Namespace(device=args.device, prefill_len=4096, batches=args.batches,
                            decode_prompt_len=512, warmup_steps=3, decode_steps=10, max_len=640,
                            prefill_group=32, seed=0)  # fmt: skip
    out: dict[str, Any] = {"layers": args.layers}
    for name in ("before", "now"):
        _settings(name == "before")
        out[name] = time_model(lp, cfg, "auto")
        print({name: out[name]}, file=sys.stderr)
    _settings(False)
    return out


def ab_parser(doc: str | None, rounds: int) -> argparse.ArgumentParser:
    """The options every Gluon A/B script takes: device, rounds, repeats, output path."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    return ap


def ab_header(benchmark: str, args: argparse.Namespace) -> tuple[dict[str, Any], float]:
    """A GPU A/B's result header (its GPU, torch, the copy bandwidth measured now), and that
    bandwidth in bytes per second."""
    bandwidth = copy_bandwidth(args.device, args.repeats, 1 << 30)
    header = {
        "benchmark": benchmark,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1),
    }
    return header, bandwidth


def main() -> int:
    ap = ab_parser(__doc__, rounds=2)
    ap.add_argument("--parts", nargs="+", default=["fp4", "fp8"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--decode-m", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--layers", type=int, default=4, help="model part: layers of V4-Flash")
    args = ap.parse_args()
    result, bandwidth = ab_header("gluon_decode_ab", args)
    if "fp8" in args.parts:
        result["fp8"] = fp8(args, bandwidth)
    if "fp4" in args.parts:
        result["fp4"] = fp4(args, bandwidth)
    if "model" in args.parts:
        result["model"] = model(args)
    write_result(result, args.out, "gluon_decode_ab")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
