"""Streaming one request: ``LLM.stream`` yields the growing output after every engine step.

Closing the iterator early (``break``) aborts the request and frees its state.

    python examples/streaming.py [--prompt "ROMEO:"] [--stop-after 20]
"""

from __future__ import annotations

import argparse
import sys

from deepinfer import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompt", default="ROMEO:")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stop-after", type=int, default=0, help="abort after this many tokens")
    args = ap.parse_args()

    llm = LLM(args.model)
    params = SamplingParams(temperature=0.8, max_tokens=args.max_tokens, seed=1)
    printed = 0
    sys.stdout.write(args.prompt)
    for out in llm.stream(args.prompt, params):
        text = out.outputs[0].text
        sys.stdout.write(text[printed:])  # only what is new since the last step
        sys.stdout.flush()
        printed = len(text)
        if args.stop_after and len(out.outputs[0].token_ids) >= args.stop_after:
            print("\n[aborted]")
            break
    else:
        print(f"\n[{out.outputs[0].finish_reason}]")


if __name__ == "__main__":
    main()
