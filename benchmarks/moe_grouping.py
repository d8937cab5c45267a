"""A step's (token, slot) pairs grouped by expert (``moe_group.group_pairs``), timed alone.

Every MoE layer of every step groups its pairs before the grouped expert kernels run, so at a
decode batch the grouping is a launch on the step's critical path. This times ``group_pairs``
at config A's (16 experts, top-4) and V4-Flash's (256 experts, top-6) decode batches and a
4k-token prefill chunk, each call replayed from a CUDA graph (``low_precision.graph_timer``,
medians of ``--repeats``), over routings drawn at random. ``--baseline FILE`` times another
``moe_group.py`` (an earlier commit's) beside it, interleaved, and checks both give the same
groups.

    python benchmarks/moe_grouping.py [--baseline OLD/moe_group.py] [--out PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from _results import write_result
from low_precision import graph_timer

#: (name, experts, top-k, tokens)
CASES = [
    (f"{name}_b{tokens}", experts, k, tokens)
    for name, experts, k in (("config_a", 16, 4), ("v4_flash", 256, 6))
    for tokens in (1, 8, 64, 256, 4096)
]


def load(path: Path) -> ModuleType:
    """``moe_group`` from another file (it imports nothing of its package)."""
    spec = importlib.util.spec_from_file_location("moe_group_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def routing(experts: int, k: int, tokens: int, g: torch.Generator) -> tuple[Any, Any]:
    """Router weights and ``k`` distinct experts a token, as a top-k router picks them."""
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    weights, indices = scores.topk(k, dim=-1)
    return weights, indices


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=None, help="an earlier moe_group.py")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("moe_grouping.py times CUDA graphs: it needs an NVIDIA GPU")
    from deepinfer_kernels_sm100 import moe_group

    modules = {"current": moe_group}
    if args.baseline is not None:
        modules["baseline"] = load(args.baseline)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, experts, k, tokens in CASES:
        weights, indices = routing(experts, k, tokens, g)
        timers = {
            label: graph_timer([partial(m.group_pairs, weights, indices, experts)])
            for label, m in modules.items()
        }
        times: dict[str, list[float]] = {label: [] for label in modules}
        for _ in range(args.repeats):
            for label, timer in timers.items():
                times[label].append(timer() * 1e6)
        row: dict[str, Any] = {"case": name, "pairs": tokens * k}
        row |= {f"{label}_us": round(statistics.median(t), 2) for label, t in times.items()}
        if "baseline" in modules:
            got = modules["current"].group_pairs(weights, indices, experts)
            want = modules["baseline"].group_pairs(weights, indices, experts)
            row["same_groups"] = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        rows.append(row)
        print(row, flush=True)
    result = {
        "benchmark": "moe_grouping",
        "device": torch.cuda.get_device_name(0),
        "baseline": str(args.baseline) if args.baseline else None,
        "rows": rows,
    }
    write_result(result, args.out, "moe_grouping_" + result["device"].split()[1].lower())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
