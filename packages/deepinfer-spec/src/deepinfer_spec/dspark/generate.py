"""One sequence decoded with DSpark speculation, round by round (``dspark.md`` §4): the
reference loop, and what ``tools/train_dspark.py`` measures the acceptance length with.

Each round the drafter proposes a block after the anchor; the target verifies the anchor and
every draft as one row that keeps all logits and the context features of each position; the
kept drafts pass lossless rejection sampling against the drafts' own distributions
(:mod:`deepinfer.sampling.rejection`); the target rolls back to what it accepted and the
drafter absorbs the features of the anchor and the kept drafts. Greedy requests (temperature 0)
emit exactly the target's greedy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer.models.batch import ForwardBatch
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.layer_capture import captured_layers, features_of
from deepinfer.sampling.rejection import draw, target_distribution, verify_sequence
from deepinfer_spec.dspark.draft import DraftContext, propose
from deepinfer_spec.dspark.model import DSparkDrafter


@dataclass
class DSparkOutput:
    tokens: list[int]
    #: drafts kept in each round (tau, the acceptance length, is their mean plus one)
    accepted: list[int] = field(default_factory=list)
    #: each round's confidences, [block] each
    confidence: list[list[float]] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return 1.0 + sum(self.accepted) / max(1, len(self.accepted))


@torch.no_grad()
def dspark_generate(
    model: DeepseekCausalLM,
    drafter: DSparkDrafter,
    prompt: list[int],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
) -> DSparkOutput:
    """``max_tokens`` tokens after ``prompt`` (see the module)."""
    c = drafter.c
    c.check_target(model.cfg)
    layers, k, device = c.target_layer_ids, c.block_size, model.device
    state = model.new_state(1, slack=k)
    ctx = DraftContext()
    with captured_layers(model, layers) as seen:
        out = model(ForwardBatch.of(torch.tensor(prompt, device=device), state, num_logits=1))
        ctx.absorb(drafter, features_of(seen, layers))
    first = target_distribution(out.logits[-1:], temperature)[0]
    anchor = draw(first, temperature, seed, len(prompt))
    result = DSparkOutput([anchor])
    while len(result.tokens) < max_tokens:
        start = state.pos  # the anchor's position
        prop = propose(drafter, ctx, anchor, model.embed, model.logits,
                       temperature=temperature, seed=seed)  # fmt: skip
        row = torch.cat((torch.tensor([anchor], device=device), prop.tokens))
        with captured_layers(model, layers) as seen:
            verify = model(ForwardBatch.of(row, state, num_logits=k + 1))
            feats = features_of(seen, layers)
        p = target_distribution(verify.logits, temperature)
        n, dist = verify_sequence(p, prop.probs, prop.tokens, seed, start)
        anchor = draw(dist, temperature, seed, start + n + 1)
        result.tokens += [*prop.tokens[:n].tolist(), anchor]
        result.accepted.append(n)
        result.confidence.append(prop.confidence.tolist())
        model.rollback(state, start + n + 1, [*prompt, *result.tokens[:-1]])
        ctx.absorb(drafter, feats[: n + 1])
    del result.tokens[max_tokens:]
    return result
