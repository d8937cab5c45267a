"""Chat through ``deepseek_recipe``: messages in, answer and reasoning apart out.

The prompt is rendered by the recipe in the DeepSeek-V4.1 format and the reply parsed by its
stream parser. The embedded tiny model only knows Shakespeare, so its "reasoning" is verse; with
a V4.1 checkpoint the same code gives real answers.

    python examples/chat.py [--model tiny|CHECKPOINT_DIR] [--thinking]
"""

from __future__ import annotations

import argparse

from deepinfer import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--thinking", action="store_true", help="let the model reason first")
    args = ap.parse_args()

    llm = LLM(args.model)
    conversations = [
        [
            {"role": "system", "content": "Thou art a player in a tragedy."},
            {"role": "user", "content": "Who goes there?"},
        ],
        [{"role": "user", "content": "Speak of the king."}],
    ]
    params = SamplingParams(temperature=0.7, max_tokens=80, seed=3)
    outs = llm.chat(conversations, params, thinking=args.thinking)
    for conv, out in zip(conversations, outs, strict=True):
        print(f"--- user: {conv[-1]['content']}")
        if out.reasoning_content[0]:
            print(f"reasoning: {out.reasoning_content[0]}")
        print(f"answer:    {out.outputs[0].text}")


if __name__ == "__main__":
    main()
