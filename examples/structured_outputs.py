"""Structured outputs: JSON schema, regex, choice and EBNF constraints (``deepinfer[structured]``).

Each request carries its own constraint; constrained and free requests share a batch.

    pip install 'deepinfer[structured]'
    python examples/structured_outputs.py
"""

from __future__ import annotations

import argparse
import json

from deepinfer import LLM, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "speaker": {"type": "string", "maxLength": 12},
        "act": {"type": "integer", "minimum": 1, "maximum": 5},
        "mood": {"enum": ["merry", "sad", "wrathful"]},
    },
    "required": ["speaker", "act", "mood"],
    "additionalProperties": False,
}
GRAMMAR = r"""
root ::= name ": " line
name ::= [A-Z]+
line ::= [a-z ]+ "."
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args()

    llm = LLM(args.model)
    constraints = {
        "json": {"json": SCHEMA},
        "regex": {"regex": r"(Thou|Thee) [a-z]+ [a-z]+\."},
        "choice": {"choice": ["Montague", "Capulet"]},
        "grammar": {"grammar": GRAMMAR},
        "free": None,
    }
    params = [
        SamplingParams(temperature=0.8, seed=i, max_tokens=200, structured_outputs=c)
        for i, c in enumerate(constraints.values())
    ]
    outs = llm.generate(["ROMEO:"] * len(params), params, use_tqdm=False)
    for kind, out in zip(constraints, outs, strict=True):
        print(f"{kind:>7}: {out.outputs[0].text!r} ({out.outputs[0].finish_reason})")
    if outs[0].outputs[0].finish_reason == "stop":  # complete, so valid under the schema
        print("parsed:", json.loads(outs[0].outputs[0].text))


if __name__ == "__main__":
    main()
