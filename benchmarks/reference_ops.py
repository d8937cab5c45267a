"""The torch reference's small-op paths on the CPU, one at a time, at the shapes a CPU engine run
meets: ``offline_throughput.py``'s model (hidden 256, 8 heads of 64, 4 mHC streams, window 64,
top-16 entries) at a batch-32 decode step and a 32 x 64-token ragged prefill.

On a CPU these ops cost their count and their memory traffic, not their arithmetic, so their
formulation matters: the Sinkhorn loop of every mHC entry (40 dependent normalisations of
[tokens, 4, 4] matrices, twice a layer), the key gathers of sparse attention in a prefill and of
paged attention in a decode step. Each case reports the median microseconds of ``--repeats``
calls. To compare two trees, run the script under each (their ``packages/*/src`` first on
``PYTHONPATH``) with a ``--label`` and the same ``--out``: each run adds its label's rows.

    python benchmarks/reference_ops.py [--threads 1] [--repeats 200] --label L [--out PATH]

Results: ``benchmarks/results/reference_ops_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import RESULTS, write_result

from deepinfer.backends.attention_ref import sparse_sink_attention
from deepinfer.backends.mhc_ref import sinkhorn
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.paging import KeyPages

HEADS, HEAD_DIM, STREAMS, WINDOW, TOPK = 8, 64, 4, 64, 16


def median_us(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after two warm-up calls, in us."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)


def sinkhorn_cases(repeats: int) -> list[dict[str, Any]]:
    """One mHC entry's Sinkhorn at a decode batch (1, 32, 256 rows) and a prefill (2,048)."""
    rows = []
    for tokens in (1, 32, 256, 2048):
        logits = torch.randn(tokens, STREAMS, STREAMS)
        us = median_us(lambda logits=logits: sinkhorn(logits, 20, 1e-6), repeats)
        rows.append({"op": "sinkhorn", "tokens": tokens, "us": us})
    return rows


def prefill_attention_case(repeats: int) -> dict[str, Any]:
    """One block of 256 query rows of a ragged prefill's sliding-window attention: each query
    lists its window's rows of the pass's keys (half of them none, as in 64-token prompts)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 256, HEADS, HEAD_DIM, generator=g)
    kv = torch.randn(1, 4096, HEAD_DIM, generator=g)
    index = torch.randint(0, 4096, (1, 256, WINDOW), generator=g)
    index[..., WINDOW // 2 :] = -1
    sinks = torch.randn(HEADS, generator=g)
    us = median_us(lambda: sparse_sink_attention(q, kv, index, sinks, HEAD_DIM**-0.5), repeats)
    return {"op": "sparse_sink_attention", "queries": 256, "keys": WINDOW, "us": us}


def decode_attention_case(repeats: int, batch: int = 32) -> dict[str, Any]:
    """One layer's paged attention of a decode step: each row's ring (one page of ``WINDOW``)
    and ``TOPK`` of its compressed entries (pages of 16), read through the reference's gather."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, generator=g)
    ring = KeyPages(
        torch.randn(batch, WINDOW, HEAD_DIM, generator=g),
        torch.arange(batch)[:, None],
        torch.randint(0, WINDOW, (batch, 1, WINDOW), generator=g),
    )
    entries = KeyPages(
        torch.randn(batch * 8, 16, HEAD_DIM, generator=g),
        torch.arange(batch * 8).view(batch, 8),
        torch.randint(0, 128, (batch, 1, TOPK), generator=g),
    )
    sinks = torch.randn(HEADS, generator=g)
    ops = TorchBackend()
    angles = (torch.ones(batch, 1, 8), torch.zeros(batch, 1, 8))
    us = median_us(
        lambda: ops.paged_attention(q, [ring, entries], sinks, HEAD_DIM**-0.5, angles), repeats
    )
    return {"op": "paged_attention", "batch": batch, "keys": WINDOW + TOPK, "us": us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--label", required=True, help="the tree measured (e.g. a commit)")
    ap.add_argument("--out", type=Path, default=RESULTS / "reference_ops_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = [
        *sinkhorn_cases(args.repeats),
        prefill_attention_case(args.repeats),
        decode_attention_case(args.repeats),
    ]
    for row in rows:
        print(row)
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(benchmark="reference_ops", device="cpu", torch=torch.__version__)
    result.setdefault("runs", {})[args.label] = {"threads": args.threads, "rows": rows}
    write_result(result, args.out, "reference_ops_cpu")


if __name__ == "__main__":
    main()
