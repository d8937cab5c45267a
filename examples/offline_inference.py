"""Offline batched generation: several prompts, greedy and sampled, with per-request metrics.

python examples/offline_inference.py [--model tiny|CHECKPOINT_DIR] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse

from deepinfer import LLM, SamplingParams

PROMPTS = ["ROMEO:", "JULIET:", "First Citizen:\nBefore we proceed any further,", "KING LEAR:"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    llm = LLM(args.model, device=args.device)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    sampled = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, seed=7)
    # One params object for all prompts, or one per prompt.
    params = [greedy, sampled] * (len(PROMPTS) // 2)
    for out in llm.generate(PROMPTS, params):
        completion = out.outputs[0]
        m = out.metrics
        assert m is not None and m.first_token_time is not None and m.finished_time is not None
        ttft = 1e3 * (m.first_token_time - m.arrival_time)
        n = len(completion.token_ids)
        print(f"--- {completion.finish_reason}, {n} tokens, first after {ttft:.0f} ms")
        print(out.prompt + completion.text)


if __name__ == "__main__":
    main()
