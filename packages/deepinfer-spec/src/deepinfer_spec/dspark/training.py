"""DSpark's training objective (``dspark.md`` §8): many anchor blocks of a sequence in one pass.

For anchors p (sorted, at most ``S - 1 - block``): block b is ``[token[p], noise ...]`` at
positions ``p .. p + block - 1``; its queries see the context features of positions < p and
every key of their own block. The labels are ``token[p + 1 .. p + block]``; the Markov head is
teacher-forced with the previous true token. Per slot k (weight ``exp(-(k - 1) / decay)``):

* CE of the label under the drafter's distribution;
* L1 (total variation x 2) between the drafter's and the target's next-token distributions,
  both at temperature 1;
* BCE of the confidence logit against ``clamp(1 - L1 / 2, 0, 1)``, the analytic chance that
  the draft survives verification given the drafts before it did (no gradient into the label).

The total is ``ce_alpha * CE + l1_alpha * L1 + conf_alpha * BCE`` over the weighted slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from deepinfer_spec.dspark.model import DSparkDrafter, Embed, Head


@dataclass(frozen=True)
class LossWeights:
    ce_alpha: float = 0.1
    l1_alpha: float = 0.9
    conf_alpha: float = 1.0
    decay: float = 4.0


@dataclass
class BlockLosses:
    total: Tensor
    ce: float
    l1: float
    conf: float
    #: mean analytic acceptance 1 - L1 / 2 per slot, [block]
    accept_rate: Tensor

    @property
    def tau(self) -> float:
        """Expected acceptance length at temperature 1 under teacher forcing: 1 + the sum of
        the per-slot survival products."""
        return 1.0 + float(torch.cumprod(self.accept_rate, 0).sum())


def block_mask(anchors: Tensor, seq_len: int, block: int, window: int | None = None) -> Tensor:
    """[B, A * block, seq_len + A * block] True where a block query may look: context keys
    before its anchor (the last ``window`` of them; None: all), and its own block's keys."""
    b, a = anchors.shape
    keys = torch.arange(seq_len, device=anchors.device)[None, None, :]
    ctx = keys < anchors[:, :, None]
    if window is not None:
        ctx &= keys >= anchors[:, :, None] - window
    ctx = ctx[:, :, None, :].expand(b, a, block, seq_len).reshape(b, a * block, seq_len)
    owner = torch.arange(a * block, device=anchors.device) // block
    own = (owner[:, None] == owner[None, :])[None].expand(b, -1, -1)
    return torch.cat((ctx, own), dim=-1)


def block_losses(
    drafter: DSparkDrafter,
    features: Tensor,
    tokens: Tensor,
    target_logits: Tensor,
    anchors: Tensor,
    *,
    embed: Embed,
    head: Head,
    weights: LossWeights = LossWeights(),
) -> BlockLosses:
    """Losses for sequences ``tokens`` [B, S] with target ``features`` [B, S, F] and
    next-token ``target_logits`` [B, S, V] (row t predicts token t + 1), at ``anchors`` [B, A]
    (each at most ``S - 1 - block``)."""
    c = drafter.c
    k = c.block_size
    bsz, seq = tokens.shape
    a = anchors.shape[1]
    offsets = torch.arange(k, device=tokens.device)
    context = drafter.context(features, torch.arange(seq, device=tokens.device).expand(bsz, -1))
    block = drafter.block_input(tokens.gather(1, anchors), embed).flatten(1, 2)
    positions = (anchors[:, :, None] + offsets).flatten(1)  # [B, A * k]
    h = drafter.backbone(block, positions, context, block_mask(anchors, seq, k, c.sliding_window))
    h = h.view(bsz, a, k, -1)
    labels = tokens.gather(1, positions + 1).view(bsz, a, k)
    prev = torch.cat((tokens.gather(1, anchors)[..., None], labels[..., :-1]), dim=-1)
    logits = head(h) + drafter.markov_bias(prev)
    target = target_logits.gather(
        1, positions[..., None].expand(-1, -1, target_logits.shape[-1])
    ).view(bsz, a, k, -1)
    log_q = F.log_softmax(logits.float(), dim=-1)
    p_t = torch.softmax(target.float(), dim=-1)
    ce = -log_q.gather(-1, labels[..., None])[..., 0]
    l1 = (log_q.exp() - p_t).abs().sum(-1)
    label = (1 - l1.detach() / 2).clamp(0, 1)
    conf = F.binary_cross_entropy_with_logits(
        drafter.confidence_logit(h, prev), label, reduction="none"
    )
    w = torch.exp(-offsets.float() / weights.decay).expand_as(ce)
    mean = lambda x: (w * x).sum() / w.sum()  # noqa: E731
    total = weights.ce_alpha * mean(ce) + weights.l1_alpha * mean(l1)
    total = total + weights.conf_alpha * mean(conf)
    return BlockLosses(
        total,
        float(mean(ce)),
        float(mean(l1)),
        float(mean(conf)),
        label.mean(dim=(0, 1)),
    )


def sample_anchors(
    seq_len: int, block: int, count: int, batch: int, gen: torch.Generator
) -> Tensor:
    """[batch, count] sorted anchors drawn without replacement from 0 .. seq_len - 1 - block."""
    high = seq_len - block
    rows = [torch.randperm(high, generator=gen)[:count].sort().values for _ in range(batch)]
    return torch.stack(rows)
