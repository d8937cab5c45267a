"""Many sequences' DSpark drafting in one pass of the drafter (the engine's rounds).

Each request's context keys and values live in its own :class:`~.draft.DraftContext`; a round
stacks them, padded to the longest, and a mask hides each request's padding from its block, so
every block attends to its own context and its own block only (``dspark.md`` §3.2), as
:func:`~.draft.propose` does for one sequence. Newly verified positions of every request are
projected in one pass too (:func:`absorb_all`: the projection is per position, so rows of
different requests never mix). Drafts are greedy: the Markov loop runs over all requests at
once, slot by slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer_spec.dspark.draft import DraftContext
from deepinfer_spec.dspark.model import DSparkDrafter, Embed, Head


def absorb_all(
    drafter: DSparkDrafter,
    contexts: Sequence[DraftContext],
    features: Tensor,
    lengths: Sequence[int],
) -> None:
    """Append to each context its ``lengths[i]`` next verified positions, whose target
    features are consecutive rows of ``features`` [sum(lengths), F], in one projection."""
    starts = [ctx.end for ctx in contexts]
    positions = torch.cat(
        [
            torch.arange(s, s + n, device=features.device)
            for s, n in zip(starts, lengths, strict=True)
        ]
    )
    new = drafter.context(features[None], positions[None])  # per layer ([1, N, H, D], ...)
    end = 0
    for ctx, n in zip(contexts, lengths, strict=True):
        ctx.extend([(k[:, end : end + n], v[:, end : end + n]) for k, v in new],
                   drafter.c.sliding_window)  # fmt: skip
        end += n


def padded_context(
    drafter: DSparkDrafter, contexts: Sequence[DraftContext], device: torch.device
) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """Every layer's context keys and values [R, T, H, D], each request's padded with zeros
    to the longest T, and the mask [R, block, T + block] (True: visible) that hides the
    padding and shows every block slot its whole block."""
    c = drafter.c
    sizes = [ctx.end - ctx.first for ctx in contexts]
    longest = max(sizes, default=0)
    dtype = drafter.fc.weight.dtype
    layers = []
    for layer in range(c.num_layers):
        ks = torch.zeros(
            len(contexts), longest, c.num_heads, c.head_dim, device=device, dtype=dtype
        )
        vs = torch.zeros_like(ks)
        for i, ctx in enumerate(contexts):
            if ctx.kv:
                ks[i, : sizes[i]] = ctx.kv[layer][0][0]
                vs[i, : sizes[i]] = ctx.kv[layer][1][0]
        layers.append((ks, vs))
    seen = torch.arange(longest, device=device)[None] < torch.tensor(sizes, device=device)[:, None]
    mask = torch.cat((seen, seen.new_ones(len(contexts), c.block_size)), dim=1)
    return layers, mask[:, None].expand(-1, c.block_size, -1)


@torch.no_grad()
def propose_batch(
    drafter: DSparkDrafter,
    contexts: Sequence[DraftContext],
    anchors: Tensor,
    embed: Embed,
    head: Head,
) -> tuple[Tensor, Tensor]:
    """Greedy drafts [R, block] after each request's ``anchors[i]`` (at position
    ``contexts[i].end``) and their confidences [R, block]: slot j predicts the position after
    the anchor's + j, as :func:`~.draft.propose` with temperature 0."""
    device = drafter.fc.weight.device
    starts = torch.tensor([ctx.end for ctx in contexts], device=device)
    context, mask = padded_context(drafter, contexts, device)
    return draft_block(drafter, context, mask, anchors.to(device), starts, embed, head)


def draft_block(  # noqa: PLR0917
    drafter: DSparkDrafter,
    context: list[tuple[Tensor, Tensor]],
    mask: Tensor,
    anchors: Tensor,
    starts: Tensor,
    embed: Embed,
    head: Head,
) -> tuple[Tensor, Tensor]:
    """Greedy drafts and confidences [R, block] of blocks after ``anchors`` [R] at positions
    ``starts`` [R], over per-layer ``context`` keys and values [R, T, H, D] of which ``mask``
    [R, block, T + block] shows each block its own: device ops on fixed shapes only (no host
    sync), so a CUDA graph can hold them."""
    c = drafter.c
    positions = starts[:, None] + torch.arange(c.block_size, device=starts.device)
    h = drafter.backbone(drafter.block_input(anchors, embed), positions, context, mask)
    base = head(h)  # [R, block, V] fp32
    prev, tokens = anchors, [anchors]
    for k in range(c.block_size):
        prev = (base[:, k] + drafter.markov_bias(prev)).argmax(dim=-1)
        tokens.append(prev)
    chain = torch.stack(tokens, dim=1)  # [R, 1 + block]: the anchor, then the drafts
    # every slot's confidence at once, once the token before each is known
    return chain[:, 1:], torch.sigmoid(drafter.confidence_logit(h, chain[:, :-1]))
