"""Indexer top-k of a prefill chunk: the row select against the segmented radix select.

``deepinfer_kernels_sm100.topk.stable_topk_picks`` picks a prefill chunk's rows with one program
a row holding its keys in registers (``_row_select_kernel``) where every row fits
``topk.ROW_SELECT_MAX`` entries, and with the segmented radix select (four histogram and two
collection launches) otherwise; rows of at most ``topk.ROW_SORT_MAX`` entries
(``ROW_SORT_MAX_MANY_ROWS`` where the rows alone fill the GPU) are sorted whole by one program
instead (``_row_sort_kernel``). This script times the three on the same scores, side by side
in one process, by setting the limits for each arm's calls: ``shipped`` (the module's limits),
``row_select`` (no whole-row sort) and ``segmented`` (neither). Shapes are
those of a ratio-4 indexer over a causal prefill chunk of ``tokens`` queries (``tokens / 4``
entries a row, each row seeing the entries its position has closed, 512 picks as V4-Flash's
``index_topk``).

Each case checks first that the arms give the same picks, then times ``--repeats`` rounds of
``--iters`` calls an arm (CUDA events, the arms alternating every round) and reports each arm's
median ms a call and its ratio to the segmented arm's.

    python benchmarks/topk_select.py [--tokens 4096 8192 16384] [--out PATH]

Results: ``benchmarks/results/topk_select_<gpu>.json``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import write_result

from deepinfer_kernels_sm100 import topk

RATIO = 4
TOP_K = 512


def chunk_scores(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random scores [tokens, tokens / RATIO] and each query's visible entry count (the windows
    of RATIO tokens its position has closed), as a causal ratio-4 prefill chunk has them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    entries = tokens // RATIO
    scores = torch.randn(tokens, entries, device="cuda", generator=gen)
    n_visible = (torch.arange(tokens, device="cuda") + 1) // RATIO
    return scores, n_visible.clamp(min=1)


def timed_ms(fn: Callable[[], object], iters: int) -> float:
    """Mean ms of one of ``iters`` back-to-back calls, from CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


#: Each arm's (``ROW_SORT_MAX``, ``ROW_SELECT_MAX``); None keeps the module's value.
ARMS: dict[str, tuple[int | None, int | None]] = {
    "shipped": (None, None),
    "row_select": (0, None),
    "segmented": (0, 0),
}


def run_case(tokens: int, repeats: int, iters: int, seed: int) -> dict[str, Any]:
    scores, n_visible = chunk_scores(tokens, seed)
    shipped = (topk.ROW_SORT_MAX, topk.ROW_SORT_MAX_MANY_ROWS, topk.ROW_SELECT_MAX)

    def pick(arm: str) -> torch.Tensor:
        sort_max, select_max = ARMS[arm]
        if sort_max is not None:  # both row-sort limits: few rows and many
            topk.ROW_SORT_MAX = topk.ROW_SORT_MAX_MANY_ROWS = sort_max
        if select_max is not None:
            topk.ROW_SELECT_MAX = select_max
        try:
            return topk.stable_topk_picks(scores, TOP_K, n_visible=n_visible)
        finally:
            topk.ROW_SORT_MAX, topk.ROW_SORT_MAX_MANY_ROWS, topk.ROW_SELECT_MAX = shipped

    picks = {arm: pick(arm) for arm in ARMS}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(repeats):
        for arm in ARMS:
            times[arm].append(timed_ms(lambda a=arm: pick(a), iters))
    med = {arm: statistics.median(values) for arm, values in times.items()}
    entries = scores.shape[-1]
    return {
        "tokens": tokens,
        "entries_per_row": entries,
        "k": TOP_K,
        "shipped_path": (
            "row_sort" if entries <= shipped[0]
            else "row_select" if 1 << (entries - 1).bit_length() <= shipped[1]
            else "segmented"
        ),
        "same_picks": all(torch.equal(picks["segmented"], p) for p in picks.values()),
        **{f"{arm}_ms": round(ms, 4) for arm, ms in med.items()},
        **{f"{arm}_over_segmented": round(med[arm] / med["segmented"], 3) for arm in ARMS},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("topk_select.py times CUDA kernels: it needs an NVIDIA GPU")
    rows = [run_case(t, args.repeats, args.iters, args.seed) for t in args.tokens]
    for row in rows:
        print(row)
    result = {
        "benchmark": "topk_select",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "row_sort_max": topk.ROW_SORT_MAX,
        "row_sort_max_many_rows": topk.ROW_SORT_MAX_MANY_ROWS,
        "row_select_max": topk.ROW_SELECT_MAX,
        "rows": rows,
    }
    name = torch.cuda.get_device_name().split()[1].lower()  # e.g. "h200"
    write_result(result, args.out, f"topk_select_{name}")


if __name__ == "__main__":
    main()
