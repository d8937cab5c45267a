"""The DSpark drafter (``dspark.md`` §3): a parallel backbone over the block, a Markov head and
a confidence head.

* **Context.** The target's raw outputs at ``target_layer_ids`` (every residual stream) are
  concatenated per position, projected to the hidden size (``fc``) and normalised: ``H_ctx``.
  Each draft layer projects ``H_ctx`` to keys and values (no input norm: ``H_ctx`` is normed
  already) at the positions' true offsets; these are the drafter's only state.
* **Backbone.** The block ``[anchor, noise x (block_size - 1)]`` is embedded with the target's
  own (frozen) embedding and runs through pre-norm attention + SwiGLU layers whose queries see
  every context key before the anchor and every key of their own block (non-causal inside
  it). A final norm gives ``h_1 .. h_block``; the target's (frozen) head gives base logits
  ``U_k``.
* **Markov head.** ``U_k + W2 E1[x_{k-1}]``: a rank-``markov_rank`` bigram bias from the token
  sampled before (the anchor for the first slot), applied left to right while sampling.
* **Confidence head.** ``sigmoid(w [h_k ; E1[x_{k-1}]] + b)``: the probability that draft k
  survives verification given that the drafts before it did.

Everything runs in the module's dtype (fp32 for training and the CPU); the target's pieces are
passed in, never copied into the drafter's weights, so the shipped file holds only its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from deepinfer_spec.dspark.config import DSparkConfig

#: the target's frozen token embedding: ids [...] -> [..., d]
Embed = Callable[[Tensor], Tensor]
#: the target's frozen head: hidden [..., d] -> fp32 logits [..., V]
Head = Callable[[Tensor], Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32, weight = x.float(), self.weight.float()
        if x.is_cuda:  # one fused kernel; on a CPU the composite below is the faster
            return F.rms_norm(x32, weight.shape, weight, self.eps).to(x.dtype)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * weight).to(x.dtype)


#: (cos, sin) [..., S, 1, D] of rotate-half RoPE at some positions, each half's angles twice
Rotation = tuple[Tensor, Tensor]


def rotation(positions: Tensor, head_dim: int, theta: float) -> Rotation:
    """The rotation of every head at ``positions`` [..., S]: computed once a pass and shared
    by the queries and keys of every layer (they sit at the same positions)."""
    half = head_dim // 2
    freq = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.float()[..., None] * freq  # [..., S, half]
    angles = torch.cat((angles, angles), dim=-1)[..., None, :]
    return angles.cos(), angles.sin()


def rope(x: Tensor, rot: Rotation) -> Tensor:
    """Rotate-half RoPE over the whole head: x [..., S, H, D], halves (a, b) to
    (a cos - b sin, b cos + a sin)."""
    half = x.shape[-1] // 2
    x32 = x.float()
    turned = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * rot[0] + turned * rot[1]).to(x.dtype)


class DraftLayer(nn.Module):
    """Pre-norm attention over [context ; block] and a SwiGLU MLP."""

    def __init__(self, c: DSparkConfig) -> None:
        super().__init__()
        d, h, hd = c.hidden_size, c.num_heads, c.head_dim
        self.c = c
        self.attn_norm = RMSNorm(d, c.rms_norm_eps)
        self.wq = nn.Linear(d, h * hd, bias=False)
        self.wk = nn.Linear(d, h * hd, bias=False)
        self.wv = nn.Linear(d, h * hd, bias=False)
        self.wo = nn.Linear(h * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(hd, c.rms_norm_eps)
        self.mlp_norm = RMSNorm(d, c.rms_norm_eps)
        self.w1 = nn.Linear(d, c.intermediate_size, bias=False)
        self.w3 = nn.Linear(d, c.intermediate_size, bias=False)
        self.w2 = nn.Linear(c.intermediate_size, d, bias=False)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(*x.shape[:-1], self.c.num_heads, self.c.head_dim)

    def kv(self, x: Tensor, rot: Rotation) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated by ``rot``) and values [..., S, H, D] of normed inputs."""
        k = rope(self.k_norm(self._heads(self.wk(x))), rot)
        return k, self._heads(self.wv(x))

    def forward(
        self, x: Tensor, rot: Rotation, context: tuple[Tensor, Tensor], mask: Tensor | None
    ) -> Tensor:
        """x [B, Q, d] block rows rotated by ``rot`` (their positions'); ``context`` keys and
        values [B, T, H, D]; ``mask`` [B, Q, T + Q] (True: visible) or None (all visible)."""
        n = self.attn_norm(x)
        q = rope(self.q_norm(self._heads(self.wq(n))), rot)
        k, v = self.kv(n, rot)
        k = torch.cat((context[0], k), dim=1)
        v = torch.cat((context[1], v), dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=None if mask is None else mask[:, None],
        )
        x = x + self.wo(out.transpose(1, 2).flatten(2))
        n = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(n)) * self.w3(n))


class DSparkDrafter(nn.Module):
    def __init__(self, c: DSparkConfig) -> None:
        super().__init__()
        self.c = c
        self.fc = nn.Linear(c.feature_size, c.hidden_size, bias=False)
        self.ctx_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.markov_embed = nn.Embedding(c.vocab_size, c.markov_rank)
        self.markov_out = nn.Linear(c.markov_rank, c.vocab_size, bias=False)
        self.confidence = nn.Linear(c.hidden_size + c.markov_rank, 1)

    def context(self, features: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's context keys and values [B, T, H, D] for target features
        [B, T, feature_size] at ``positions`` [B, T]."""
        h = self.ctx_norm(self.fc(features.to(self.fc.weight.dtype)))
        rot = self.rotation(positions)
        return [layer.kv(h, rot) for layer in self.layers]

    def rotation(self, positions: Tensor) -> Rotation:
        """The rotation of this drafter's heads at ``positions`` (:func:`rotation`)."""
        return rotation(positions, self.c.head_dim, self.c.rope_theta)

    def backbone(
        self,
        block: Tensor,
        positions: Tensor,
        context: list[tuple[Tensor, Tensor]],
        mask: Tensor | None,
    ) -> Tensor:
        """Normed hidden states [B, Q, d] of embedded block rows ``block`` [B, Q, d]."""
        x, rot = block.to(self.fc.weight.dtype), self.rotation(positions)
        for layer, kv in zip(self.layers, context, strict=True):
            x = layer(x, rot, kv, mask)
        return self.norm(x)

    def markov_bias(self, prev: Tensor) -> Tensor:
        """[..., V] the bias the previous tokens ``prev`` [...] add to the base logits."""
        return self.markov_out(self.markov_embed(prev)).float()

    def confidence_logit(self, h: Tensor, prev: Tensor) -> Tensor:
        """[...] the logit of draft k surviving given the drafts before it did."""
        return self.confidence(torch.cat((h, self.markov_embed(prev)), dim=-1))[..., 0].float()

    def block_input(self, anchors: Tensor, embed: Embed) -> Tensor:
        """[..., block_size, d] embeddings of [anchor, noise, ...] for anchors [...]."""
        noise = torch.full_like(anchors, self.c.noise_token_id)
        ids = torch.stack((anchors, *[noise] * (self.c.block_size - 1)), dim=-1)
        return embed(ids)
