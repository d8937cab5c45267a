"""Speculative decoding: MTP and DSpark drafts, verified losslessly, with their acceptance.

Runs the same greedy requests without speculation and with each ``speculative_config`` asked
for (vLLM's option), checks the tokens are the same (verification keeps a draft only where it
is the engine's own draw), and prints what each drafted: tau (tokens a verification row
emitted, on average), the share of rows that kept a draft at each position, and the seconds
spent drafting and verifying. ``--scheduling adaptive`` verifies only the drafts worth their
cost (confidence-scheduled, profiled at start: the first engine of a machine takes a few
seconds longer, later ones read the profile from ``~/.cache/deepinfer``).

    python examples/speculative_decoding.py [--method mtp dspark] [--scheduling fixed]
"""

from __future__ import annotations

import argparse
import time

from deepinfer import LLM, SamplingParams

PROMPTS = [
    "ROMEO:\nWhat light through yonder window breaks?",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "KING HENRY:\nOnce more unto the breach, dear friends,",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--method", nargs="+", default=["mtp", "dspark"], choices=["mtp", "dspark"])
    ap.add_argument("--num-speculative-tokens", type=int, default=3)
    ap.add_argument("--scheduling", default="fixed", choices=["fixed", "adaptive"])
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    # async scheduling off: speculation needs each step's tokens before the next step
    plain = LLM(args.model, speculative_config=None, async_scheduling=False)
    want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params, use_tqdm=False)]
    for method in args.method:
        config = {"method": method, "num_speculative_tokens": args.num_speculative_tokens}
        if args.scheduling != "fixed":
            config["scheduling"] = args.scheduling
        llm = LLM(args.model, speculative_config=config, async_scheduling=False)
        start = time.perf_counter()
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        assert [o.outputs[0].token_ids for o in outs] == want, "speculation changed a token"
        metrics = [o.metrics for o in outs if o.metrics is not None]
        rounds = sum(m.spec_rounds for m in metrics)
        kept = sum(m.spec_accepted_tokens for m in metrics)
        width = max((len(m.spec_accepted_per_position) for m in metrics), default=0)
        per = [sum(m.spec_accepted_per_position[j] for m in metrics
                   if j < len(m.spec_accepted_per_position)) for j in range(width)]  # fmt: skip
        runner = llm.engine.spec
        assert runner is not None
        tau = (kept + rounds) / rounds if rounds else float("nan")
        print(
            f"{method:>6}: {seconds:.2f} s, {rounds} verification rows, tau {tau:.2f}, "
            f"kept at each position {[round(c / max(rounds, 1), 2) for c in per]}, "
            f"drafting {runner.draft_seconds:.3f} s, verifying {runner.verify_seconds:.3f} s"
        )
    print("greedy outputs equal the engine's without speculation")


if __name__ == "__main__":
    main()
