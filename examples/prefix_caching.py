"""Prefix caching: requests sharing a long prefix skip its prefill once it is cached.

The first batch fills the cache (blocks of 128 tokens); the second, with the same prefix and
other suffixes, restores the cached state and prefills only the suffixes. Outputs are exactly
those of a cold run (the restored state is the state the prefill would have built).

    python examples/prefix_caching.py [--num-requests 8] [--prefix-blocks 4]
"""

from __future__ import annotations

import argparse
import time

from deepinfer import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--prefix-blocks", type=int, default=4, help="shared prefix, in 128 tokens")
    args = ap.parse_args()

    llm = LLM(args.model)  # enable_prefix_caching=True is the default
    prefix = list(range(100, 100 + 128 * args.prefix_blocks))  # any token ids
    params = SamplingParams(temperature=0.0, max_tokens=16)

    def run(tag: str, first_suffix: int) -> list[list[int]]:
        prompts = [[*prefix, first_suffix + i] for i in range(args.num_requests)]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        cached = sum(o.metrics.num_cached_tokens for o in outs if o.metrics)
        print(
            f"{tag:>5}: {time.perf_counter() - start:.2f} s, "
            f"{cached} of {sum(len(p) for p in prompts)} prompt tokens from the cache"
        )
        return [o.outputs[0].token_ids for o in outs]

    run("cold", 5000)
    warm = run("warm", 6000)
    stats = llm.engine.prefix_cache.stats if llm.engine.prefix_cache else None
    print(f"cache: {stats}")
    llm.reset_prefix_cache()
    assert run("again", 6000) == warm, "a cache hit must give the cold run's tokens"


if __name__ == "__main__":
    main()
