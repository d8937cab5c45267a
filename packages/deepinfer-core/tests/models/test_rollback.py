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

from deepinfer.cache.slots import StateSlots
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


def test_a_batch_with_an_impossible_rollback_changes_no_state(
    model: DeepseekV4ForCausalLM,
) -> None:
    """``rollback_many`` checks every rollback before it changes any state: one it cannot do
    raises and leaves the others as they were (their next logits are a forward over all their
    tokens), and the same batch without it then rolls them back exactly."""
    gen = torch.Generator().manual_seed(7)
    slots = StateSlots(lambda: model.new_state(1, slack=4), max_slots=3, max_len=256)
    ids = [text_ids(model, gen, 40 + 3 * i).tolist() for i in range(3)]
    states = [slots.new_state() for _ in ids]
    for state, seq in zip(states, ids, strict=True):
        model.step(torch.tensor([seq]), state)
    bad = [(states[0], len(ids[0]) - 2, ids[0]), (states[1], len(ids[1]) - 5, ids[1])]
    with pytest.raises(ValueError, match="cannot roll back 5 tokens"):
        model.rollback_many(bad)
    assert [s.pos for s in states] == [len(seq) for seq in ids]
    nxt = text_ids(model, gen, 1).tolist()
    kept = [seq[:-3] for seq in ids]
    model.rollback_many([(s, len(k), k) for s, k in zip(states[1:], kept[1:], strict=True)])
    for state, seq in zip(states, [ids[0], *kept[1:]], strict=True):
        got = model.step(torch.tensor([nxt]), state)[0, -1]
        want = model.forward_logits(torch.tensor([seq + nxt]))[0, -1]
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5)


@pytest.mark.parametrize("extra", [1, 3, 6])
def test_rollback_right_after_a_prefix_cache_restore(
    model: DeepseekV4ForCausalLM, extra: int
) -> None:
    """A state restored from a prefix-cache block at a 128-token boundary (recorded inside a
    chunk, so without rollback history) feeds a verification row and rolls back into it, as a
    speculative step after a cache hit does: the history is rebuilt from the restored open
    windows and previous halves, so the logits afterwards equal a fresh forward."""
    from deepinfer.cache.prefix import BLOCK_SIZE, PrefixCache

    slack = 6
    gen = torch.Generator().manual_seed(extra)
    ids = text_ids(model, gen, BLOCK_SIZE + 40)
    first = model.new_state(1, slack=slack)
    out = model(ForwardBatch.build([ids[: BLOCK_SIZE + 9]], [first], record_at=[[BLOCK_SIZE]]))
    cache = PrefixCache(1 << 30)
    view = out.states_at[0][0]
    block = cache.insert(None, ids[:BLOCK_SIZE].tolist(), cache.snapshot(None, view))
    state = cache.restore(block, lambda: model.new_state(1, slack=slack))
    tokens = ids[:BLOCK_SIZE].tolist()
    model.step(ids[None, BLOCK_SIZE : BLOCK_SIZE + slack], state)  # the row: 6 drafts
    keep = BLOCK_SIZE + extra
    model.rollback(state, keep, ids[:keep].tolist())
    tokens = ids[:keep].tolist()
    rest = ids[keep : keep + 12]
    got = model.step(rest[None], state)[0, -1]
    want = model.forward_logits(torch.tensor([tokens + rest.tolist()]))[0, -1]
    torch.testing.assert_close(got, want, rtol=0, atol=5e-5)
