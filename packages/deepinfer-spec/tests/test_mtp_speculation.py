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
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer_spec.mtp import MTPDrafter
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
