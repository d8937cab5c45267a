"""KV compressor: pools every ``ratio`` consecutive tokens into one long-range entry.

Used three ways: the CSA main compressor (ratio 4, overlapping windows, head_dim wide), the
indexer's key compressor (same, index_head_dim wide) and the HCA compressor (large ratio, no
overlap). With overlap each token is projected twice (two halves of ``wkv``/``wgate``): the second
half joins its own window's entry, the first half the next window's, so each entry sees 2*ratio
tokens at stride ratio. Projections and the softmax pooling run in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.models.layers.norm import Linear, RMSNorm, fp32_param
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.state import CompressorState


class Compressor(nn.Module):
    def __init__(
        self,
        hidden: int,
        dim: int,
        ratio: int,
        *,
        overlap: bool,
        eps: float,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.ratio = ratio
        self.overlap = overlap
        width = 2 * dim if overlap else dim
        self.wkv = Linear(hidden, width, dtype)
        self.wgate = Linear(hidden, width, dtype)
        self.ape = fp32_param(ratio, width)
        self.norm = RMSNorm(dim, eps)

    def new_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> CompressorState:
        return CompressorState.empty(
            batch, ratio=self.ratio, overlap=self.overlap, dim=self.dim, dtype=dtype, device=device
        )

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        state: CompressorState,
    ) -> Tensor:
        """Feed ``x`` [B, S, d] at ``positions``; returns every entry emitted so far [B, T, D]."""
        xf = x.float()
        kv = ops.linear(xf, self.wkv.weight.float())
        score = ops.linear(xf, self.wgate.weight.float()) + self.ape[positions % self.ratio]
        kv = torch.cat((state.buf_kv, kv), dim=1)
        score = torch.cat((state.buf_score, score), dim=1)
        b, total, width = kv.shape
        n = total // self.ratio
        used = n * self.ratio
        state.buf_kv, state.buf_score = kv[:, used:], score[:, used:]
        if n == 0:
            return state.entries

        win_kv = kv[:, :used].view(b, n, self.ratio, width)
        win_score = score[:, :used].view(b, n, self.ratio, width)
        pooled = ops.compress(win_kv, win_score, state.prev_kv, state.prev_score, self.overlap)
        if self.overlap:
            state.prev_kv = win_kv[:, -1, :, : self.dim].clone()
            state.prev_score = win_score[:, -1, :, : self.dim].clone()

        entries = self.norm(ops, pooled.to(state.entries.dtype))
        first = state.num_entries
        entry_pos = torch.arange(first, first + n, device=x.device) * self.ratio
        cos, sin = rotary.cos_sin(entry_pos)
        entries = ops.rope(entries[:, :, None], cos, sin)[:, :, 0]
        state.entries = torch.cat((state.entries, entries), dim=1)
        return state.entries
