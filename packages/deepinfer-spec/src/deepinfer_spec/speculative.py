"""One sequence decoded with speculation, step by step: the reference the engine's speculative
steps are checked against.

Each round drafts ``k`` tokens (:class:`~deepinfer_spec.mtp.MTPDrafter`), feeds the anchor and
the drafts to the target as one k-token row that keeps every logit, keeps the drafts that pass
verification (:mod:`deepinfer.sampling.rejection`), emits the token after them and rolls the
target's state back to what it accepted. Randomness is keyed by position with the engine's
counter RNG: a draft's acceptance by its position (stream ``STREAM_ACCEPT``), the emitted token
by its own (the sampler's Gumbel-max), so a seeded request gives the same tokens in any batch.
Greedy requests (temperature 0) emit exactly the target's greedy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer.models.batch import ForwardBatch
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.sampling.rejection import draw, target_distribution, verify_sequence
from deepinfer_spec.mtp import MTPDrafter


@dataclass
class SpeculativeOutput:
    tokens: list[int]
    #: Drafts kept in each round (the acceptance length tau is their mean plus one).
    accepted: list[int] = field(default_factory=list)


@torch.no_grad()
def speculative_generate(
    model: DeepseekCausalLM,
    prompt: list[int],
    k: int,
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
) -> SpeculativeOutput:
    """``max_tokens`` tokens after ``prompt`` (see the module)."""
    drafter = MTPDrafter(model, k)
    device = model.device
    state = model.new_state(1, slack=k)
    ids = torch.tensor(prompt, device=device)
    out = model(ForwardBatch.of(ids, state, num_logits=1, return_streams=True))
    assert out.streams is not None
    first = target_distribution(out.logits[-1:], temperature)[0]
    anchor = draw(first, temperature, seed, len(prompt))
    result = SpeculativeOutput([anchor])
    streams, after = out.streams, torch.tensor([*prompt[1:], anchor], device=device)
    while len(result.tokens) < max_tokens:
        start = state.pos  # the anchor's position
        draft = drafter.draft(state, streams, after)
        row = torch.cat((torch.tensor([anchor], device=device), draft.tokens))
        verify = model(ForwardBatch.of(row, state, num_logits=k + 1, return_streams=True))
        assert verify.streams is not None
        p = target_distribution(verify.logits, temperature)
        n, dist = verify_sequence(p, None, draft.tokens, seed, start)
        anchor = draw(dist, temperature, seed, start + n + 1)
        result.tokens += [*draft.tokens[:n].tolist(), anchor]
        result.accepted.append(n)
        model.rollback(state, start + n + 1)
        kept_ids = [*draft.tokens[:n].tolist(), anchor]
        streams, after = verify.streams[: n + 1], torch.tensor(kept_ids, device=device)
    del result.tokens[max_tokens:]
    return result
