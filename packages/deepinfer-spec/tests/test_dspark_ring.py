"""DSpark rounds over slot rings (``deepinfer_spec.dspark.ring``, ``.graphed``) against the
eager rounds over per-request contexts (``.batch``), and the sliding window itself.

The shipped drafter is given a short window (6 positions) so contexts wrap their rings within a
few rounds. Over rounds whose requests absorb different numbers of positions (a whole prompt, a
prompt past the window, one to k + 1 verified positions), start at a prefix-cache hit (context
from a position past 0) or start again in a reused slot, the ring rounds draft the eager
rounds' greedy tokens with confidences within fp tolerance. The window is checked on its own:
a context that dropped its old positions drafts as one that never absorbed them. On a GPU the
rounds replay CUDA graphs and still agree (the engine speculating with them:
``test_engine_cuda.py``).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest
import torch

from deepinfer.assets import tiny_model
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.layer_capture import captured_layers, features_of
from deepinfer_spec.dspark import DSparkDrafter
from deepinfer_spec.dspark.batch import absorb_all, propose_batch
from deepinfer_spec.dspark.draft import DraftContext
from deepinfer_spec.dspark.graphed import GraphedRounds
from deepinfer_spec.dspark.weights import SHIPPED, load_drafter

WINDOW = 6
K = 4
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclass(eq=False)
class FakeState:
    """What the rounds read of a target state: its slot row and its next position."""

    slot: int
    pos: int


def _drafter(model: DeepseekCausalLM) -> DSparkDrafter:
    drafter = load_drafter(SHIPPED, model)
    drafter.c = dataclasses.replace(drafter.c, sliding_window=WINDOW)
    return drafter


@pytest.fixture(scope="module", params=DEVICES)
def setup(request: pytest.FixtureRequest) -> tuple[DeepseekCausalLM, DSparkDrafter, torch.Tensor]:
    model = tiny_model(torch.float32, torch.device(request.param))
    drafter = _drafter(model)
    ids = random.Random(3).choices(range(3, 8000), k=48)
    with captured_layers(model, drafter.c.target_layer_ids) as seen:
        model.forward_logits(torch.tensor([ids], device=model.device))
    return model, drafter, features_of(seen, drafter.c.target_layer_ids)


def test_ring_rounds_draft_as_the_eager_rounds(
    setup: tuple[DeepseekCausalLM, DSparkDrafter, torch.Tensor],
) -> None:
    model, drafter, feats = setup
    graphs = DecodeGraphs(8)
    rounds = GraphedRounds(drafter, model.embed, model.logits, graphs, K)
    gen = torch.Generator().manual_seed(0)
    # per request: its slot, where its context starts, the new positions of each round
    plan = {
        3: (0, [9, 1, 5, 2, 5, 3]),  # a prompt longer than the window, then verified rows
        1: (4, [3, 5, 1, 1, 4, 2]),  # a prefix-cache hit: its context starts at 4
        6: (0, [1, 2, 3, 5, 5, 1]),
    }
    states = {s: FakeState(s, first) for s, (first, _) in plan.items()}
    contexts = {s: DraftContext(first=first) for s, (first, _) in plan.items()}
    for r in range(6):
        if r == 3:  # slot 6 taken by a new request, which starts at 0 with a new context
            states[6], contexts[6] = FakeState(6, 0), DraftContext()
        order = sorted(plan)
        lengths = [plan[s][1][r] for s in order]
        rows = []
        for s, n in zip(order, lengths, strict=True):
            rows.append(feats[states[s].pos : states[s].pos + n])
            states[s].pos += n
        new = torch.cat(rows)
        next_ids = torch.randint(3, 8000, (len(new),), generator=gen).to(model.device)
        anchors = next_ids[torch.tensor(lengths).cumsum(0) - 1]
        eager = [contexts[s] for s in order]
        absorb_all(drafter, eager, new, lengths)
        want = propose_batch(drafter, eager, anchors, model.embed, model.logits)
        got = rounds.draft([states[s] for s in order], new, next_ids, lengths)
        assert got[0].tolist() == want[0].tolist(), f"round {r}"
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
    expect = 1 if model.device.type == "cuda" else 0  # graphs replay on a GPU only
    assert graphs.num_captured == expect


def test_the_window_drops_older_positions(
    setup: tuple[DeepseekCausalLM, DSparkDrafter, torch.Tensor],
) -> None:
    model, drafter, feats = setup
    anchors = torch.tensor([17, 905], device=model.device)
    long, short = DraftContext(), DraftContext(first=20 - WINDOW)
    long.absorb(drafter, feats[:12])
    long.absorb(drafter, feats[12:20])
    short.absorb(drafter, feats[20 - WINDOW : 20])
    assert (long.first, long.end) == (short.first, short.end)
    tokens, conf = propose_batch(drafter, [long, short], anchors[:1].repeat(2), model.embed,
                                 model.logits)  # fmt: skip
    assert tokens[0].tolist() == tokens[1].tolist()
    torch.testing.assert_close(conf[0], conf[1], rtol=1e-5, atol=1e-6)
    # and the window matters: the whole context drafts otherwise
    whole = dataclasses.replace(drafter.c, sliding_window=None)
    drafter.c, saved = whole, drafter.c
    try:
        full = DraftContext()
        full.absorb(drafter, feats[:20])
        _, conf_full = propose_batch(drafter, [full], anchors[:1], model.embed, model.logits)
    finally:
        drafter.c = saved
    assert not torch.allclose(conf_full[0], conf[0])
