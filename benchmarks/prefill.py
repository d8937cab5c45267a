"""Prefill throughput: sparse attention (each query's window rows and picks) vs a dense mask.

A prefill chunk's query sees ``sliding_window`` rows plus its top-k compressed entries, yet a
dense masked attention scores it against every key of the chunk (its rows, the ring, all
entries): S x L work for S x K useful. The model lists each query's keys and calls
``sparse_attention``; the ``dense`` variant here turns those lists back into the [B, S, L] mask
and calls ``attention`` (what the model did before), so both variants read the same keys and
differ only in the attention op.

For each prompt length and batch, ``--repeats`` alternating runs of each variant time
``LLM.generate`` of one token (prefix cache off) on fresh random prompts; the median wall
seconds and prompt tok/s go to ``benchmarks/results/prefill_<device>.json``.

    python benchmarks/prefill.py [--device cuda] [--lengths 512 2048] [--batches 1 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from torch import Tensor

from deepinfer import LLM, SamplingParams


def dense_from_index(llm: LLM) -> Any:
    """The backend's sparse op replaced by the dense one over the equivalent mask."""
    ops = llm.backend

    def dense(q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float) -> Tensor:
        b, s = q.shape[:2]
        n = kv.shape[1]
        mask = torch.zeros(b, s, n + 1, dtype=torch.bool, device=kv.device)
        mask.scatter_(-1, torch.where(index < 0, n, index).expand(b, s, -1), True)
        return ops.attention(q, kv, mask[..., :n], sinks, scale)

    return dense


def timed(llm: LLM, prompts: list[list[int]], device: str) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=1)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    llm = LLM(args.model, device=args.device, enable_prefix_caching=False)
    ops = llm.backend
    variants = {"sparse": type(ops).sparse_attention.__get__(ops), "dense": dense_from_index(llm)}
    cfg = llm.engine.model.cfg
    tokens = [t for t in range(3, cfg.vocab_size) if t != cfg.image_token_id]  # text only
    rnd = random.Random(0)
    rows = []
    for length in args.lengths:
        for batch in args.batches:
            times: dict[str, list[float]] = {name: [] for name in variants}
            for rep in range(args.repeats + 1):  # the first round warms up
                for name, op in variants.items():
                    ops.sparse_attention = op  # type: ignore[method-assign]
                    prompts = [rnd.choices(tokens, k=length) for _ in range(batch)]
                    elapsed = timed(llm, prompts, args.device)
                    if rep:
                        times[name].append(elapsed)
            row: dict[str, Any] = {"prompt_len": length, "batch": batch}
            for name, ts in times.items():
                med = statistics.median(ts)
                row[f"{name}_seconds"] = [round(t, 4) for t in ts]
                row[f"{name}_prompt_tok_per_s"] = round(batch * length / med, 1)
            row["speedup"] = round(
                row["sparse_prompt_tok_per_s"] / row["dense_prompt_tok_per_s"], 2
            )
            print(row)
            rows.append(row)
    result = {
        "benchmark": "prefill",
        "model": args.model,
        "device": args.device,
        "backend": type(ops).__name__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "rows": rows,
    }
    write_result(result, args.out, f"prefill_{args.device}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
