"""Rolling a state back to an earlier length leaves it exactly as if the later tokens never ran.

The reference is a fresh state fed only the surviving tokens (``forward_logits``). Steps mix
chunks, single tokens and batched decodes, and rollbacks of random size up to the slack, in the
pattern speculative decoding produces (never below an earlier rollback's target), long enough
that rings wrap and compressors roll back across window boundaries.
"""

from __future__ import annotations

import random

import pytest
import torch
from _tiny_models import text_ids, tiny_models

from deepinfer.models.batch import ForwardBatch
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


@pytest.fixture(scope="module", params=tiny_models(seed=4), ids=lambda m: m[0])
def model(request: pytest.FixtureRequest) -> DeepseekV4ForCausalLM:
    return request.param[1]


@pytest.mark.parametrize("slack", [1, 6])
def test_rollback_equals_never_having_run(model: DeepseekV4ForCausalLM, slack: int) -> None:
    rnd = random.Random(slack)
    gen = torch.Generator().manual_seed(slack)
    state = model.new_state(1, slack=slack)
    other = model.new_state(1)  # a decode-batch neighbour
    model.step(text_ids(model, gen, 9)[None], other)
    tokens: list[int] = []
    rolled = worst = 0.0
    for step in range(70):
        new = text_ids(model, gen, rnd.choice([1, 1, 2, 3, slack, slack + 1, 19])).tolist()
        if len(new) == 1 and step % 2:
            nbr = text_ids(model, gen, 1)
            logits = model(
                ForwardBatch.decode(torch.cat((torch.tensor(new), nbr)), [state, other])
            ).logits[0]
        else:
            logits = model.step(torch.tensor([new]), state)[0, -1]
        tokens += new
        if step % 4 == 0:
            want = model.forward_logits(torch.tensor([tokens]))[0, -1]
            worst = max(worst, float((want - logits).abs().max()))
        back = rnd.randint(0, min(slack, len(tokens) - state.committed))
        if back:
            tokens = tokens[: len(tokens) - back]
            model.rollback(state, len(tokens), tokens)
            rolled += back
    assert state.pos == len(tokens) > model.cfg.sliding_window + slack
    assert rolled > 20
    assert worst < 5e-5, worst


def test_rollback_refuses_what_it_cannot_do_exactly(model: DeepseekV4ForCausalLM) -> None:
    ids = text_ids(model, torch.Generator().manual_seed(0), 30).tolist()
    plain = model.new_state(1)
    model.step(torch.tensor([ids]), plain)
    with pytest.raises(ValueError, match="keeps 0"):
        model.rollback(plain, 29, ids)
    state = model.new_state(1, slack=4)
    model.step(torch.tensor([ids]), state)
    with pytest.raises(ValueError, match="cannot roll back 5 tokens"):
        model.rollback(state, 25, ids)
    with pytest.raises(ValueError, match="back to 31"):
        model.rollback(state, 31, ids)
    model.rollback(state, 28, ids)
    model.step(torch.tensor([ids[28:30]]), state)
    with pytest.raises(ValueError, match="first 28 tokens final"):
        model.rollback(state, 27, ids)
    if getattr(model, "engram_history", 0):  # V4.1 Engram rebuilds its look-back from ids
        with pytest.raises(ValueError, match="token ids"):
            model.rollback(state, 29)
