"""Shared-KV MQA with attention sinks, and its three long-range variants.

One 512-wide kv head serves as both key and value for every query head. Each layer sees its own
sliding window of ``sliding_window`` recent rows; compressed layers add long-range entries:

* ``swa``: the window only (base-theta RoPE, no YaRN);
* ``csa``: plus the compressed entries the lightning indexer picks per query (top-k);
* ``hca``: plus every compressed entry whose whole window is in the past (dense).

Because values carry RoPE at key positions, the output's rope channels are rotated back at the
query position, which leaves the value contribution depending on relative position only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.layers.compressor import Compressor
from deepinfer.models.layers.indexer import Indexer
from deepinfer.models.layers.norm import Linear, RMSNorm, fp32_param
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.state import LayerState, SWARing


def init_mqa(module: nn.Module, cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Create the per-layer parts V4 and V4.1 attention share (low-rank query path, the shared
    kv head, the grouped output projection, the sinks) under their official names; returns the
    hidden size."""
    module.n_heads = cfg.num_attention_heads
    module.head_dim = cfg.head_dim
    module.window = cfg.sliding_window
    module.groups = cfg.o_groups
    module.eps = cfg.rms_norm_eps
    d, hd = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
    module.wq_a = Linear(d, cfg.q_lora_rank, dtype)
    module.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
    module.wq_b = Linear(cfg.q_lora_rank, hd, dtype)
    module.wkv = Linear(d, cfg.head_dim, dtype)
    module.kv_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
    module.wo_a = Linear(hd // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, dtype)
    module.wo_b = Linear(cfg.o_groups * cfg.o_lora_rank, d, dtype)
    module.attn_sink = fp32_param(cfg.num_attention_heads)
    return d


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = cfg.attn_kind(layer_id)
        self.ratio = cfg.compress_ratio(layer_id)
        d = init_mqa(self, cfg, dtype)
        self.compressor: Compressor | None = None
        self.indexer: Indexer | None = None
        if self.kind != "swa":
            overlap = self.kind == "csa"
            self.compressor = Compressor(
                d, self.head_dim, self.ratio, overlap=overlap, eps=cfg.rms_norm_eps, dtype=dtype
            )
        if self.kind == "csa":
            self.indexer = Indexer(cfg, self.ratio, dtype)

    def new_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> LayerState:
        ring = torch.zeros(batch, self.window, self.head_dim, dtype=dtype, device=device)
        return LayerState(
            swa=SWARing(ring),
            compressor=self.compressor.new_state(batch, dtype, device) if self.compressor else None,
            indexer=self.indexer.compressor.new_state(batch, dtype, device)
            if self.indexer
            else None,
        )

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        state: LayerState,
    ) -> Tensor:
        """``x`` [B, S, d] is the normed sublayer input at absolute ``positions`` [S]."""
        b, s, _ = x.shape
        cos, sin = rotary.cos_sin(positions)

        qr = self.q_norm(ops, self.wq_a(ops, x))
        q = self.wq_b(ops, qr).view(b, s, self.n_heads, self.head_dim)
        q = ops.rms_norm(q, None, self.eps)  # per-head unweighted norm (V4 only)
        q = ops.rope(q, cos, sin)

        kv = self.kv_norm(ops, self.wkv(ops, x))
        kv = ops.rope(kv[:, :, None], cos, sin)[:, :, 0]

        start = state.swa.length  # tokens this layer has seen = position of the first new one
        past, past_pos = state.swa.read(start)
        keys = torch.cat((past.to(kv.dtype), kv), dim=1)
        key_pos = torch.cat((past_pos, positions))
        delta = positions[:, None] - key_pos[None, :]
        mask = ((delta >= 0) & (delta < self.window))[None].expand(b, -1, -1)
        state.swa.write(kv, start)

        if self.compressor is not None:
            assert state.compressor is not None
            entries = self.compressor(ops, x, positions, rotary, state.compressor)
            n = entries.shape[1]
            if self.indexer is not None:
                assert state.indexer is not None
                picks = self.indexer(ops, x, qr, positions, rotary=rotary, state=state.indexer)
                picks = torch.where(picks < 0, torch.full_like(picks, n), picks)
                comp_mask = torch.zeros(b, s, n + 1, dtype=torch.bool, device=x.device)
                comp_mask.scatter_(-1, picks, True)
                comp_mask = comp_mask[..., :n]
            else:
                visible = (positions + 1) // self.ratio
                comp_mask = torch.arange(n, device=x.device)[None, :] < visible[:, None]
                comp_mask = comp_mask[None].expand(b, -1, -1)
            keys = torch.cat((keys, entries.to(kv.dtype)), dim=1)
            mask = torch.cat((mask, comp_mask), dim=-1)

        o = ops.attention(q, keys, mask, self.attn_sink, self.head_dim**-0.5)
        o = ops.rope(o, cos, sin, inverse=True)
        o = ops.grouped_linear(o.reshape(b, s, self.groups, -1), self.wo_a.weight)
        return self.wo_b(ops, o.flatten(2))
