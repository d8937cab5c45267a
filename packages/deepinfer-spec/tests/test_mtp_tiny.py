"""MTP drafting on the embedded model (V4.1, one MTP layer trained with it): lossless, and its
drafts are kept often enough to emit more than one token a round."""

from __future__ import annotations

from deepinfer import LLM, SamplingParams

PROMPTS = ["ROMEO:\nWhat light through yonder window breaks?", "First Citizen:\nBefore we"]


def test_mtp_speculation_on_the_tiny_model_keeps_greedy_outputs() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    outputs = []
    for config in (None, spec):
        llm = LLM("tiny", max_num_seqs=4, speculative_config=config)
        outputs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)])
    assert outputs[0] == outputs[1]
    runner = llm.engine.spec
    assert runner is not None and runner.num_drafts > 0
    assert runner.num_accepted / runner.num_drafts > 0.2  # a trained layer: about 0.4 here
