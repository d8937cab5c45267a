"""What the prefix cache saves: requests that share a long prompt prefix, cache on vs off.

N requests share one ``--prefix-len``-token prefix (a system prompt, say) followed by their own
random suffix of ``--suffix-len`` tokens, and each generates ``--output-len`` tokens (sampled,
temperature 0.6, ``ignore_eos``). The embedded tiny model runs the workload three ways, each in
its own ``LLM``, alternating, ``--repeats`` times (new suffixes every run):

* ``off``: ``enable_prefix_caching=False``; every prompt is computed in full;
* ``cold``: cache on, emptied before the run: the first requests record the prefix's blocks,
  requests admitted after that hit them;
* ``warm``: cache on, the prefix recorded by a previous run: every request restores it.

Reported per mode: median wall seconds, output and total tok/s, prompt tokens computed (the
model's embedding calls count them) and the cache's hit rate. Results go to
``benchmarks/results/prefix_cache_<device>.json``.

    python benchmarks/prefix_cache.py [--device cuda] [--num-seqs 128] [--prefix-len 1024]
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

from deepinfer import LLM, SamplingParams


def workload(
    rnd: random.Random, prefix: list[int], args: argparse.Namespace, top: int
) -> list[list[int]]:
    return [
        [*prefix, *(rnd.randrange(3, top) for _ in range(args.suffix_len))]
        for _ in range(args.num_seqs)
    ]


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    computed = [0]
    hook = llm.engine.model.embed.register_forward_hook(
        lambda m, a, out: computed.__setitem__(0, computed[0] + a[0].numel())
    )
    try:
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        hook.remove()
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    cached = sum(o.metrics.num_cached_tokens or 0 for o in outs)
    return {
        "seconds": seconds,
        "output_tokens": generated,
        "prompt_tokens": sum(len(p) for p in prompts),
        "cached_prompt_tokens": cached,
        # Everything the model embedded, decode tokens included.
        "tokens_through_model": computed[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-seqs", type=int, default=128)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    options: dict[str, Any] = {"device": args.device, "dtype": "float32", "seed": 0}
    llms = {
        "off": LLM("tiny", enable_prefix_caching=False, **options),
        "cold": LLM("tiny", **options),
        "warm": LLM("tiny", **options),
    }
    cfg = llms["off"].engine.model.cfg
    top = min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size)
    rnd = random.Random(0)
    prefix = [rnd.randrange(3, top) for _ in range(args.prefix_len)]
    params = SamplingParams(temperature=0.6, max_tokens=args.output_len, ignore_eos=True)
    for llm in llms.values():  # warm-up: kernels, graphs; records the prefix for "warm"
        llm.generate(workload(rnd, prefix, args, top), params, use_tqdm=False)

    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in llms}
    for _ in range(args.repeats):
        for mode, llm in llms.items():
            if mode == "cold":
                assert llm.reset_prefix_cache()
            runs[mode].append(timed(llm, workload(rnd, prefix, args, top), params))

    rows = []
    for mode, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        last = results[-1]
        row = {
            "mode": mode,
            "median_seconds": round(seconds, 3),
            "seconds": [round(r["seconds"], 3) for r in results],
            "output_tok_per_s": round(last["output_tokens"] / seconds, 1),
            "total_tok_per_s": round((last["output_tokens"] + last["prompt_tokens"]) / seconds, 1),
            "prompt_tokens": last["prompt_tokens"],
            "cached_prompt_tokens": last["cached_prompt_tokens"],
            "tokens_through_model": last["tokens_through_model"],
        }
        print(row)
        rows.append(row)
    off = rows[0]["median_seconds"]
    for row in rows:
        row["speedup_vs_off"] = round(off / row["median_seconds"], 2)
    result = {
        "benchmark": "prefix_cache",
        "device": args.device,
        "torch": torch.__version__,
        "threads": args.threads,
        "num_seqs": args.num_seqs,
        "prefix_len": args.prefix_len,
        "suffix_len": args.suffix_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "rows": rows,
    }
    write_result(result, args.out, f"prefix_cache_{args.device}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
