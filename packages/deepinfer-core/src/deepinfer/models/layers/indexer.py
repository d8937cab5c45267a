"""Lightning indexer: picks, per query, the top-k compressed entries a CSA layer attends to.

It keeps its own narrow compressor (index_head_dim) over the same ratio-4 windows, reads the
attention's shared query latent ``qr``, and scores ``sum_h w_h * relu(q_h . k)``. ReLU makes exact
zeros common, so top-k ties are possible with few index heads; real models use 64.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.layers.compressor import Compressor
from deepinfer.models.layers.norm import Linear
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layers.visibility import visible_count
from deepinfer.models.layouts import CompressorStates, RaggedCompressor, memo_of
from deepinfer.models.ragged_plan import ScoreGroup, by_score_group, group_entries
from deepinfer.paging import dense_entries


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_heads = cfg.index_n_heads
        self.head_dim = cfg.index_head_dim
        self.topk = cfg.index_topk
        self.ratio = ratio
        self.compressor = Compressor(
            cfg.hidden_size, self.head_dim, ratio, overlap=True, eps=cfg.rms_norm_eps
        )
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, dtype, fp8_capable=True)
        self.weights_proj = Linear(cfg.hidden_size, self.n_heads, dtype)

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        qr: Tensor,
        positions: Tensor,
        *,
        rotary: Rotary,
        state: CompressorStates,
        projected: tuple[Tensor, ...] | None = None,
    ) -> Tensor:
        """Returns selected entry ids [B, S, k], -1 where fewer than k entries are visible
        (for a ragged pass [1, N, k], each among its own span's entries). ``projected``: the
        compressor's projections of ``x``, made by the layer's fused GEMM."""
        keys = self.compressor(ops, x, positions, rotary, state, projected)
        b, s = x.shape[:2]
        q = self.wq_b(ops, qr).view(b, s, self.n_heads, self.head_dim)
        cos, sin = rotary.cos_sin(positions)
        q = ops.rope(q, cos, sin)
        weights = self.weights_proj(ops, x)  # widened and scaled where the scores read them
        scale = self.head_dim**-0.5 * self.n_heads**-0.5
        visible = visible_count(positions, self.ratio, memo_of(state))
        if not isinstance(state, RaggedCompressor):
            return ops.indexer_topk(q, keys, weights, visible, self.topk, scale)
        # Each span's queries against its own keys, spans of similar length as one batch.
        per_span = dense_entries(keys)  # [n, T, c]
        k = min(self.topk, per_span.shape[1])
        if k == 0:
            return torch.full((*x.shape[:2], 0), -1, dtype=torch.long, device=x.device)

        def picks(_: int, g: ScoreGroup) -> Tensor:
            seen = torch.where(g.real, visible[g.tokens], 0)
            limit = group_entries(state.meta, g, self.ratio)
            keys_g = per_span[:, :limit].index_select(0, g.spans)
            return ops.indexer_topk(q[0, g.tokens], keys_g, weights[0, g.tokens], seen, k, scale)

        return by_score_group(state.meta, k, picks)
