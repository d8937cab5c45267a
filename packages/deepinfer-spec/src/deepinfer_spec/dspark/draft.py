"""One sequence's DSpark drafting (``dspark.md`` §4): context absorbed as it is verified, then
a block of drafts sampled left to right through the Markov head.

The drafter's state is its context keys and values, one row per verified position: only the
target's features of tokens that survived verification are absorbed, so a rejection leaves
nothing to undo. Draft tokens are drawn with the counter RNG on their own stream
(``STREAM_DRAFT``), keyed by (seed, position): independent of the acceptance uniforms and of the
sampler's noise at the same position, as lossless verification needs, and reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from deepinfer.sampling import rng
from deepinfer_spec.dspark.model import DSparkDrafter, Embed, Head


@dataclass
class DraftContext:
    """A sequence's context keys and values per draft layer, [1, T, H, D] each, for the
    positions ``first .. end - 1`` (``first`` > 0 after a prefix-cache hit, whose cached
    positions the target never ran, so their features never existed, and past the drafter's
    ``sliding_window``, whose older positions are dropped)."""

    first: int = 0
    kv: list[tuple[Tensor, Tensor]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.first + (self.kv[0][0].shape[1] if self.kv else 0)

    def absorb(self, drafter: DSparkDrafter, features: Tensor) -> None:
        """Append the verified positions ``end ..`` with target features [n, F]."""
        start = self.end
        positions = torch.arange(start, start + features.shape[0], device=features.device)
        self.extend(drafter.context(features[None], positions[None]), drafter.c.sliding_window)

    def extend(self, new: list[tuple[Tensor, Tensor]], window: int | None) -> None:
        """Append per-layer keys and values [1, n, H, D] of the next positions, then keep
        the last ``window`` positions (None: all)."""
        if self.kv:
            new = [
                (torch.cat((k, nk), dim=1), torch.cat((v, nv), dim=1))
                for (k, v), (nk, nv) in zip(self.kv, new, strict=True)
            ]
        size = new[0][0].shape[1]
        if window is not None and size > window:
            self.first += size - window
            new = [(k[:, -window:], v[:, -window:]) for k, v in new]
        self.kv = new


@dataclass
class Proposal:
    tokens: Tensor  # [block] long
    probs: Tensor | None  # [block, V] the distributions drawn from (None: greedy)
    confidence: Tensor  # [block] P(draft k survives | the drafts before it did)


@torch.no_grad()
def propose(
    drafter: DSparkDrafter,
    ctx: DraftContext,
    anchor: int,
    embed: Embed,
    head: Head,
    *,
    temperature: float = 0.0,
    seed: int = 0,
) -> Proposal:
    """A block of drafts after ``anchor`` (at position ``ctx.end``): slot j predicts
    position ``ctx.end + j + 1``."""
    c = drafter.c
    device = drafter.fc.weight.device
    start = ctx.end
    positions = torch.arange(start, start + c.block_size, device=device)[None]
    block = drafter.block_input(torch.tensor([anchor], device=device), embed)
    h = drafter.backbone(block, positions, ctx.kv or _empty(drafter, device), None)[0]
    base = head(h)  # [block, V] fp32
    prev = torch.tensor(anchor, device=device)
    tokens, probs, conf = [], [], []
    for k in range(c.block_size):
        logits = base[k] + drafter.markov_bias(prev)
        conf.append(torch.sigmoid(drafter.confidence_logit(h[k], prev)))
        if temperature <= 0:
            tok = logits.argmax()
        else:
            scaled = logits / temperature
            probs.append(torch.softmax(scaled, dim=-1))
            keys = rng.position_keys(
                torch.tensor([seed]), torch.tensor([start + k + 1]), rng.STREAM_DRAFT
            )
            noise = rng.gumbel(rng.uniform(keys.to(device), scaled.shape[-1]))[0]
            tok = (scaled + noise).argmax()
        tokens.append(tok)
        prev = tok
    return Proposal(torch.stack(tokens), torch.stack(probs) if probs else None, torch.stack(conf))


def _empty(drafter: DSparkDrafter, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    c = drafter.c
    z = torch.zeros(1, 0, c.num_heads, c.head_dim, device=device, dtype=drafter.fc.weight.dtype)
    return [(z, z) for _ in range(c.num_layers)]
