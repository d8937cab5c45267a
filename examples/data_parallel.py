"""Data + expert parallelism: D ranks, each running attention for its own requests and holding
1/D of the routed experts, stepped in lockstep by rank 0.

One node, the other D - 1 ranks spawned by this process:
    python examples/data_parallel.py [--data-parallel-size 2] [--model tiny|CHECKPOINT_DIR]
Any number of nodes, every rank started by torchrun (env:// rendezvous; D is its world size):
    torchrun --nnodes N --node-rank I --master-addr HOST --master-port PORT \\
        --nproc-per-node G examples/data_parallel.py --model CHECKPOINT_DIR
Under torchrun only rank 0 gets past ``LLM(...)``: every other rank serves rank 0's steps
inside it and exits its process when rank 0 ends the run.
"""

from __future__ import annotations

import argparse
import os

from deepinfer import LLM, SamplingParams

PROMPTS = ["ROMEO:", "JULIET:", "First Citizen:\nBefore we proceed any further,", "KING LEAR:"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--data-parallel-size", type=int, default=2, help="ignored under torchrun")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    size = int(os.environ.get("WORLD_SIZE", args.data_parallel_size))
    llm = LLM(args.model, device=args.device, data_parallel_size=size, enable_expert_parallel=True)
    # Rank 0 only from here on.
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for out in llm.generate(PROMPTS, params):
        print(f"--- {out.outputs[0].finish_reason}")
        print(out.prompt + out.outputs[0].text)
    for m in llm.engine.metrics():
        routed = sum(sum(counts) for counts in m.expert_load.values())
        print(
            f"rank {m.rank}: {m.steps} steps ({m.dummy_steps} with no work of its own), "
            f"{routed} (token, expert) pairs routed"
        )
    llm.engine.shutdown()


if __name__ == "__main__":  # spawned ranks import this module: nothing may run on import
    main()
