"""V4.1 ratio-1/2 compressor, owned by a KV-source layer and read by its whole layer group.

Unlike V4's compressors there is no overlap and no position bias: ratio 1 turns every token into
an entry (``norm(wkv(x))``), ratio 2 pools each pair with a per-channel softmax of ``wgate``
scores. The pooled latent is normalised here and returned before RoPE, because the group's
indexer keys are projected from the un-rotated latent; the caller rotates both.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.models.layers.norm import Linear, RMSNorm
from deepinfer.models.state import CompressorState


class SharedCompressor(nn.Module):
    def __init__(
        self, hidden: int, dim: int, ratio: int, *, eps: float, dtype: torch.dtype
    ) -> None:
        super().__init__()
        if ratio not in (1, 2):
            raise NotImplementedError(f"V4.1 compressor ratio {ratio}: only 1 and 2 exist")
        self.dim = dim
        self.ratio = ratio
        self.wkv = Linear(hidden, dim, dtype)
        # A softmax over one slot is 1, so ratio 1 has no gate at all.
        self.wgate: Linear | None = Linear(hidden, dim, dtype) if ratio > 1 else None
        self.norm = RMSNorm(dim, eps)

    def new_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> CompressorState:
        return CompressorState.empty(
            batch, ratio=self.ratio, overlap=False, dim=self.dim, dtype=dtype, device=device
        )

    def forward(self, ops: Backend, x: Tensor, state: CompressorState) -> tuple[Tensor, int]:
        """Feed ``x`` [B, S, d]; returns (new normalised latents [B, n, D], index of the first).

        The open half of a pair waits in ``state.buf_kv``/``buf_score`` (fp32) for its partner,
        so a chunk boundary inside a pair changes nothing.
        """
        xf = x.float()
        kv = torch.cat((state.buf_kv, ops.linear(xf, self.wkv.weight.float())), dim=1)
        if self.wgate is not None:
            score = ops.linear(xf, self.wgate.weight.float())
        else:
            score = torch.zeros_like(kv[:, state.buf_kv.shape[1] :])
        score = torch.cat((state.buf_score, score), dim=1)
        b, total, width = kv.shape
        n = total // self.ratio
        used = n * self.ratio
        state.buf_kv, state.buf_score = kv[:, used:], score[:, used:]
        first = state.num_entries
        if n == 0:
            return kv.new_zeros(b, 0, self.dim).to(state.entries.dtype), first
        win_kv = kv[:, :used].view(b, n, self.ratio, width)
        win_score = score[:, :used].view(b, n, self.ratio, width)
        pooled = ops.compress(win_kv, win_score, None, None, False)
        return self.norm(ops, pooled.to(state.entries.dtype)), first
