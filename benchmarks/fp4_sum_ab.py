"""A few tokens' FP4 routed experts on Hopper: the pairs added in the down kernel
(:mod:`.fp4_gluon_sum`) against a launch of their own, and a slot per pair against grouped
slots, side by side in one process (CUDA graphs, variants alternated over ``--rounds``).

At V4-Flash's shapes (256 experts of 2048, top-6, hidden 4096, random FP4 weights whose scale
bytes fit), the whole ``moe_experts_fp4`` call at each of ``--batches``:

* ``grouped``: :func:`.moe_group.group_pairs`' slots, per-pair rows, :func:`.moe.slot_sum`;
* ``by_pair``: a slot per pair (``BY_PAIR_TOKENS`` raised to the batch), per-pair rows,
  :func:`.moe.slot_sum` (``SUM_IN_DOWN`` off);
* ``by_pair_sum``: a slot per pair, the pairs and residual added by the down kernel, at
  :func:`.fp4_gluon_sum.pick_tiles`' launch shape, and each of ``--sum-tiles``
  (warps_n,split_k,stages) and without programmatic dependent launch at batch 1.

Bandwidth fractions count the bytes of the experts the batch touches (``low_precision.py
--parts experts``); each variant's kernels at batch 1 come from the torch profiler.

    python benchmarks/fp4_sum_ab.py --device cuda [--batches 1 2 4 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from _results import write_result
from gluon_decode_ab import _alternate, _kernels, ab_header, ab_parser, medians
from low_precision import expert_routing, expert_weights, graph_s


@contextmanager
def _under(settings: dict[str, Any]) -> Iterator[None]:
    """fp4_gluon's knobs and fp4_gluon_sum's forced launch shape (``tiles``) as ``settings``
    has them, for the block, then restored."""
    from deepinfer_kernels_sm100 import fp4_gluon, fp4_gluon_sum

    values = {(fp4_gluon, k): v for k, v in settings.items() if k != "tiles"}
    values[fp4_gluon_sum, "OVERRIDE"] = settings.get("tiles")
    saved = {key: getattr(*key) for key in values}
    for (module, knob), value in values.items():
        setattr(module, knob, value)
    try:
        yield
    finally:
        for (module, knob), value in saved.items():
            setattr(module, knob, value)


def _variants(batch: int, sum_tiles: list[tuple[int, ...]]) -> dict[str, dict[str, Any]]:
    """Each variant's settings: fp4_gluon's knobs and fp4_gluon_sum's forced launch shape."""
    from deepinfer_kernels_sm100.fp4_gluon_sum import SumTiles

    out: dict[str, dict[str, Any]] = {
        "grouped": {"BY_PAIR_TOKENS": 0},
        "by_pair": {"BY_PAIR_TOKENS": batch, "SUM_IN_DOWN": False},
        "by_pair_sum": {"BY_PAIR_TOKENS": batch, "SUM_IN_DOWN": True},
    }
    if batch == 1:
        out["by_pair_sum_no_pdl"] = {"BY_PAIR_TOKENS": 1, "SUM_IN_DOWN": True, "PDL_DOWN": False}
    for tiles in sum_tiles:
        name = "by_pair_sum_" + "x".join(map(str, tiles))
        out[name] = {"BY_PAIR_TOKENS": batch, "SUM_IN_DOWN": True, "tiles": SumTiles(*tiles)}
    return out


def _timed(settings: dict[str, Any], call: Callable[[], object], repeats: int) -> float:
    """Seconds per call of ``call`` under ``settings``."""
    with _under(settings):
        return graph_s([call], repeats)


def run(args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    from deepinfer_kernels_sm100.fp4_moe import moe_experts_fp4

    w, shape = expert_weights(args.device, False)
    per_expert = sum(t[0].numel() for t in w.values())
    tiles = [tuple(int(v) for v in s.split(",")) for s in args.sum_tiles]
    rows, kernels = [], {}
    for b in args.batches:
        x, weights, indices = expert_routing(b, shape, args.device)
        residual = torch.randn_like(x)
        call = partial(moe_experts_fp4, x, weights, indices, swiglu_limit=10.0,
                       scales_fit=True, kernel="gluon", residual=residual,
                       out_dtype=torch.bfloat16, **w)  # fmt: skip
        variants = _variants(b, tiles)
        runs = {name: partial(_timed, s, call, args.repeats) for name, s in variants.items()}
        seconds = _alternate(runs, args.rounds)
        touched = int(torch.unique(indices).numel()) * per_expert
        row: dict[str, Any] = {"batch": b, "experts_touched": touched // per_expert}
        row.update(medians(seconds, touched, bandwidth))
        rows.append(row)
        print(row, file=sys.stderr)
        for name in ("by_pair", "by_pair_sum") if b == 1 else ():
            with _under(variants[name]):
                kernels[name] = _kernels(call, 10)
    settings = {n: {k: str(v) for k, v in s.items()} for n, s in _variants(1, tiles).items()}
    return {"variants_at_batch_1": settings, "rows": rows, "kernels_us_per_call_b1": kernels}


def main() -> int:
    ap = ab_parser(__doc__, rounds=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sum-tiles", nargs="*", default=["1,4,4", "1,8,2", "1,16,2", "2,8,4"])
    args = ap.parse_args()
    result, bandwidth = ab_header("fp4_sum_ab", args)
    result["fp4"] = run(args, bandwidth)
    write_result(result, args.out, "fp4_sum_ab")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
