"""Batched DSpark drafting (``deepinfer_spec.dspark.batch``) against one request at a time.

Requests of different context lengths (one with none, one after a prefix-cache hit whose
context starts past 0), with the target's real layer features of held-out-like prompts and
with the shipped drafter: one padded pass gives every request the drafts of drafting it alone
(the same greedy tokens) and the same confidences within fp tolerance; absorbing all requests'
new positions in one projection equals absorbing each request's on its own; and a later round,
after each context absorbed a different number of verified positions, still agrees.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.assets import tiny_model
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.layer_capture import captured_layers, features_of
from deepinfer_spec.dspark import DSparkDrafter
from deepinfer_spec.dspark.batch import absorb_all, propose_batch
from deepinfer_spec.dspark.draft import DraftContext, propose
from deepinfer_spec.dspark.weights import SHIPPED, load_drafter

PROMPTS = [
    [0, 1340, 18, 410, 612, 33, 907, 25, 11, 260, 1890, 47, 93, 5, 700, 12, 880],
    [0, 77, 310, 45, 2],
    [0, 512, 19, 3001, 64, 28, 911],
    [0, 4000, 21, 9, 18, 650, 37, 1200, 84, 5, 305],
]
#: Where each request's context starts (a prefix-cache hit starts past 0) and its anchor.
FIRSTS = [0, 0, 3, 0]


@pytest.fixture(scope="module")
def setup() -> Setup:
    model = tiny_model(torch.float32)
    drafter = load_drafter(SHIPPED, model)
    feats = []
    for ids in PROMPTS:
        with captured_layers(model, drafter.c.target_layer_ids) as seen:
            model.forward_logits(torch.tensor([ids]))
        feats.append(features_of(seen, drafter.c.target_layer_ids))
    return model, drafter, feats


Setup = tuple[DeepseekCausalLM, DSparkDrafter, list[torch.Tensor]]


def _check(
    model: DeepseekCausalLM,
    drafter: DSparkDrafter,
    one: list[DraftContext],
    many: list[DraftContext],
    anchors: list[int],
) -> None:
    tokens, conf = propose_batch(drafter, many, torch.tensor(anchors), model.embed, model.logits)
    for i, ctx in enumerate(one):
        alone = propose(drafter, ctx, anchors[i], model.embed, model.logits)
        assert tokens[i].tolist() == alone.tokens.tolist()
        torch.testing.assert_close(conf[i], alone.confidence, rtol=1e-4, atol=1e-5)


def test_batched_drafts_equal_one_request_at_a_time(setup: Setup) -> None:
    model, drafter, feats = setup
    cut = [len(p) - 2 for p in PROMPTS]
    cut[1] = 0  # a request with no context yet
    one = [DraftContext(first=f) for f in FIRSTS]
    many = [DraftContext(first=f) for f in FIRSTS]
    lengths = [c - f for c, f in zip(cut, FIRSTS, strict=True)]
    pieces = [x[f:c] for x, f, c in zip(feats, FIRSTS, cut, strict=True)]
    for ctx, piece in zip(one, pieces, strict=True):
        ctx.absorb(drafter, piece)
    absorb_all(drafter, many, torch.cat(pieces), lengths)
    for a, b in zip(one, many, strict=True):
        assert a.end == b.end
        for (ka, va), (kb, vb) in zip(a.kv, b.kv, strict=True):
            torch.testing.assert_close(ka, kb, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(va, vb, rtol=1e-5, atol=1e-6)
    _check(model, drafter, one, many, [p[c] for p, c in zip(PROMPTS, cut, strict=True)])
    # a second round: each request verified a different number of positions since
    more = [1, 4, 1, 1]
    pieces = [x[c : c + m] for x, c, m in zip(feats, cut, more, strict=True)]
    for ctx, piece in zip(one, pieces, strict=True):
        ctx.absorb(drafter, piece)
    absorb_all(drafter, many, torch.cat(pieces), more)
    anchors = [p[c + m] for p, c, m in zip(PROMPTS, cut, more, strict=True)]
    _check(model, drafter, one, many, anchors)
