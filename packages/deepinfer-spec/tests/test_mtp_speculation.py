"""MTP speculation on one sequence is lossless: greedy tokens equal plain greedy decoding.

The tiny V4 model has random weights, so its MTP layer drafts poorly; what matters here is
that every kept draft and every emitted token is the target's own greedy choice, through the
k-token verification rows and the exact rollbacks of the target's state and the MTP layer's,
past the sliding window. The reference is the target alone, one token per step.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.assets import random_tiny_model
from deepinfer.cache.slots import StateSlots
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer_spec.mtp import MTPDrafter
from deepinfer_spec.mtp_graphed import GraphedMTPRounds
from deepinfer_spec.speculative import speculative_generate


@pytest.fixture(scope="module")
def model() -> DeepseekCausalLM:
    return random_tiny_model(torch.float32, seed=5)


def _greedy(model: DeepseekCausalLM, prompt: list[int], n: int) -> list[int]:
    state = model.new_state(1)
    logits = model.step(torch.tensor([prompt]), state)[0, -1]
    out = [int(logits.argmax())]
    while len(out) < n:
        out.append(int(model.step(torch.tensor([out[-1:]]), state)[0, -1].argmax()))
    return out


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculation_equals_greedy_decoding(model: DeepseekCausalLM, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    prompt = torch.randint(3, model.cfg.vocab_size, (model.cfg.sliding_window - 8,), generator=g)
    prompt_ids = prompt.tolist()
    n = 24  # the rings wrap during speculation
    got = speculative_generate(model, prompt_ids, k, n)
    assert got.tokens == _greedy(model, prompt_ids, n)
    assert sum(got.accepted) + len(got.accepted) + 1 >= n  # every round emitted its tokens


def test_seeded_sampling_is_reproducible(model: DeepseekCausalLM) -> None:
    """Randomness is keyed by position: the same seed gives the same tokens; another seed
    other tokens."""
    prompt = list(range(5, 25))
    a = speculative_generate(model, prompt, 3, 12, temperature=1.0, seed=7)
    b = speculative_generate(model, prompt, 3, 12, temperature=1.0, seed=7)
    c = speculative_generate(model, prompt, 3, 12, temperature=1.0, seed=8)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_a_drafter_needs_at_least_one_token(model: DeepseekCausalLM) -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        MTPDrafter(model, 0)


@pytest.mark.parametrize("chained", ["ragged", "graphed"])
def test_batched_drafts_equal_drafts_one_sequence_at_a_time(
    model: DeepseekCausalLM, chained: str
) -> None:
    """Sequences in the engine's slots draft in one ragged pass of the MTP layer per draft
    (or, ``graphed``, the passes a round's CUDA graph holds, run eagerly on the CPU: rows of
    k + 1 verified positions after an eager pass over longer runs' earlier ones, then decode
    passes): the same drafts as each sequence drafting on its own state, round after round
    (the second round continues from where the first left the layer), with confidences that
    are each draft's softmax probability under the MTP logits it was drafted from."""
    k, g = 3, torch.Generator().manual_seed(9)
    slots = StateSlots(lambda: model.new_state(1, slack=k), max_slots=3, max_len=1024)
    shared = [slots.new_state() for _ in range(3)]
    own = [model.new_state(1, slack=k) for _ in range(3)]
    drafter = MTPDrafter(model, k)
    if chained == "graphed":  # use_graphs keeps rounds eager off a GPU, where graphs run eagerly
        drafter.graphed = GraphedMTPRounds(model, DecodeGraphs(4), k)
    pending = [torch.randint(3, 8000, (n,), generator=g) for n in (5, 40, 130)]
    for _ in range(2):
        streams, after, want, sure = [], [], [], []
        for chunk, a, b in zip(pending, own, shared, strict=True):
            out_a = model(ForwardBatch.of(chunk, a, num_logits=1, return_streams=True))
            out_b = model(ForwardBatch.of(chunk, b, num_logits=1, return_streams=True))
            assert out_a.streams is not None and out_b.streams is not None
            nxt = torch.cat((chunk[1:], out_a.logits[-1:].argmax(dim=-1)))
            own_draft = drafter.draft(a, out_a.streams, nxt)
            want.append(own_draft.tokens)
            # each draft's probability under its own logits, in float64
            probs = torch.softmax(own_draft.logits.double(), dim=-1)
            sure.append(probs.gather(1, own_draft.tokens[:, None])[:, 0])
            streams.append(out_b.streams)
            after.append(nxt)
        lengths = [c.numel() for c in pending]
        got, confidence = drafter.draft_with_confidence(
            shared, torch.cat(streams), torch.cat(after), lengths
        )
        assert torch.equal(got, torch.stack(want))
        torch.testing.assert_close(confidence.double(), torch.stack(sure), rtol=1e-4, atol=1e-6)
        assert [s.mtp_pos for s in shared] == [s.mtp_pos for s in own]
        pending = [torch.randint(3, 8000, (n,), generator=g) for n in (1, 7, 3)]
